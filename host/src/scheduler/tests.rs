//! The scheduler driven below HTTP: a fake instance that records its batches, under tokio's
//! paused clock, so batch forming, delays, priorities, timeouts, queue bounds and the rate limiter
//! are checked exactly and without waiting.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::rate_limit::{RateLimiter, Share};
use super::{BatchPolicy, Executor, Scheduler};
use crate::backend::{Executed, ModelInstance};
use crate::config;
use crate::infer::{
    BoxFuture, Call, CallContext, ErrorKind, InferRequest, InferResponse, InferResult,
};
use crate::metrics::{ExecutionTiming, ModelStats};
use crate::tensor::Tensor;

/// What the fake instances saw: each execution's request ids, when it started, and the most
/// executions that ran at once.
#[derive(Default)]
struct Record {
    batches: Mutex<Vec<(Duration, Vec<String>)>>,
    running: AtomicUsize,
    most_running: AtomicUsize,
}

/// An instance that takes `busy` (virtual time) per execution and echoes each request's id.
struct Recording {
    record: Arc<Record>,
    busy: Duration,
    epoch: Instant,
}

impl ModelInstance for Recording {
    fn execute(&mut self, batch: Vec<Call>) -> BoxFuture<'_, Executed> {
        let ids = batch.iter().map(|c| c.request.id.clone()).collect();
        let record = self.record.clone();
        record
            .batches
            .lock()
            .expect("record")
            .push((self.epoch.elapsed(), ids));
        let now = record.running.fetch_add(1, Ordering::SeqCst) + 1;
        record.most_running.fetch_max(now, Ordering::SeqCst);
        let busy = self.busy;
        Box::pin(async move {
            tokio::time::sleep(busy).await;
            record.running.fetch_sub(1, Ordering::SeqCst);
            Executed {
                results: batch
                    .into_iter()
                    .map(|c| {
                        Ok(InferResponse {
                            id: c.request.id,
                            ..Default::default()
                        })
                    })
                    .collect(),
                timing: ExecutionTiming::default(),
            }
        })
    }
}

struct Fixture {
    scheduler: Arc<Scheduler>,
    record: Arc<Record>,
}

/// A scheduler for a model configured by `config_text` with `instances` recording instances,
/// each needing `need` of the rate limiter's resources.
fn fixture(
    config_text: &str,
    instances: usize,
    busy: Duration,
    limiter: RateLimiter,
    need: &[(&str, u32)],
) -> Fixture {
    let config = config::parse(config_text, "test").expect("config");
    let record = Arc::new(Record::default());
    let epoch = Instant::now();
    let need: super::rate_limit::Requirement = need
        .iter()
        .map(|(n, c)| (super::rate_limit::Resource::on_device(*n, 0), *c))
        .collect();
    limiter.register(&need).expect("resources");
    let executors = (0..instances)
        .map(|_| Executor {
            instance: Box::new(Recording {
                record: record.clone(),
                busy,
                epoch,
            }),
            share: Share::new(need.clone(), 0),
        })
        .collect();
    let scheduler = Scheduler::start(
        BatchPolicy::from_config(&config),
        executors,
        Arc::new(ModelStats::default()),
        Arc::new(limiter),
    );
    Fixture {
        scheduler: Arc::new(scheduler),
        record,
    }
}

fn request(id: &str, priority: u32, timeout: Option<Duration>) -> InferRequest {
    InferRequest {
        id: id.into(),
        inputs: vec![Tensor::from_f32("X", vec![1, 1], &[1.0])],
        priority,
        timeout,
        ..Default::default()
    }
}

impl Fixture {
    /// Submits a request in the background.
    fn send(&self, id: &str, priority: u32) -> tokio::task::JoinHandle<InferResult> {
        self.send_with(request(id, priority, None))
    }

    fn send_with(&self, request: InferRequest) -> tokio::task::JoinHandle<InferResult> {
        self.send_as(None, request)
    }

    /// Submits a request of `tenant` in the background.
    fn send_as(
        &self,
        tenant: Option<&str>,
        request: InferRequest,
    ) -> tokio::task::JoinHandle<InferResult> {
        let scheduler = self.scheduler.clone();
        let cx = CallContext::root_for(tenant.map(Arc::from));
        tokio::spawn(async move { scheduler.submit(cx, request).await })
    }

    fn batches(&self) -> Vec<(Duration, Vec<String>)> {
        self.record.batches.lock().expect("record").clone()
    }

