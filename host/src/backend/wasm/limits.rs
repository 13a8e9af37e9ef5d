//! The sandbox's limits, set per model in `config.pbtxt` `parameters` (string values, as Triton
//! parameters are), and the counters the server reports about guests.
//!
//! | parameter             | unit  | default   | why |
//! |-----------------------|-------|-----------|-----|
//! | `max_memory_bytes`    | bytes | 256 MiB   | a guest's linear memory; past it, growth fails and the guest traps. Bounds what one tenant takes from the machine. At most `--wasm-max-memory-bytes` (4 GiB). |
//! | `execute_deadline_ms` | ms    | 10 000    | wall-clock time of one `execute` (or `initialize`), BLS calls included; at most an hour. A looping guest is interrupted at the next epoch tick (`--epoch-tick-ms`, 5 ms) and its instance replaced. |
//! | `fuel_per_execute`    | fuel  | unlimited | wasmtime fuel (about one unit per instruction) per `execute`: a deterministic CPU budget, independent of machine load. Only on a server started with `--wasm-fuel` (metering slows every guest); refused at load otherwise. |
//! | `max_output_bytes`    | bytes | 64 MiB    | total output tensor bytes of one response; a larger response fails that request only. |
//! | `max_table_elements`  | count | 100 000   | elements of one table (function pointers); stops table-growth abuse. |
//! | `max_instances`       | count | 64        | core instances inside one component instance. |
//! | `max_log_bytes`       | bytes | 64 KiB    | per execution (and per `initialize`), for each of stdout, stderr and the `log` import: what a guest may write to the server log; the rest is dropped and counted in `tessera_wasm_log_dropped_bytes_total`. A `log` call costs its message plus 64 bytes, so empty messages are not free. |
//! | `max_log_bytes_per_second` | bytes/s | 1 MiB | the model's log rate, all its instances together (a token bucket with a burst of one second): many fast executions cannot flood the log either. |
//! | `max_host_resources`  | count | 1 000     | host-side resources (WASI streams and the like) one instance may hold open. They live in host memory, outside `max_memory_bytes` (about 0.7 KiB each), so they are bounded by count; past it the call traps. |
//!
//! `max_output_bytes` counts everything a guest hands back in one response: tensor payloads,
//! 4 bytes per BYTES element (their length on the wire), names and shapes, response parameters,
//! and the message of an error it returns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::{ModelConfig, string_parameter};

/// Sandbox limits of one model version.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_memory_bytes: usize,
    pub execute_deadline: Duration,
    /// Fuel per call: None where the server does not meter fuel (no `--wasm-fuel`), else the
    /// budget (`u64::MAX`: unlimited).
    pub fuel_per_execute: Option<u64>,
    pub max_output_bytes: usize,
    pub max_table_elements: usize,
    pub max_instances: usize,
    pub max_log_bytes: usize,
    pub max_log_bytes_per_second: usize,
    pub max_host_resources: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_memory_bytes: 256 << 20,
            execute_deadline: Duration::from_secs(10),
            fuel_per_execute: None,
            max_output_bytes: 64 << 20,
            max_table_elements: 100_000,
            max_instances: 64,
            max_log_bytes: 64 << 10,
            max_log_bytes_per_second: 1 << 20,
            max_host_resources: 1000,
        }
    }
}

/// The longest `execute_deadline_ms` a handler may have: an hour. Without a bound, a handler
/// stuck waiting (a BLS call whose callee waits for rate-limiter resources the caller holds)
/// held its instance and resources until the server restarted.
pub const MAX_EXECUTE_DEADLINE_MS: u64 = 3_600_000;

impl Limits {
    /// The limits `config` sets; `max_memory_cap` is the server's `--wasm-max-memory-bytes`,
    /// `fuel_metered` its `--wasm-fuel`.
    pub fn from_config(
        config: &ModelConfig,
        max_memory_cap: u64,
        fuel_metered: bool,
    ) -> Result<Limits, String> {
        let mut limits = Limits {
            fuel_per_execute: fuel_metered.then_some(u64::MAX),
            ..Limits::default()
        };
        let number = |key: &str| -> Result<Option<u64>, String> {
            string_parameter(config, key)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| {
                            format!("parameter {key} must be a positive integer, got '{v}'")
                        })
                })
                .transpose()
        };
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        if let Some(n) = number("max_memory_bytes")? {
            if n > max_memory_cap {
                return Err(format!(
                    "max_memory_bytes {n} exceeds the server's cap of {max_memory_cap} (--wasm-max-memory-bytes)"
                ));
            }
            limits.max_memory_bytes = size(n);
        }
        if let Some(n) = number("execute_deadline_ms")? {
            if n > MAX_EXECUTE_DEADLINE_MS {
                return Err(format!(
                    "execute_deadline_ms {n} is more than an hour ({MAX_EXECUTE_DEADLINE_MS}): a handler stuck waiting (on a BLS call, on rate-limiter resources) must give up its instance and resources in time"
                ));
            }
            limits.execute_deadline = Duration::from_millis(n);
        }
        if let Some(n) = number("fuel_per_execute")? {
            if !fuel_metered {
                return Err(format!(
                    "parameter fuel_per_execute {n} needs a server that meters fuel: start it \
                     with --wasm-fuel (off by default, as metering slows every guest), or bound \
                     the handler's time with execute_deadline_ms"
                ));
            }
            limits.fuel_per_execute = Some(n);
        }
        if let Some(n) = number("max_output_bytes")? {
            limits.max_output_bytes = size(n);
        }
        if let Some(n) = number("max_table_elements")? {
            limits.max_table_elements = size(n);
        }
        if let Some(n) = number("max_instances")? {
            limits.max_instances = size(n);
        }
        if let Some(n) = number("max_log_bytes")? {
            limits.max_log_bytes = size(n);
        }
        if let Some(n) = number("max_log_bytes_per_second")? {
            limits.max_log_bytes_per_second = size(n);
        }
        if let Some(n) = number("max_host_resources")? {
            limits.max_host_resources = size(n);
        }
        Ok(limits)
    }

    /// Fills a store's fuel for one call, where the server meters fuel.
    pub fn refuel<T>(&self, store: &mut wasmtime::Store<T>) -> wasmtime::Result<()> {
        match self.fuel_per_execute {
            Some(fuel) => store.set_fuel(fuel),
            None => Ok(()),
        }
    }
}

