//! `tensorrt_llm_bls`: a decoupled model that takes text and streams text — TensorRT-LLM's
//! BLS model (a Python model in Triton), here sandboxed. Per request:
//!
//! - `text_input` (BYTES `[1]`), or `messages` (BYTES `[1]`: OpenAI-style chat messages as
//!   JSON, rendered with the model's chat template);
//! - `max_tokens` (INT32 `[1]`); `stream` (BOOL `[1]`, default false);
//! - optional sampling: `temperature`, `top_p`, `min_p`, `repetition_penalty`,
//!   `presence_penalty`, `frequency_penalty` (FP32 `[1]`), `top_k` (INT32 `[1]`), `seed` (UINT64
//!   `[1]`), `min_tokens` (INT32 `[1]`: end tokens are ignored before this many); `stop` (BYTES
//!   `[-1]`): strings that end generation and are left out of the text.
//!
//! Output `text_output` (BYTES `[1]`): with `stream`, one response per piece of new text (never
//! half a character, never part of a stop string), else one response with all of it. The last
//! response carries the parameters `finish_reason` (`stop` or `length`), `prompt_tokens` and
//! `completion_tokens`.
//!
//! It tokenizes and detokenizes itself (the tokenizer from its folder) and runs the engine
//! (`parameters { key: "engine" }`, default `tensorrt_llm`) through the engine's queue with
//! `infer-stream`. One instance serves every stream: `execute` starts them, `resume` forwards
//! what has arrived on any of them and returns; the host resumes it as soon as more arrives.

use std::path::Path;
use std::time::Duration;

use llm_text::{Detokenizer, Message, StopStrings, Text};
use tessera_guest::{
    DataType, DecoupledModel, Error, ModelConfig, Polled, Request, Response, ResponseSender,
    ResponseStream, Resume, Tensor,
};

/// A request being generated.
struct Generation {
    /// `None` once the final response or error went out.
    sender: Option<ResponseSender>,
    engine: ResponseStream,
    stream: bool,
    detokenizer: Detokenizer,
    stops: StopStrings,
    /// The text so far, when it is sent in one response.
    text: String,
    prompt_tokens: u32,
    completion_tokens: u32,
    /// With `return_logprobs`: the tokens not yet sent.
    logprobs: Option<Pending>,
}

/// Tokens whose log-probabilities are not sent yet: each one's bytes and log-probability, and
/// `top` alternatives each (flattened, the most likely first).
#[derive(Default)]
struct Pending {
    top: usize,
    bytes: Vec<Vec<u8>>,
    logprobs: Vec<f32>,
    top_bytes: Vec<Vec<u8>>,
    top_logprobs: Vec<f32>,
}

struct Bls {
    text: Text,
    engine: String,
    generations: Vec<Generation>,
}