    /// Lets virtual time pass.
    async fn after(&self, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

fn ids(batches: &[(Duration, Vec<String>)]) -> Vec<Vec<&str>> {
    batches
        .iter()
        .map(|(_, ids)| ids.iter().map(String::as_str).collect())
        .collect()
}

const IO: &str = r#"input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
                    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]"#;

fn no_limits() -> RateLimiter {
    RateLimiter::new(false, &[])
}

#[tokio::test(start_paused = true)]
async fn without_dynamic_batching_each_execution_takes_one_request() {
    let f = fixture(
        &format!("max_batch_size: 8 {IO}"),
        1,
        Duration::from_millis(10),
        no_limits(),
        &[],
    );
    let sent: Vec<_> = ["a", "b", "c"].iter().map(|id| f.send(id, 0)).collect();
    for s in sent {
        assert!(s.await.expect("task").is_ok());
    }
    assert_eq!(ids(&f.batches()), vec![vec!["a"], vec!["b"], vec!["c"]]);
}

#[tokio::test(start_paused = true)]
async fn requests_within_the_queue_delay_share_a_batch() {
    let f = fixture(
        &format!(
            "max_batch_size: 8 {IO} dynamic_batching {{ max_queue_delay_microseconds: 50000 }}"
        ),
        1,
        Duration::from_millis(1),
        no_limits(),
        &[],
    );
    let a = f.send("a", 0);
    f.after(10).await;
    let b = f.send("b", 0);
    f.after(10).await;
    let c = f.send("c", 0);
    f.after(100).await;
    let d = f.send("d", 0);
    for s in [a, b, c, d] {
        assert!(s.await.expect("task").is_ok());
    }
    let batches = f.batches();
    assert_eq!(ids(&batches), vec![vec!["a", "b", "c"], vec!["d"]]);
    // The first batch left when the first request had waited the delay, not before.
    assert_eq!(batches[0].0, Duration::from_millis(50));
}

#[tokio::test(start_paused = true)]
async fn a_preferred_batch_size_leaves_without_waiting_out_the_delay() {
    let f = fixture(
        &format!(
            "max_batch_size: 8 {IO} dynamic_batching {{ preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 1000000 }}"
        ),
        1,
        Duration::from_millis(1),
        no_limits(),
        &[],
    );
    let a = f.send("a", 0);
    f.after(5).await;
    let b = f.send("b", 0);
    for s in [a, b] {
        assert!(s.await.expect("task").is_ok());
    }
    let batches = f.batches();
    assert_eq!(ids(&batches), vec![vec!["a", "b"]]);
    assert_eq!(batches[0].0, Duration::from_millis(5));
}

#[tokio::test(start_paused = true)]
async fn tenants_take_turns_in_a_shared_queue() {
    let f = fixture(
        &format!("max_batch_size: 1 {IO}"),
        1,
        Duration::from_millis(10),
        no_limits(),
        &[],
    );
    let busy = f.send("busy", 0);
    f.after(1).await;
    // A floods the queue first; B's two requests arrive after all of A's.
    let mut sent = Vec::new();
    for i in 0..4 {
        sent.push(f.send_as(Some("a"), request(&format!("a{i}"), 0, None)));
        f.after(0).await;
    }
    for i in 0..2 {
        sent.push(f.send_as(Some("b"), request(&format!("b{i}"), 0, None)));
        f.after(0).await;
    }
    assert!(busy.await.expect("task").is_ok());
    for s in sent {
        assert!(s.await.expect("task").is_ok());
    }
    // Not FIFO (a0 a1 a2 a3 b0 b1): each tenant in turn, each in its own arrival order.
    assert_eq!(
        ids(&f.batches()),
        vec![
            vec!["busy"],
            vec!["a0"],
            vec!["b0"],
            vec!["a1"],
            vec!["b1"],
            vec!["a2"],
            vec!["a3"]
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_highest_priority_runs_first_then_arrival_order() {
    let f = fixture(
        &format!(
            "max_batch_size: 1 {IO} dynamic_batching {{ priority_levels: 2 default_priority_level: 2 }}"
        ),
        1,
        Duration::from_millis(10),
        no_limits(),
        &[],
    );
    let busy = f.send("busy", 0);
    f.after(1).await;
    let low1 = f.send("low1", 2);
    f.after(1).await;
    let high = f.send("high", 1);
    f.after(1).await;
    let low2 = f.send("low2", 0); // 0: the model's default level, 2
    for s in [busy, low1, high, low2] {
        assert!(s.await.expect("task").is_ok());
    }
    assert_eq!(
        ids(&f.batches()),
        vec![vec!["busy"], vec!["high"], vec!["low1"], vec!["low2"]]
    );
}

#[tokio::test(start_paused = true)]
async fn a_queue_timeout_fails_a_request_still_waiting() {
    let f = fixture(
        &format!(
            "max_batch_size: 1 {IO} dynamic_batching {{ default_queue_policy {{ timeout_action: REJECT default_timeout_microseconds: 5000 allow_timeout_override: true }} }}"
        ),
        1,
        Duration::from_millis(20),
        no_limits(),
        &[],
    );
    let busy = f.send("busy", 0);
    f.after(1).await;
    let started = Instant::now();
    let waiting = f.send("waiting", 0);
    // Its own shorter timeout (2 ms) wins over the default (5 ms), as overrides are allowed.
    let shorter = f.send_with(request("shorter", 0, Some(Duration::from_millis(2))));
    let e = waiting.await.expect("task").expect_err("timed out");
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::Timeout, "Request timeout expired")
    );
    assert_eq!(started.elapsed(), Duration::from_millis(5));
    assert_eq!(
        shorter.await.expect("task").expect_err("timed out").kind,
        ErrorKind::Timeout
    );
    assert!(busy.await.expect("task").is_ok());
    assert_eq!(
        ids(&f.batches()),
        vec![vec!["busy"]],
        "timed-out requests never run"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_batch_waits_for_more_still_times_out() {
    // The batch waits up to 100 ms for company; the lone request's own timeout is 10 ms. It was
    // answered 200 after the whole delay (taken from the queue, it was "running").
    let f = fixture(
        &format!(
            "max_batch_size: 4 {IO} dynamic_batching {{ max_queue_delay_microseconds: 100000 default_queue_policy {{ timeout_action: REJECT }} }}"
        ),
        1,
        Duration::from_millis(1),
        no_limits(),
        &[],
    );
    let started = Instant::now();
    let lone = f.send_with(request("lone", 0, Some(Duration::from_millis(10))));
    let e = lone.await.expect("task").expect_err("timed out");
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert_eq!(started.elapsed(), Duration::from_millis(10));
    // One that joins later and waits less than its timeout runs, without the timed-out one.
    let _first = f.send_with(request("first", 0, Some(Duration::from_millis(5))));
    f.after(1).await;
    let second = f.send("second", 0);
    let answer = second.await.expect("task");
    assert!(answer.is_ok(), "{:?}", answer.err());
    assert_eq!(
        ids(&f.batches()),
        vec![vec!["second"]],
        "timed-out requests never run"
    );
}

#[tokio::test(start_paused = true)]
async fn requests_waiting_for_their_batch_count_against_the_queue_bound() {
    let f = fixture(
        &format!(
            "max_batch_size: 4 {IO} dynamic_batching {{ max_queue_delay_microseconds: 100000 default_queue_policy {{ max_queue_size: 1 }} }}"
        ),
        1,
        Duration::from_millis(1),
        no_limits(),
        &[],
    );
    let first = f.send("first", 0);
    f.after(1).await;
    assert_eq!(f.scheduler.pending_count(), 1, "gathering counts as queued");
    let refused = f.send("refused", 0).await.expect("task").expect_err("full");
    assert!(refused.message.contains("Exceeds maximum queue size"));
    assert!(first.await.expect("task").is_ok());
    assert_eq!(f.scheduler.pending_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once() {
    let f = fixture(
        &format!(
            "max_batch_size: 1 {IO} dynamic_batching {{ default_queue_policy {{ max_queue_size: 1 }} }}"
        ),
        1,
        Duration::from_millis(10),
        no_limits(),
        &[],
    );
    let busy = f.send("busy", 0);
    f.after(1).await;
    let queued = f.send("queued", 0);
    f.after(1).await;
    let refused = f.send("refused", 0).await.expect("task").expect_err("full");
    assert_eq!(refused.kind, ErrorKind::Unavailable);
    assert!(refused.message.contains("Exceeds maximum queue size"));
    assert!(busy.await.expect("task").is_ok());
    assert!(queued.await.expect("task").is_ok());
}

#[tokio::test(start_paused = true)]
async fn the_default_queue_bound_applies_where_the_policy_sets_none() {
    let config = config::parse(&format!("max_batch_size: 1 {IO}"), "test").expect("config");
    let policy = BatchPolicy::from_config(&config).with_default_max_queue_size(3);
    assert_eq!(policy.queue_policy(0).max_queue_size, 3);
    let explicit = config::parse(
        &format!("max_batch_size: 1 {IO} dynamic_batching {{ default_queue_policy {{ max_queue_size: 7 }} }}"),
        "test",
    )
    .expect("config");
    let policy = BatchPolicy::from_config(&explicit).with_default_max_queue_size(3);
    assert_eq!(policy.queue_policy(0).max_queue_size, 7);
}

#[tokio::test(start_paused = true)]
async fn instances_sharing_a_resource_never_run_at_once() {
    let work = |limiter: RateLimiter| async move {
        let f = fixture(
            &format!("max_batch_size: 1 {IO}"),
            2,
            Duration::from_millis(10),
            limiter,
            &[("R", 1)],
        );
        let sent: Vec<_> = (0..4).map(|i| f.send(&i.to_string(), 0)).collect();
        for s in sent {
            assert!(s.await.expect("task").is_ok());
        }
        f.record.most_running.load(Ordering::SeqCst)
    };
    assert_eq!(
        work(RateLimiter::new(
            true,
            &[super::rate_limit::ResourceLimit {
                name: "R".into(),
                count: 1,
                device: None
            }]
        ))
        .await,
        1
    );
    // The same two instances without the limiter run side by side.
    assert_eq!(work(no_limits()).await, 2);
}
