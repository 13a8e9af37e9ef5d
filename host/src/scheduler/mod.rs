//! The per-model-version scheduler: one queue, one batcher, the model's instances.
//!
//! Every request for a model version, whether from HTTP, an ensemble step or a Wasm handler's
//! `infer` call, enters [`Scheduler::submit`]. The batcher task waits for an idle instance, then
//! forms a batch from the queue (by priority, then arrival; merging only requests with the same
//! non-batch shapes; waiting up to `max_queue_delay_microseconds` for more when dynamic batching
//! is on) and hands it to that instance. With dynamic batching, while every instance is busy the
//! queue grows, so the next batch is larger: batching adapts to load even with no delay set.
//! Without `dynamic_batching`, each execution gets exactly one request.

mod policy;
mod queue;
pub mod rate_limit;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use tokio::time::Instant;

use tokio::sync::{mpsc, oneshot};

use crate::backend::ModelInstance;
use crate::infer::{Call, CallContext, InferError, InferRequest, InferResult};
use crate::metrics::ModelStats;
use crate::stream::ResponseStream;

pub use policy::{BatchPolicy, QueuePolicy, TimeoutAction};
use queue::{Pending, Queue, Reply};
use rate_limit::{RateLimiter, Share};

/// An instance and its standing with the rate limiter.
pub struct Executor {
    pub instance: Box<dyn ModelInstance>,
    pub share: Share,
}

/// Handle to a model version's queue. Dropping it stops the batcher once the queue drains.
pub struct Scheduler {
    queue: Arc<Queue>,
    policy: Arc<BatchPolicy>,
    /// The instances answer every request through a stream, unary calls included.
    streams_only: bool,
}

impl Scheduler {
    /// Starts the batcher for `instances`, recording into `stats`.
    pub fn start(
        policy: BatchPolicy,
        instances: Vec<Executor>,
        stats: Arc<ModelStats>,
        limiter: Arc<RateLimiter>,
    ) -> Scheduler {
        let queue = Arc::new(Queue::new(policy.priority_levels()));
        let policy = Arc::new(policy);
        let (idle_tx, idle_rx) = mpsc::unbounded_channel();
        let in_place = instances.len() == 1 && instances[0].instance.executes_in_task();
        let streams_only = instances
            .first()
            .is_some_and(|e| e.instance.answers_through_streams());
        for instance in instances {
            // The receiver is alive: it is moved into the batcher below.
            let _ = idle_tx.send(instance);
        }
        tokio::spawn(batcher(
            queue.clone(),
            policy.clone(),
            in_place,
            idle_tx,
            idle_rx,
            stats,
            limiter,
        ));
        Scheduler {
            queue,
            policy,
            streams_only,
        }
    }

    /// Queues a request for a decoupled model: its responses come through the stream (a
    /// queue timeout or a failure of the instance ends it with an error). Errors before it is
    /// queued (the queue is full) come back at once.
    pub fn submit_stream(
        &self,
        cx: CallContext,
        request: InferRequest,
    ) -> Result<ResponseStream, InferError> {
        let (sender, stream) = crate::stream::channel();
        let level = self.policy.level_of(request.priority);
        let queue_policy = self.policy.queue_policy(level);
        let now = Instant::now();
        let deadline = queue_policy.deadline(now, request.timeout);
        let claim = queue::Claim::default();
        if let (Some(deadline), TimeoutAction::Reject) = (deadline, queue_policy.timeout_action) {
            // Past the queue timeout and still queued: the batcher will skip it; end the stream.
            // A weak handle: the timer must not keep a stream open that its model ended.
            let (claim, sender) = (claim.clone(), sender.downgrade());
            tokio::spawn(async move {
                tokio::time::sleep_until(deadline).await;
                if let Some(sender) = sender.upgrade()
                    && claim.cancel()
                {
                    sender.fail(queue::timeout_error());
                }
            });
        }
        let pending = self.pending(cx, request, level, Reply::Stream(sender.clone()), claim);
        let mut pending = pending;
        pending.call.stream = Some(sender);
        self.queue
            .push(level, pending, queue_policy.max_queue_size)?;
        Ok(stream)
    }

