//! What the LLM engines report on `/metrics` (`tessera_llm_*`): time to first token,
//! inter-token latency, tokens per second (as counters), running and waiting sequences,
//! KV-cache use, and the shape of each step (how many sequences decoded together, how many
//! prompt tokens rode along), per model; prompt and generated tokens also per tenant.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::metrics::Family;

/// A histogram with fixed bucket bounds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    /// The sum, in millionths of the observed unit.
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            if value <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_micros
            .fetch_add((value * 1e6).max(0.0) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, family: &mut Family<'_>, labels: &[(&str, &str)]) {
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let le = bound.to_string();
            let mut with = labels.to_vec();
            with.push(("le", &le));
            family.sample_of("_bucket", &with, count.load(Ordering::Relaxed));
        }
        let total = self.count.load(Ordering::Relaxed);
        let mut with = labels.to_vec();
        with.push(("le", "+Inf"));
        family.sample_of("_bucket", &with, total);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        family.sample_of("_sum", labels, sum);
        family.sample_of("_count", labels, total);
    }
}

const LATENCY_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
];
const SEQUENCE_BOUNDS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
const TOKEN_BOUNDS: &[f64] = &[
    0.0, 1.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// One model's engine figures; they outlive its reloads.
#[derive(Debug)]
pub struct EngineMetrics {
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    /// Sequences that decoded a token, per step.
    pub step_sequences: Histogram,
    /// Prompt tokens a step prefilled while other sequences decoded in it.
    pub step_prompt_tokens_while_decoding: Histogram,
    pub steps: AtomicU64,
    /// Sequences moved to a lower KV region (a region freed below them).
    pub kv_region_moves: AtomicU64,
    pub running: AtomicU64,
    /// Admitted sequences still prefilling their prompts.
    pub prefilling: AtomicU64,
    pub kv_cells_used: AtomicU64,
    pub kv_cells: AtomicU64,
    pub cancelled: AtomicU64,
    pub finished_stop: AtomicU64,
    pub finished_length: AtomicU64,
    pub failed: AtomicU64,
    /// (prompt, generated) tokens per tenant ("" without tenants).
    tokens: Mutex<BTreeMap<String, (u64, u64)>>,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        EngineMetrics {
            time_to_first_token: Histogram::new(LATENCY_BOUNDS),
            inter_token_latency: Histogram::new(LATENCY_BOUNDS),
            step_sequences: Histogram::new(SEQUENCE_BOUNDS),
            step_prompt_tokens_while_decoding: Histogram::new(TOKEN_BOUNDS),
            steps: AtomicU64::new(0),
            kv_region_moves: AtomicU64::new(0),
            running: AtomicU64::new(0),
            prefilling: AtomicU64::new(0),
            kv_cells_used: AtomicU64::new(0),
            kv_cells: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            finished_stop: AtomicU64::new(0),
            finished_length: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            tokens: Mutex::new(BTreeMap::new()),
        }
    }
}

impl EngineMetrics {
    pub fn count_tokens(&self, tenant: Option<&str>, prompt: u64, generated: u64) {
        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        let entry = tokens.entry(tenant.unwrap_or("").to_owned()).or_default();
        entry.0 += prompt;
        entry.1 += generated;
    }

    pub fn observe_gap(&self, histogram: &Histogram, gap: Duration) {
        histogram.observe(gap.as_secs_f64());
    }
}

/// Every LLM model's metrics, by model name.
#[derive(Debug, Default)]
pub struct EngineRegistry {
    models: Mutex<BTreeMap<String, Arc<EngineMetrics>>>,
}

impl EngineRegistry {
    pub fn for_model(&self, model: &str) -> Arc<EngineMetrics> {
        let mut models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        models.entry(model.to_owned()).or_default().clone()
    }

