//! The example handlers, built from `examples/` by the build, served and checked exactly.

use serde_json::{Value, json};

use crate::harness::{TestServer, examples_repo, output, output_f32, shared_cache, temp_dir};

async fn start() -> TestServer {
    TestServer::start(&[examples_repo()], &[], &shared_cache()).await
}

fn pair(a: &[f32], b: &[f32]) -> Value {
    json!([
        { "name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": a },
        { "name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": b },
    ])
}

#[tokio::test]
async fn add_sub_wasm_matches_add_sub_onnx() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    let a: Vec<f32> = (0..16).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..16).map(|i| 3.0 - i as f32).collect();
    let (status, wasm) = s.infer("add_sub_wasm", pair(&a, &b)).await;
    assert_eq!(status, 200, "{wasm}");
    let (_, onnx) = s.infer("add_sub", pair(&a, &b)).await;
    for name in ["OUTPUT0", "OUTPUT1"] {
        assert_eq!(output_f32(&wasm, name), output_f32(&onnx, name), "{name}");
    }
    assert_eq!(output_f32(&wasm, "OUTPUT0")[3], 1.5 + 0.0);
    let (_, meta) = s.get("/v2/models/add_sub_wasm").await;
    assert_eq!(meta["platform"], "wasm");
}

#[tokio::test]
async fn tokenizer_produces_bert_ids() {
    let s = start().await;
    let inputs = json!([{ "name": "TEXT", "shape": [2, 1], "datatype": "BYTES",
        "data": [["A man is eating food."], ["Hello, world!"]] }]);
    let (status, body) = s.infer("preprocess_text", inputs).await;
    assert_eq!(status, 200, "{body}");
    let ids = output(&body, "INPUT_IDS");
    assert_eq!(ids["shape"], json!([2, 8]));
    assert_eq!(
        ids["data"],
        json!([
            101, 1037, 2158, 2003, 5983, 2833, 1012, 102, 101, 7592, 1010, 2088, 999, 102, 0, 0
        ])
    );
    let mask = output(&body, "ATTENTION_MASK");
    assert_eq!(
        mask["data"],
        json!([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0])
    );
}

#[tokio::test]
async fn tokenizer_rejects_non_utf8_alone() {
    let s = start().await;
    let header = json!({ "inputs": [{ "name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
        "parameters": { "binary_data_size": 6 } }] });
    let mut body = serde_json::to_vec(&header).expect("json");
    let n = body.len();
    body.extend_from_slice(&2u32.to_le_bytes());
    body.extend_from_slice(&[0xff, 0xfe]);
    let (status, err) = s
        .post_raw("/v2/models/preprocess_text/infer", body, Some(n))
        .await;
    assert_eq!(status, 400, "{err}");
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|e| e.to_lowercase().contains("utf-8")),
        "{err}"
    );
    let ok = json!([{ "name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["fine"] }]);
    assert_eq!(s.infer("preprocess_text", ok).await.0, 200);
}

#[tokio::test]
async fn postprocess_topk_ranks_labels() {
    let s = start().await;
    let logits = json!([{ "name": "LOGITS", "shape": [1, 10], "datatype": "FP32",
        "data": [0.0, 0.0, 0.0, 5.0, 0.0, 1.0, 0.0, 0.0, 0.0, 3.0] }]);
    let (status, body) = s.infer("postprocess_topk", logits).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output(&body, "INDICES")["data"], json!([3, 9, 5]));
    let labels = output(&body, "LABELS");
    let first = labels["data"][0].as_str().expect("label");
    assert!(first.starts_with("cat:"), "{first}");
    let p: f64 = first["cat:".len()..].parse().expect("probability");
    let want = 5f64.exp() / (5f64.exp() + 3f64.exp() + 1f64.exp() + 7.0);
    assert!((p - want).abs() < 1e-3, "{p} vs {want}");
}

#[tokio::test]
async fn bls_branch_takes_each_branch_through_other_models() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let b: Vec<f32> = vec![1.0; 16];
    // sum(a + b) >= 0: branch B runs add_sub_wasm(a+b, a-b) -> 2a.
    let (status, body) = s.infer("bls_branch", pair(&a, &b)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        output_f32(&body, "OUTPUT"),
        a.iter().map(|x| 2.0 * x).collect::<Vec<_>>()
    );
    assert_eq!(output(&body, "BRANCH")["data"], json!(["add_sub_wasm"]));
    // sum(a + b) < 0: branch C runs add_sub(a-b, a+b) and takes OUTPUT1 = -2b.
    let neg: Vec<f32> = a.iter().map(|x| -x - 5.0).collect();
    let (status, body) = s.infer("bls_branch", pair(&neg, &b)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output_f32(&body, "OUTPUT"), vec![-2.0; 16]);
    assert_eq!(output(&body, "BRANCH")["data"], json!(["add_sub"]));
    // The inner calls went through the other models' queues: their statistics saw them.
    let (_, stats) = s.get("/v2/models/add_sub/stats").await;
    assert_eq!(
        stats["model_stats"][0]["inference_stats"]["success"]["count"], 3,
        "{stats}"
    );
}

#[tokio::test]
async fn restart_reuses_compiled_code() {
    let cache = temp_dir("restart-cache");
    let first = TestServer::start(&[examples_repo()], &[], &cache).await;
    assert!(!first.states().await.is_empty());
    let log = first.stop();
    assert!(
        log.contains("compiled-code cache miss"),
        "first start compiles:\n{log}"
    );
    let second = TestServer::start(&[examples_repo()], &[], &cache).await;
    let (status, _) = second
        .infer("add_sub_wasm", pair(&[1.0; 16], &[2.0; 16]))
        .await;
    assert_eq!(status, 200);
    let log = second.stop();
    assert!(
        log.contains("compiled-code cache hit"),
        "restart loads from the cache:\n{log}"
    );
    assert!(
        !log.contains("compiled-code cache miss"),
        "restart must not recompile:\n{log}"
    );
}