    /// A queue entry for `request`.
    fn pending(
        &self,
        cx: CallContext,
        request: InferRequest,
        level: usize,
        reply: Reply,
        claim: queue::Claim,
    ) -> Pending {
        let queue_policy = self.policy.queue_policy(level);
        let now = Instant::now();
        let queued = tracing::debug_span!(
            target: crate::telemetry::TARGET,
            parent: &cx.span,
            "queue",
            priority_level = level
        );
        Pending {
            queued,
            claim,
            rows: self.policy.rows_of(&request),
            shape_key: self.policy.shape_key(&request),
            deadline: queue_policy.deadline(now, request.timeout),
            call: Call {
                cx,
                request,
                stream: None,
            },
            reply,
            enqueued: now,
            timeout_action: queue_policy.timeout_action,
            level,
        }
    }

    /// Queues `request` and waits for its result.
    pub async fn submit(&self, cx: CallContext, request: InferRequest) -> InferResult {
        if self.streams_only {
            return one_response(self.submit_stream(cx, request)?).await;
        }
        let level = self.policy.level_of(request.priority);
        let queue_policy = self.policy.queue_policy(level);
        let now = Instant::now();
        let deadline = queue_policy.deadline(now, request.timeout);
        let (reply, mut rx) = oneshot::channel();
        let claim = queue::Claim::default();
        let pending = self.pending(cx, request, level, Reply::One(reply), claim.clone());
        self.queue
            .push(level, pending, queue_policy.max_queue_size)?;
        let closed = || InferError::internal("the model was unloaded before the request ran");
        if let (Some(deadline), TimeoutAction::Reject) = (deadline, queue_policy.timeout_action) {
            tokio::select! {
                result = &mut rx => return result.unwrap_or_else(|_| Err(closed())),
                _ = tokio::time::sleep_until(deadline) => {
                    // Still queued: give up (the batcher will skip it). Already running: the
                    // queue timeout no longer applies; wait for the answer.
                    if claim.cancel() {
                        return Err(queue::timeout_error());
                    }
                }
            }
        }
        rx.await.unwrap_or_else(|_| Err(closed()))
    }

    /// Requests waiting in the queue.
    pub fn pending_count(&self) -> usize {
        self.queue.len()
    }
}

/// The one response of a unary call to a model that answers through streams. A request that
/// streams (an LLM request with `streaming` set) is refused and, by dropping its stream,
/// cancelled.
async fn one_response(mut stream: ResponseStream) -> InferResult {
    let Some(first) = stream.next().await else {
        return Err(InferError::internal(
            "the model ended the request without a response",
        ));
    };
    if !first.last {
        return Err(InferError::invalid(
            "this request asks for a stream of responses (streaming is set): send it with gRPC ModelStreamInfer or POST .../generate_stream",
        ));
    }
    first.result.unwrap_or_else(|| {
        Err(InferError::internal(
            "the model ended the request without a response",
        ))
    })
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.queue.close();
    }
}

async fn batcher(
    queue: Arc<Queue>,
    policy: Arc<BatchPolicy>,
    in_place: bool,
    idle_tx: mpsc::UnboundedSender<Executor>,
    mut idle_rx: mpsc::UnboundedReceiver<Executor>,
    stats: Arc<ModelStats>,
    limiter: Arc<RateLimiter>,
) {
    let ordering = Arc::new(queue::Sequencer::default());
    let mut sequence = 0u64;
    // With one instance that executes in the calling task (a Wasm guest), the batcher has
    // nothing to do while it runs, so it runs the batch itself: one task hand-off fewer per
    // execution. With several instances, each batch runs on its own task so the batcher can feed
    // the others; an instance with its own thread (ONNX Runtime) gets its next batch while the
    // last one's callers are answered (running those in place measured 10-20 % slower at c16).
    loop {
        let Some(instance) = idle_rx.recv().await else {
            break;
        };
        let Some(batch) = queue.next_batch(&policy).await else {
            break;
        };
        let ticket = policy.preserve_ordering().then(|| {
            sequence += 1;
            sequence
        });
        let run = run_batch(
            instance,
            batch,
            Shared {
                queue: queue.clone(),
                policy: policy.clone(),
                stats: stats.clone(),
                limiter: limiter.clone(),
            },
            idle_tx.clone(),
            ticket.map(|t| (t, ordering.clone())),
        );
        if in_place {
            run.await;
        } else {
            tokio::spawn(run);
        }
    }
}

