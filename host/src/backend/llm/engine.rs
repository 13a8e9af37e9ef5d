//! The token loop: one thread owns llama.cpp's model and context and runs one step at a time.
//!
//! The context holds one KV cache with a region per sequence slot (llama.cpp's non-unified
//! cache: `n_ctx / n_seq_max` cells each). A step is one `llama_decode` over one batch that holds
//! the next token of every decoding sequence plus chunks of prompts still being prefilled, under
//! a token budget: a request joins at the next step and a finished or cancelled one leaves at
//! the next step, the shape of TGI's and vLLM's schedulers (in-flight batching). Sampling is
//! llama.cpp's sampler chain, one per sequence (penalties keep per-sequence state).
//!
//! llama.cpp's context borrows its model and is not `Send`, so both live on this thread; the
//! model instance ([`super::LlmInstance`]) sends it one [`Step`] at a time and awaits the report.

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::{LlamaModelParams, LlamaSplitMode};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::oneshot;

/// How the engine is set up for one model version (from the config's `parameters`).
#[derive(Clone, Debug)]
pub struct EngineSettings {
    pub model_path: PathBuf,
    /// Sequence slots: how many requests generate at once (`max_num_seqs`).
    pub slots: u32,
    /// KV cells per slot: the longest prompt plus generation a request may have.
    pub context_per_slot: u32,
    /// The most tokens one step decodes (`max_num_batched_tokens`).
    pub max_step_tokens: u32,
    /// Prompt tokens a step adds while other sequences decode (`prefill_chunk_tokens`), or as
    /// many as sequences decode if more: the bound on how much a new prompt slows the running
    /// streams.
    pub prefill_chunk: u32,
    /// Waiting prompts per decoding sequence from which a step prefills with its whole budget
    /// rather than a chunk (`waiting_served_ratio`, TGI's name); `None`: always a chunk.
    pub waiting_served_ratio: Option<f32>,
    pub threads: i32,
    /// The CUDA device the weights, the KV cache and the compute go to; `None`: the CPU only.
    pub gpu: Option<u32>,
}

/// What the loaded model is, for the request side's checks.
#[derive(Clone, Debug)]
pub struct ModelFacts {
    pub vocab_size: i32,
    /// Tokens that end generation unless the request names its own `end_id`.
    pub end_of_generation: Vec<i32>,
    pub context_per_slot: u32,
    pub slots: u32,
    /// The model's training context: the per-slot context may not exceed it.
    pub trained_context: u32,
    /// KV cache bytes per token, for the cache-use gauge.
    pub description: String,
}

/// Sampling settings of one request; the defaults are greedy.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u32,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl Sampling {
    /// Greedy when the temperature is 0 or only the single best token may be chosen.
    fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    fn sampler(&self, vocab_size: i32) -> LlamaSampler {
        let mut chain = Vec::new();
        if self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
        {
            // Over the whole sequence so far (the prompt is accepted into the sampler too).
            chain.push(LlamaSampler::penalties(
                vocab_size,
                -1,
                self.repetition_penalty,
                self.frequency_penalty,
                self.presence_penalty,
            ));
        }
        if self.is_greedy() {
            chain.push(LlamaSampler::greedy());
        } else {
            if self.top_k > 0 {
                chain.push(LlamaSampler::top_k(self.top_k));
            }
            if self.top_p < 1.0 {
                chain.push(LlamaSampler::top_p(self.top_p, 1));
            }
            if self.min_p > 0.0 {
                chain.push(LlamaSampler::min_p(self.min_p, 1));
            }
            chain.push(LlamaSampler::temp(self.temperature));
            chain.push(LlamaSampler::dist(self.seed));
        }
        LlamaSampler::chain_simple(chain)
    }
}