/// A model's log allowance: a token bucket refilled at `max_log_bytes_per_second`, shared by all
/// its instances.
pub struct LogRate {
    bytes_per_second: f64,
    state: std::sync::Mutex<(f64, std::time::Instant)>,
}

impl LogRate {
    pub fn new(bytes_per_second: usize) -> LogRate {
        let rate = bytes_per_second as f64;
        LogRate {
            bytes_per_second: rate,
            state: std::sync::Mutex::new((rate, std::time::Instant::now())),
        }
    }

    /// Takes `n` bytes of allowance if there are that many; all or nothing.
    pub fn take(&self, n: usize) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        let refill = now.duration_since(state.1).as_secs_f64() * self.bytes_per_second;
        state.0 = (state.0 + refill).min(self.bytes_per_second);
        state.1 = now;
        if state.0 >= n as f64 {
            state.0 -= n as f64;
            true
        } else {
            false
        }
    }
}

/// Enforces the memory and table limits of one store and remembers what happened.
pub struct StoreLimiter {
    pub max_memory_bytes: usize,
    pub max_table_elements: usize,
    pub max_instances: usize,
    /// A growth was refused since the last execution began.
    pub memory_exceeded: bool,
    /// The largest linear memory seen, in bytes.
    pub high_water: usize,
}

impl wasmtime::ResourceLimiter for StoreLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_memory_bytes {
            self.memory_exceeded = true;
            return Ok(false);
        }
        self.high_water = self.high_water.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= self.max_table_elements)
    }

    fn instances(&self) -> usize {
        self.max_instances
    }

    fn tables(&self) -> usize {
        self.max_instances
    }

    fn memories(&self) -> usize {
        self.max_instances
    }
}

/// Counters about one model's guests, exported as `tessera_wasm_*{model="..."}`.
#[derive(Debug, Default)]
pub struct Counters {
    pub instantiations: AtomicU64,
    pub traps: AtomicU64,
    pub deadline_kills: AtomicU64,
    pub fuel_kills: AtomicU64,
    pub memory_kills: AtomicU64,
    /// Instances replaced between calls as their memory neared the limit.
    pub memory_replacements: AtomicU64,
    pub compile_cache_hits: AtomicU64,
    pub compile_cache_misses: AtomicU64,
    pub memory_high_water_bytes: AtomicU64,
    /// Guest log output (stdout, stderr, the `log` import) dropped at a limit.
    pub log_dropped_bytes: AtomicU64,
    /// Instances alive (created and not yet finalized).
    pub live_instances: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The metric families of [`Counters`]: name, type, help, and the field each reads.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Counters) -> &AtomicU64,
);
const FAMILIES: [Family; 11] = [
    (
        "tessera_wasm_instantiations_total",
        "counter",
        "Wasm guest instances created (initial and replacements)",
        |c| &c.instantiations,
    ),
    (
        "tessera_wasm_traps_total",
        "counter",
        "Wasm executions that trapped (panics, memory, fuel)",
        |c| &c.traps,
    ),
    (
        "tessera_wasm_deadline_kills_total",
        "counter",
        "Wasm executions stopped at their wall-clock deadline",
        |c| &c.deadline_kills,
    ),
    (
        "tessera_wasm_fuel_kills_total",
        "counter",
        "Wasm executions stopped when their fuel ran out",
        |c| &c.fuel_kills,
    ),
    (
        "tessera_wasm_memory_kills_total",
        "counter",
        "Wasm executions stopped at their memory limit",
        |c| &c.memory_kills,
    ),
    (
        "tessera_wasm_memory_replacements_total",
        "counter",
        "Wasm instances replaced between calls as their memory passed 3/4 of max_memory_bytes",
        |c| &c.memory_replacements,
    ),
    (
        "tessera_wasm_compile_cache_hits_total",
        "counter",
        "Wasm components loaded from the compiled-code cache",
        |c| &c.compile_cache_hits,
    ),
    (
        "tessera_wasm_compile_cache_misses_total",
        "counter",
        "Wasm components compiled because the cache had no entry",
        |c| &c.compile_cache_misses,
    ),
    (
        "tessera_wasm_log_dropped_bytes_total",
        "counter",
        "Guest log bytes (stdout, stderr, log import) dropped at max_log_bytes or max_log_bytes_per_second",
        |c| &c.log_dropped_bytes,
    ),
    (
        "tessera_wasm_memory_high_water_bytes",
        "gauge",
        "Largest linear memory a Wasm guest of the model has reached",
        |c| &c.memory_high_water_bytes,
    ),
    (
        "tessera_wasm_live_instances",
        "gauge",
        "Wasm guest instances alive",
        |c| &c.live_instances,
    ),
];

