//! Requests written to hurt the server: each gets a clear KServe error (or, where Triton answers,
//! Triton's answer) and the server keeps serving. Several of these aborted or crashed it before.

use serde_json::{Value, json};

use crate::harness::{TestServer, examples_repo, output_f32, shared_cache};

async fn start() -> TestServer {
    TestServer::start(&[examples_repo()], &[], &shared_cache()).await
}

fn good_inputs() -> Value {
    let row: Vec<f32> = (0..16).map(|i| i as f32).collect();
    json!([
        { "name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": row },
        { "name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": row },
    ])
}

async fn still_serves(s: &TestServer, after: &str) {
    let (status, body) = s.infer("add_sub", good_inputs()).await;
    assert_eq!(
        status, 200,
        "after {after} the server must still serve: {body}"
    );
}

fn error_text(what: &str, body: &Value) -> String {
    body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: KServe error JSON, got {body}"))
        .to_owned()
}

#[tokio::test]
async fn declared_shapes_cannot_abort_or_panic_the_server() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    let cases = [
        // ~10^12 elements, one element of data: the decoder allocated 8 TB and aborted.
        ("10^12 elements", json!([1_000_000, 1_000_000]), "elements"),
        // Near 2^62 and i64::MAX: "capacity overflow" panics dropped the connection.
        ("2^62", json!([4_611_686_018_427_387_904i64]), "elements"),
        ("i64::MAX", json!([i64::MAX]), "elements"),
        (
            "product overflows",
            json!([4_294_967_296i64, 4_294_967_296i64]),
            "overflows",
        ),
        ("negative", json!([1, -16]), "negative"),
    ];
    for (what, shape, want) in cases {
        let inputs = json!([
            { "name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0] },
            { "name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": vec![1.0; 16] },
        ]);
        let (status, body) = s.infer("add_sub", inputs).await;
        assert_eq!(status, 400, "{what}: {body}");
        let message = error_text(what, &body);
        assert!(
            message.contains(want),
            "{what}: '{message}' should mention '{want}'"
        );
        still_serves(&s, what).await;
    }
    // Binary data: [2^62] FP32 "needed" 2^64 = 0 bytes with wrapping arithmetic and reached ORT.
    let header = json!({ "inputs": [
        { "name": "INPUT0", "shape": [4_611_686_018_427_387_904i64, 16], "datatype": "FP32", "parameters": { "binary_data_size": 0 } },
        { "name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "parameters": { "binary_data_size": 64 } },
    ]});
    let mut body = serde_json::to_vec(&header).expect("json");
    let n = body.len();
    body.extend_from_slice(&[0u8; 64]);
    let (status, err) = s.post_raw("/v2/models/add_sub/infer", body, Some(n)).await;
    assert_eq!(status, 400, "{err}");
    assert!(
        error_text("binary 2^62", &err).contains("overflows"),
        "{err}"
    );
    still_serves(&s, "a binary 2^62 shape").await;
}

#[tokio::test]
async fn deep_nesting_is_refused() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    let data = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
    let body = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":{data}}}]}}"#
    );
    let (status, err) = s
        .post_raw("/v2/models/add_sub/infer", body.into_bytes(), None)
        .await;
    assert_eq!(status, 400, "{err}");
    error_text("deep nesting", &err);
    still_serves(&s, "deep nesting").await;
}

#[tokio::test]
async fn a_large_json_body_costs_a_small_multiple_of_its_size() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    still_serves(&s, "start").await;
    let before = s.peak_rss();
    // 48 MB of `1,` elements. Through a serde_json::Value tree this grew the server by ~1 GB.
    let elements = 24_000_000usize;
    let mut body =
        br#"{"inputs":[{"name":"INPUT0","shape":[1,24000000],"datatype":"FP32","data":["#.to_vec();
    body.reserve(elements * 2 + 100);
    for i in 0..elements {
        if i > 0 {
            body.push(b',');
        }
        body.push(b'1');
    }
    body.extend_from_slice(br#"]},{"name":"INPUT1","shape":[1,16],"datatype":"FP32","data":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}"#);
    let size = body.len() as u64;
    let (status, err) = s.post_raw("/v2/models/add_sub/infer", body, None).await;
    assert_eq!(status, 400, "{err}");
    assert!(
        error_text("large body", &err).contains("unexpected shape"),
        "{err}"
    );
    let grown = s.peak_rss().saturating_sub(before);
    // The body itself, 4 bytes per element (2x the body), and hyper's buffers.
    assert!(
        grown < 5 * size,
        "decoding a {size} byte body grew the server by {grown} bytes"
    );
    still_serves(&s, "a large body").await;
}

