//! Misbehaving guests (built from `tests/guests/`): each fails only its own requests, with a clear
//! error; the server stays healthy, other models answer, and the guest serves again afterwards.

use serde_json::{Value, json};

use crate::harness::{TestServer, fixtures_repo, output_f32, shared_cache};

fn x(value: f32) -> Value {
    json!([{ "name": "X", "shape": [1, 1], "datatype": "FP32", "data": [value] }])
}

async fn start() -> TestServer {
    TestServer::start(&[fixtures_repo()], &[], &shared_cache()).await
}

/// Sends the bad input, checks the error, then checks the server, a bystander and the guest.
async fn misbehaves(s: &TestServer, model: &str, want_status: u16, want_text: &str) {
    let (status, err) = s.infer(model, x(-1.0)).await;
    assert_eq!(status, want_status, "{model}: {err}");
    let message = err["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{model}: KServe error JSON, got {err}"));
    assert!(
        message.contains(want_text),
        "{model}: '{message}' should mention '{want_text}'"
    );
    assert_eq!(
        s.get("/v2/health/live").await.0,
        200,
        "{model}: server alive"
    );
    let (status, body) = s.infer("identity_echo", x(4.0)).await;
    assert_eq!(
        (status, output_f32(&body, "Y")),
        (200, vec![4.0]),
        "{model}: bystander answers"
    );
    let (status, body) = s.infer(model, x(2.0)).await;
    assert_eq!(status, 200, "{model} serves again: {body}");
    assert_eq!(output_f32(&body, "Y"), vec![2.0]);
}

#[tokio::test]
async fn every_fixture_loads() {
    let s = start().await;
    for (name, state, reason) in s.states().await {
        assert_eq!(state, "READY", "{name}: {reason}");
    }
}

#[tokio::test]
async fn panicking_guest() {
    misbehaves(&start().await, "guest_panic", 500, "trapped").await;
}

#[tokio::test]
async fn looping_guest_hits_its_deadline() {
    misbehaves(&start().await, "guest_loop", 503, "deadline").await;
}

#[tokio::test]
async fn memory_hog_hits_its_cap() {
    misbehaves(&start().await, "guest_memory_hog", 429, "memory limit").await;
}

#[tokio::test]
async fn oversized_output_is_refused() {
    misbehaves(&start().await, "guest_big_output", 429, "max_output_bytes").await;
}

#[tokio::test]
async fn unknown_model_call_is_reported() {
    misbehaves(&start().await, "guest_unknown_model", 404, "no_such_model").await;
}

#[tokio::test]
async fn self_recursion_is_refused_not_deadlocked() {
    misbehaves(&start().await, "guest_recursive", 429, "cycle").await;
}

#[tokio::test]
async fn a_stuck_guest_does_not_block_others() {
    let s = start().await;
    let looping = s.infer("guest_loop", x(-1.0));
    let bystander = s.infer("identity_echo", x(1.0));
    // Whichever answers first wins: the bystander must, while the guest is still looping.
    tokio::select! {
        biased;
        (status, body) = bystander => assert_eq!(status, 200, "{body}"),
        (status, body) = looping => panic!("the looping guest answered ({status} {body}) before the bystander"),
    }
}