/// Every model's [`Counters`], by model name; a model's counters outlive its reloads.
#[derive(Debug, Default)]
pub struct CounterRegistry {
    models: std::sync::Mutex<std::collections::BTreeMap<String, std::sync::Arc<Counters>>>,
}

impl CounterRegistry {
    /// The counters of `model`, created on first use.
    pub fn for_model(&self, model: &str) -> std::sync::Arc<Counters> {
        let mut models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        models.entry(model.to_owned()).or_default().clone()
    }

    /// Drops the counters of every model `owned` names.
    pub fn forget(&self, owned: impl Fn(&str) -> bool) {
        let mut models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        models.retain(|model, _| !owned(model));
    }

    /// The `tessera_wasm_*` families for the metrics exposition, one sample per model.
    pub fn families(&self) -> Vec<crate::metrics::LabeledFamily> {
        let models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        FAMILIES
            .iter()
            .map(|(name, kind, help, field)| crate::metrics::LabeledFamily {
                name,
                kind,
                help,
                samples: models
                    .iter()
                    .map(|(model, c)| (model.clone(), field(c).load(Ordering::Relaxed)))
                    .collect(),
            })
            .collect()
    }
}

/// Instances alive across all Wasm models, so shutdown can wait for their `finalize`.
#[derive(Debug, Default)]
pub struct InstanceTracker {
    pub live: AtomicU64,
    /// Signalled whenever an instance is gone.
    pub dropped: tokio::sync::Notify,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    #[test]
    fn parameters_override_defaults() {
        let config = parse(
            r#"parameters { key: "max_memory_bytes" value { string_value: "1048576" } }
               parameters { key: "execute_deadline_ms" value { string_value: "250" } }"#,
            "c",
        )
        .expect("parses");
        let limits = Limits::from_config(&config, 4 << 30, false).expect("valid");
        assert_eq!(limits.max_memory_bytes, 1 << 20);
        assert_eq!(limits.execute_deadline, Duration::from_millis(250));
        assert_eq!(limits.fuel_per_execute, None, "not metered");
        let metered = Limits::from_config(&config, 4 << 30, true).expect("valid");
        assert_eq!(
            metered.fuel_per_execute,
            Some(u64::MAX),
            "metered, unlimited"
        );
    }

    #[test]
    fn a_deadline_past_an_hour_is_refused() {
        let config = parse(
            r#"parameters { key: "execute_deadline_ms" value { string_value: "18446744073709551615" } }"#,
            "c",
        )
        .expect("parses");
        let e = Limits::from_config(&config, 4 << 30, false).expect_err("refused");
        assert!(e.contains("more than an hour"), "{e}");
    }

    #[test]
    fn a_fuel_budget_needs_a_metering_server() {
        let config = parse(
            r#"parameters { key: "fuel_per_execute" value { string_value: "5000" } }"#,
            "c",
        )
        .expect("parses");
        let e = Limits::from_config(&config, 4 << 30, false).expect_err("refused");
        assert!(e.contains("--wasm-fuel"), "{e}");
        let limits = Limits::from_config(&config, 4 << 30, true).expect("valid");
        assert_eq!(limits.fuel_per_execute, Some(5000));
    }

    #[test]
    fn log_rate_allows_a_burst_then_refills() {
        let rate = LogRate::new(1000);
        assert!(rate.take(900));
        // Unless this thread stalls 0.8 s between the two calls.
        assert!(!rate.take(900), "the burst is one second's worth");
        assert!(rate.take(100));
        std::thread::sleep(Duration::from_millis(200));
        assert!(rate.take(150), "refilled at 1000 bytes/s");
    }

    #[test]
    fn bad_values_are_named() {
        let config = parse(
            r#"parameters { key: "fuel_per_execute" value { string_value: "lots" } }"#,
            "c",
        )
        .expect("parses");
        let e = Limits::from_config(&config, 4 << 30, true).expect_err("invalid");
        assert!(e.contains("fuel_per_execute"), "{e}");
    }
}
