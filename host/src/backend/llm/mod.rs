//! The LLM engine backend (`backend: "llamacpp"`): a generative model in a GGUF file, run by
//! llama.cpp with in-flight batching, behind TensorRT-LLM's tensors ([`contract`]).
//!
//! A model version has one instance, and the instance owns the token loop ([`engine`]). Requests
//! reach it through the model's queue like every other request: the scheduler hands it a batch,
//! the instance puts each request in a free sequence slot, and from then on the scheduler calls
//! [`ModelInstance::resume`] once per step, taking newly queued requests between steps while
//! slots are free (`capacity`). So a request joins the running ones at the next step; one whose
//! caller has gone is dropped from the next step and its slot reused. While every slot is busy
//! requests wait in the queue, where the queue policy (size, timeouts, priorities) applies.
//!
//! Every request is answered through a stream: one response per token when it asks for
//! `streaming`, else one response at the end. A reader that falls behind does not hold up the
//! others: its sequence sits steps out until its buffer has room.

mod contract;
pub mod engine;
pub mod metrics;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::FutureExt;

use super::{Backend, Executed, LoadContext, LoadError, ModelInstance};
use crate::config::{self, ModelConfig};
use crate::infer::{BoxFuture, Call, InferError, InferResponse, InferResult};
use crate::metrics::ExecutionTiming;
use crate::stream::{ResponseSender, TrySendError};
use engine::{Engine, EngineSettings, Event, Finish, ModelFacts, Step, TokenLogProb};

/// Where an engine reports the tokens a tenant's requests use (for a tenant's
/// `tokens_per_minute`).
pub trait TokenMeter: Send + Sync {
    fn charge(&self, tenant: &str, tokens: u64);
}

/// The `llamacpp` backend: records into the server's engine metrics and charges tenants.
pub struct LlmBackend {
    pub metrics: Arc<metrics::EngineRegistry>,
    pub meter: Arc<dyn TokenMeter>,
}

/// A whole-number parameter of the configuration, with its default.
fn number(config: &ModelConfig, key: &str, default: u32) -> Result<u32, LoadError> {
    match config::string_parameter(config, key) {
        None => Ok(default),
        Some(text) => text.trim().parse::<u32>().map_err(|_| {
            LoadError::invalid(format!(
                "parameter '{key}' must be a whole number, got '{text}'"
            ))
        }),
    }
}

/// The engine's settings from the configuration's `parameters`.
fn settings(ctx: &LoadContext) -> Result<EngineSettings, LoadError> {
    let config = &ctx.config;
    let max_batch = u32::try_from(config.max_batch_size).unwrap_or(0);
    let slots = number(config, "max_num_seqs", max_batch.max(1))?;
    if !(1..=256).contains(&slots) {
        return Err(LoadError::invalid(format!(
            "max_num_seqs must be between 1 and 256 (llama.cpp's limit), got {slots}"
        )));
    }
    if max_batch > slots {
        return Err(LoadError::invalid(format!(
            "max_batch_size {max_batch} is more than max_num_seqs {slots}: a batch's requests each need a sequence slot"
        )));
    }
    let context_per_slot = number(config, "max_sequence_length", 2048)?;
    let max_step_tokens = number(config, "max_num_batched_tokens", 512)?;
    let gpu = ctx.instances.first().and_then(|slot| slot.gpu);
    // Measured with SmolLM2-135M (docs/benchmarks.md). On 2 CPU cores a step costs about the
    // same per token whatever it holds, so a chunk as large as the decoding sequences (8 at
    // least) keeps mixed steps within about twice a decoding step, and prefilling a burst of
    // new prompts together (ratio 0.5) gave 1.1x the tokens/s at 16 streams. On an H200 a step
    // costs the same for 16 or 64 prompt tokens, and 64 gave 1.7x the tokens/s of 16; bursts
    // were not measured there, so a GPU instance leaves them off.
    let prefill_chunk = number(
        config,
        "prefill_chunk_tokens",
        if gpu.is_some() { 64 } else { 8 },
    )?;
    if context_per_slot < 16 || max_step_tokens < 16 || prefill_chunk == 0 {
        return Err(LoadError::invalid(
            "max_sequence_length and max_num_batched_tokens must be at least 16, prefill_chunk_tokens at least 1",
        ));
    }
    let waiting_served_ratio = match config::string_parameter(config, "waiting_served_ratio") {
        None => gpu.is_none().then_some(0.5),
        Some(text) if text.trim() == "none" => None,
        Some(text) => text
            .trim()
            .parse::<f32>()
            .ok()
            .filter(|r| r.is_finite() && *r >= 0.0)
            .ok_or_else(|| {
                LoadError::invalid(format!(
                    "parameter 'waiting_served_ratio' must be a number >= 0 or 'none', got '{text}'"
                ))
            })
            .map(Some)?,
    };
    // llama.cpp's threads meet at every operation, so one that loses its core to the server's
    // own threads stalls the step: on 16 cores, 12 threads gave 1.4x the tokens/s of 16.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let default_threads = if cores <= 4 { cores } else { cores - cores / 4 };
    let threads = number(config, "threads", default_threads)?.max(1);
    Ok(EngineSettings {
        model_path: config::model_file(config, &ctx.version_dir, "model.gguf"),
        slots,
        context_per_slot,
        max_step_tokens,
        prefill_chunk,
        waiting_served_ratio,
        threads: i32::try_from(threads).unwrap_or(1),
        gpu,
    })
}

