//! KServe v2 over HTTP against ONNX models: metadata, inference (JSON and binary), errors.

use serde_json::{Value, json};

use crate::harness::{TestServer, examples_repo, output, output_f32, shared_cache};

fn add_sub_inputs(a: &[f32], b: &[f32], rows: usize) -> Value {
    json!([
        { "name": "INPUT0", "shape": [rows, 16], "datatype": "FP32", "data": a },
        { "name": "INPUT1", "shape": [rows, 16], "datatype": "FP32", "data": b },
    ])
}

fn ramp(rows: usize, scale: f32) -> Vec<f32> {
    (0..rows * 16).map(|i| i as f32 * scale).collect()
}

async fn start() -> TestServer {
    TestServer::start(&[examples_repo()], &[], &shared_cache()).await
}

#[tokio::test]
async fn the_async_runtime_runs_the_workers_the_flag_asks_for() {
    crate::harness::require_onnx_runtime!();
    let s = TestServer::start(
        &[examples_repo()],
        &["--worker-threads", "1"],
        &shared_cache(),
    )
    .await;
    assert!(s.log_text().contains("workers=1"), "{}", s.log_text());
    let (status, body) = s
        .infer("add_sub", add_sub_inputs(&ramp(1, 1.0), &ramp(1, 2.0), 1))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output_f32(&body, "OUTPUT0")[3], 9.0);
}

#[tokio::test]
async fn health_metadata_and_config() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    assert_eq!(s.get("/v2/health/live").await.0, 200);
    let (status, meta) = s.get("/v2").await;
    assert_eq!(status, 200);
    assert!(
        meta["extensions"]
            .as_array()
            .is_some_and(|e| e.iter().any(|x| x == "binary_tensor_data"))
    );

    let (status, model) = s.get("/v2/models/add_sub").await;
    assert_eq!(status, 200, "{model}");
    assert_eq!(model["platform"], "onnxruntime_onnx");
    assert_eq!(
        model["inputs"][0],
        json!({ "name": "INPUT0", "datatype": "FP32", "shape": [-1, 16] })
    );
    assert_eq!(s.get("/v2/models/add_sub/versions/1/ready").await.0, 200);

    let (status, config) = s.get("/v2/models/add_sub/config").await;
    assert_eq!(status, 200);
    assert_eq!(config["max_batch_size"], 8);
    assert_eq!(config["input"][1]["data_type"], "TYPE_FP32");
    assert_eq!(config["input"][1]["dims"], json!([16]));
    assert_eq!(config["instance_group"][0]["kind"], "KIND_CPU");
}

#[tokio::test]
async fn add_sub_json_batches_exactly() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    let (a, b) = (ramp(3, 1.5), ramp(3, -0.25));
    let (status, body) = s.infer("add_sub", add_sub_inputs(&a, &b, 3)).await;
    assert_eq!(status, 200, "{body}");
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let diff: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x - y).collect();
    assert_eq!(output_f32(&body, "OUTPUT0"), sum);
    assert_eq!(output_f32(&body, "OUTPUT1"), diff);
    assert_eq!(output(&body, "OUTPUT0")["shape"], json!([3, 16]));
    assert_eq!(body["model_version"], "1");
}

