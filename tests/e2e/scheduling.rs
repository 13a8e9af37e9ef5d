//! Scheduling: dynamic batching (for ONNX and Wasm models, across HTTP and BLS callers),
//! priorities, queue policies, ordering, the rate limiter, warmup, ensembles and metrics.
//!
//! Order-sensitive tests use `slow_echo` (tests/guests): Y = X after waiting the request's
//! `delay_ms` parameter, which keeps an instance busy so that requests queue behind it. They
//! assert the order in which answers arrive, never how long anything took. Each step waits for
//! the server to reach a state (a request running, N queued) before sending the next, and each
//! ordered answer carries 300 ms of work, so a loaded client still sees them in order.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::harness::{
    TestServer, examples_repo, fixtures_repo, output, output_f32, shared_cache, temp_dir,
    wait_until,
};

const SLOW_ECHO_IO: &str = r#"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"#;

/// Writes `<repo>/<name>/config.pbtxt`, copying the model file and label files of `from`.
fn model(repo: &Path, name: &str, from: &Path, file: &str, config: &str) {
    let dir = repo.join(name);
    std::fs::create_dir_all(dir.join("1")).expect("mkdir");
    std::fs::copy(from.join("1").join(file), dir.join("1").join(file)).expect("model file");
    for entry in std::fs::read_dir(from).expect("model dir").flatten() {
        let path = entry.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "txt") {
            std::fs::copy(&path, dir.join(entry.file_name())).expect("label file");
        }
    }
    std::fs::write(
        dir.join("config.pbtxt"),
        format!("name: \"{name}\"\n{config}"),
    )
    .expect("config");
}

fn slow_echo(repo: &Path, name: &str, config: &str) {
    let config = format!("backend: \"wasm\"\n{SLOW_ECHO_IO}\n{config}");
    model(
        repo,
        name,
        &fixtures_repo().join("slow_echo"),
        "model.wasm",
        &config,
    );
}

fn echo_request(x: f32, delay_ms: u64, priority: u32) -> Value {
    json!({
        "inputs": [{ "name": "X", "shape": [1, 1], "datatype": "FP32", "data": [x] }],
        "parameters": { "delay_ms": delay_ms, "priority": priority },
    })
}

async fn start(repo: PathBuf, extra: &[&str]) -> TestServer {
    let s = TestServer::start(&[repo], extra, &shared_cache()).await;
    for (name, state, reason) in s.states().await {
        assert_eq!(state, "READY", "{name}: {reason}");
    }
    s
}

async fn stats(s: &TestServer, model: &str) -> Value {
    let (status, body) = s.get(&format!("/v2/models/{model}/stats")).await;
    assert_eq!(status, 200, "{body}");
    body["model_stats"][0].clone()
}