impl Backend for LlmBackend {
    /// With llama.cpp's CUDA backend built in, `KIND_AUTO` puts the engine on the GPU.
    fn executes_on_gpu(&self) -> bool {
        cfg!(feature = "llm-cuda")
    }

    fn load<'a>(
        &'a self,
        ctx: &'a LoadContext,
    ) -> BoxFuture<'a, Result<Vec<Box<dyn ModelInstance>>, LoadError>> {
        async move {
            if ctx.instances.len() != 1 {
                return Err(LoadError::invalid(format!(
                    "an LLM engine model has one instance (it batches every request in flight), not {}; set max_num_seqs for more concurrent sequences",
                    ctx.instances.len()
                )));
            }
            let settings = settings(ctx)?;
            if !settings.model_path.is_file() {
                return Err(LoadError::invalid(format!(
                    "no model file at {} (a GGUF file; name it model.gguf or set default_model_filename)",
                    settings.model_path.display()
                )));
            }
            let exclude_input = config::string_parameter(&ctx.config, "exclude_input_in_output")
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
            let (engine, facts) = Engine::start(&ctx.name, settings)
                .await
                .map_err(LoadError::runtime)?;
            tracing::info!(
                model = %crate::namespace::shown(&ctx.name),
                slots = facts.slots,
                context_per_slot = facts.context_per_slot,
                "LLM engine ready: {}",
                facts.description
            );
            let metrics = self
                .metrics
                .for_model(crate::namespace::shown(&ctx.name));
            metrics.kv_cells.store(
                u64::from(facts.slots) * u64::from(facts.context_per_slot),
                Ordering::Relaxed,
            );
            let instance: Box<dyn ModelInstance> = Box::new(LlmInstance {
                engine,
                metrics,
                meter: self.meter.clone(),
                free: (0..facts.slots).collect(),
                facts,
                exclude_input,
                active: HashMap::new(),
                draining: Vec::new(),
                admit: Vec::new(),
            });
            Ok(vec![instance])
        }
        .boxed()
    }
}

/// A request in a sequence slot, as its caller sees it.
struct Active {
    sender: ResponseSender,
    tenant: Option<Arc<str>>,
    admitted: Instant,
    /// When its last token came (None before the first).
    last_token: Option<Instant>,
    prompt_tokens: u64,
    generated: u64,
    streaming: bool,
    /// What the final response holds (the prompt first when it is echoed).
    tokens: Vec<i32>,
    log_probs: Option<Vec<TokenLogProb>>,
    /// Alternatives given with each log-probability.
    top_log_probs: u32,
    /// The sum of the log-probabilities of every token generated so far.
    cum_log_prob: f32,
    /// Responses the reader has no room for yet, with whether each is the last.
    backlog: VecDeque<(InferResponse, bool)>,
}

impl Active {
    /// A response with the tokens gathered since the last one.
    fn response(&self, finish: Option<Finish>) -> InferResponse {
        let log_probs = self.log_probs.as_deref().map(|tokens| contract::LogProbs {
            tokens,
            cumulative: self.cum_log_prob,
            top: self.top_log_probs,
        });
        contract::response(&self.tokens, log_probs, finish)
    }