#[tokio::test]
async fn an_output_asked_for_twice_is_answered_once() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    let request = json!({
        "inputs": good_inputs(),
        "outputs": [ { "name": "OUTPUT0" }, { "name": "OUTPUT0" } ],
    });
    let (status, body) = s.post_json("/v2/models/add_sub/infer", &request).await;
    assert_eq!(status, 200, "{body}");
    let outputs = body["outputs"].as_array().expect("outputs");
    assert_eq!(outputs.len(), 1, "{body}");
    let want: Vec<f32> = (0..16).map(|i| 2.0 * i as f32).collect();
    assert_eq!(output_f32(&body, "OUTPUT0"), want);
}

#[tokio::test]
async fn every_error_has_a_kserve_json_body() {
    crate::harness::require_onnx_runtime!();
    let s = start().await;
    use reqwest::Method;
    let cases = [
        // A model name that is not UTF-8 once percent-decoded: axum answered text/plain.
        (Method::POST, "/v2/models/%FF%FE/infer", 400),
        (Method::GET, "/v2/models/%C3%28", 400),
        (Method::GET, "/v2/no/such/route", 404),
        (Method::GET, "/", 404),
        // The method a route does not take: an empty 405.
        (Method::GET, "/v2/models/add_sub/infer", 405),
        (Method::DELETE, "/v2/models/add_sub", 405),
        (Method::POST, "/v2/models/stats", 405),
    ];
    for (method, path, want) in cases {
        let (status, content_type, text) = s.request(method.clone(), path).await;
        assert_eq!(status, want, "{method} {path}: {text}");
        assert!(
            content_type.starts_with("application/json"),
            "{method} {path}: content type '{content_type}'"
        );
        let body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: '{text}' is not JSON: {e}"));
        let message = error_text(path, &body);
        assert!(!message.is_empty(), "{method} {path}");
    }
    // Health endpoints keep Triton's bare status.
    let (status, _, text) = s.request(Method::GET, "/v2/health/live").await;
    assert_eq!((status, text.as_str()), (200, ""));
    still_serves(&s, "routing errors").await;
}

#[tokio::test]
async fn a_shape_only_onnx_runtime_checks_is_the_clients_error() {
    crate::harness::require_onnx_runtime!();
    // Triton's `simple` graph (fixed [16] rows) under a config that leaves the row length open:
    // only ONNX Runtime knows that 5 is wrong.
    let repo = crate::harness::temp_dir("ort-dims");
    let model = repo.join("simple_open");
    std::fs::create_dir_all(model.join("1")).expect("version folder");
    std::fs::copy(
        examples_repo().join("simple/1/model.onnx"),
        model.join("1/model.onnx"),
    )
    .expect("the simple model (scripts/gen_models.py)");
    let tensor = |name: &str| format!("{{ name: \"{name}\" data_type: TYPE_INT32 dims: [ -1 ] }}");
    std::fs::write(
        model.join("config.pbtxt"),
        format!(
            "name: \"simple_open\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 8\n\
             input [ {}, {} ]\noutput [ {}, {} ]\n",
            tensor("INPUT0"),
            tensor("INPUT1"),
            tensor("OUTPUT0"),
            tensor("OUTPUT1")
        ),
    )
    .expect("config");
    // The same graph under a config that leaves INPUT1 out: no request could ever succeed, so
    // it is refused at load, saying which input is missing.
    let half = repo.join("simple_half");
    std::fs::create_dir_all(half.join("1")).expect("version folder");
    std::fs::copy(model.join("1/model.onnx"), half.join("1/model.onnx")).expect("model");
    std::fs::write(
        half.join("config.pbtxt"),
        format!(
            "name: \"simple_half\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 8\n\
             input [ {} ]\noutput [ {}, {} ]\n",
            tensor("INPUT0"),
            tensor("OUTPUT0"),
            tensor("OUTPUT1")
        ),
    )
    .expect("config");
    let s = TestServer::start(&[repo], &[], &shared_cache()).await;
    let (status, index) = s.post_json("/v2/repository/index", &json!({})).await;
    assert_eq!(status, 200, "{index}");
    let row = index
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == "simple_half"))
        .unwrap_or_else(|| panic!("simple_half is listed: {index}"));
    assert_eq!(row["state"], "UNAVAILABLE", "{row}");
    assert!(
        row["reason"]
            .as_str()
            .is_some_and(|r| r
                .contains("takes the input 'INPUT1', which the configuration does not declare")),
        "{row}"
    );
    let inputs = |n: usize| {
        let row: Vec<i32> = (0..n as i32).collect();
        json!([
            { "name": "INPUT0", "shape": [1, n], "datatype": "INT32", "data": row },
            { "name": "INPUT1", "shape": [1, n], "datatype": "INT32", "data": row },
        ])
    };
    let (status, body) = s.infer("simple_open", inputs(5)).await;
    assert_eq!(status, 400, "{body}");
    let message = error_text("a row of 5", &body);
    assert!(
        message.contains("ONNX Runtime refused the inputs") && message.contains("INPUT"),
        "ONNX Runtime's reason, in its words: {message}"
    );
    let (status, body) = s.infer("simple_open", inputs(16)).await;
    assert_eq!(
        status, 200,
        "rows of the graph's length still serve: {body}"
    );
}