/// One request to generate, checked by the request side.
#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt: Vec<i32>,
    pub max_tokens: u32,
    /// Ends of generation are ignored until this many tokens were generated.
    pub min_tokens: u32,
    pub sampling: Sampling,
    /// Tokens that end generation; empty: the model's own.
    pub end_ids: Vec<i32>,
    /// Token sequences that end generation when the output ends with one (TRT-LLM's
    /// `stop_words_list`); they stay in the output.
    pub stop_sequences: Vec<Vec<i32>>,
    pub log_probs: bool,
    /// With `log_probs`: how many of the most likely tokens to give beside the chosen one.
    pub top_log_probs: u32,
}

/// The model's log-probability of a generated token (before temperature and filters), and of
/// the most likely tokens at its place, most likely first, when they were asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogProb {
    pub chosen: f32,
    pub top: Vec<(i32, f32)>,
}

/// Why a sequence stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token or a stop sequence.
    Stop,
    /// `max_tokens`, or the slot's context is full.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What a step did for one sequence.
#[derive(Debug)]
pub enum Event {
    /// A token was generated (`None`: the step ended the sequence on an end token, which is not
    /// part of the output).
    Token {
        slot: u32,
        token: Option<i32>,
        log_prob: Option<TokenLogProb>,
        finish: Option<Finish>,
        /// The output so far ends inside a UTF-8 character (a token can be half of one): a
        /// stream holds this token back until the character is whole, so that a response
        /// decoded on its own never shows a broken character.
        partial_character: bool,
    },
    /// The sequence cannot go on (llama.cpp refused the batch); its slot is free again.
    Failed { slot: u32, message: String },
}

/// The work of one step, as the request side asks for it.
#[derive(Default)]
pub struct Step {
    /// New sequences, each in a free slot.
    pub admit: Vec<(u32, Generation)>,
    /// Sequences whose callers have gone: their slots are freed before the step.
    pub cancel: Vec<u32>,
    /// Sequences that sit this step out (their readers are behind).
    pub paused: Vec<u32>,
}

/// What one step did.
#[derive(Debug, Default)]
pub struct StepReport {
    pub events: Vec<Event>,
    /// Sequences that decoded a token in this step.
    pub decoded: usize,
    /// Prompt tokens prefilled in this step.
    pub prefilled: usize,
    /// Sequences still prefilling their prompts after the step.
    pub prefilling: usize,
    /// KV cells in use after the step.
    pub kv_cells: u64,
    /// Sequences moved to a lower KV region before the step.
    pub moved: usize,
    pub elapsed: Duration,
}

enum Command {
    Step(Step, oneshot::Sender<StepReport>),
}

/// The request side's handle on an engine thread. Dropping it stops the thread, which frees the
/// model and its cache.
pub struct Engine {
    /// `None` once dropping: a closed channel ends the thread.
    commands: Option<std::sync::mpsc::Sender<Command>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Engine {
    /// Ends the engine thread and waits while it frees the context and the model. A CUDA build
    /// must release its device memory before the process exits: freed after CUDA's own teardown,
    /// llama.cpp aborts (seen on SIGTERM on an H200).
    fn drop(&mut self) {
        self.commands = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the LLM engine thread panicked");
        }
    }
}