    /// Hands the reader what it has room for. False once the caller has gone.
    fn flush(&mut self) -> bool {
        while let Some((response, last)) = self.backlog.pop_front() {
            match self.sender.try_send(Some(Ok(response)), last) {
                Ok(()) => {}
                Err(TrySendError::Full(message)) => {
                    if let Some(Ok(response)) = message.result {
                        self.backlog.push_front((response, message.last));
                    }
                    return true;
                }
                Err(TrySendError::Cancelled | TrySendError::Closed) => return false,
            }
        }
        true
    }
}

/// The one instance of an LLM engine model version.
pub struct LlmInstance {
    engine: Engine,
    metrics: Arc<metrics::EngineMetrics>,
    meter: Arc<dyn TokenMeter>,
    facts: ModelFacts,
    exclude_input: bool,
    /// Free sequence slots (the engine maps them to KV regions of its own).
    free: BTreeSet<u32>,
    /// Requests in slots, by slot.
    active: HashMap<u32, Active>,
    /// Finished requests whose last responses wait for room in their readers' buffers.
    draining: Vec<Active>,
    /// Requests taken since the last step, to start in the next.
    admit: Vec<(u32, engine::Generation)>,
}

impl ModelInstance for LlmInstance {
    fn execute(&mut self, batch: Vec<Call>) -> BoxFuture<'_, Executed> {
        async move { self.take(batch) }.boxed()
    }

    fn has_open_work(&self) -> bool {
        !self.active.is_empty() || !self.draining.is_empty()
    }

    fn capacity(&self) -> usize {
        self.free.len()
    }

    fn answers_through_streams(&self) -> bool {
        true
    }

    fn resume(&mut self) -> BoxFuture<'_, Option<Duration>> {
        async move { self.step().await }.boxed()
    }
}

impl LlmInstance {
    /// Puts each request of a batch in a free slot, to start at the next step.
    fn take(&mut self, batch: Vec<Call>) -> Executed {
        let t0 = Instant::now();
        let mut results = Vec::with_capacity(batch.len());
        for call in batch {
            results.push(self.admit_one(call));
        }
        Executed {
            results,
            timing: ExecutionTiming {
                input: t0.elapsed(),
                ..ExecutionTiming::default()
            },
        }
    }

    fn admit_one(&mut self, call: Call) -> InferResult {
        let Some(sender) = call.stream else {
            // The scheduler sends this model's requests as streams (answers_through_streams).
            return Err(InferError::internal(
                "an LLM engine answers through a stream",
            ));
        };
        let parsed = contract::parse(&call.request, &self.facts, self.exclude_input)?;
        let Some(slot) = self.free.pop_first() else {
            return Err(InferError::unavailable(
                "every sequence slot is busy; retry later",
            ));
        };
        let tokens = if parsed.echo_prompt {
            parsed.generation.prompt.clone()
        } else {
            Vec::new()
        };
        self.active.insert(
            slot,
            Active {
                sender,
                tenant: call.cx.tenant.clone(),
                admitted: Instant::now(),
                last_token: None,
                prompt_tokens: parsed.generation.prompt.len() as u64,
                generated: 0,
                streaming: parsed.streaming,
                tokens,
                log_probs: parsed.generation.log_probs.then(Vec::new),
                top_log_probs: parsed.generation.top_log_probs,
                cum_log_prob: 0.0,
                backlog: VecDeque::new(),
            },
        );
        if let Some(tenant) = &call.cx.tenant {
            self.meter
                .charge(tenant, parsed.generation.prompt.len() as u64);
        }
        self.admit.push((slot, parsed.generation));
        Ok(InferResponse::default())
    }

