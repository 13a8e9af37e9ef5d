//! llama.cpp alone, through `llama-cpp-2`, with no server: the reference the LLM engine is
//! checked and measured against.
//!
//!     llm_bare greedy MODEL.gguf MAX_TOKENS < prompts.jsonl
//!         Each input line is a JSON array of prompt token ids; each output line the ids greedy
//!         decoding generates for it, alone in its context, until an end-of-generation token or
//!         MAX_TOKENS (llama.cpp's `simple` example, one prompt at a time).
//!
//!     llm_bare bench MODEL.gguf STREAMS PROMPT_TOKENS GENERATED_TOKENS
//!         STREAMS sequences in one batch per step (prompts prefilled together, then one token
//!         per sequence per step): llama.cpp's own batched loop. Prints JSON with the time to
//!         first token, the inter-token latencies (p50, p99) and output tokens/s.
//!
//!     llm_bare steps MODEL.gguf
//!         What one step costs by what it holds: for each number of decoding sequences and each
//!         prompt chunk added beside them, the median time of a step and the tokens per second
//!         (all and decoded); then sixteen decoding slots in ascending, descending and gapped
//!         order. The ground for the engine's step planning.
//!
//! Threads: all cores, as the server's engine uses by default (`LLM_THREADS` to change).
//! `LLM_KV_UNIFIED=1` gives all sequences one KV cache, not a region per slot as the server does.
//! `LLM_GPU=1` puts every layer on the GPU (a build with `--features llm-cuda`); else the CPU.

use std::io::BufRead;
use std::num::NonZeroU32;
use std::time::Instant;

use anyhow::{Context, bail};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

fn threads() -> i32 {
    std::env::var("LLM_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as i32))
}

fn context_params(slots: u32, per_slot: u32) -> LlamaContextParams {
    LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(slots * per_slot))
        .with_n_seq_max(slots)
        .with_kv_unified(std::env::var("LLM_KV_UNIFIED").is_ok_and(|v| v == "1"))
        .with_n_batch(2048)
        .with_n_ubatch(512)
        .with_n_threads(threads())
        .with_n_threads_batch(threads())
}

