//! Per-model-version statistics, in the shape of Triton's statistics extension
//! (`GET /v2/models/{m}/stats`): counts and cumulative nanoseconds per phase, and per batch size;
//! and the same numbers as Prometheus text on `--metrics-port` (`/metrics`), under Triton's metric
//! names and labels, plus Tessera's own `tessera_*` metrics about Wasm guests.
//!
//! With `--metrics-config summary_latencies=true` the exposition also has Triton's latency
//! summaries (`nv_inference_request_summary_us`, ...): quantiles 0.5, 0.9, 0.95 and 0.99 over
//! the last 60 seconds (at most the last 8,192 observations of each), with `_sum` and `_count`
//! over the whole lifetime. Compute summaries observe executions (a batch counts once), requests
//! and queue summaries observe requests.
//!
//! The exposition is written here rather than with a metrics crate: the Prometheus client crates
//! append `_total` to counter names, and Triton's names (`nv_inference_request_success`, ...)
//! must stay exactly as dashboards and alerts already know them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// Time spent in the three compute phases Triton reports, for one execution (batch).
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecutionTiming {
    pub input: Duration,
    pub infer: Duration,
    pub output: Duration,
}

/// A count and its cumulative duration.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    pub count: u64,
    pub ns: u64,
}

impl Tally {
    fn add(&mut self, d: Duration) {
        self.count += 1;
        self.ns += u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    }

    fn json(&self) -> Value {
        json!({ "count": self.count, "ns": self.ns })
    }
}

/// Compute phases of the executions of one batch size.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchTally {
    pub compute_input: Tally,
    pub compute_infer: Tally,
    pub compute_output: Tally,
}

/// A snapshot of a model version's statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatsSnapshot {
    /// Milliseconds since the epoch of the last request; 0 if none.
    pub last_inference_ms: u64,
    /// Inferences, counting each batch row (Triton's `inference_count`).
    pub inference_count: u64,
    /// Backend executions (batches).
    pub execution_count: u64,
    pub success: Tally,
    pub fail: Tally,
    pub queue: Tally,
    pub compute_input: Tally,
    pub compute_infer: Tally,
    pub compute_output: Tally,
    /// Keyed by the batch size in rows.
    pub batch: BTreeMap<usize, BatchTally>,
    /// Streams (decoupled models): what their callers read.
    pub streams: StreamTally,
}

/// What the callers of a decoupled model read from their streams.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StreamTally {
    /// Responses with outputs, and errors.
    pub responses: u64,
    /// Final responses without outputs (Triton's flags-only final).
    pub empty_finals: u64,
    /// Streams their caller dropped before the last response.
    pub cancelled: u64,
    /// From each request's arrival to its first response: how many, and their total.
    pub first_response: Tally,
}

/// Quantiles the latency summaries report (Triton's defaults).
pub const SUMMARY_QUANTILES: [f64; 4] = [0.5, 0.9, 0.95, 0.99];
/// How far back the summaries look, and how many observations they keep at most.
const WINDOW_AGE: Duration = Duration::from_secs(60);
const WINDOW_LEN: usize = 8192;

/// Recent observations of one duration, for quantiles.
#[derive(Clone, Debug, Default)]
struct Window(VecDeque<(Instant, u64)>);

impl Window {
    fn push(&mut self, at: Instant, d: Duration) {
        if self.0.len() == WINDOW_LEN {
            self.0.pop_front();
        }
        self.0
            .push_back((at, u64::try_from(d.as_micros()).unwrap_or(u64::MAX)));
    }

    /// Nearest-rank quantiles (µs) of the observations younger than [`WINDOW_AGE`]; `None` if
    /// there are none.
    fn quantiles(&self, now: Instant) -> Option<[u64; SUMMARY_QUANTILES.len()]> {
        let mut recent: Vec<u64> = self
            .0
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) <= WINDOW_AGE)
            .map(|(_, us)| *us)
            .collect();
        if recent.is_empty() {
            return None;
        }
        recent.sort_unstable();
        let n = recent.len();
        Some(SUMMARY_QUANTILES.map(|q| {
            let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
            recent[rank - 1]
        }))
    }
}

#[derive(Clone, Debug, Default)]
struct Windows {
    request: Window,
    queue: Window,
    compute_input: Window,
    compute_infer: Window,
    compute_output: Window,
}