/// llama.cpp's backend is initialised once per process.
fn backend() -> Result<&'static LlamaBackend, String> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            // Its logs go through tracing (target `llama-cpp-2`), not to stderr.
            llama_cpp_2::send_logs_to_tracing(
                llama_cpp_2::LogOptions::default().with_logs_enabled(true),
            );
            LlamaBackend::init().map_err(|e| format!("cannot start llama.cpp: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Where the model runs: every layer on the one GPU of its instance (llama.cpp's device named
/// `CUDA<n>`), or nothing on any GPU for a CPU instance, even in a CUDA build (llama.cpp would
/// otherwise offload to every GPU it finds).
fn model_params(backend: &LlamaBackend, gpu: Option<u32>) -> Result<LlamaModelParams, String> {
    let Some(gpu) = gpu else {
        return LlamaModelParams::default()
            .with_n_gpu_layers(0)
            .with_devices(&[])
            .map_err(|e| format!("cannot keep llama.cpp on the CPU: {e}"));
    };
    if !backend.supports_gpu_offload() {
        return Err(format!(
            "this instance group asks for GPU {gpu}, but this tessera was built without the LLM engine's CUDA backend (cargo build --release --features llm-cuda); use KIND_CPU"
        ));
    }
    let wanted = format!("CUDA{gpu}");
    let devices = llama_cpp_2::list_llama_ggml_backend_devices();
    let device = devices.iter().find(|d| d.name == wanted).ok_or_else(|| {
        let seen: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        format!("llama.cpp has no device {wanted} (it sees {seen:?})")
    })?;
    tracing::info!(gpu, device = %device.description, "LLM engine on the GPU");
    LlamaModelParams::default()
        .with_n_gpu_layers(u32::MAX)
        .with_split_mode(LlamaSplitMode::None)
        .with_main_gpu(0)
        .with_devices(&[device.index])
        .map_err(|e| format!("cannot place the model on {wanted}: {e}"))
}

impl Engine {
    /// Starts the engine thread and loads the model on it.
    pub async fn start(
        name: &str,
        settings: EngineSettings,
    ) -> Result<(Engine, ModelFacts), String> {
        let (commands, receiver) = std::sync::mpsc::channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("llm-{name}"))
            .spawn(move || run(settings, ready_tx, receiver))
            .map_err(|e| format!("cannot start the engine thread: {e}"))?;
        let engine = Engine {
            commands: Some(commands),
            thread: Some(thread),
        };
        let facts = ready_rx
            .await
            .map_err(|_| "the engine thread ended while loading".to_owned())??;
        Ok((engine, facts))
    }

    /// Runs one step; `None` if the engine thread has gone.
    pub async fn step(&self, step: Step) -> Option<StepReport> {
        let (tx, rx) = oneshot::channel();
        self.commands.as_ref()?.send(Command::Step(step, tx)).ok()?;
        rx.await.ok()
    }
}

fn run(
    settings: EngineSettings,
    ready: oneshot::Sender<Result<ModelFacts, String>>,
    commands: std::sync::mpsc::Receiver<Command>,
) {
    let backend = match backend() {
        Ok(backend) => backend,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let model_params = match model_params(backend, settings.gpu) {
        Ok(params) => params,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let model = match LlamaModel::load_from_file(backend, &settings.model_path, &model_params) {
        Ok(model) => model,
        Err(e) => {
            let _ = ready.send(Err(format!(
                "cannot load {}: {e}",
                settings.model_path.display()
            )));
            return;
        }
    };
    let trained_context = model.n_ctx_train();
    if settings.context_per_slot > trained_context {
        let _ = ready.send(Err(format!(
            "context_per_slot {} is more than the model was trained for ({trained_context})",
            settings.context_per_slot
        )));
        return;
    }
    let total_context = settings.slots.saturating_mul(settings.context_per_slot);
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(total_context))
        .with_n_seq_max(settings.slots)
        // One region per slot: batched output equals solo output in this configuration (a
        // unified cache made batched greedy output differ from solo runs).
        .with_kv_unified(false)
        .with_n_batch(settings.max_step_tokens)
        .with_n_ubatch(settings.max_step_tokens)
        .with_n_threads(settings.threads)
        .with_n_threads_batch(settings.threads);
    let context = match model.new_context(backend, params) {
        Ok(context) => context,
        Err(e) => {
            let _ = ready.send(Err(format!("cannot create the llama.cpp context: {e}")));
            return;
        }
    };
    let vocab = model.vocab();
    let end_of_generation: Vec<i32> = (0..model.n_vocab())
        .filter(|&t| vocab.is_eog(LlamaToken(t)))
        .collect();
    let facts = ModelFacts {
        vocab_size: model.n_vocab(),
        end_of_generation,
        // llama.cpp rounds the context up; each slot gets an equal share of what it made.
        context_per_slot: context.n_ctx() / settings.slots.max(1),
        slots: settings.slots,
        trained_context,
        description: format!(
            "{} parameters, {} layers, vocabulary {}, trained context {trained_context}",
            model.n_params(),
            model.n_layer(),
            model.n_vocab()
        ),
    };
    // Each token's text, for the character boundaries of streamed output.
    let pieces: Vec<Box<[u8]>> = (0..model.n_vocab())
        .map(|t| {
            vocab
                .token_to_piece(LlamaToken(t), false, None)
                .into_boxed_slice()
        })
        .collect();
    let mut loop_ = TokenLoop {
        context,
        pieces,
        facts: facts.clone(),
        settings,
        sequences: Vec::new(),
        free_regions: (0..facts.slots).collect(),
        batch: None,
    };
    if ready.send(Ok(facts)).is_err() {
        return;
    }
    while let Ok(command) = commands.recv() {
        match command {
            Command::Step(step, reply) => {
                let report = loop_.step(step);
                let _ = reply.send(report);
            }
        }
    }
}

/// A sequence in a slot.
struct Sequence {
    /// The request side's name for it.
    slot: u32,
    /// Its region of the KV cache (llama.cpp's sequence id), kept among the lowest (see
    /// [`TokenLoop::compact`]).
    region: u32,
    request: Generation,
    /// Prompt tokens already in the KV cache.
    prefilled: usize,
    /// The token the next decode step feeds (the last one sampled).
    next: Option<i32>,
    /// Position of the next token in the sequence.
    position: i32,
    generated: u32,
    /// The tail of the output, for stop sequences.
    recent: Vec<i32>,
    /// Bytes of a UTF-8 character the output has only begun.
    unfinished_character: Vec<u8>,
    sampler: LlamaSampler,
}

struct TokenLoop<'m> {
    context: LlamaContext<'m>,
    pieces: Vec<Box<[u8]>>,
    facts: ModelFacts,
    settings: EngineSettings,
    /// In arrival order: prompts prefill first come, first served.
    sequences: Vec<Sequence>,
    /// KV regions no sequence holds.
    free_regions: BTreeSet<u32>,
    batch: Option<LlamaBatch<'static>>,
}

impl TokenLoop<'_> {
    /// Ends the sequence in `slot`, if any, and frees its KV region.
    fn remove(&mut self, slot: u32) {
        if let Some(i) = self.sequences.iter().position(|s| s.slot == slot) {
            let seq = self.sequences.remove(i);
            self.free_region(seq.region);
        }
    }

    fn free_region(&mut self, region: u32) {
        let _ = self.context.clear_kv_cache_seq(Some(region), None, None);
        self.free_regions.insert(region);
    }

    /// Moves the sequences in the highest KV regions into the lowest free ones, so that the
    /// sequences hold regions 0..n. llama.cpp runs each run of consecutive regions in a batch
    /// as its own micro-batch, reading every weight once per micro-batch: a region left free in
    /// the middle by a finished sequence would cost every later step another pass over the
    /// weights (about 7 ms here, against a 23-38 ms step of 4-8 sequences). llama.cpp copies a
    /// region between streams whole, at the next decode (35 MB for SmolLM2 at 1,536 cells: a few
    /// ms, once); a sequence with nothing in the cache yet just takes the lower region. Returns
    /// how many sequences moved.
    fn compact(&mut self) -> usize {
        let mut moved = 0;
        while let Some(&hole) = self.free_regions.first() {
            let Some(top) = self
                .sequences
                .iter_mut()
                .filter(|s| s.region > hole)
                .max_by_key(|s| s.region)
            else {
                break;
            };
            let from = top.region;
            if top.prefilled > 0
                && self
                    .context
                    .copy_kv_cache_seq(from as i32, hole as i32, None, None)
                    .is_err()
            {
                break; // only out-of-range positions fail, and a whole-region copy has none
            }
            top.region = hole;
            self.free_regions.remove(&hole);
            self.free_region(from);
            moved += 1;
        }
        moved
    }

    fn step(&mut self, step: Step) -> StepReport {
        let started = Instant::now();
        let mut report = StepReport::default();
        for slot in step.cancel {
            self.remove(slot);
        }
        for (slot, request) in step.admit {
            // The request side admits no more sequences than there are slots.
            let Some(region) = self.free_regions.pop_first() else {
                report.events.push(Event::Failed {
                    slot,
                    message: "the engine has no free KV region".into(),
                });
                continue;
            };
            let mut sampler = request.sampling.sampler(self.facts.vocab_size);
            // Penalties count the prompt's tokens too, as llama.cpp's own server does.
            sampler.accept_many(request.prompt.iter().map(|&t| LlamaToken(t)));
            self.sequences.push(Sequence {
                slot,
                region,
                request,
                prefilled: 0,
                next: None,
                position: 0,
                generated: 0,
                recent: Vec::new(),
                unfinished_character: Vec::new(),
                sampler,
            });
        }

        report.moved = self.compact();
        let capacity = self.settings.max_step_tokens as usize;
        let slots = self.settings.slots as usize;
        let states: Vec<SequenceState> = self
            .sequences
            .iter()
            .map(|seq| SequenceState {
                region: seq.region,
                decoding: seq.next.is_some() && !step.paused.contains(&seq.slot),
                prompt_left: if seq.next.is_some() {
                    0
                } else {
                    seq.request.prompt.len().saturating_sub(seq.prefilled)
                },
            })
            .collect();
        let plan = plan_step(&states, &self.settings);
        report.decoded = plan.iter().filter(|&&(_, take)| take == 0).count();
        report.prefilled = plan.iter().map(|&(_, take)| take).sum();
        let batch = self
            .batch
            .get_or_insert_with(|| LlamaBatch::new(capacity + slots, slots as i32));
        batch.clear();
        // (index into sequences, index in the batch of the token whose logits it samples)
        let mut sampled_at: Vec<(usize, i32)> = Vec::new();
        let mut chunks: Vec<(usize, usize)> = Vec::new();
        let mut used = 0usize;
        for (i, take) in plan {
            let seq = &self.sequences[i];
            if take == 0 {
                let Some(token) = seq.next else { continue };
                // At most one token per slot: the batch has room for all of them.
                let _ = batch.add(LlamaToken(token), seq.position, &[seq.region as i32], true);
                sampled_at.push((i, used as i32));
                used += 1;
                continue;
            }
            let completes = seq.prefilled + take == seq.request.prompt.len();
            for k in 0..take {
                let at = seq.prefilled + k;
                let last = completes && k + 1 == take;
                // The batch holds `capacity + slots` tokens and the budget stays under it.
                let _ = batch.add(
                    LlamaToken(seq.request.prompt[at]),
                    at as i32,
                    &[seq.region as i32],
                    last,
                );
                if last {
                    sampled_at.push((i, used as i32));
                }
                used += 1;
            }
            chunks.push((i, take));
        }
        if used == 0 {
            report.elapsed = started.elapsed();
            return report;
        }
        if let Err(e) = self.context.decode(batch) {
            // Nothing of this batch is trusted: every sequence in it fails and frees its slot.
            let message = format!("the engine could not run a step: {e}");
            tracing::error!("{message}");
            let failed: Vec<u32> = self.sequences.iter().map(|s| s.slot).collect();
            for slot in failed {
                self.remove(slot);
                report.events.push(Event::Failed {
                    slot,
                    message: message.clone(),
                });
            }
            report.elapsed = started.elapsed();
            return report;
        }
        for (i, took) in chunks {
            let seq = &mut self.sequences[i];
            seq.prefilled += took;
            seq.position = seq.prefilled as i32;
        }

        let mut finished = Vec::new();
        for (i, index) in sampled_at {
            let seq = &mut self.sequences[i];
            let token = seq.sampler.sample(&self.context, index).0;
            let log_prob = seq.request.log_probs.then(|| {
                log_probs_of(
                    self.context.get_logits_ith(index),
                    token,
                    seq.request.top_log_probs as usize,
                )
            });
            if seq.next.is_some() {
                seq.position += 1; // the fed token is now in the cache
            }
            seq.generated += 1;
            let ends = if seq.request.end_ids.is_empty() {
                self.facts.end_of_generation.contains(&token)
            } else {
                seq.request.end_ids.contains(&token)
            };
            let finish = if ends && seq.generated > seq.request.min_tokens {
                Some(Finish::Stop)
            } else {
                seq.recent.push(token);
                let longest = seq
                    .request
                    .stop_sequences
                    .iter()
                    .map(Vec::len)
                    .max()
                    .unwrap_or(0);
                if seq.recent.len() > longest.max(1) {
                    seq.recent.remove(0);
                }
                let stopped = seq.generated >= seq.request.min_tokens
                    && seq
                        .request
                        .stop_sequences
                        .iter()
                        .any(|stop| !stop.is_empty() && seq.recent.ends_with(stop));
                if stopped {
                    Some(Finish::Stop)
                } else if seq.generated >= seq.request.max_tokens
                    // Feeding this token back would need a cell the slot does not have.
                    || seq.position >= self.facts.context_per_slot as i32
                {
                    Some(Finish::Length)
                } else {
                    None
                }
            };
            let emitted = (!(ends && finish == Some(Finish::Stop))).then_some(token);
            let partial_character = match emitted {
                Some(token) => {
                    let piece = usize::try_from(token)
                        .ok()
                        .and_then(|t| self.pieces.get(t))
                        .map_or(&[][..], |p| &p[..]);
                    ends_inside_character(&mut seq.unfinished_character, piece)
                }
                None => !seq.unfinished_character.is_empty(),
            };
            seq.next = Some(token);
            report.events.push(Event::Token {
                slot: seq.slot,
                token: emitted,
                log_prob: emitted.and(log_prob),
                finish,
                partial_character,
            });
            if finish.is_some() {
                finished.push(seq.slot);
            }
        }
        for slot in finished {
            self.remove(slot);
        }
        report.prefilling = self.sequences.iter().filter(|s| s.next.is_none()).count();
        report.kv_cells = self
            .sequences
            .iter()
            .map(|s| u64::try_from(s.position.max(0)).unwrap_or(0))
            .sum();
        report.elapsed = started.elapsed();
        report
    }
}

