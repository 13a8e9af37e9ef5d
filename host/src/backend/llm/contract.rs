//! TensorRT-LLM's tensor contract, so that clients written for Triton's `tensorrt_llm` model run
//! unchanged: a request is `input_ids` plus `request_output_len` and optional sampling tensors,
//! a response is `output_ids` `[1, beam, tokens]` and `sequence_length` `[1, beam]`.
//!
//! Inputs read (all with the batch dimension first; one request, one prompt): `input_ids`,
//! `input_lengths`, `request_output_len`, `end_id`, `pad_id`, `streaming`, `beam_width` (1
//! only), `temperature`, `runtime_top_k`, `runtime_top_p`, `min_p` (Tessera's),
//! `repetition_penalty`, `presence_penalty`, `frequency_penalty`, `min_length`/`min_tokens`,
//! `random_seed`/`seed`, `stop_words_list`, `return_log_probs`, `top_log_probs` (Tessera's: the
//! most likely tokens at each place, up to 20, as OpenAI's `top_logprobs`),
//! `exclude_input_in_output`.
//! Anything else the configuration declares is accepted and ignored, as TensorRT-LLM ignores
//! inputs a request leaves out.

use crate::infer::{InferError, InferRequest, InferResponse, ParamValue};
use crate::tensor::{DataType, Tensor, TensorData};

use super::engine::{Finish, Generation, ModelFacts, Sampling, TokenLogProb};

/// A request read from its tensors.
#[derive(Debug)]
pub struct Parsed {
    pub generation: Generation,
    pub streaming: bool,
    /// The prompt goes in front of the output (TensorRT-LLM's `exclude_input_in_output: false`).
    pub echo_prompt: bool,
}

fn input<'a>(request: &'a InferRequest, names: &[&str]) -> Option<&'a Tensor> {
    names
        .iter()
        .find_map(|name| request.inputs.iter().find(|t| t.name == *name))
}

/// All elements of a numeric tensor as f64.
fn numbers(tensor: &Tensor) -> Result<Vec<f64>, InferError> {
    tensor.to_f64_vec().ok_or_else(|| {
        InferError::invalid(format!(
            "input '{}' must be numeric, got {}",
            tensor.name, tensor.datatype
        ))
    })
}

/// The one value of a per-request scalar (shape `[1]` or `[1, 1]`).
fn scalar(request: &InferRequest, names: &[&str]) -> Result<Option<f64>, InferError> {
    let Some(tensor) = input(request, names) else {
        return Ok(None);
    };
    let values = numbers(tensor)?;
    match values.as_slice() {
        [v] => Ok(Some(*v)),
        _ => Err(InferError::invalid(format!(
            "input '{}' must hold one value per request, got {} (shape {:?})",
            tensor.name,
            values.len(),
            tensor.shape
        ))),
    }
}

/// The request's seed, exactly: a 64-bit integer tensor read as its bits (past 2^53 an f64
/// would merge neighbours), any other number as a whole number >= 0.
fn seed_of(request: &InferRequest) -> Result<Option<u64>, InferError> {
    let Some(tensor) = input(request, &["random_seed", "seed"]) else {
        return Ok(None);
    };
    if let (DataType::Uint64 | DataType::Int64, TensorData::Raw(bytes)) =
        (tensor.datatype, &tensor.data)
        && let Ok(raw) = <[u8; 8]>::try_from(bytes.as_ref())
    {
        let seed = u64::from_le_bytes(raw);
        if tensor.datatype == DataType::Int64 && (seed as i64) < 0 {
            return Err(InferError::invalid(format!(
                "seed must be a whole number >= 0, got {}",
                seed as i64
            )));
        }
        return Ok(Some(seed));
    }
    match scalar(request, &["random_seed", "seed"])? {
        Some(seed) if seed < 0.0 || seed.fract() != 0.0 || seed >= 18_446_744_073_709_551_616.0 => {
            Err(InferError::invalid(format!(
                "seed must be a whole number from 0 to 2^64 - 1, got {seed}"
            )))
        }
        Some(seed) => Ok(Some(seed as u64)),
        None => Ok(None),
    }
}