    /// Runs one step of the token loop and hands out what it generated.
    async fn step(&mut self) -> Option<Duration> {
        self.draining
            .retain_mut(|a| a.flush() && !a.backlog.is_empty());
        let mut cancel = Vec::new();
        let mut paused = Vec::new();
        let mut gone = Vec::new();
        for (&slot, active) in &mut self.active {
            if active.sender.is_cancelled() || !active.flush() {
                gone.push(slot);
            } else if !active.backlog.is_empty() {
                paused.push(slot);
            }
        }
        for slot in gone {
            if let Some(active) = self.active.remove(&slot) {
                self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                self.metrics.count_tokens(
                    active.tenant.as_deref(),
                    active.prompt_tokens,
                    active.generated,
                );
            }
            self.free.insert(slot);
            let before = self.admit.len();
            self.admit.retain(|(s, _)| *s != slot);
            if self.admit.len() == before {
                cancel.push(slot); // it is in the engine: free its cache there
            }
        }
        if self.admit.is_empty() && cancel.is_empty() && paused.len() == self.active.len() {
            // Nothing can run: every sequence waits for its reader (or there are none).
            return self.has_open_work().then_some(Duration::from_millis(2));
        }
        let step = Step {
            admit: std::mem::take(&mut self.admit),
            cancel,
            paused,
        };
        let Some(report) = self.engine.step(step).await else {
            let error = InferError::internal("the LLM engine stopped");
            for (slot, active) in self.active.drain() {
                active.sender.fail(error.clone());
                self.free.insert(slot);
            }
            return None;
        };
        let m = &self.metrics;
        m.steps.fetch_add(1, Ordering::Relaxed);
        m.kv_region_moves
            .fetch_add(report.moved as u64, Ordering::Relaxed);
        if report.decoded > 0 {
            m.step_sequences.observe(report.decoded as f64);
            m.step_prompt_tokens_while_decoding
                .observe(report.prefilled as f64);
        }
        m.prefilling
            .store(report.prefilling as u64, Ordering::Relaxed);
        m.kv_cells_used.store(report.kv_cells, Ordering::Relaxed);
        for event in report.events {
            match event {
                Event::Token {
                    slot,
                    token,
                    log_prob,
                    finish,
                    partial_character,
                } => self.deliver(slot, token, log_prob, finish, partial_character),
                Event::Failed { slot, message } => {
                    if let Some(active) = self.active.remove(&slot) {
                        active.sender.fail(InferError::internal(message));
                        self.metrics.failed.fetch_add(1, Ordering::Relaxed);
                    }
                    self.free.insert(slot);
                }
            }
        }
        self.metrics
            .running
            .store(self.active.len() as u64, Ordering::Relaxed);
        self.has_open_work().then_some(Duration::ZERO)
    }

    fn deliver(
        &mut self,
        slot: u32,
        token: Option<i32>,
        log_prob: Option<TokenLogProb>,
        finish: Option<Finish>,
        partial_character: bool,
    ) {
        let Some(active) = self.active.get_mut(&slot) else {
            return; // cancelled while the step ran: the engine frees it next step
        };
        let now = Instant::now();
        match active.last_token {
            None => self
                .metrics
                .time_to_first_token
                .observe((now - active.admitted).as_secs_f64()),
            Some(last) => self
                .metrics
                .inter_token_latency
                .observe((now - last).as_secs_f64()),
        }
        active.last_token = Some(now);
        if token.is_some() {
            active.generated += 1;
            if let Some(tenant) = &active.tenant {
                self.meter.charge(tenant, 1);
            }
        }
        if let Some(token) = token {
            // A stream's `tokens` also holds what was held back for an unfinished character.
            active.tokens.push(token);
            if let (Some(all), Some(lp)) = (active.log_probs.as_mut(), log_prob) {
                active.cum_log_prob += lp.chosen;
                all.push(lp);
            }
        }
        if active.streaming {
            if partial_character && finish.is_none() {
                return;
            }
            let response = active.response(finish);
            active.tokens.clear();
            if let Some(all) = active.log_probs.as_mut() {
                all.clear();
            }
            active.backlog.push_back((response, finish.is_some()));
        } else if finish.is_some() {
            let response = active.response(finish);
            active.backlog.push_back((response, true));
        }
        let alive = active.flush();
        if let Some(finish) = finish {
            let m = &self.metrics;
            match finish {
                Finish::Stop => m.finished_stop.fetch_add(1, Ordering::Relaxed),
                Finish::Length => m.finished_length.fetch_add(1, Ordering::Relaxed),
            };
            m.count_tokens(
                active.tenant.as_deref(),
                active.prompt_tokens,
                active.generated,
            );
            // The engine freed the slot; what the reader has not taken yet drains on its own.
            if let Some(active) = self.active.remove(&slot)
                && alive
                && !active.backlog.is_empty()
            {
                self.draining.push(active);
            }
            self.free.insert(slot);
        }
    }
}

impl std::fmt::Debug for LlmInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmInstance")
            .field("free", &self.free.len())
            .field("active", &self.active.len())
            .finish()
    }
}