/// What a batch's run needs of its model version.
#[derive(Clone)]
struct Shared {
    queue: Arc<Queue>,
    policy: Arc<BatchPolicy>,
    stats: Arc<ModelStats>,
    limiter: Arc<RateLimiter>,
}

/// Executes one batch on one instance, answers its callers and returns the instance. An
/// instance left with open streams (a decoupled handler) first serves them to their end.
async fn run_batch(
    mut executor: Executor,
    batch: Vec<Pending>,
    shared: Shared,
    idle: mpsc::UnboundedSender<Executor>,
    ordering: Option<(u64, Arc<queue::Sequencer>)>,
) {
    let answers = execute(&mut executor, batch, &shared).await;
    if !executor.instance.has_open_work() {
        // The instance goes back before the callers are answered: the next batch can start.
        let _ = idle.send(executor);
        answer(answers, ordering);
        return;
    }
    answer(answers, ordering);
    serve_open_work(&mut executor, &shared).await;
    let _ = idle.send(executor);
}

/// Serves an instance's open streams to their end: between steps it takes the requests that
/// have arrived (so new streams join the running ones, in-flight batching) while it has room,
/// and otherwise waits as long as the instance asked, or until what it waits on is ready,
/// before resuming it.
async fn serve_open_work(executor: &mut Executor, shared: &Shared) {
    let mut wait = Some(std::time::Duration::ZERO);
    while executor.instance.has_open_work() {
        let capacity = executor.instance.capacity();
        if capacity > 0
            && let Some(batch) = shared.queue.try_batch(&shared.policy, capacity)
        {
            let answers = execute(executor, batch, shared).await;
            answer(answers, None);
            wait = Some(std::time::Duration::ZERO);
            continue;
        }
        let Some(after) = wait else {
            break;
        };
        if !after.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(after) => {}
                _ = shared.queue.arrival() => continue,
                _ = executor.instance.work_ready() => {}
            }
        }
        let permit = shared.limiter.acquire(&mut executor.share).await;
        wait = executor.instance.resume().await;
        drop(permit);
    }
}

/// Hands the answers to their callers, in batch order when the model preserves ordering.
fn answer(answers: Vec<queue::Answer>, ordering: Option<(u64, Arc<queue::Sequencer>)>) {
    match ordering {
        Some((ticket, sequencer)) => sequencer.release(ticket, answers),
        None => {
            for (reply, result) in answers {
                reply.send(result);
            }
        }
    }
}

/// Executes one batch on an instance: what each caller is to be answered.
async fn execute(
    executor: &mut Executor,
    batch: Vec<Pending>,
    shared: &Shared,
) -> Vec<queue::Answer> {
    let Shared {
        queue,
        stats,
        limiter,
        ..
    } = shared;
    let permit = limiter.acquire(&mut executor.share).await;
    queue.started(batch.len());
    let started = Instant::now();
    // Warmup runs before the model is READY, so a batch is all warmup or none; it is not counted.
    let counted = !batch.iter().all(|p| p.call.cx.warmup);
    let mut calls = Vec::with_capacity(batch.len());
    let mut waiters = Vec::with_capacity(batch.len());
    let mut rows = 0;
    let batch_size = batch.len();
    let mut executing = Vec::with_capacity(batch_size);
    for pending in batch {
        if counted {
            stats.record_queue(started - pending.enqueued);
        }
        // Dequeued: the queue span closes, the request's execution span opens.
        drop(pending.queued);
        executing.push(tracing::debug_span!(
            target: crate::telemetry::TARGET,
            parent: &pending.call.cx.span,
            "execute",
            batch_size,
            rows = pending.rows
        ));
        rows += pending.rows;
        calls.push(pending.call);
        waiters.push(pending.reply);
    }
    let expected = calls.len();
    let executed = executor.instance.execute(calls).await;
    drop(executing);
    drop(permit);
    if counted {
        stats.record_execution(rows, executed.timing);
    }

    let mut results = executed.results;
    if results.len() != expected {
        let message = format!(
            "the backend returned {} responses for {expected} requests",
            results.len()
        );
        results = (0..expected)
            .map(|_| Err(InferError::internal(message.clone())))
            .collect();
    }
    waiters.into_iter().zip(results).collect()
}