/// llama.cpp's sampler takes 32 bits, and reads 0xFFFFFFFF as "draw a random seed": the 64-bit
/// seed is mixed down (splitmix64's finalizer), so seeds 2^32 apart do not give the same text,
/// and never to that value, so every seed is reproducible.
fn sampler_seed(seed: u64) -> u32 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let folded = (z ^ (z >> 32)) as u32;
    if folded == u32::MAX {
        u32::MAX - 1
    } else {
        folded
    }
}

fn finite(
    name: &str,
    value: f64,
    check: impl Fn(f64) -> bool,
    rule: &str,
) -> Result<f32, InferError> {
    if !value.is_finite() || !check(value) {
        return Err(InferError::invalid(format!(
            "{name} must be {rule}, got {value}"
        )));
    }
    Ok(value as f32)
}

fn token_id(value: f64, facts: &ModelFacts, what: &str) -> Result<i32, InferError> {
    if value.fract() != 0.0 || value < 0.0 || value >= f64::from(facts.vocab_size) {
        return Err(InferError::invalid(format!(
            "{what} {value} is not a token of this model (vocabulary of {})",
            facts.vocab_size
        )));
    }
    Ok(value as i32)
}

/// TensorRT-LLM's `stop_words_list` `[1, 2, n]`: the words' tokens one after the other, then
/// the offset where each word ends, padded with -1.
fn stop_words(tensor: &Tensor, facts: &ModelFacts) -> Result<Vec<Vec<i32>>, InferError> {
    let values = numbers(tensor)?;
    let n = *tensor.shape.last().unwrap_or(&0);
    let n = usize::try_from(n).unwrap_or(0);
    if values.len() != 2 * n {
        return Err(InferError::invalid(format!(
            "stop_words_list must have shape [1, 2, n] (tokens, then end offsets), got {:?}",
            tensor.shape
        )));
    }
    let (tokens, offsets) = values.split_at(n);
    let mut words = Vec::new();
    let mut start = 0usize;
    for &end in offsets {
        if end < 0.0 {
            break;
        }
        let end = end as usize;
        if end <= start || end > n {
            return Err(InferError::invalid(format!(
                "stop_words_list has an offset {end} out of order or past its {n} tokens"
            )));
        }
        let word = tokens[start..end]
            .iter()
            .map(|&t| token_id(t, facts, "a stop word token"))
            .collect::<Result<Vec<_>, _>>()?;
        words.push(word);
        start = end;
    }
    Ok(words)
}