#[tokio::test]
async fn binary_request_and_response() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..16).map(|i| 100.0 - i as f32).collect();
    let header = json!({
        "id": "bin-1",
        "inputs": [
            { "name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": { "binary_data_size": 64 } },
            { "name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "parameters": { "binary_data_size": 64 } },
        ],
        "outputs": [ { "name": "OUTPUT1", "parameters": { "binary_data": true } } ],
    });
    let mut body = serde_json::to_vec(&header).expect("json");
    let header_len = body.len();
    for v in a.iter().chain(&b) {
        body.extend_from_slice(&v.to_le_bytes());
    }
    let r = s
        .client
        .post(s.url("/v2/models/add_sub/infer"))
        .header("Inference-Header-Content-Length", header_len.to_string())
        .body(body)
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 200);
    let json_len: usize = r.headers()["inference-header-content-length"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("number");
    let bytes = r.bytes().await.expect("body");
    let meta: Value = serde_json::from_slice(&bytes[..json_len]).expect("json header");
    assert_eq!(meta["id"], "bin-1");
    assert_eq!(
        meta["outputs"].as_array().map(Vec::len),
        Some(1),
        "only the requested output: {meta}"
    );
    assert_eq!(meta["outputs"][0]["parameters"]["binary_data_size"], 64);
    let got: Vec<f32> = bytes[json_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x - y).collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn classification_uses_labels() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    let x: Vec<f32> = (0..64)
        .map(|i| ((i * 7) % 13) as f32 / 13.0 - 0.5)
        .collect();
    let inputs = json!([{ "name": "INPUT", "shape": [1, 64], "datatype": "FP32", "data": x }]);
    let (_, raw) = s.infer("mlp_classifier", inputs.clone()).await;
    let probs = output_f32(&raw, "PROBS");
    let best = (0..probs.len())
        .max_by(|&i, &j| probs[i].total_cmp(&probs[j]))
        .expect("classes");
    let labels =
        std::fs::read_to_string(examples_repo().join("mlp_classifier/labels.txt")).expect("labels");
    let label = labels.lines().nth(best).expect("label line");
    let (status, body) = s
        .post_json(
            "/v2/models/mlp_classifier/infer",
            &json!({ "inputs": inputs, "outputs": [{ "name": "PROBS", "parameters": { "classification": 2 } }] }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let top = output(&body, "PROBS");
    assert_eq!(top["datatype"], "BYTES");
    assert_eq!(top["shape"], json!([1, 2]));
    let first = top["data"][0].as_str().expect("string");
    assert!(
        first.ends_with(&format!(":{best}:{label}")),
        "{first} should name class {best} ({label})"
    );
}

#[tokio::test]
async fn bad_requests_get_clear_errors_and_the_server_keeps_serving() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    let good = add_sub_inputs(&ramp(1, 1.0), &ramp(1, 2.0), 1);
    /// (what, body, Inference-Header-Content-Length, status, text the error must contain)
    type Case = (&'static str, Vec<u8>, Option<usize>, u16, &'static str);
    let cases: Vec<Case> = vec![
        ("malformed JSON", b"{\"inputs\": [".to_vec(), None, 400, "parse"),
        (
            "wrong datatype",
            serde_json::to_vec(&json!({ "inputs": [
                { "name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": vec![1; 16] },
                { "name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": vec![1.0; 16] } ] }))
            .expect("json"),
            None,
            400,
            "data-type",
        ),
        (
            "wrong shape",
            serde_json::to_vec(&json!({ "inputs": add_sub_inputs(&[1.0; 15], &[1.0; 15], 1)
                .as_array().expect("array").iter().map(|t| { let mut t = t.clone(); t["shape"] = json!([1, 15]); t }).collect::<Vec<_>>() }))
            .expect("json"),
            None,
            400,
            "unexpected shape",
        ),
        (
            "batch over max_batch_size",
            serde_json::to_vec(&json!({ "inputs": add_sub_inputs(&ramp(9, 1.0), &ramp(9, 1.0), 9) })).expect("json"),
            None,
            400,
            "batch-size must be <= 8",
        ),
        (
            "a batch of no rows",
            serde_json::to_vec(&json!({ "inputs": add_sub_inputs(&[], &[], 0) })).expect("json"),
            None,
            400,
            "batch-size must be at least 1",
        ),
        ("truncated binary body", br#"{"inputs":[]}"#.to_vec(), Some(400), 400, "Inference-Header-Content-Length"),
    ];
    for (what, body, header_length, want_status, want_text) in cases {
        let (status, err) = s
            .post_raw("/v2/models/add_sub/infer", body, header_length)
            .await;
        assert_eq!(status, want_status, "{what}: {err}");
        let message = err["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: KServe error JSON, got {err}"));
        assert!(
            message.contains(want_text),
            "{what}: '{message}' should mention '{want_text}'"
        );
        let (status, body) = s.infer("add_sub", good.clone()).await;
        assert_eq!(
            status, 200,
            "after {what} a good request must succeed: {body}"
        );
    }
    let (status, err) = s.infer("no_such_model", good.clone()).await;
    assert_eq!(status, 404, "{err}");
    let (status, err) = s
        .post_json(
            "/v2/models/add_sub/versions/7/infer",
            &json!({ "inputs": good }),
        )
        .await;
    assert_eq!(status, 404, "{err}");
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|e| e.contains("version 7"))
    );
    let (status, _) = s.get("/v2/models/no_such_model").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn body_limit_is_enforced() {
    crate::harness::require_onnx_runtime!();
    let s = TestServer::start(
        &[examples_repo()],
        &["--http-max-input-size", "512"],
        &shared_cache(),
    )
    .await;
    let (status, err) = s
        .infer("add_sub", add_sub_inputs(&ramp(4, 1.0), &ramp(4, 1.0), 4))
        .await;
    assert_eq!(status, 413, "{err}");
    assert!(err["error"].as_str().is_some_and(|e| e.contains("512")));
    let (status, _) = s.infer("add_sub", json!([])).await;
    assert_eq!(status, 400, "a small bad body is still read and rejected");
}

#[tokio::test]
async fn stats_count_requests_and_batches() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    for rows in [1usize, 2, 2] {
        let (status, _) = s
            .infer(
                "add_sub",
                add_sub_inputs(&ramp(rows, 1.0), &ramp(rows, 1.0), rows),
            )
            .await;
        assert_eq!(status, 200);
    }
    let _ = s.infer("add_sub", json!([])).await; // a failure
    let (status, stats) = s.get("/v2/models/add_sub/stats").await;
    assert_eq!(status, 200);
    let m = &stats["model_stats"][0];
    assert_eq!(m["inference_count"], 5, "{m}");
    assert_eq!(m["execution_count"], 3);
    assert_eq!(m["inference_stats"]["success"]["count"], 3);
    assert_eq!(m["inference_stats"]["fail"]["count"], 1);
    let sizes: Vec<u64> = m["batch_stats"]
        .as_array()
        .expect("batch stats")
        .iter()
        .map(|b| b["batch_size"].as_u64().expect("size"))
        .collect();
    assert_eq!(sizes, vec![1, 2]);
    // A version the model does not have is named in the answer.
    let (status, body) = s.get("/v2/models/add_sub/versions/9/stats").await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("'add_sub' version 9 is not found")),
        "{body}"
    );
    // The index's `ready` is a boolean, not anything truthy.
    let (status, body) = s
        .post_json("/v2/repository/index", &json!({ "ready": "yes" }))
        .await;
    assert_eq!(status, 400, "{body}");
}