fn greedy(backend: &LlamaBackend, model: &LlamaModel, max_tokens: usize) -> anyhow::Result<()> {
    let vocab = model.vocab();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let prompt: Vec<i32> = serde_json::from_str(&line).context("a JSON array of token ids")?;
        let mut ctx = model.new_context(backend, context_params(1, 2048))?;
        let mut batch = LlamaBatch::new(2048, 1);
        for (i, &t) in prompt.iter().enumerate() {
            batch.add(LlamaToken(t), i as i32, &[0], i + 1 == prompt.len())?;
        }
        ctx.decode(&mut batch)?;
        let mut sampler = LlamaSampler::greedy();
        let mut out = Vec::new();
        let mut pos = prompt.len() as i32;
        let mut last = batch.n_tokens() - 1;
        while out.len() < max_tokens {
            let token = sampler.sample(&ctx, last);
            if vocab.is_eog(token) {
                break;
            }
            out.push(token.0);
            batch.clear();
            batch.add(token, pos, &[0], true)?;
            pos += 1;
            ctx.decode(&mut batch)?;
            last = 0;
        }
        println!("{}", serde_json::to_string(&out)?);
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn bench(
    backend: &LlamaBackend,
    model: &LlamaModel,
    streams: usize,
    prompt_tokens: usize,
    generated: usize,
) -> anyhow::Result<()> {
    let per_slot = (prompt_tokens + generated + 16).next_multiple_of(256) as u32;
    let mut ctx = model.new_context(backend, context_params(streams as u32, per_slot))?;
    // Distinct prompts (token ids from the ordinary vocabulary), as distinct users send.
    let prompts: Vec<Vec<i32>> = (0..streams)
        .map(|s| {
            (0..prompt_tokens)
                .map(|i| 100 + ((i * 7 + s * 13) % 20000) as i32)
                .collect()
        })
        .collect();
    let mut batch = LlamaBatch::new(streams * prompt_tokens.max(1), streams as i32);
    let started = Instant::now();
    let mut logits_at = Vec::new();
    for (s, prompt) in prompts.iter().enumerate() {
        for (i, &t) in prompt.iter().enumerate() {
            let last = i + 1 == prompt.len();
            if last {
                logits_at.push(batch.n_tokens());
            }
            batch.add(LlamaToken(t), i as i32, &[s as i32], last)?;
        }
    }
    ctx.decode(&mut batch)?;
    let mut samplers: Vec<LlamaSampler> = (0..streams).map(|_| LlamaSampler::greedy()).collect();
    let mut next: Vec<LlamaToken> = (0..streams)
        .map(|s| samplers[s].sample(&ctx, logits_at[s]))
        .collect();
    let first_token = started.elapsed().as_secs_f64();
    let mut gaps = Vec::new();
    let mut produced = streams;
    let mut step_started = Instant::now();
    for step in 1..generated {
        batch.clear();
        for (s, token) in next.iter().enumerate() {
            batch.add(*token, (prompt_tokens + step - 1) as i32, &[s as i32], true)?;
        }
        ctx.decode(&mut batch)?;
        for (s, token) in next.iter_mut().enumerate() {
            *token = samplers[s].sample(&ctx, s as i32);
        }
        produced += streams;
        let now = Instant::now();
        gaps.push((now - step_started).as_secs_f64());
        step_started = now;
    }
    let total = started.elapsed().as_secs_f64();
    gaps.sort_by(f64::total_cmp);
    let report = serde_json::json!({
        "streams": streams,
        "prompt_tokens": prompt_tokens,
        "generated_tokens": generated,
        "ttft_s": first_token,
        "itl_p50_ms": percentile(&gaps, 0.5) * 1e3,
        "itl_p99_ms": percentile(&gaps, 0.99) * 1e3,
        "output_tokens_per_s": produced as f64 / total,
        "threads": threads(),
    });
    println!("{report}");
    Ok(())
}

fn steps(backend: &LlamaBackend, model: &LlamaModel) -> anyhow::Result<()> {
    const DECODERS: usize = 16;
    const PROMPT: usize = 128;
    const REPEAT: usize = 7;
    // Slots 0..32 decode (room for every other slot), the last one takes prompt chunks.
    const SLOTS: usize = 2 * DECODERS + 1;
    let newcomer = (SLOTS - 1) as i32;
    let mut ctx = model.new_context(backend, context_params(SLOTS as u32, 1024))?;
    let mut batch = LlamaBatch::new(DECODERS * PROMPT + 512, SLOTS as i32);
    let mut positions = [PROMPT as i32; SLOTS];
    for s in 0..2 * DECODERS {
        batch.clear();
        for i in 0..PROMPT {
            let t = 100 + ((i * 7 + s * 13) % 20000) as i32;
            batch.add(LlamaToken(t), i as i32, &[s as i32], i + 1 == PROMPT)?;
        }
        ctx.decode(&mut batch)?;
    }
    // One step: the next token of each slot in `decoding` (in that order), then `chunk` prompt
    // tokens of the newcomer; the median time of REPEAT such steps.
    let mut time_steps = |decoding: &[usize], chunk: usize| -> anyhow::Result<f64> {
        ctx.clear_kv_cache_seq(Some(newcomer as u32), None, None)?;
        let mut times = Vec::new();
        for r in 0..REPEAT {
            batch.clear();
            for &s in decoding {
                batch.add(LlamaToken(200 + s as i32), positions[s], &[s as i32], true)?;
            }
            for k in 0..chunk {
                let at = r * chunk + k;
                let token = LlamaToken(300 + (at % 5000) as i32);
                batch.add(token, at as i32, &[newcomer], k + 1 == chunk)?;
            }
            let t0 = Instant::now();
            ctx.decode(&mut batch)?;
            times.push(t0.elapsed().as_secs_f64());
            for &s in decoding {
                positions[s] += 1;
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times[REPEAT / 2])
    };
    println!(
        "| decoding | prompt chunk | step ms (median of {REPEAT}) | tokens/s | decoded tokens/s |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for decoders in [1usize, 4, 8, 16] {
        let slots: Vec<usize> = (0..decoders).collect();
        for chunk in [0usize, 8, 16, 32, 64, 128] {
            let t = time_steps(&slots, chunk)?;
            println!(
                "| {decoders} | {chunk} | {:.1} | {:.0} | {:.0} |",
                t * 1e3,
                (decoders + chunk) as f64 / t,
                decoders as f64 / t
            );
        }
    }
    // llama.cpp splits a batch over a per-sequence KV cache into micro-batches of consecutive
    // sequence ids, taken in batch order: the same sixteen tokens cost more the more runs
    // their slots make.
    println!();
    println!(
        "| 16 decoding, slots in the batch | step ms (median of {REPEAT}) | decoded tokens/s |"
    );
    println!("|---|---:|---:|");
    let ascending: Vec<usize> = (0..DECODERS).collect();
    let descending: Vec<usize> = (0..DECODERS).rev().collect();
    let every_other: Vec<usize> = (0..DECODERS).map(|s| 2 * s).collect();
    for (name, slots) in [
        ("0..15 ascending", &ascending),
        ("15..0 descending", &descending),
        ("0, 2, .., 30 ascending", &every_other),
    ] {
        let t = time_steps(slots, 0)?;
        println!("| {name} | {:.1} | {:.0} |", t * 1e3, DECODERS as f64 / t);
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let mut backend = LlamaBackend::init()?;
    backend.void_logs();
    let usage = "usage: llm_bare greedy MODEL MAX_TOKENS | bench MODEL STREAMS PROMPT GENERATED | steps MODEL";
    let Some(mode) = args.get(1) else {
        bail!(usage)
    };
    let path = args.get(2).context(usage)?;
    let on_gpu = std::env::var("LLM_GPU").is_ok_and(|v| v == "1");
    let params = LlamaModelParams::default().with_n_gpu_layers(if on_gpu { u32::MAX } else { 0 });
    let model = LlamaModel::load_from_file(&backend, path, &params)?;
    let arg = |i: usize| -> anyhow::Result<usize> {
        args.get(i).context(usage)?.parse().context("a number")
    };
    match mode.as_str() {
        "greedy" => greedy(&backend, &model, arg(3)?),
        "bench" => bench(&backend, &model, arg(3)?, arg(4)?, arg(5)?),
        "steps" => steps(&backend, &model),
        _ => bail!(usage),
    }
}