/// What must hold on the server before the next request is sent, so that order-sensitive
/// tests do not depend on how fast a loaded machine delivers requests.
#[derive(Clone, Copy)]
enum Then {
    /// `model` has started this many executions (`queue.count` in its statistics counts requests
    /// that left the queue for an instance).
    Started(&'static str, u64),
    /// This many requests wait in `model`'s queue (`nv_inference_pending_request_count`).
    Queued(&'static str, u64),
    Nothing,
}

async fn wait_for(s: &TestServer, then: Then) {
    wait_until("the queue state the next request needs", || async {
        match then {
            Then::Started(model, n) => {
                stats(s, model).await["inference_stats"]["queue"]["count"]
                    .as_u64()
                    .unwrap_or(0)
                    >= n
            }
            Then::Queued(model, n) => {
                s.has_metric(&format!(
                    "nv_inference_pending_request_count{{model=\"{model}\",version=\"1\"}} {n}"
                ))
                .await
            }
            Then::Nothing => true,
        }
    })
    .await;
}

/// Sends the requests concurrently, each once the previous one's condition holds, and returns the
/// tags in the order their answers arrived, with each answer.
async fn arrival_order(
    s: &TestServer,
    sends: Vec<(&'static str, String, Value, Then)>,
) -> Vec<(&'static str, u16, Value)> {
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (tag, path, body, then) in sends {
        let (client, url, order) = (s.client.clone(), s.url(&path), order.clone());
        tasks.push(tokio::spawn(async move {
            let r = client.post(url).json(&body).send().await.expect("answers");
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            order.lock().expect("lock").push((tag, status, body));
        }));
        wait_for(s, then).await;
    }
    for t in tasks {
        t.await.expect("task");
    }
    order.lock().expect("lock").clone()
}

#[tokio::test]
async fn dynamic_batching_merges_onnx_requests_exactly() {
    crate::harness::require_onnx_runtime!();
    let repo = temp_dir("batch-onnx");
    let mlp = examples_repo().join("mlp_classifier");
    let io = std::fs::read_to_string(mlp.join("config.pbtxt")).expect("config");
    let io = io.replace("name: \"mlp_classifier\"", "");
    model(
        &repo,
        "mlp_batched",
        &mlp,
        "model.onnx",
        &format!(
            "{io}\ndynamic_batching {{ max_queue_delay_microseconds: 300000 preferred_batch_size: [ 16 ] }}"
        ),
    );
    model(&repo, "mlp_alone", &mlp, "model.onnx", &io);
    let s = start(repo, &[]).await;
    let rows: Vec<Vec<f32>> = (0..16)
        .map(|r| {
            (0..64)
                .map(|i| ((r * 31 + i * 7) % 17) as f32 / 17.0 - 0.5)
                .collect()
        })
        .collect();
    let request = |x: &Vec<f32>| json!([{ "name": "INPUT", "shape": [1, 64], "datatype": "FP32", "data": x }]);
    let answers =
        futures::future::join_all(rows.iter().map(|x| s.infer("mlp_batched", request(x)))).await;
    let st = stats(&s, "mlp_batched").await;
    assert_eq!(st["inference_count"], 16, "{st}");
    let executions = st["execution_count"].as_u64().expect("count");
    assert!(
        executions < 16,
        "16 concurrent requests should share executions, got {executions}: {st}"
    );
    // Every caller got exactly its own row back.
    for (x, (status, body)) in rows.iter().zip(answers) {
        assert_eq!(status, 200, "{body}");
        let (_, alone) = s.infer("mlp_alone", request(x)).await;
        let (got, want) = (output_f32(&body, "PROBS"), output_f32(&alone, "PROBS"));
        assert!(
            got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5),
            "{got:?} vs {want:?}"
        );
    }
    // The metrics endpoint reports the same counts under Triton's names.
    drop(s);
    let repo2 = temp_dir("batch-metrics");
    model(
        &repo2,
        "mlp_batched",
        &mlp,
        "model.onnx",
        &format!(
            "{io}\ndynamic_batching {{ max_queue_delay_microseconds: 300000 preferred_batch_size: [ 4 ] }}"
        ),
    );
    let s = start(repo2, &[]).await;
    let _ = futures::future::join_all(
        rows.iter()
            .take(4)
            .map(|x| s.infer("mlp_batched", request(x))),
    )
    .await;
    let text = s.metrics().await;
    assert!(
        text.contains("nv_inference_count{model=\"mlp_batched\",version=\"1\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("nv_inference_request_success{model=\"mlp_batched\",version=\"1\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE nv_inference_exec_count counter"),
        "{text}"
    );
    assert!(
        text.contains("tessera_batch_size_bucket{model=\"mlp_batched\",version=\"1\",le=\"+Inf\"}"),
        "{text}"
    );
    assert!(text.contains("tessera_wasm_instantiations_total"), "{text}");
}

#[tokio::test]
async fn wasm_handlers_infer_calls_share_the_onnx_batcher() {
    crate::harness::require_onnx_runtime!();
    let repo = temp_dir("batch-bls");
    let examples = examples_repo();
    let io = std::fs::read_to_string(examples.join("add_sub/config.pbtxt"))
        .expect("config")
        .replace("name: \"add_sub\"", "");
    model(
        &repo,
        "add_sub",
        &examples.join("add_sub"),
        "model.onnx",
        &format!(
            "{io}\ndynamic_batching {{ max_queue_delay_microseconds: 300000 preferred_batch_size: [ 8 ] }}"
        ),
    );
    for handler in ["bls_branch", "add_sub_wasm"] {
        let config =
            std::fs::read_to_string(examples.join(handler).join("config.pbtxt")).expect("config");
        let config = config
            .replace(&format!("name: \"{handler}\""), "")
            .replace("count: 1", "count: 8");
        model(
            &repo,
            handler,
            &examples.join(handler),
            "model.wasm",
            &config,
        );
    }
    let s = start(repo, &[]).await;
    let pair = |k: f32| {
        json!([
            { "name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": vec![k; 16] },
            { "name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": vec![1.0; 16] },
        ])
    };
    let answers =
        futures::future::join_all((0..8).map(|k| s.infer("bls_branch", pair(k as f32)))).await;
    for (k, (status, body)) in answers.into_iter().enumerate() {
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            output_f32(&body, "OUTPUT"),
            vec![2.0 * k as f32; 16],
            "caller {k} got its own rows"
        );
    }
    let st = stats(&s, "add_sub").await;
    assert_eq!(st["inference_count"], 8, "{st}");
    let executions = st["execution_count"].as_u64().expect("count");
    assert!(
        executions < 8,
        "8 handlers' infer calls should be batched together, got {executions} executions: {st}"
    );
}

#[tokio::test]
async fn wasm_model_receives_the_batch_as_its_request_list() {
    let repo = temp_dir("batch-wasm");
    slow_echo(
        &repo,
        "echo",
        "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 300000 preferred_batch_size: [ 6 ] }",
    );
    let s = start(repo, &[]).await;
    let bodies: Vec<Value> = (0..6).map(|i| echo_request(i as f32, 0, 0)).collect();
    let answers = futures::future::join_all(
        bodies
            .iter()
            .map(|b| s.post_json("/v2/models/echo/infer", b)),
    )
    .await;
    for (i, (status, body)) in answers.into_iter().enumerate() {
        assert_eq!(status, 200, "{body}");
        assert_eq!(output_f32(&body, "Y"), vec![i as f32]);
    }
    let st = stats(&s, "echo").await;
    assert_eq!(st["inference_count"], 6);
    assert!(st["execution_count"].as_u64().expect("count") < 6, "{st}");
}

#[tokio::test]
async fn higher_priority_requests_are_served_first() {
    let repo = temp_dir("priority");
    slow_echo(
        &repo,
        "echo",
        "max_batch_size: 1\ndynamic_batching { priority_levels: 2 default_priority_level: 2 }",
    );
    let s = start(repo, &[]).await;
    let path = "/v2/models/echo/infer".to_string();
    let order = arrival_order(
        &s,
        vec![
            (
                "blocker",
                path.clone(),
                echo_request(0.0, 1500, 0),
                Then::Started("echo", 1),
            ),
            (
                "low",
                path.clone(),
                echo_request(1.0, 300, 2),
                Then::Queued("echo", 1),
            ),
            (
                "high",
                path.clone(),
                echo_request(2.0, 300, 1),
                Then::Queued("echo", 2),
            ),
        ],
    )
    .await;
    let tags: Vec<_> = order.iter().map(|(t, status, _)| (*t, *status)).collect();
    assert_eq!(tags, vec![("blocker", 200), ("high", 200), ("low", 200)]);
}

#[tokio::test]
async fn queue_timeout_rejects_and_full_queue_rejects_at_once() {
    let repo = temp_dir("queue-policy");
    slow_echo(
        &repo,
        "timeout",
        "max_batch_size: 1\ndynamic_batching { default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000 } }",
    );
    slow_echo(
        &repo,
        "bounded",
        "max_batch_size: 1\ndynamic_batching { default_queue_policy { max_queue_size: 1 } }",
    );
    let s = start(repo, &[]).await;
    let timeout = "/v2/models/timeout/infer".to_string();
    let order = arrival_order(
        &s,
        vec![
            (
                "blocker",
                timeout.clone(),
                echo_request(0.0, 1500, 0),
                Then::Started("timeout", 1),
            ),
            ("late", timeout, echo_request(1.0, 0, 0), Then::Nothing),
        ],
    )
    .await;
    let late = order
        .iter()
        .find(|(t, _, _)| *t == "late")
        .expect("late answered");
    assert_eq!(late.1, 503, "{:?}", late.2);
    assert!(
        late.2["error"]
            .as_str()
            .is_some_and(|e| e.contains("timeout")),
        "{:?}",
        late.2
    );
    assert_eq!(
        order[0].0, "late",
        "the timed-out request is answered before the blocker finishes"
    );
    assert_eq!(
        order[1].1, 200,
        "the running blocker is not subject to the queue timeout"
    );

    let bounded = "/v2/models/bounded/infer".to_string();
    let order = arrival_order(
        &s,
        vec![
            (
                "blocker",
                bounded.clone(),
                echo_request(0.0, 1500, 0),
                Then::Started("bounded", 1),
            ),
            (
                "queued",
                bounded.clone(),
                echo_request(1.0, 300, 0),
                Then::Queued("bounded", 1),
            ),
            ("overflow", bounded, echo_request(2.0, 0, 0), Then::Nothing),
        ],
    )
    .await;
    let tags: Vec<_> = order.iter().map(|(t, status, _)| (*t, *status)).collect();
    assert_eq!(
        tags,
        vec![("overflow", 503), ("blocker", 200), ("queued", 200)]
    );
    assert!(
        order[0].2["error"]
            .as_str()
            .is_some_and(|e| e.contains("Exceeds maximum queue size"))
    );
}

#[tokio::test]
async fn preserve_ordering_holds_responses_back() {
    let repo = temp_dir("ordering");
    let two = "max_batch_size: 1\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n";
    slow_echo(
        &repo,
        "ordered",
        &format!("{two}dynamic_batching {{ preserve_ordering: true }}"),
    );
    slow_echo(&repo, "unordered", &format!("{two}dynamic_batching {{ }}"));
    let s = start(repo, &[]).await;
    // A slow request, then (once it runs) a fast one on the second instance. When the fast answer
    // arrives, has the slow request finished executing? Only if its answer was held back.
    for (model, executed_when_fast_arrives) in [("unordered", 1), ("ordered", 2)] {
        let path = format!("/v2/models/{model}/infer");
        let (client, url) = (s.client.clone(), s.url(&path));
        let slow = tokio::spawn(async move {
            client
                .post(url)
                .json(&echo_request(0.0, 1500, 0))
                .send()
                .await
                .map(|r| r.status())
        });
        wait_for(&s, Then::Started(model, 1)).await;
        let (status, body) = s.post_json(&path, &echo_request(1.0, 0, 0)).await;
        assert_eq!(status, 200, "{body}");
        let st = stats(&s, model).await;
        assert_eq!(
            st["execution_count"], executed_when_fast_arrives,
            "{model}: {st}"
        );
        assert_eq!(slow.await.expect("task").expect("answer"), 200);
    }
}

#[tokio::test]
async fn rate_limiter_serialises_instances_sharing_a_resource() {
    let limited = "max_batch_size: 1\ninstance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: \"R\" count: 1 } ] } } ]";
    let sends = || {
        vec![
            (
                "slow",
                "/v2/models/a/infer".to_string(),
                echo_request(0.0, 1500, 0),
                Then::Started("a", 1),
            ),
            (
                "fast",
                "/v2/models/b/infer".to_string(),
                echo_request(1.0, 300, 0),
                Then::Nothing,
            ),
        ]
    };
    let limit = vec![
        "--rate-limit",
        "execution_count",
        "--rate-limit-resource",
        "R:1",
    ];
    for (flags, want) in [(vec![], ["fast", "slow"]), (limit, ["slow", "fast"])] {
        let repo = temp_dir("rate-limit");
        slow_echo(&repo, "a", limited);
        slow_echo(&repo, "b", limited);
        let s = start(repo, &flags).await;
        let order = arrival_order(&s, sends()).await;
        let tags: Vec<_> = order.iter().map(|(t, _, _)| *t).collect();
        assert_eq!(tags, want, "flags {flags:?}");
    }
}

/// Triton's instance priority: waiting instances run lowest `executions × priority` first.
/// After one run each, `low` (priority 5) ranks 5 and `high` (priority 1) ranks 1, so `high` goes
/// first when the resource frees up, although `low` was waiting longer.
#[tokio::test]
async fn rate_limiter_serves_waiting_instances_by_priority() {
    let group = |priority: u32| {
        format!(
            "max_batch_size: 1\ninstance_group [ {{ count: 1 kind: KIND_CPU rate_limiter {{ resources [ {{ name: \"R\" count: 1 }} ] priority: {priority} }} }} ]"
        )
    };
    let repo = temp_dir("rate-limit-priority");
    slow_echo(&repo, "blocker", &group(1));
    slow_echo(&repo, "high", &group(1));
    slow_echo(&repo, "low", &group(5));
    let s = start(
        repo,
        &[
            "--rate-limit",
            "execution_count",
            "--rate-limit-resource",
            "R:1",
        ],
    )
    .await;
    for model in ["high", "low"] {
        let (status, body) = s
            .post_json(
                &format!("/v2/models/{model}/infer"),
                &echo_request(0.0, 0, 0),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let order = arrival_order(
        &s,
        vec![
            (
                "blocker",
                "/v2/models/blocker/infer".to_string(),
                // Long enough for both others to be seen queued behind it, one after the
                // other, on a loaded machine.
                echo_request(0.0, 3000, 0),
                Then::Started("blocker", 1),
            ),
            (
                "low",
                "/v2/models/low/infer".to_string(),
                echo_request(1.0, 300, 0),
                Then::Queued("low", 1),
            ),
            (
                "high",
                "/v2/models/high/infer".to_string(),
                echo_request(2.0, 300, 0),
                Then::Queued("high", 1),
            ),
        ],
    )
    .await;
    let tags: Vec<_> = order.iter().map(|(t, status, _)| (*t, *status)).collect();
    assert_eq!(tags, [("blocker", 200), ("high", 200), ("low", 200)]);
}

/// `--metrics-config summary_latencies=true` adds Triton's latency summaries; off by default.
#[tokio::test]
async fn latency_summaries_report_recent_quantiles() {
    let repo = temp_dir("summaries");
    slow_echo(&repo, "timed", "max_batch_size: 1");
    let plain = start(repo.clone(), &[]).await;
    let (status, body) = plain
        .post_json("/v2/models/timed/infer", &echo_request(0.0, 0, 0))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !plain.metrics().await.contains("_summary_us"),
        "summaries are off by default"
    );
    drop(plain);

    let s = start(repo, &["--metrics-config", "summary_latencies=true"]).await;
    for delay_ms in [0, 60, 60, 60] {
        let (status, body) = s
            .post_json("/v2/models/timed/infer", &echo_request(1.0, delay_ms, 0))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let text = s.metrics().await;
    let value = |family: &str, quantile: &str| -> u64 {
        let prefix = format!("{family}{{model=\"timed\",version=\"1\",quantile=\"{quantile}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
    };
    // Three of four executions took at least 60 ms: the median and above do, the fastest did not.
    let infer =
        [0.5, 0.9, 0.99].map(|q| value("nv_inference_compute_infer_summary_us", &q.to_string()));
    assert!(infer.iter().all(|&us| us >= 60_000), "{infer:?}");
    assert!(value("nv_inference_request_summary_us", "0.5") >= 60_000);
    assert!(
        text.contains(
            "nv_inference_compute_infer_summary_us_count{model=\"timed\",version=\"1\"} 4\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("nv_inference_request_summary_us_count{model=\"timed\",version=\"1\"} 4\n"),
        "{text}"
    );
}

#[tokio::test]
async fn warmup_runs_before_ready_and_a_failing_warmup_is_reported() {
    let repo = temp_dir("warmup");
    let warm = "max_batch_size: 4\nmodel_warmup [ { name: \"zeros\" batch_size: 2 count: 3 inputs { key: \"X\" value { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]";
    slow_echo(&repo, "warm", warm);
    slow_echo(
        &repo,
        "cold",
        &warm.replace("key: \"X\"", "key: \"NOT_AN_INPUT\""),
    );
    let s = TestServer::start(&[repo], &["--strict-readiness=false"], &shared_cache()).await;
    let state = s.state_lookup().await;
    assert_eq!(state("warm").1, "READY");
    assert_eq!(state("cold").1, "UNAVAILABLE");
    assert!(
        state("cold").2.contains("warmup 'zeros' failed"),
        "{:?}",
        state("cold")
    );
    let log = s.log_text();
    assert!(
        log.lines().any(|l| l.contains("warmup done")
            && l.contains("model=warm")
            && l.contains("warmup=zeros")),
        "the warmup ran: {log}"
    );
    // As in Triton, warmup requests are not counted in the statistics (nor the metrics).
    let st = stats(&s, "warm").await;
    assert_eq!(st["execution_count"], 0, "warmup is not counted: {st}");
    assert_eq!(st["inference_count"], 0, "{st}");
    assert_eq!(st["inference_stats"]["success"]["count"], 0, "{st}");
    let metrics = s.metrics().await;
    assert!(
        metrics.contains("nv_inference_exec_count{model=\"warm\",version=\"1\"} 0\n"),
        "{metrics}"
    );
    let (status, body) = s
        .infer(
            "warm",
            json!([{ "name": "X", "shape": [1, 1], "datatype": "FP32", "data": [1.0] }]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let st = stats(&s, "warm").await;
    assert_eq!(st["execution_count"], 1, "a real request is: {st}");
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

#[tokio::test]
async fn embedding_ensemble_matches_its_steps_and_ranks_similarity() {
    crate::harness::require_onnx_runtime!();
    let s = start(examples_repo(), &[]).await;
    let sentences = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The stock market fell sharply on Monday.",
    ];
    let text = json!([{ "name": "TEXT", "shape": [3, 1], "datatype": "BYTES", "data": sentences }]);
    let (status, body) = s.infer("embed_text", text).await;
    assert_eq!(status, 200, "{body}");
    let all = output_f32(&body, "EMBEDDING");
    assert_eq!(output(&body, "EMBEDDING")["shape"], json!([3, 384]));
    let e: Vec<&[f32]> = all.chunks(384).collect();
    let similar = cosine(e[0], e[1]);
    assert!(
        (similar - 0.755).abs() < 0.02,
        "cosine {similar}, fp32 reference 0.755"
    );
    assert!(
        cosine(e[0], e[2]) < similar - 0.3,
        "unrelated sentences score far lower: {}",
        cosine(e[0], e[2])
    );

    // The same pipeline by hand, step by step, gives the same vector.
    let one =
        json!([{ "name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [sentences[0]] }]);
    let (_, tokens) = s.infer("preprocess_text", one).await;
    let ids = |n: &str| {
        let t = output(&tokens, n);
        json!({ "name": n.to_lowercase(), "shape": t["shape"], "datatype": "INT64", "data": t["data"] })
    };
    let (status, hidden) = s
        .infer(
            "minilm",
            json!([
                ids("INPUT_IDS"),
                ids("ATTENTION_MASK"),
                ids("TOKEN_TYPE_IDS")
            ]),
        )
        .await;
    assert_eq!(status, 200, "{hidden}");
    let h = output(&hidden, "last_hidden_state");
    let mask = output(&tokens, "ATTENTION_MASK");
    let (status, pooled) = s
        .infer(
            "pool_embeddings",
            json!([
                { "name": "TOKEN_EMBEDDINGS", "shape": h["shape"], "datatype": "FP32", "data": h["data"] },
                { "name": "ATTENTION_MASK", "shape": mask["shape"], "datatype": "INT64", "data": mask["data"] },
            ]),
        )
        .await;
    assert_eq!(status, 200, "{pooled}");
    let by_hand = output_f32(&pooled, "EMBEDDING");
    assert!(
        by_hand.iter().zip(e[0]).all(|(a, b)| (a - b).abs() < 1e-5),
        "ensemble and manual pipeline differ"
    );
}

#[tokio::test]
async fn ensemble_failures_name_the_step_and_bad_configs_are_unavailable() {
    let repo = temp_dir("ensembles");
    slow_echo(&repo, "echo", "max_batch_size: 4");
    let ensemble = |name: &str, steps: &str| {
        std::fs::create_dir_all(repo.join(name).join("1")).expect("mkdir");
        std::fs::write(
            repo.join(name).join("config.pbtxt"),
            format!("name: \"{name}\"\nplatform: \"ensemble\"\nmax_batch_size: 4\n{SLOW_ECHO_IO}\nensemble_scheduling {{ step [ {steps} ] }}"),
        )
        .expect("config");
    };
    let step = |input: &str, output: &str| {
        format!(
            "{{ model_name: \"echo\" model_version: -1 input_map {{ key: \"X\" value: \"{input}\" }} output_map {{ key: \"Y\" value: \"{output}\" }} }}"
        )
    };
    ensemble(
        "chain",
        &format!("{}, {}", step("X", "mid"), step("mid", "Y")),
    );
    // Sorts before "chain" but uses it as a step: loads after it all the same.
    ensemble(
        "a_outer",
        "{ model_name: \"chain\" input_map { key: \"X\" value: \"X\" } output_map { key: \"Y\" value: \"Y\" } }",
    );
    ensemble(
        "unknown_model",
        "{ model_name: \"nope\" input_map { key: \"X\" value: \"X\" } output_map { key: \"Y\" value: \"Y\" } }",
    );
    ensemble("unmapped", &step("missing_tensor", "Y"));
    ensemble("cycle", &format!("{}, {}", step("b", "a"), step("a", "Y")));
    let s = TestServer::start(&[repo], &["--strict-readiness=false"], &shared_cache()).await;
    let state = s.state_lookup().await;
    assert_eq!(state("chain").1, "READY", "{:?}", state("chain"));
    assert_eq!(state("a_outer").1, "READY", "{:?}", state("a_outer"));
    assert!(
        state("unknown_model").2.contains("nope"),
        "{:?}",
        state("unknown_model")
    );
    assert!(
        state("unmapped").2.contains("missing_tensor"),
        "{:?}",
        state("unmapped")
    );
    assert_eq!(state("cycle").1, "UNAVAILABLE", "{:?}", state("cycle"));

    let (status, body) = s
        .post_json("/v2/models/chain/infer", &echo_request(5.0, 0, 0))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(output_f32(&body, "Y"), vec![5.0]);
    // A step that fails fails the request, naming the step (the echo's deadline is 10 s; a
    // non-number delay is refused by the guest as invalid input).
    let bad = json!({ "inputs": [{ "name": "X", "shape": [1, 1], "datatype": "FP32", "data": [1.0] }], "parameters": { "delay_ms": "soon" } });
    let (status, body) = s.post_json("/v2/models/chain/infer", &bad).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("step 'echo'")),
        "{body}"
    );
}

#[tokio::test]
async fn graceful_shutdown_runs_finalize() {
    let repo = temp_dir("shutdown");
    slow_echo(
        &repo,
        "echo",
        "max_batch_size: 1\ninstance_group [ { count: 2 kind: KIND_CPU } ]",
    );
    let s = start(repo, &[]).await;
    let (status, _) = s
        .post_json("/v2/models/echo/infer", &echo_request(1.0, 0, 0))
        .await;
    assert_eq!(status, 200);
    let (clean, log) = s.terminate();
    assert!(clean, "SIGTERM exits cleanly:\n{log}");
    assert_eq!(
        log.matches("slow_echo finalized").count(),
        2,
        "both instances finalized:\n{log}"
    );
}

#[tokio::test]
async fn admission_control_refuses_requests_beyond_the_in_flight_limit() {
    let repo = temp_dir("admission");
    slow_echo(&repo, "slow", "max_batch_size: 1");
    let s = start(repo, &["--max-inflight-requests", "1"]).await;
    let url = s.url("/v2/models/slow/infer");
    let client = s.client.clone();
    let first = tokio::spawn(async move {
        let r = client
            .post(url)
            .json(&echo_request(1.0, 2000, 0))
            .send()
            .await
            .expect("answers");
        r.status().as_u16()
    });
    // The first request is running: the server is at its limit of one.
    wait_for(&s, Then::Started("slow", 1)).await;
    let (status, err) = s
        .post_json("/v2/models/slow/infer", &echo_request(2.0, 0, 0))
        .await;
    assert_eq!(status, 503, "{err}");
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|m| m.contains("--max-inflight-requests")),
        "{err}"
    );
    assert_eq!(first.await.expect("first"), 200);
    // Once it is done, requests are admitted again.
    let (status, body) = s
        .post_json("/v2/models/slow/infer", &echo_request(3.0, 0, 0))
        .await;
    assert_eq!(status, 200, "{body}");
}
