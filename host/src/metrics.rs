//! Per-model-version statistics, in the shape of Triton's statistics extension
//! (`GET /v2/models/{m}/stats`): counts and cumulative nanoseconds per phase, and per batch size;
//! and the same numbers as Prometheus text on `--metrics-port` (`/metrics`), under Triton's metric
//! names and labels, plus Tessera's own `tessera_*` metrics about Wasm guests.
//!
//! The exposition is written here rather than with a metrics crate: the Prometheus client crates
//! append `_total` to counter names, and Triton's names (`nv_inference_request_success`, ...)
//! must stay exactly as dashboards and alerts already know them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::backend::ComputeTiming;

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
}

/// Live statistics of one model version.
#[derive(Debug, Default)]
pub struct ModelStats {
    inner: Mutex<StatsSnapshot>,
}

impl ModelStats {
    fn with<R>(&self, f: impl FnOnce(&mut StatsSnapshot) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A request finished (successfully or not) after `total` since it arrived.
    pub fn record_request(&self, ok: bool, total: Duration) {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.with(|s| {
            s.last_inference_ms = now_ms;
            if ok {
                s.success.add(total)
            } else {
                s.fail.add(total)
            }
        });
    }

    /// A request waited `waited` in the queue.
    pub fn record_queue(&self, waited: Duration) {
        self.with(|s| s.queue.add(waited));
    }

    /// A batch of `rows` executed.
    pub fn record_execution(&self, rows: usize, timing: ComputeTiming) {
        self.with(|s| {
            s.execution_count += 1;
            s.inference_count += rows as u64;
            s.compute_input.add(timing.input);
            s.compute_infer.add(timing.infer);
            s.compute_output.add(timing.output);
            let b = s.batch.entry(rows).or_default();
            b.compute_input.add(timing.input);
            b.compute_infer.add(timing.infer);
            b.compute_output.add(timing.output);
        });
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        self.with(|s| s.clone())
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
}

/// Batch sizes that bound the batch-size histogram's buckets.
const BATCH_BUCKETS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

fn us(ns: u64) -> u64 {
    ns / 1000
}

/// Renders Prometheus text format (version 0.0.4).
pub fn render_prometheus(models: &[ModelMetrics<'_>], wasm: &[(&str, &str, &str, u64)]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    type Pick = fn(&ModelMetrics<'_>) -> u64;
    let families: [(&str, &str, &str, Pick); 10] = [
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
    ];
    for (name, kind, help, pick) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for m in models {
            let _ = writeln!(
                out,
                "{name}{{model=\"{}\",version=\"{}\"}} {}",
                m.name,
                m.version,
                pick(m)
            );
        }
    }
    let name = "tessera_batch_size";
    let _ = writeln!(
        out,
        "# HELP {name} Rows per model execution\n# TYPE {name} histogram"
    );
    for m in models {
        let labels = format!("model=\"{}\",version=\"{}\"", m.name, m.version);
        let executions = |pred: &dyn Fn(usize) -> bool| -> u64 {
            m.stats
                .batch
                .iter()
                .filter(|(size, _)| pred(**size))
                .map(|(_, b)| b.compute_infer.count)
                .sum()
        };
        for bound in BATCH_BUCKETS {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{bound}\"}} {}",
                executions(&|s| s <= bound)
            );
        }
        let total = executions(&|_| true);
        let sum: u64 = m
            .stats
            .batch
            .iter()
            .map(|(size, b)| *size as u64 * b.compute_infer.count)
            .sum();
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {total}");
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {sum}\n{name}_count{{{labels}}} {total}"
        );
    }
    for (name, kind, help, value) in wasm {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
    out
}
