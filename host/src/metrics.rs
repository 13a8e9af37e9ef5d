//! Per-model-version statistics, in the shape of Triton's statistics extension
//! (`GET /v2/models/{m}/stats`): counts and cumulative nanoseconds per phase, and per batch size.

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
            if ok { s.success.add(total) } else { s.fail.add(total) }
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