    /// Appends the `tessera_llm_*` families (nothing while no LLM model was loaded).
    pub fn render(&self, out: &mut String) {
        let models: Vec<(String, Arc<EngineMetrics>)> = self
            .models
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(name, m)| (name.clone(), m.clone()))
            .collect();
        if models.is_empty() {
            return;
        }
        type Pick = fn(&EngineMetrics) -> &Histogram;
        let histograms: [(&str, &str, Pick); 4] = [
            (
                "tessera_llm_time_to_first_token_seconds",
                "Time from a request's admission to its first generated token",
                |m| &m.time_to_first_token,
            ),
            (
                "tessera_llm_inter_token_latency_seconds",
                "Time between two tokens of one sequence",
                |m| &m.inter_token_latency,
            ),
            (
                "tessera_llm_step_sequences",
                "Sequences that decoded a token together in one engine step",
                |m| &m.step_sequences,
            ),
            (
                "tessera_llm_step_prompt_tokens_while_decoding",
                "Prompt tokens prefilled in a step that also decoded running sequences (prefill_chunk_tokens or the number decoding, or the whole budget in a burst)",
                |m| &m.step_prompt_tokens_while_decoding,
            ),
        ];
        for (name, help, pick) in histograms {
            let mut family = Family::start(out, name, "histogram", help);
            for (model, m) in &models {
                pick(m).render(&mut family, &[("model", model)]);
            }
        }
        type Count = fn(&EngineMetrics) -> &AtomicU64;
        let gauges: [(&str, &str, &str, Count); 10] = [
            (
                "tessera_llm_steps_total",
                "counter",
                "Engine steps run",
                |m| &m.steps,
            ),
            (
                "tessera_llm_kv_region_moves_total",
                "counter",
                "Sequences moved down into a KV region freed below them, so that a step's sequences stay consecutive",
                |m| &m.kv_region_moves,
            ),
            (
                "tessera_llm_sequences_running",
                "gauge",
                "Sequences in a slot (prefilling or decoding)",
                |m| &m.running,
            ),
            (
                "tessera_llm_sequences_prefilling",
                "gauge",
                "Sequences in a slot still prefilling their prompts",
                |m| &m.prefilling,
            ),
            (
                "tessera_llm_kv_cache_used_tokens",
                "gauge",
                "KV cache cells holding tokens of running sequences",
                |m| &m.kv_cells_used,
            ),
            (
                "tessera_llm_kv_cache_capacity_tokens",
                "gauge",
                "KV cache cells (slots times max_sequence_length)",
                |m| &m.kv_cells,
            ),
            (
                "tessera_llm_requests_cancelled_total",
                "counter",
                "Sequences dropped because their caller went away",
                |m| &m.cancelled,
            ),
            (
                "tessera_llm_requests_finished_stop_total",
                "counter",
                "Sequences that ended on an end token or a stop word",
                |m| &m.finished_stop,
            ),
            (
                "tessera_llm_requests_finished_length_total",
                "counter",
                "Sequences that ended at their token limit",
                |m| &m.finished_length,
            ),
            (
                "tessera_llm_requests_failed_total",
                "counter",
                "Sequences the engine could not go on with",
                |m| &m.failed,
            ),
        ];
        for (name, kind, help, pick) in gauges {
            let mut family = Family::start(out, name, kind, help);
            for (model, m) in &models {
                family.sample(&[("model", model)], pick(m).load(Ordering::Relaxed));
            }
        }
        for (name, help, pick) in [
            (
                "tessera_llm_prompt_tokens_total",
                "Prompt tokens of admitted requests",
                (|t: &(u64, u64)| t.0) as fn(&(u64, u64)) -> u64,
            ),
            (
                "tessera_llm_generation_tokens_total",
                "Tokens generated",
                |t: &(u64, u64)| t.1,
            ),
        ] {
            let mut family = Family::start(out, name, "counter", help);
            for (model, m) in &models {
                let tokens = m.tokens.lock().unwrap_or_else(|p| p.into_inner());
                for (tenant, t) in tokens.iter() {
                    family.sample(&[("model", model), ("tenant", tenant)], pick(t));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_render_cumulative_buckets() {
        let registry = EngineRegistry::default();
        let m = registry.for_model("llm");
        m.step_sequences.observe(1.0);
        m.step_sequences.observe(3.0);
        m.count_tokens(Some("acme"), 10, 4);
        let mut out = String::new();
        registry.render(&mut out);
        assert!(
            out.contains("tessera_llm_step_sequences_bucket{model=\"llm\",le=\"1\"} 1"),
            "{out}"
        );
        assert!(out.contains("tessera_llm_step_sequences_bucket{model=\"llm\",le=\"4\"} 2"));
        assert!(out.contains("tessera_llm_step_sequences_count{model=\"llm\"} 2"));
        assert!(
            out.contains("tessera_llm_generation_tokens_total{model=\"llm\",tenant=\"acme\"} 4")
        );
    }
}
