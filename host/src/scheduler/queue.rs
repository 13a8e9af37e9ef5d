//! The queue of a model version: per priority level, one FIFO per tenant served round-robin;
//! and batch formation.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock (the same as std's unless a test pauses it), so the unit tests can drive time.
use tokio::time::Instant;

use tokio::sync::{Notify, oneshot};

use super::policy::{BatchPolicy, TimeoutAction};
use crate::infer::{Call, ErrorKind, InferError, InferResult};
use crate::stream::ResponseSender;

/// Where a queued request stands; the batcher and a timed-out caller race to change it once.
#[derive(Clone, Default)]
pub struct Claim(Arc<AtomicU8>);

const QUEUED: u8 = 0;
const DISPATCHED: u8 = 1;
const CANCELLED: u8 = 2;

impl Claim {
    /// The batcher takes the request; false if its caller gave up first.
    fn dispatch(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, DISPATCHED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The caller gives up waiting; false if the request already runs (the queue timeout no
    /// longer applies then, as in Triton).
    pub fn cancel(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Where a request's answer goes.
pub enum Reply {
    /// A caller waiting for the one result.
    One(oneshot::Sender<InferResult>),
    /// The caller of a decoupled model, reading a stream. The model sends the responses itself
    /// (the sender travels with the call); a result here ends the stream only when it is an
    /// error (the request timed out in the queue, the instance failed or trapped).
    Stream(ResponseSender),
}

impl Reply {
    pub fn send(self, result: InferResult) {
        match (self, result) {
            (Reply::One(tx), result) => {
                let _ = tx.send(result);
            }
            (Reply::Stream(sender), Err(error)) => sender.fail(error),
            (Reply::Stream(_), Ok(_)) => {}
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Reply::One(tx) => tx.is_closed(),
            Reply::Stream(sender) => sender.is_cancelled(),
        }
    }
}

/// A queued request and the caller waiting for it.
pub struct Pending {
    pub claim: Claim,
    pub call: Call,
    /// Open while the request waits in the queue (a trace's `queue` span).
    pub queued: tracing::Span,
    pub reply: Reply,
    pub enqueued: Instant,
    pub deadline: Option<Instant>,
    pub timeout_action: TimeoutAction,
    pub rows: usize,
    pub shape_key: Vec<(String, Vec<i64>)>,
    /// The priority level it was queued at (set by [`Queue::push`]).
    pub level: usize,
}

impl Pending {
    /// The caller stopped waiting (its queue timeout fired, or it went away).
    fn abandoned(&self) -> bool {
        self.reply.is_closed() || self.claim.0.load(Ordering::Acquire) == CANCELLED
    }

    fn expired(&self, now: Instant) -> bool {
        self.timeout_action == TimeoutAction::Reject && self.deadline.is_some_and(|d| d <= now)
    }
}

/// One priority level: a FIFO per tenant, served in turn, one request each, so a tenant that
/// floods a shared model queues behind its own requests rather than in front of everyone's.
/// With one tenant (or none) it is a plain FIFO.
#[derive(Default)]
struct Level {
    /// Tenants with queued requests, the next to be served first.
    flows: VecDeque<(Option<Arc<str>>, VecDeque<Pending>)>,
    len: usize,
}

impl Level {
    fn push_back(&mut self, pending: Pending) {
        let tenant = &pending.call.cx.tenant;
        match self.flows.iter_mut().find(|(t, _)| t == tenant) {
            Some((_, flow)) => flow.push_back(pending),
            None => self
                .flows
                .push_back((tenant.clone(), VecDeque::from([pending]))),
        }
        self.len += 1;
    }

    /// The request [`Level::pop_front`] takes next.
    fn front(&self) -> Option<&Pending> {
        self.flows.front().and_then(|(_, flow)| flow.front())
    }

    /// Takes the oldest request of the tenant whose turn it is; that tenant goes to the back.
    fn pop_front(&mut self) -> Option<Pending> {
        let (tenant, mut flow) = self.flows.pop_front()?;
        let pending = flow.pop_front();
        if !flow.is_empty() {
            self.flows.push_back((tenant, flow));
        }
        if pending.is_some() {
            self.len -= 1;
        }
        pending
    }

    fn len(&self) -> usize {
        self.len
    }
}

struct State {
    /// The priority levels that hold requests, by level (0 first). Levels are kept only while
    /// they hold requests: a configuration may allow 2^64 of them.
    levels: BTreeMap<usize, Level>,
    /// Levels past this one are queued at it.
    last_level: usize,
    /// Requests taken into a batch that waits for more (`max_queue_delay_microseconds`), by
    /// level: still queued as far as the queue's bound and their timeouts go, as in Triton.
    gathering: BTreeMap<usize, usize>,
    closed: bool,
}

impl State {
    fn drop_empty_levels(&mut self) {
        self.levels.retain(|_, level| level.len() > 0);
    }
}

pub struct Queue {
    state: Mutex<State>,
    notify: Notify,
    /// Requests in formed batches that have not started yet (waiting for the rate limiter).
    staged: AtomicUsize,
}

impl Queue {
    pub fn new(levels: usize) -> Queue {
        Queue {
            state: Mutex::new(State {
                levels: BTreeMap::new(),
                last_level: levels.max(1) - 1,
                gathering: BTreeMap::new(),
                closed: false,
            }),
            notify: Notify::new(),
            staged: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain data behind; keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a request at `level`, refusing it when that level holds `max_size` already.
    pub fn push(
        &self,
        level: usize,
        mut pending: Pending,
        max_size: usize,
    ) -> Result<(), InferError> {
        let mut state = self.lock();
        if state.closed {
            return Err(InferError::unavailable("the model is being unloaded"));
        }
        let key = level.min(state.last_level);
        let gathering = state.gathering.get(&key).copied().unwrap_or(0);
        let queue = state.levels.entry(key).or_default();
        if max_size > 0 && queue.len() + gathering >= max_size {
            return Err(InferError::unavailable("Exceeds maximum queue size"));
        }
        pending.level = key;
        queue.push_back(pending);
        drop(state);
        self.notify.notify_one();
        Ok(())
    }

    /// Requests awaiting execution: queued (a batch that gathers more included), or batched and
    /// waiting for resources.
    pub fn len(&self) -> usize {
        let state = self.lock();
        let queued: usize = state.levels.values().map(Level::len).sum();
        let gathering: usize = state.gathering.values().sum();
        queued + gathering + self.staged.load(Ordering::Acquire)
    }

    /// A batch from [`Queue::next_batch`] of `n` requests started executing.
    pub fn started(&self, n: usize) {
        self.staged.fetch_sub(n, Ordering::AcqRel);
    }

    pub fn close(&self) {
        self.lock().closed = true;
        // Every waiter: the batcher, and instances serving open streams between batches.
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// Waits for the next batch: at least one request, then as many compatible ones as the policy
    /// allows. `None` once the queue is closed and empty. Its requests count as pending until
    /// [`Queue::started`].
    pub async fn next_batch(&self, policy: &BatchPolicy) -> Option<Vec<Pending>> {
        loop {
            let first = loop {
                let notified = self.notify.notified();
                {
                    let mut state = self.lock();
                    if let Some(first) = pop_live(&mut state) {
                        break first;
                    }
                    if state.closed {
                        return None;
                    }
                }
                notified.await;
            };
            let gathered = self.gather(first, policy).await;
            let batch = dispatch(&mut self.lock(), gathered);
            if !batch.is_empty() {
                self.staged.fetch_add(batch.len(), Ordering::AcqRel);
                return Some(batch);
            }
            // Every request of it timed out or went away while it gathered: start over.
        }
    }

    /// A batch of what is queued now, without waiting for more: how an instance with open
    /// streams takes new requests between the steps of its streams (in-flight batching), at
    /// most `max_requests` of them.
    pub fn try_batch(&self, policy: &BatchPolicy, max_requests: usize) -> Option<Vec<Pending>> {
        let mut state = self.lock();
        let first = pop_live(&mut state)?;
        let mut rows = first.rows;
        let mut batch = vec![first];
        if policy.dynamic.is_some() {
            take_compatible(
                &mut state,
                &mut batch,
                &mut rows,
                policy.max_batch_size.max(1).min(max_requests),
            );
        }
        let batch = dispatch(&mut state, batch);
        drop(state);
        if batch.is_empty() {
            return None;
        }
        self.staged.fetch_add(batch.len(), Ordering::AcqRel);
        Some(batch)
    }

    /// Waits until a request may have been queued (or the queue closed).
    pub async fn arrival(&self) {
        self.notify.notified().await;
    }

    /// Adds compatible requests to `first` as the policy allows.
    async fn gather(&self, first: Pending, policy: &BatchPolicy) -> Vec<Pending> {
        let Some(dynamic) = &policy.dynamic else {
            return vec![first];
        };
        let max_rows = policy.max_batch_size.max(1);
        let target = dynamic
            .preferred_batch_sizes
            .iter()
            .copied()
            .max()
            .unwrap_or(max_rows)
            .min(max_rows);
        let flush_at = first.enqueued + dynamic.max_queue_delay;
        let mut rows = first.rows;
        let mut batch = vec![first];
        loop {
            let notified = self.notify.notified();
            let blocked = {
                let mut state = self.lock();
                take_compatible(&mut state, &mut batch, &mut rows, max_rows)
            };
            if blocked || rows >= target || Instant::now() >= flush_at {
                break;
            }
            tokio::select! {
                _ = notified => {}
                _ = sleep_until(flush_at) => {}
            }
        }
        batch
    }
}

/// Below this, tokio's timer (1 ms resolution) would stretch a batching delay several times over.
const COARSE_TIMER: Duration = Duration::from_millis(2);

/// Waits until `deadline` with sub-millisecond precision: short waits sleep on a blocking-pool
/// thread (the OS timer is precise to tens of microseconds), long ones on tokio's timer.
async fn sleep_until(deadline: Instant) {
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining >= COARSE_TIMER {
        tokio::time::sleep_until(deadline).await;
    } else if !remaining.is_zero() {
        // If the batch fills first this future is dropped; the thread finishes its short sleep.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(remaining)).await;
    }
}

pub fn timeout_error() -> InferError {
    InferError::new(ErrorKind::Timeout, "Request timeout expired")
}

/// Pops the oldest live request of the highest priority, failing expired ones on the way. It
/// stays cancellable (its caller's timeout still applies) until [`dispatch`].
fn pop_live(state: &mut State) -> Option<Pending> {
    let now = Instant::now();
    let mut live = None;
    'levels: for level in state.levels.values_mut() {
        while let Some(p) = level.pop_front() {
            if p.abandoned() {
                continue;
            }
            if p.expired(now) {
                if p.claim.cancel() {
                    p.reply.send(Err(timeout_error()));
                }
                continue;
            }
            live = Some(p);
            break 'levels;
        }
    }
    state.drop_empty_levels();
    if let Some(p) = &live {
        *state.gathering.entry(p.level).or_default() += 1;
    }
    live
}

/// Commits a gathered batch to run: each request is taken from its caller's timeout, except
/// those that timed out or whose caller left while the batch gathered (Triton rejects a request
/// whose timeout passes while its batch waits for more, too).
fn dispatch(state: &mut State, gathered: Vec<Pending>) -> Vec<Pending> {
    let now = Instant::now();
    let mut batch = Vec::with_capacity(gathered.len());
    for p in gathered {
        if let Some(n) = state.gathering.get_mut(&p.level) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.gathering.remove(&p.level);
            }
        }
        if p.expired(now) {
            if p.claim.cancel() {
                p.reply.send(Err(timeout_error()));
            }
            continue;
        }
        if !p.reply.is_closed() && p.claim.dispatch() {
            batch.push(p);
        }
    }
    batch
}

/// Moves queued requests that fit into the batch, in priority then arrival order. Returns true
/// when the head of the queue cannot join this batch (different shapes or too many rows), so the
/// batch should go now rather than wait.
fn take_compatible(
    state: &mut State,
    batch: &mut Vec<Pending>,
    rows: &mut usize,
    max_rows: usize,
) -> bool {
    let now = Instant::now();
    let mut head_left_out = false;
    'levels: for level in state.levels.values_mut() {
        while let Some(p) = level.front() {
            if p.abandoned() || p.expired(now) {
                if let Some(p) = level.pop_front()
                    && p.claim.cancel()
                {
                    p.reply.send(Err(timeout_error()));
                }
                continue;
            }
            if p.shape_key != batch[0].shape_key || *rows + p.rows > max_rows {
                head_left_out = true;
                break 'levels;
            }
            if let Some(p) = level.pop_front() {
                *rows += p.rows;
                *state.gathering.entry(p.level).or_default() += 1;
                batch.push(p);
            }
        }
    }
    state.drop_empty_levels();
    head_left_out
}

/// A caller and the answer for it.
pub type Answer = (Reply, InferResult);

/// Releases answers in the order their batches were formed (`preserve_ordering`).
#[derive(Default)]
pub struct Sequencer {
    /// The last ticket released, and the batches that finished ahead of their turn.
    state: Mutex<(u64, BTreeMap<u64, Vec<Answer>>)>,
}

impl Sequencer {
    /// Stores the answers of batch `ticket` (tickets start at 1) and sends every batch that is
    /// now next in line.
    pub fn release(&self, ticket: u64, answers: Vec<Answer>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.1.insert(ticket, answers);
        loop {
            let next = state.0 + 1;
            let Some(ready) = state.1.remove(&next) else {
                break;
            };
            state.0 = next;
            for (reply, result) in ready {
                reply.send(result);
            }
        }
    }
}