/// Reads a request; `exclude_input` is the model's `exclude_input_in_output` setting.
pub fn parse(
    request: &InferRequest,
    facts: &ModelFacts,
    exclude_input: bool,
) -> Result<Parsed, InferError> {
    let ids = input(request, &["input_ids"])
        .ok_or_else(|| InferError::invalid("input 'input_ids' is required"))?;
    if ids.shape.len() == 2 && ids.shape[0] != 1 {
        return Err(InferError::invalid(format!(
            "one prompt per request: input_ids has shape {:?}; send each prompt as its own request (they are batched in flight)",
            ids.shape
        )));
    }
    let mut prompt = numbers(ids)?
        .into_iter()
        .map(|t| token_id(t, facts, "input_ids holds"))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(length) = scalar(request, &["input_lengths"])? {
        if length < 1.0 || length.fract() != 0.0 || length as usize > prompt.len() {
            return Err(InferError::invalid(format!(
                "input_lengths {length} must be between 1 and the {} tokens of input_ids",
                prompt.len()
            )));
        }
        prompt.truncate(length as usize);
    }
    if prompt.is_empty() {
        return Err(InferError::invalid(
            "input_ids is empty: the prompt needs at least one token",
        ));
    }
    let max_tokens = scalar(request, &["request_output_len"])?
        .ok_or_else(|| InferError::invalid("input 'request_output_len' is required"))?;
    let room = facts.context_per_slot as usize;
    if max_tokens < 1.0 || max_tokens.fract() != 0.0 || max_tokens > room as f64 {
        return Err(InferError::invalid(format!(
            "request_output_len must be a whole number between 1 and {room} (the context per sequence), got {max_tokens}"
        )));
    }
    let max_tokens = max_tokens as u32;
    if prompt.len() + max_tokens as usize > room {
        return Err(InferError::invalid(format!(
            "the prompt of {} tokens plus request_output_len {max_tokens} is more than the {room} tokens of context per sequence",
            prompt.len()
        )));
    }
    if let Some(beams) = scalar(request, &["beam_width"])?
        && beams != 1.0
    {
        return Err(InferError::invalid(format!(
            "beam_width {beams} is not supported: the engine samples one sequence per request (beam_width 1)"
        )));
    }
    let mut sampling = Sampling::default();
    if let Some(t) = scalar(request, &["temperature"])? {
        sampling.temperature = finite(
            "temperature",
            t,
            |v| (0.0..=100.0).contains(&v),
            "between 0 and 100",
        )?;
    }
    if let Some(k) = scalar(request, &["runtime_top_k", "top_k"])? {
        if k < 0.0 || k.fract() != 0.0 || k > f64::from(facts.vocab_size) {
            return Err(InferError::invalid(format!(
                "runtime_top_k must be a whole number from 0 (off) to the vocabulary size, got {k}"
            )));
        }
        sampling.top_k = k as i32;
    }
    if let Some(p) = scalar(request, &["runtime_top_p", "top_p"])? {
        // TensorRT-LLM takes 0 for "off" (the guide's client sends top_p 0 with top_k 1).
        let p = if p == 0.0 { 1.0 } else { p };
        sampling.top_p = finite("runtime_top_p", p, |v| v > 0.0 && v <= 1.0, "in (0, 1]")?;
    }
    if let Some(p) = scalar(request, &["min_p"])? {
        sampling.min_p = finite("min_p", p, |v| (0.0..=1.0).contains(&v), "in [0, 1]")?;
    }
    if let Some(r) = scalar(request, &["repetition_penalty"])? {
        sampling.repetition_penalty = finite(
            "repetition_penalty",
            r,
            |v| v > 0.0 && v <= 10.0,
            "in (0, 10]",
        )?;
    }
    if let Some(p) = scalar(request, &["presence_penalty"])? {
        sampling.presence_penalty = finite(
            "presence_penalty",
            p,
            |v| (-2.0..=2.0).contains(&v),
            "in [-2, 2]",
        )?;
    }
    if let Some(f) = scalar(request, &["frequency_penalty"])? {
        sampling.frequency_penalty = finite(
            "frequency_penalty",
            f,
            |v| (-2.0..=2.0).contains(&v),
            "in [-2, 2]",
        )?;
    }
    if let Some(seed) = seed_of(request)? {
        sampling.seed = sampler_seed(seed);
    }
    let min_tokens = match scalar(request, &["min_length", "min_tokens"])? {
        Some(m) if m < 0.0 || m.fract() != 0.0 || m > f64::from(max_tokens) => {
            return Err(InferError::invalid(format!(
                "min_length must be a whole number from 0 to request_output_len, got {m}"
            )));
        }
        Some(m) => m as u32,
        None => 0,
    };
    let end_ids = match scalar(request, &["end_id"])? {
        Some(id) => vec![token_id(id, facts, "end_id")?],
        None => Vec::new(),
    };
    let stop_sequences = match input(request, &["stop_words_list"]) {
        Some(tensor) => stop_words(tensor, facts)?,
        None => Vec::new(),
    };
    let flag = |names: &[&str]| -> Result<Option<bool>, InferError> {
        Ok(scalar(request, names)?.map(|v| v != 0.0))
    };
    let streaming = flag(&["streaming"])?.unwrap_or(false);
    let top_log_probs = match scalar(request, &["top_log_probs"])? {
        None => 0,
        Some(n) if n.fract() == 0.0 && (0.0..=f64::from(MAX_TOP_LOG_PROBS)).contains(&n) => {
            n as u32
        }
        Some(n) => {
            return Err(InferError::invalid(format!(
                "top_log_probs must be a whole number from 0 to {MAX_TOP_LOG_PROBS}, got {n}"
            )));
        }
    };
    // Alternatives come with the chosen token's log-probability.
    let log_probs = flag(&["return_log_probs"])?.unwrap_or(false) || top_log_probs > 0;
    let exclude = flag(&["exclude_input_in_output"])?.unwrap_or(exclude_input);
    Ok(Parsed {
        generation: Generation {
            prompt,
            max_tokens,
            min_tokens,
            sampling,
            end_ids,
            stop_sequences,
            log_probs,
            top_log_probs,
        },
        streaming,
        // A stream carries only new tokens, as TensorRT-LLM's does.
        echo_prompt: !exclude && !streaming,
    })
}

