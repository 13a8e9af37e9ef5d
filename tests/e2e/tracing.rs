//! Request tracing end to end: the server exports its spans over OTLP/HTTP to a receiver this
//! test runs, and a request that crosses an ensemble, or a handler's BLS calls, is one trace
//! under the client's `traceparent`, with a span for every hop, its queue wait and execution.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::json;

use crate::harness::{TestServer, examples_repo, require_onnx_runtime, shared_cache, wait_until};

/// A span as the receiver got it.
#[derive(Clone, Debug)]
struct Received {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: Vec<(String, String)>,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// An OTLP/HTTP trace receiver on a loopback port: `POST /v1/traces` with protobuf bodies.
async fn receiver() -> (String, Arc<Mutex<Vec<Received>>>) {
    let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
    let store = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let store = store.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut store = store.lock().expect("lock");
                for span in request
                    .resource_spans
                    .iter()
                    .flat_map(|r| &r.scope_spans)
                    .flat_map(|s| &s.spans)
                {
                    let attributes = span
                        .attributes
                        .iter()
                        .map(|kv| {
                            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                Some(AnyValue::StringValue(s)) => s.clone(),
                                Some(AnyValue::IntValue(n)) => n.to_string(),
                                other => format!("{other:?}"),
                            };
                            (kv.key.clone(), value)
                        })
                        .collect();
                    store.push(Received {
                        name: span.name.clone(),
                        trace_id: hex::encode(&span.trace_id),
                        span_id: hex::encode(&span.span_id),
                        parent_span_id: hex::encode(&span.parent_span_id),
                        attributes,
                    });
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let url = format!(
        "http://{}/v1/traces",
        listener.local_addr().expect("address")
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, spans)
}

fn trace_of(spans: &Mutex<Vec<Received>>, trace_id: &str) -> Vec<Received> {
    spans
        .lock()
        .expect("lock")
        .iter()
        .filter(|s| s.trace_id == trace_id)
        .cloned()
        .collect()
}

/// The `infer` span of `model` in `trace`, if one came.
fn hop<'t>(trace: &'t [Received], model: &str) -> Option<&'t Received> {
    trace
        .iter()
        .find(|s| s.name == "infer" && s.attribute("model") == Some(model))
}

#[tokio::test]
async fn a_request_through_an_ensemble_and_bls_calls_is_one_trace_with_every_hop() {
    require_onnx_runtime!();
    let (url, spans) = receiver().await;
    let url_setting = format!("opentelemetry,url={url}");
    let server = TestServer::start(
        &[examples_repo()],
        &[
            "--trace-config",
            "mode=opentelemetry",
            "--trace-config",
            "rate=1",
            "--trace-config",
            &url_setting,
            "--trace-config",
            "opentelemetry,bsp_schedule_delay=100",
        ],
        &shared_cache(),
    )
    .await;

    // A BLS handler: bls_branch calls add_sub, then add_sub_wasm or add_sub.
    let bls_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let values: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let answer = server
        .client
        .post(server.url("/v2/models/bls_branch/infer"))
        .header("traceparent", format!("00-{bls_trace}-{client_span}-01"))
        .json(&json!({ "inputs": [
            { "name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": values },
            { "name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": values },
        ]}))
        .send()
        .await
        .expect("answers");
    assert_eq!(answer.status().as_u16(), 200, "{:?}", answer.text().await);

    // An ensemble: embed_text runs preprocess_text, minilm and pool_embeddings.
    let ensemble_trace = "0af7651916cd43dd8448eb211c80319c";
    let answer = server
        .client
        .post(server.url("/v2/models/embed_text/infer"))
        .header(
            "traceparent",
            format!("00-{ensemble_trace}-b7ad6b7169203331-01"),
        )
        .json(
            &json!({ "inputs": [{ "name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
            "data": ["A man is eating food."] }] }),
        )
        .send()
        .await
        .expect("answers");
    assert_eq!(answer.status().as_u16(), 200, "{:?}", answer.text().await);

    wait_until("both traces exported with every hop", || {
        let spans = spans.clone();
        async move {
            let bls = trace_of(&spans, bls_trace);
            let ensemble = trace_of(&spans, ensemble_trace);
            // Every span asserted on below: a parent span ends after its children and may
            // be exported in a later batch.
            let parts_of = |span: &Received| {
                ["queue", "execute"].iter().all(|part| {
                    bls.iter()
                        .any(|s| s.name == *part && s.parent_span_id == span.span_id)
                })
            };
            bls.iter().any(|s| s.name == "request")
                && hop(&bls, "bls_branch").is_some()
                && bls
                    .iter()
                    .filter(|s| s.name == "infer" && s.attribute("caller") == Some("bls_branch"))
                    .count()
                    >= 2
                && bls.iter().filter(|s| s.name == "infer").all(parts_of)
                && ["embed_text", "preprocess_text", "minilm", "pool_embeddings"]
                    .iter()
                    .all(|m| hop(&ensemble, m).is_some())
        }
    })
    .await;

    let bls = trace_of(&spans, bls_trace);
    let request = bls
        .iter()
        .find(|s| s.name == "request")
        .expect("the request span");
    assert_eq!(
        request.parent_span_id, client_span,
        "a child of the client's span"
    );
    let handler = hop(&bls, "bls_branch").expect("the handler's hop");
    assert_eq!(handler.parent_span_id, request.span_id);
    for call in bls
        .iter()
        .filter(|s| s.name == "infer" && s.attribute("caller") == Some("bls_branch"))
    {
        assert_eq!(
            call.parent_span_id, handler.span_id,
            "a BLS hop under its handler"
        );
        let model = call.attribute("model").unwrap_or_default();
        assert!(model == "add_sub" || model == "add_sub_wasm", "{model}");
    }
    // Every hop waited in its queue and executed, each under its own hop.
    for span in bls.iter().filter(|s| s.name == "infer") {
        for part in ["queue", "execute"] {
            assert!(
                bls.iter()
                    .any(|s| s.name == part && s.parent_span_id == span.span_id),
                "{part} of {:?}",
                span.attribute("model")
            );
        }
    }
    assert!(
        bls.iter()
            .filter(|s| s.name == "execute")
            .all(|s| s.attribute("batch_size").is_some())
    );

    let ensemble = trace_of(&spans, ensemble_trace);
    let top = hop(&ensemble, "embed_text").expect("the ensemble's hop");
    for step in ["preprocess_text", "minilm", "pool_embeddings"] {
        let step = hop(&ensemble, step).expect("a step");
        assert_eq!(
            step.parent_span_id, top.span_id,
            "a step under its ensemble"
        );
        assert_eq!(step.attribute("caller"), Some("embed_text"));
    }
}