/// A sequence as the step planner sees it.
#[derive(Clone, Copy, Debug)]
struct SequenceState {
    region: u32,
    /// It feeds its last token this step (it is past its prompt and its reader keeps up).
    decoding: bool,
    /// Prompt tokens not yet in the cache.
    prompt_left: usize,
}

/// What each sequence adds to the next step, as (index in `sequences`, prompt tokens): 0 for a
/// decoding sequence's next token, n for n tokens of a prompt. In KV region order.
///
/// Prompts get the whole token budget while nothing decodes, or while many wait compared with
/// those decoding (a burst of new requests: the sooner they all decode, the fuller and cheaper
/// per token every later step; TGI's `waiting_served_ratio`). Otherwise a chunk of
/// `prefill_chunk` tokens, or as many as sequences decode if more: on the CPU a step costs
/// about the same per token whatever it holds, so a chunk that size keeps a mixed step within
/// about twice a decoding step (`llm_bare steps`). Prompts are served first come, first served.
fn plan_step(sequences: &[SequenceState], settings: &EngineSettings) -> Vec<(usize, usize)> {
    let capacity = settings.max_step_tokens as usize;
    let mut plan: Vec<(usize, usize)> = sequences
        .iter()
        .enumerate()
        .filter(|(_, s)| s.decoding)
        .map(|(i, _)| (i, 0))
        .collect();
    let decoding = plan.len();
    let waiting = sequences.iter().filter(|s| s.prompt_left > 0).count();
    let burst = settings
        .waiting_served_ratio
        .is_some_and(|ratio| waiting as f32 >= ratio * decoding as f32);
    let mut budget = if decoding == 0 || burst {
        capacity.saturating_sub(decoding)
    } else {
        (settings.prefill_chunk as usize)
            .max(decoding)
            .min(capacity.saturating_sub(decoding))
    };
    for (i, s) in sequences.iter().enumerate() {
        if budget == 0 {
            break;
        }
        if s.prompt_left > 0 {
            let take = s.prompt_left.min(budget);
            plan.push((i, take));
            budget -= take;
        }
    }
    // llama.cpp cuts a batch over a per-sequence KV cache into micro-batches of consecutive
    // sequence ids (our regions), taken in batch order, and each micro-batch reads every weight
    // once: sixteen decoding regions in descending order cost 2.6x the same ascending
    // (`llm_bare steps`). So the batch goes in region order.
    plan.sort_unstable_by_key(|&(i, _)| sequences[i].region);
    plan
}