/// Sampling inputs passed to the engine under its names.
const SAMPLING: &[(&str, &str)] = &[
    ("temperature", "temperature"),
    ("top_p", "runtime_top_p"),
    ("min_p", "min_p"),
    ("repetition_penalty", "repetition_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("top_k", "runtime_top_k"),
    ("seed", "random_seed"),
    ("min_tokens", "min_length"),
];

/// An engine's error in this model's own input names: the engine names its inputs
/// (`request_output_len`, `runtime_top_p`, ...), the caller knows only ours.
fn in_our_names(e: Error) -> Error {
    let renamed = SAMPLING
        .iter()
        .chain(&[("max_tokens", "request_output_len")])
        .filter(|(ours, theirs)| ours != theirs)
        .fold(e.message().to_owned(), |message, (ours, theirs)| {
            message.replace(theirs, ours)
        });
    Error::new(e.kind(), renamed)
}

fn utf8(tensor: &Tensor) -> Result<String, Error> {
    let values = tensor.as_bytes_elements()?;
    let first = values
        .first()
        .ok_or_else(|| Error::invalid_input(format!("{} is empty", tensor.name())))?;
    String::from_utf8(first.clone())
        .map_err(|_| Error::invalid_input(format!("{} is not valid UTF-8", tensor.name())))
}

impl Bls {
    /// Starts one request: its prompt, and the engine's stream for it.
    /// The generation is made without its sender, which the caller adds.
    fn start(&self, request: &Request) -> Result<Generation, Error> {
        let prompt = match (
            request.get_input("messages"),
            request.get_input("text_input"),
        ) {
            (Some(messages), _) => {
                let messages: Vec<Message> =
                    serde_json::from_str(&utf8(messages)?).map_err(|e| {
                        Error::invalid_input(format!(
                            "messages must be a JSON list of {{\"role\", \"content\"}} objects: {e}"
                        ))
                    })?;
                if messages.is_empty() {
                    return Err(Error::invalid_input("messages is empty"));
                }
                self.text
                    .chat_prompt(&messages)
                    .map_err(Error::invalid_input)?
            }
            (None, Some(text)) => utf8(text)?,
            (None, None) => return Err(Error::invalid_input("text_input or messages is required")),
        };
        let ids: Vec<i32> = self
            .text
            .encode(&prompt)
            .map_err(Error::invalid_input)?
            .into_iter()
            .map(|t| t as i32)
            .collect();
        if ids.is_empty() {
            return Err(Error::invalid_input("the prompt is empty"));
        }
        let max_tokens = request
            .input("max_tokens")?
            .expect_datatype(DataType::Int32)?
            .as_i32()?
            .first()
            .copied()
            .ok_or_else(|| Error::invalid_input("max_tokens is empty"))?;
        let stream = match request.get_input("stream") {
            Some(t) => t.as_bool()?.first().copied().unwrap_or(false),
            None => false,
        };
        let stops = match request.get_input("stop") {
            Some(t) => t.as_strings()?.into_iter().map(str::to_owned).collect(),
            None => Vec::new(),
        };
        let top = match request.get_input("top_logprobs") {
            Some(t) => t.as_i32()?.first().copied().unwrap_or(0),
            None => 0,
        };
        let logprobs = match request.get_input("return_logprobs") {
            Some(t) => t.as_bool()?.first().copied().unwrap_or(false),
            None => false,
        } || top > 0;
        let prompt_tokens = ids.len() as u32;
        let mut engine = Request::builder()
            .input(Tensor::from_i32("input_ids", [1, ids.len() as i64], &ids))
            .input(Tensor::from_i32(
                "request_output_len",
                [1, 1],
                &[max_tokens],
            ))
            // Always streamed from the engine: text goes out as it comes, and a stop string
            // ends generation at once.
            .input(Tensor::from_bool("streaming", [1, 1], &[true]))
            .input(Tensor::from_bool("return_log_probs", [1, 1], &[logprobs]));
        if top > 0 {
            engine = engine.input(Tensor::from_i32("top_log_probs", [1, 1], &[top]));
        }
        for (ours, theirs) in SAMPLING {
            if let Some(t) = request.get_input(ours) {
                engine = engine.input(t.clone().renamed(*theirs).reshaped([1, 1]));
            }
        }
        let engine = tessera_guest::infer_stream(&self.engine, None, engine.build())
            .map_err(in_our_names)?;
        Ok(Generation {
            sender: None,
            engine,
            stream,
            detokenizer: Detokenizer::default(),
            stops: StopStrings::new(stops),
            text: String::new(),
            prompt_tokens,
            completion_tokens: 0,
            logprobs: logprobs.then(|| Pending {
                top: usize::try_from(top).unwrap_or(0),
                ..Pending::default()
            }),
        })
    }

    /// Forwards what has arrived for one generation. Returns true when it is over.
    fn forward(&self, g: &mut Generation) -> bool {
        // The caller has gone: drop the generation now, and with it the engine's stream (its
        // sequence slot frees at the engine's next step). A non-streaming caller would
        // otherwise be noticed only at the end, when its one response fails to send.
        if g.sender.as_ref().is_none_or(ResponseSender::is_cancelled) {
            return true;
        }
        loop {
            let response = match g.engine.try_next() {
                Polled::Pending => return false,
                Polled::Ready(Ok(response)) => response,
                Polled::Ready(Err(e)) => {
                    g.end(Err(in_our_names(e)));
                    return true;
                }
                Polled::Ended => {
                    g.end(Err(Error::internal(
                        "the engine ended the stream without a finish reason",
                    )));
                    return true;
                }
            };
            match self.step(g, &response) {
                Ok(false) => {}
                Ok(true) => return true,
                Err(e) => {
                    g.end(Err(e));
                    return true;
                }
            }
        }
    }

    /// One engine response: new text out; true once the generation is over.
    fn step(&self, g: &mut Generation, response: &Response) -> Result<bool, Error> {
        let ids: Vec<u32> = response
            .output("output_ids")?
            .as_i32()?
            .iter()
            .map(|&t| u32::try_from(t).unwrap_or(0))
            .collect();
        g.completion_tokens += ids.len() as u32;
        if let Some(pending) = &mut g.logprobs {
            let values = response.output("output_log_probs")?.as_f32()?;
            if values.len() != ids.len() {
                return Err(Error::internal(format!(
                    "the engine gave {} log-probabilities for {} tokens",
                    values.len(),
                    ids.len()
                )));
            }
            pending
                .bytes
                .extend(ids.iter().map(|&id| self.text.token_bytes(id)));
            pending.logprobs.extend_from_slice(&values);
            if pending.top > 0 {
                let top_ids = response.output("output_top_log_prob_ids")?.as_i32()?;
                let top_values = response.output("output_top_log_probs")?.as_f32()?;
                let expected = ids.len() * pending.top;
                if top_ids.len() != expected || top_values.len() != expected {
                    return Err(Error::internal(format!(
                        "the engine gave {} alternatives for {} tokens of {} each",
                        top_ids.len(),
                        ids.len(),
                        pending.top
                    )));
                }
                pending.top_bytes.extend(top_ids.iter().map(|&id| {
                    u32::try_from(id).map_or_else(|_| Vec::new(), |id| self.text.token_bytes(id))
                }));
                pending.top_logprobs.extend_from_slice(&top_values);
            }
        }
        let finish = response
            .parameter("finish_reason")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        let mut delta = g
            .detokenizer
            .push(&self.text, &ids)
            .map_err(Error::internal)?;
        if finish.is_some() {
            delta.push_str(&g.detokenizer.finish(&self.text).map_err(Error::internal)?);
        }
        let (mut out, stopped) = g.stops.push(&delta);
        let finish = match (stopped, finish) {
            (true, _) => Some("stop".to_owned()),
            (false, Some(reason)) => {
                out.push_str(&g.stops.finish());
                Some(reason)
            }
            (false, None) => None,
        };
        let Some(reason) = finish else {
            if g.stream && !out.is_empty() {
                let piece = g.with_logprobs(Response::new().with_output(Tensor::from_strings(
                    "text_output",
                    [1],
                    &[out],
                )));
                let sent = g.sender.as_ref().map(|s| s.send(piece));
                // The caller has gone: drop the generation (and with it the engine's stream).
                return Ok(!matches!(sent, Some(Ok(()))));
            }
            g.text.push_str(&out);
            return Ok(false);
        };
        let text = if g.stream {
            out
        } else {
            g.text.push_str(&out);
            std::mem::take(&mut g.text)
        };
        let last = g
            .with_logprobs(Response::new())
            .with_output(Tensor::from_strings("text_output", [1], &[text]))
            .with_parameter("finish_reason", reason)
            .with_parameter("prompt_tokens", i64::from(g.prompt_tokens))
            .with_parameter("completion_tokens", i64::from(g.completion_tokens));
        g.end(Ok(last));
        Ok(true)
    }
}

impl Generation {
    /// `response` with the log-probabilities of the tokens not sent yet, if asked for.
    fn with_logprobs(&mut self, response: Response) -> Response {
        let Some(p) = self.logprobs.as_mut() else {
            return response;
        };
        let n = p.logprobs.len() as i64;
        let mut response = response
            .with_output(Tensor::from_bytes_elements(
                "token_bytes",
                [n],
                std::mem::take(&mut p.bytes),
            ))
            .with_output(Tensor::from_f32("token_logprobs", [n], &p.logprobs));
        p.logprobs.clear();
        if p.top > 0 {
            let shape = [n, p.top as i64];
            response = response
                .with_output(Tensor::from_bytes_elements(
                    "top_token_bytes",
                    shape,
                    std::mem::take(&mut p.top_bytes),
                ))
                .with_output(Tensor::from_f32(
                    "top_token_logprobs",
                    shape,
                    &p.top_logprobs,
                ));
            p.top_logprobs.clear();
        }
        response
    }

    /// Sends the final response, or the error that ends the request.
    fn end(&mut self, last: Result<Response, Error>) {
        if let Some(sender) = self.sender.take() {
            // The caller may have gone already; there is no one else to tell.
            let _ = match last {
                Ok(response) => sender.send_final(response),
                Err(e) => sender.fail(e),
            };
        }
    }
}

impl DecoupledModel for Bls {
    fn initialize(config: &ModelConfig) -> Result<Self, String> {
        let text = Text::load(Path::new(llm_text::MODEL_FILES))?;
        let engine = config
            .parameter("engine")
            .unwrap_or("tensorrt_llm")
            .to_owned();
        tessera_guest::log::info(format!("tensorrt_llm_bls ready: engine '{engine}'"));
        Ok(Bls {
            text,
            engine,
            generations: Vec::new(),
        })
    }

    fn execute(&mut self, requests: Vec<(Request, ResponseSender)>) {
        for (request, sender) in requests {
            match self.start(&request) {
                Ok(generation) => self.generations.push(Generation {
                    sender: Some(sender),
                    ..generation
                }),
                Err(e) => {
                    let _ = sender.fail(e);
                }
            }
        }
    }

    fn resume(&mut self) -> Resume {
        let mut generations = std::mem::take(&mut self.generations);
        generations.retain_mut(|g| !self.forward(g));
        self.generations = generations;
        if self.generations.is_empty() {
            Resume::Done
        } else {
            // Resumed as soon as an engine stream has more; this is only a bound.
            Resume::After(Duration::from_secs(5))
        }
    }
}

tessera_guest::export_decoupled_model!(Bls);