/// Recent latency quantiles (µs, in the order of [`SUMMARY_QUANTILES`]) of one model version.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyQuantiles {
    pub request: Option<[u64; SUMMARY_QUANTILES.len()]>,
    pub queue: Option<[u64; SUMMARY_QUANTILES.len()]>,
    pub compute_input: Option<[u64; SUMMARY_QUANTILES.len()]>,
    pub compute_infer: Option<[u64; SUMMARY_QUANTILES.len()]>,
    pub compute_output: Option<[u64; SUMMARY_QUANTILES.len()]>,
}

/// A [`Tally`] that many threads add to without a lock.
#[derive(Debug, Default)]
struct AtomicTally {
    count: AtomicU64,
    ns: AtomicU64,
}

impl AtomicTally {
    fn add(&self, d: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.ns.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn load(&self) -> Tally {
        Tally {
            count: self.count.load(Ordering::Relaxed),
            ns: self.ns.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug, Default)]
struct AtomicBatchTally {
    compute_input: AtomicTally,
    compute_infer: AtomicTally,
    compute_output: AtomicTally,
}

impl AtomicBatchTally {
    fn add(&self, timing: ExecutionTiming) {
        self.compute_input.add(timing.input);
        self.compute_infer.add(timing.infer);
        self.compute_output.add(timing.output);
    }

    fn load(&self) -> BatchTally {
        BatchTally {
            compute_input: self.compute_input.load(),
            compute_infer: self.compute_infer.load(),
            compute_output: self.compute_output.load(),
        }
    }
}

/// Live statistics of one model version. Counters are atomics, so recording takes no lock on the
/// request path; the latency windows exist only when summaries are on, behind their own lock.
#[derive(Debug)]
pub struct ModelStats {
    last_inference_ms: AtomicU64,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    success: AtomicTally,
    fail: AtomicTally,
    queue: AtomicTally,
    compute_input: AtomicTally,
    compute_infer: AtomicTally,
    compute_output: AtomicTally,
    /// Per batch size in rows, indexed by the size (0 unused), up to `PREALLOCATED_BATCH_SIZES`.
    batch: Box<[AtomicBatchTally]>,
    /// Batch sizes past `batch`: those of a model whose max_batch_size is past
    /// `PREALLOCATED_BATCH_SIZES` (a configuration may say 2^31 - 1).
    batch_overflow: Mutex<BTreeMap<usize, BatchTally>>,
    /// Present with `--metrics-config summary_latencies=true` only.
    windows: Option<Mutex<Windows>>,
    responses: AtomicU64,
    empty_finals: AtomicU64,
    cancelled: AtomicU64,
    first_response: AtomicTally,
}

/// Batch sizes whose tallies are allocated up front (lock-free); larger ones are tallied in a
/// map as they occur.
const PREALLOCATED_BATCH_SIZES: usize = 1024;

impl Default for ModelStats {
    fn default() -> Self {
        ModelStats::new(8, false)
    }
}

impl ModelStats {
    /// Statistics for a version whose executions hold at most `max_rows` rows; `summaries` keeps
    /// the latency windows the summaries need.
    pub fn new(max_rows: usize, summaries: bool) -> ModelStats {
        ModelStats {
            last_inference_ms: AtomicU64::new(0),
            inference_count: AtomicU64::new(0),
            execution_count: AtomicU64::new(0),
            success: AtomicTally::default(),
            fail: AtomicTally::default(),
            queue: AtomicTally::default(),
            compute_input: AtomicTally::default(),
            compute_infer: AtomicTally::default(),
            compute_output: AtomicTally::default(),
            batch: (0..=max_rows.clamp(1, PREALLOCATED_BATCH_SIZES))
                .map(|_| AtomicBatchTally::default())
                .collect(),
            batch_overflow: Mutex::default(),
            windows: summaries.then(Mutex::default),
            responses: AtomicU64::new(0),
            empty_finals: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            first_response: AtomicTally::default(),
        }
    }

    fn with_windows(&self, f: impl FnOnce(&mut Windows)) {
        if let Some(windows) = &self.windows {
            f(&mut windows.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }

    /// Recent latency quantiles, for the summaries of the exposition. The windows are copied
    /// under their lock and sorted outside it.
    pub fn quantiles(&self) -> LatencyQuantiles {
        let Some(windows) = &self.windows else {
            return LatencyQuantiles::default();
        };
        let w = windows.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let now = Instant::now();
        LatencyQuantiles {
            request: w.request.quantiles(now),
            queue: w.queue.quantiles(now),
            compute_input: w.compute_input.quantiles(now),
            compute_infer: w.compute_infer.quantiles(now),
            compute_output: w.compute_output.quantiles(now),
        }
    }

    /// A request finished (successfully or not) after `total` since it arrived.
    pub fn record_request(&self, ok: bool, total: Duration) {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.last_inference_ms.store(now_ms, Ordering::Relaxed);
        if ok {
            self.success.add(total)
        } else {
            self.fail.add(total)
        }
        self.with_windows(|w| w.request.push(Instant::now(), total));
    }

    /// A caller read one message of a stream: a response or an error, or a final response
    /// without outputs (`empty`).
    pub fn record_streamed(&self, empty: bool) {
        let counter = if empty {
            &self.empty_finals
        } else {
            &self.responses
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream's first message came `after` its request arrived.
    pub fn record_first_response(&self, after: Duration) {
        self.first_response.add(after);
    }

    /// A caller dropped its stream before the last message.
    pub fn record_cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// A request waited `waited` in the queue.
    pub fn record_queue(&self, waited: Duration) {
        self.queue.add(waited);
        self.with_windows(|w| w.queue.push(Instant::now(), waited));
    }

    /// A batch of `rows` executed.
    pub fn record_execution(&self, rows: usize, timing: ExecutionTiming) {
        self.execution_count.fetch_add(1, Ordering::Relaxed);
        self.inference_count
            .fetch_add(rows as u64, Ordering::Relaxed);
        self.compute_input.add(timing.input);
        self.compute_infer.add(timing.infer);
        self.compute_output.add(timing.output);
        match self.batch.get(rows) {
            Some(tally) => tally.add(timing),
            None => {
                let mut overflow = self
                    .batch_overflow
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let b = overflow.entry(rows).or_default();
                b.compute_input.add(timing.input);
                b.compute_infer.add(timing.infer);
                b.compute_output.add(timing.output);
            }
        }
        self.with_windows(|w| {
            let now = Instant::now();
            w.compute_input.push(now, timing.input);
            w.compute_infer.push(now, timing.infer);
            w.compute_output.push(now, timing.output);
        });
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let mut batch: BTreeMap<usize, BatchTally> = self
            .batch
            .iter()
            .enumerate()
            .map(|(size, tally)| (size, tally.load()))
            .filter(|(_, b)| b.compute_infer.count > 0)
            .collect();
        batch.extend(
            self.batch_overflow
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(size, b)| (*size, *b)),
        );
        StatsSnapshot {
            last_inference_ms: self.last_inference_ms.load(Ordering::Relaxed),
            inference_count: self.inference_count.load(Ordering::Relaxed),
            execution_count: self.execution_count.load(Ordering::Relaxed),
            success: self.success.load(),
            fail: self.fail.load(),
            queue: self.queue.load(),
            compute_input: self.compute_input.load(),
            compute_infer: self.compute_infer.load(),
            compute_output: self.compute_output.load(),
            batch,
            streams: StreamTally {
                responses: self.responses.load(Ordering::Relaxed),
                empty_finals: self.empty_finals.load(Ordering::Relaxed),
                cancelled: self.cancelled.load(Ordering::Relaxed),
                first_response: self.first_response.load(),
            },
        }
    }
}

impl StatsSnapshot {
    /// One entry of Triton's `model_stats` array.
    pub fn to_json(&self, name: &str, version: &str) -> Value {
        json!({
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.json(),
                "fail": self.fail.json(),
                "queue": self.queue.json(),
                "compute_input": self.compute_input.json(),
                "compute_infer": self.compute_infer.json(),
                "compute_output": self.compute_output.json(),
                "cache_hit": Tally::default().json(),
                "cache_miss": Tally::default().json(),
            },
            "response_stats": {},
            "batch_stats": self.batch.iter().map(|(size, b)| json!({
                "batch_size": size,
                "compute_input": b.compute_input.json(),
                "compute_infer": b.compute_infer.json(),
                "compute_output": b.compute_output.json(),
            })).collect::<Vec<_>>(),
            "memory_usage": [],
        })
    }
}

/// One model version's numbers for the exposition.
pub struct ModelMetrics<'a> {
    pub name: &'a str,
    pub version: i64,
    pub stats: StatsSnapshot,
    pub pending: usize,
    /// Present when latency summaries are on (`--metrics-config summary_latencies=true`).
    pub quantiles: Option<LatencyQuantiles>,
    /// Present for a stateful model (`sequence_batching`).
    pub sequences: Option<SequenceCounts>,
}

/// A stateful model's sequences: live now, and started, ended and released for idleness.
#[derive(Clone, Copy, Debug, Default)]
pub struct SequenceCounts {
    pub live: u64,
    pub started: u64,
    pub ended: u64,
    pub expired: u64,
}

/// Batch sizes that bound the batch-size histogram's buckets.
const BATCH_BUCKETS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

fn us(ns: u64) -> u64 {
    ns / 1000
}

/// Triton's latency summaries, for the models that have quantiles.
fn render_summaries(out: &mut String, models: &[ModelMetrics<'_>]) {
    type Quantiles = Option<[u64; SUMMARY_QUANTILES.len()]>;
    type Pick = fn(&ModelMetrics<'_>, &LatencyQuantiles) -> (Quantiles, Tally);
    let families: [(&str, &str, Pick); 5] = [
        (
            "nv_inference_request_summary_us",
            "Summary of inference request duration in microseconds",
            |m, q| {
                let s = &m.stats;
                let total = Tally {
                    count: s.success.count + s.fail.count,
                    ns: s.success.ns + s.fail.ns,
                };
                (q.request, total)
            },
        ),
        (
            "nv_inference_queue_summary_us",
            "Summary of inference queuing duration in microseconds",
            |m, q| (q.queue, m.stats.queue),
        ),
        (
            "nv_inference_compute_input_summary_us",
            "Summary of compute input duration in microseconds, per execution",
            |m, q| (q.compute_input, m.stats.compute_input),
        ),
        (
            "nv_inference_compute_infer_summary_us",
            "Summary of compute inference duration in microseconds, per execution",
            |m, q| (q.compute_infer, m.stats.compute_infer),
        ),
        (
            "nv_inference_compute_output_summary_us",
            "Summary of compute output duration in microseconds, per execution",
            |m, q| (q.compute_output, m.stats.compute_output),
        ),
    ];
    if models.iter().all(|m| m.quantiles.is_none()) {
        return;
    }
    for (name, help, pick) in families {
        let mut family = Family::start(out, name, "summary", help);
        for m in models {
            let Some(q) = &m.quantiles else { continue };
            let (values, total) = pick(m, q);
            let version = m.version.to_string();
            let labels = [("model", m.name), ("version", version.as_str())];
            if let Some(values) = values {
                for (quantile, value) in SUMMARY_QUANTILES.iter().zip(values) {
                    let quantile = quantile.to_string();
                    family.sample(&[labels[0], labels[1], ("quantile", &quantile)], value);
                }
            }
            family.sample_of("_sum", &labels, us(total.ns));
            family.sample_of("_count", &labels, total.count);
        }
    }
}

/// One metric family in the Prometheus text format (0.0.4): its `# HELP` and `# TYPE` lines
/// once, then its samples. Every family on `/metrics` is written through it, so names, labels and
/// their escaping are done in one place; the counters themselves stay atomics where they count.
pub struct Family<'o> {
    out: &'o mut String,
    name: &'static str,
}

impl<'o> Family<'o> {
    pub fn start(out: &'o mut String, name: &'static str, kind: &str, help: &str) -> Family<'o> {
        use std::fmt::Write;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        Family { out, name }
    }

    /// `name{labels} value`.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.sample_of("", labels, value);
    }

    /// `name<suffix>{labels} value`: a histogram's `_bucket`, a summary's `_sum` and `_count`.
    pub fn sample_of(
        &mut self,
        suffix: &str,
        labels: &[(&str, &str)],
        value: impl std::fmt::Display,
    ) {
        use std::fmt::Write;
        self.out.push_str(self.name);
        self.out.push_str(suffix);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (key, label)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{key}=\"{}\"", escape_label(label));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// A label value in the text format: a `\`, `"` or newline in a model's directory name must not
/// end the value early and corrupt the whole scrape.
pub fn escape_label(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    let mut out = String::with_capacity(value.len() + 2);
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.into()
}

/// Renders Prometheus text format (version 0.0.4).
pub fn render_prometheus(models: &[ModelMetrics<'_>], labeled: &[LabeledFamily]) -> String {
    let mut out = String::new();
    type Pick = fn(&ModelMetrics<'_>) -> u64;
    let families: [(&str, &str, &str, Pick); 15] = [
        (
            "nv_inference_request_success",
            "counter",
            "Number of successful inference requests, all batch sizes",
            |m| m.stats.success.count,
        ),
        (
            "nv_inference_request_failure",
            "counter",
            "Number of failed inference requests, all batch sizes",
            |m| m.stats.fail.count,
        ),
        (
            "nv_inference_count",
            "counter",
            "Number of inferences performed (a batch of N counts N)",
            |m| m.stats.inference_count,
        ),
        (
            "nv_inference_exec_count",
            "counter",
            "Number of model executions performed (a batch counts once)",
            |m| m.stats.execution_count,
        ),
        (
            "nv_inference_request_duration_us",
            "counter",
            "Cumulative inference request duration in microseconds",
            |m| us(m.stats.success.ns + m.stats.fail.ns),
        ),
        (
            "nv_inference_queue_duration_us",
            "counter",
            "Cumulative inference queuing duration in microseconds",
            |m| us(m.stats.queue.ns),
        ),
        (
            "nv_inference_compute_input_duration_us",
            "counter",
            "Cumulative compute input duration in microseconds",
            |m| us(m.stats.compute_input.ns),
        ),
        (
            "nv_inference_compute_infer_duration_us",
            "counter",
            "Cumulative compute inference duration in microseconds",
            |m| us(m.stats.compute_infer.ns),
        ),
        (
            "nv_inference_compute_output_duration_us",
            "counter",
            "Cumulative inference compute output duration in microseconds",
            |m| us(m.stats.compute_output.ns),
        ),
        (
            "nv_inference_pending_request_count",
            "gauge",
            "Instantaneous number of pending requests awaiting execution per-model",
            |m| m.pending as u64,
        ),
        (
            "tessera_inference_streamed_responses",
            "counter",
            "Responses (with outputs, or errors) decoupled models sent that their callers read",
            |m| m.stats.streams.responses,
        ),
        (
            "tessera_inference_empty_final_responses",
            "counter",
            "Final responses without outputs decoupled models sent (Triton's flags-only final)",
            |m| m.stats.streams.empty_finals,
        ),
        (
            "tessera_inference_cancelled_streams",
            "counter",
            "Streamed requests whose caller went away before the last response",
            |m| m.stats.streams.cancelled,
        ),
        (
            "tessera_inference_first_response_count",
            "counter",
            "Streamed requests that got a first response",
            |m| m.stats.streams.first_response.count,
        ),
        (
            "tessera_inference_first_response_duration_us",
            "counter",
            "Cumulative time from a streamed request's arrival to its first response, in microseconds",
            |m| us(m.stats.streams.first_response.ns),
        ),
    ];
    for (name, kind, help, pick) in families {
        let mut family = Family::start(&mut out, name, kind, help);
        for m in models {
            let version = m.version.to_string();
            family.sample(&[("model", m.name), ("version", &version)], pick(m));
        }
    }
    type PickSequences = fn(&SequenceCounts) -> u64;
    let sequence_families: [(&str, &str, &str, PickSequences); 4] = [
        (
            "tessera_sequences_live",
            "gauge",
            "Sequences of a stateful model started and not yet ended or released (a slot each, or waiting for one)",
            |s| s.live,
        ),
        (
            "tessera_sequences_started_total",
            "counter",
            "Sequences started (a request with sequence_start)",
            |s| s.started,
        ),
        (
            "tessera_sequences_ended_total",
            "counter",
            "Sequences ended (a request with sequence_end)",
            |s| s.ended,
        ),
        (
            "tessera_sequences_expired_total",
            "counter",
            "Sequences released after max_sequence_idle_microseconds without a request",
            |s| s.expired,
        ),
    ];
    if models.iter().any(|m| m.sequences.is_some()) {
        for (name, kind, help, pick) in sequence_families {
            let mut family = Family::start(&mut out, name, kind, help);
            for m in models {
                if let Some(sequences) = &m.sequences {
                    let version = m.version.to_string();
                    family.sample(&[("model", m.name), ("version", &version)], pick(sequences));
                }
            }
        }
    }
    let mut family = Family::start(
        &mut out,
        "tessera_batch_size",
        "histogram",
        "Rows per model execution",
    );
    for m in models {
        let version = m.version.to_string();
        let labels = [("model", m.name), ("version", version.as_str())];
        let executions = |pred: &dyn Fn(usize) -> bool| -> u64 {
            m.stats
                .batch
                .iter()
                .filter(|(size, _)| pred(**size))
                .map(|(_, b)| b.compute_infer.count)
                .sum()
        };
        for bound in BATCH_BUCKETS {
            let le = bound.to_string();
            family.sample_of(
                "_bucket",
                &[labels[0], labels[1], ("le", &le)],
                executions(&|s| s <= bound),
            );
        }
        let total = executions(&|_| true);
        let sum: u64 = m
            .stats
            .batch
            .iter()
            .map(|(size, b)| *size as u64 * b.compute_infer.count)
            .sum();
        family.sample_of("_bucket", &[labels[0], labels[1], ("le", "+Inf")], total);
        family.sample_of("_sum", &labels, sum);
        family.sample_of("_count", &labels, total);
    }
    render_summaries(&mut out, models);
    for labeled in labeled {
        let mut family = Family::start(&mut out, labeled.name, labeled.kind, labeled.help);
        for (model, value) in &labeled.samples {
            family.sample(&[("model", model)], value);
        }
    }
    out
}

/// A metric family with one sample per model (the `tessera_wasm_*` counters).
pub struct LabeledFamily {
    pub name: &'static str,
    pub kind: &'static str,
    pub help: &'static str,
    /// (model, value)
    pub samples: Vec<(String, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank_over_recent_observations() {
        let mut w = Window::default();
        let now = Instant::now();
        assert_eq!(w.quantiles(now), None);
        for us in 1..=100u64 {
            w.push(now, Duration::from_micros(us));
        }
        assert_eq!(w.quantiles(now), Some([50, 90, 95, 99]));
        // Observations older than the window no longer count.
        let later = now + WINDOW_AGE + Duration::from_secs(1);
        w.push(later, Duration::from_micros(7));
        assert_eq!(w.quantiles(later), Some([7, 7, 7, 7]));
    }

    #[test]
    fn the_window_keeps_the_latest_observations() {
        let mut w = Window::default();
        let now = Instant::now();
        for _ in 0..WINDOW_LEN {
            w.push(now, Duration::from_micros(1));
        }
        w.push(now, Duration::from_micros(1000));
        assert_eq!(w.0.len(), WINDOW_LEN);
        assert_eq!(w.quantiles(now).map(|q| q[3]), Some(1));
        assert_eq!(w.0.back().map(|(_, us)| *us), Some(1000));
    }

    #[test]
    fn label_values_are_escaped() {
        let model = ModelMetrics {
            name: "a\"b\\c\nd",
            version: 1,
            stats: StatsSnapshot::default(),
            pending: 0,
            quantiles: None,
            sequences: None,
        };
        let text = render_prometheus(&[model], &[]);
        let line = text
            .lines()
            .find(|l| l.starts_with("nv_inference_request_success{"))
            .expect("a sample line");
        assert_eq!(
            line,
            "nv_inference_request_success{model=\"a\\\"b\\\\c\\nd\",version=\"1\"} 0"
        );
        // Every sample is still one line: the name's newline did not split it.
        assert!(text.lines().all(|l| l.starts_with('#') || l.contains('{')));
    }

    #[test]
    fn statistics_count_without_windows_unless_summaries_are_on() {
        let timing = ExecutionTiming {
            input: Duration::from_micros(1),
            infer: Duration::from_micros(5),
            output: Duration::from_micros(2),
        };
        let stats = ModelStats::new(4, false);
        stats.record_request(true, Duration::from_micros(10));
        stats.record_request(false, Duration::from_micros(20));
        stats.record_queue(Duration::from_micros(3));
        stats.record_execution(4, timing);
        stats.record_execution(9, timing); // past max_rows: still counted
        let snap = stats.snapshot();
        assert_eq!((snap.success.count, snap.fail.count), (1, 1));
        assert_eq!(snap.success.ns, 10_000);
        assert_eq!((snap.execution_count, snap.inference_count), (2, 13));
        assert_eq!(snap.compute_infer.ns, 10_000);
        assert_eq!(snap.batch.keys().copied().collect::<Vec<_>>(), vec![4, 9]);
        assert_eq!(stats.quantiles(), LatencyQuantiles::default());
        let with = ModelStats::new(4, true);
        with.record_request(true, Duration::from_micros(10));
        assert_eq!(with.quantiles().request, Some([10; 4]));
    }
}