/// Appends a token's bytes to the unfinished character before it; true if the output still
/// ends inside a character. Bytes that can never become valid UTF-8 are let through (they are
/// not held back forever).
fn ends_inside_character(unfinished: &mut Vec<u8>, piece: &[u8]) -> bool {
    unfinished.extend_from_slice(piece);
    let incomplete_from = match std::str::from_utf8(unfinished) {
        Ok(_) => None,
        Err(e) if e.error_len().is_none() => Some(e.valid_up_to()),
        Err(_) => None,
    };
    match incomplete_from {
        Some(start) => {
            unfinished.drain(..start);
            true
        }
        None => {
            unfinished.clear();
            false
        }
    }
}

/// The natural logs of the model's probabilities (before temperature and filters) of `token`
/// and of the `top` most likely tokens.
fn log_probs_of(logits: &[f32], token: i32, top: usize) -> TokenLogProb {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_total = max + logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln();
    let of = |t: i32| {
        usize::try_from(t)
            .ok()
            .and_then(|t| logits.get(t))
            .map_or(f32::NEG_INFINITY, |l| l - log_total)
    };
    let mut best = Vec::new();
    if top > 0 {
        let mut ids: Vec<i32> = (0..logits.len() as i32).collect();
        let by_logit = |a: &i32, b: &i32| logits[*b as usize].total_cmp(&logits[*a as usize]);
        let top = top.min(ids.len());
        if top < ids.len() {
            ids.select_nth_unstable_by(top, by_logit);
            ids.truncate(top);
        }
        ids.sort_unstable_by(by_logit);
        best = ids.into_iter().map(|t| (t, of(t))).collect();
    }
    TokenLogProb {
        chosen: of(token),
        top: best,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(prefill_chunk: u32, waiting_served_ratio: Option<f32>) -> EngineSettings {
        EngineSettings {
            model_path: PathBuf::new(),
            slots: 16,
            context_per_slot: 1024,
            max_step_tokens: 512,
            prefill_chunk,
            waiting_served_ratio,
            threads: 1,
            gpu: None,
        }
    }

    fn decoding(region: u32) -> SequenceState {
        SequenceState {
            region,
            decoding: true,
            prompt_left: 0,
        }
    }

    fn prompt(region: u32, tokens: usize) -> SequenceState {
        SequenceState {
            region,
            decoding: false,
            prompt_left: tokens,
        }
    }

    #[test]
    fn a_step_holds_its_sequences_in_region_order() {
        // Arrival order 5, 3, 9, 0 (a prompt), 1 (paused: neither decoding nor prefilling).
        let paused = SequenceState {
            region: 1,
            decoding: false,
            prompt_left: 0,
        };
        let seqs = [decoding(5), decoding(3), decoding(9), prompt(0, 4), paused];
        let plan = plan_step(&seqs, &settings(8, None));
        let regions: Vec<u32> = plan.iter().map(|&(i, _)| seqs[i].region).collect();
        assert_eq!(regions, [0, 3, 5, 9]);
        assert_eq!(plan[0], (3, 4));
    }

    #[test]
    fn a_prompt_joining_decoding_sequences_gets_a_chunk_as_large_as_they_are_many() {
        let mut seqs: Vec<SequenceState> = (0..12).map(decoding).collect();
        seqs.push(prompt(12, 1000));
        let chunk = |seqs: &[SequenceState], s: &EngineSettings| -> usize {
            plan_step(seqs, s).iter().map(|&(_, t)| t).sum()
        };
        // 12 decoding: 12 tokens, not the floor of 8; the floor when fewer decode.
        assert_eq!(chunk(&seqs, &settings(8, None)), 12);
        assert_eq!(chunk(&seqs[8..], &settings(8, None)), 8);
        assert_eq!(chunk(&seqs, &settings(64, None)), 64);
        // Nothing decoding: the whole budget.
        assert_eq!(chunk(&seqs[12..], &settings(8, None)), 512);
    }

    #[test]
    fn a_burst_of_prompts_is_prefilled_with_the_whole_budget() {
        // 2 decoding, 3 waiting: 3 >= 0.5 * 2, a burst; first come, first served.
        let seqs = [
            decoding(0),
            decoding(1),
            prompt(4, 300),
            prompt(2, 300),
            prompt(3, 300),
        ];
        let plan = plan_step(&seqs, &settings(8, Some(0.5)));
        let taken: Vec<(u32, usize)> = plan.iter().map(|&(i, t)| (seqs[i].region, t)).collect();
        assert_eq!(taken, [(0, 0), (1, 0), (2, 210), (4, 300)]);
        // The same with more decoding than the ratio allows: a chunk.
        let mut many: Vec<SequenceState> = (0..8).map(decoding).collect();
        many.push(prompt(8, 300));
        let plan = plan_step(&many, &settings(8, Some(0.5)));
        assert_eq!(plan.iter().map(|&(_, t)| t).sum::<usize>(), 8);
    }

    #[test]
    fn log_probs_are_a_distribution() {
        let log_prob_of = |logits: &[f32], t| log_probs_of(logits, t, 0).chosen;
        let logits = [1.0f32, 2.0, 3.0];
        let total: f32 = (0..3).map(|t| log_prob_of(&logits, t).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert!(log_prob_of(&logits, 2) > log_prob_of(&logits, 0));
        assert_eq!(log_prob_of(&logits, 7), f32::NEG_INFINITY);
        // The most likely tokens, most likely first, with the same log-probabilities.
        let logits = [0.5f32, 4.0, -1.0, 3.0, 2.5];
        let given = log_probs_of(&logits, 4, 3);
        let ids: Vec<i32> = given.top.iter().map(|(t, _)| *t).collect();
        assert_eq!(ids, [1, 3, 4]);
        assert_eq!(given.top[2].1, given.chosen);
        assert_eq!(log_probs_of(&logits, 4, 9).top.len(), 5);
    }

    #[test]
    fn a_character_split_over_tokens_is_held_until_whole() {
        // 你 is e4 bd a0; 👍 is f0 9f 91 8d.
        let mut tail = Vec::new();
        assert!(ends_inside_character(&mut tail, &[0xe4, 0xbd]));
        assert!(!ends_inside_character(&mut tail, &[0xa0, b'!']));
        assert!(ends_inside_character(&mut tail, b"a\xf0\x9f"));
        assert_eq!(tail, vec![0xf0, 0x9f]);
        assert!(ends_inside_character(&mut tail, &[0x91]));
        assert!(!ends_inside_character(&mut tail, &[0x8d]));
        // Never-valid bytes are not held back.
        assert!(!ends_inside_character(&mut tail, &[0xff]));
        assert!(tail.is_empty());
    }

    #[test]
    fn defaults_are_greedy() {
        assert!(Sampling::default().is_greedy());
        let warm = Sampling {
            temperature: 0.7,
            ..Sampling::default()
        };
        assert!(!warm.is_greedy());
    }
}