/// The most alternatives a token's log-probability comes with (OpenAI's bound).
pub const MAX_TOP_LOG_PROBS: u32 = 20;

fn int32(name: &str, shape: Vec<i64>, values: &[i32]) -> Tensor {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::new(name, DataType::Int32, shape, TensorData::Raw(bytes.into()))
}

/// The log-probabilities a response carries: those of its tokens, the sum over the whole
/// sequence so far (TensorRT-LLM's `cum_log_probs`), and how many alternatives each has.
pub struct LogProbs<'a> {
    pub tokens: &'a [TokenLogProb],
    pub cumulative: f32,
    pub top: u32,
}

/// A response holding `tokens` (and their log-probabilities when asked for); `finish` on the
/// last one of a request.
pub fn response(
    tokens: &[i32],
    log_probs: Option<LogProbs<'_>>,
    finish: Option<Finish>,
) -> InferResponse {
    let n = tokens.len() as i64;
    let mut outputs = vec![
        int32("output_ids", vec![1, 1, n], tokens),
        int32("sequence_length", vec![1, 1], &[tokens.len() as i32]),
    ];
    if let Some(log_probs) = log_probs {
        let chosen: Vec<f32> = log_probs.tokens.iter().map(|l| l.chosen).collect();
        outputs.push(Tensor::from_f32(
            "output_log_probs",
            vec![1, 1, chosen.len() as i64],
            &chosen,
        ));
        outputs.push(Tensor::from_f32(
            "cum_log_probs",
            vec![1, 1],
            &[log_probs.cumulative],
        ));
        let top = log_probs.top;
        if top > 0 {
            // [1, 1, tokens, top]; a vocabulary smaller than `top` pads with id -1.
            let shape = vec![1, 1, chosen.len() as i64, i64::from(top)];
            let (mut ids, mut values) = (Vec::new(), Vec::new());
            for l in log_probs.tokens {
                for k in 0..top as usize {
                    let (id, value) = l.top.get(k).copied().unwrap_or((-1, f32::NEG_INFINITY));
                    ids.push(id);
                    values.push(value);
                }
            }
            outputs.push(int32("output_top_log_prob_ids", shape.clone(), &ids));
            outputs.push(Tensor::from_f32("output_top_log_probs", shape, &values));
        }
    }
    let mut response = InferResponse {
        outputs,
        ..InferResponse::default()
    };
    if let Some(finish) = finish {
        response.parameters.insert(
            "finish_reason".into(),
            ParamValue::String(finish.as_str().into()),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> ModelFacts {
        ModelFacts {
            vocab_size: 100,
            end_of_generation: vec![2],
            context_per_slot: 64,
            slots: 4,
            trained_context: 8192,
            description: String::new(),
        }
    }

    fn request(inputs: Vec<Tensor>) -> InferRequest {
        InferRequest {
            inputs,
            ..InferRequest::default()
        }
    }

    fn ids(values: &[i32]) -> Tensor {
        int32("input_ids", vec![1, values.len() as i64], values)
    }

    fn len(n: i32) -> Tensor {
        int32("request_output_len", vec![1, 1], &[n])
    }

    #[test]
    fn the_guide_request_reads_with_defaults() {
        let parsed = parse(&request(vec![ids(&[5, 6, 7]), len(10)]), &facts(), false).unwrap();
        assert_eq!(parsed.generation.prompt, vec![5, 6, 7]);
        assert_eq!(parsed.generation.max_tokens, 10);
        assert_eq!(parsed.generation.sampling, Sampling::default());
        assert!(!parsed.streaming);
        assert!(parsed.echo_prompt);
    }

    #[test]
    fn every_seed_is_reproducible_and_seeds_2_32_apart_differ() {
        let seed = |value: u64| {
            let tensor = Tensor::new(
                "random_seed",
                DataType::Uint64,
                vec![1, 1],
                TensorData::Raw(value.to_le_bytes().to_vec().into()),
            );
            parse(&request(vec![ids(&[5]), len(4), tensor]), &facts(), false)
                .unwrap()
                .generation
                .sampling
                .seed
        };
        // llama.cpp draws a random seed for 0xFFFFFFFF: no request seed may reach it.
        for s in [u64::from(u32::MAX), 7, 0, u64::MAX, (1 << 62) + 7] {
            assert_ne!(seed(s), u32::MAX, "seed {s}");
            assert_eq!(seed(s), seed(s));
        }
        assert_ne!(seed(7), seed(7 + (1 << 32)));
        // Neighbours past 2^53 are one f64: read exactly, they differ.
        assert_ne!(
            seed(1 << 53),
            seed((1 << 53) + 1),
            "read exactly, not through an f64"
        );
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let f = facts();
        let e = |inputs| parse(&request(inputs), &f, false).unwrap_err().message;
        assert!(e(vec![len(4)]).contains("input_ids"));
        assert!(e(vec![ids(&[5]), len(0)]).contains("request_output_len"));
        assert!(e(vec![ids(&[5, 500]), len(4)]).contains("not a token"));
        assert!(e(vec![ids(&[5; 60]), len(10)]).contains("context per sequence"));
        assert!(
            e(vec![
                ids(&[5]),
                len(4),
                Tensor::from_f32("temperature", vec![1, 1], &[f32::NAN])
            ])
            .contains("temperature")
        );
        assert!(
            e(vec![
                ids(&[5]),
                len(4),
                Tensor::from_f32("runtime_top_p", vec![1, 1], &[1.5])
            ])
            .contains("runtime_top_p")
        );
        assert!(
            e(vec![
                ids(&[5]),
                len(4),
                int32("beam_width", vec![1, 1], &[4])
            ])
            .contains("beam_width")
        );
        let two = int32("input_ids", vec![2, 2], &[5, 6, 7, 8]);
        assert!(e(vec![two, len(4)]).contains("one prompt per request"));
    }

    #[test]
    fn stop_words_read_in_tensorrt_llm_layout() {
        // Two words: [7, 8] and [9], offsets 2 and 3, padded.
        let t = int32(
            "stop_words_list",
            vec![1, 2, 4],
            &[7, 8, 9, 0, 2, 3, -1, -1],
        );
        let words = stop_words(&t, &facts()).unwrap();
        assert_eq!(words, vec![vec![7, 8], vec![9]]);
        let bad = int32("stop_words_list", vec![1, 2, 2], &[7, 8, 3, -1]);
        assert!(stop_words(&bad, &facts()).is_err());
    }

    #[test]
    fn streaming_never_echoes_the_prompt() {
        let streaming = crate::tensor::Tensor::new(
            "streaming",
            DataType::Bool,
            vec![1, 1],
            TensorData::Raw(vec![1u8].into()),
        );
        let parsed = parse(
            &request(vec![ids(&[5]), len(4), streaming]),
            &facts(),
            false,
        )
        .unwrap();
        assert!(parsed.streaming);
        assert!(!parsed.echo_prompt);
    }
}
