//! The OpenAI-compatible API: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models` and `GET /v1/models/{model}`, so the official `openai` clients (and every
//! tool built on them) talk to Tessera unchanged.
//!
//! It is a front-end like the others, not a side path: a request becomes a request to the named
//! model through [`super::client_infer_stream`], the same path as gRPC and the generate
//! extension, with the caller's key, grants and quotas. The model is one that takes text and
//! streams text, the contract of the example repository's `tensorrt_llm_bls` (a sandboxed Wasm
//! handler that applies the chat template, tokenizes, runs the engine through its queue and
//! detokenizes): inputs `messages` (chat, the messages as JSON) or `text_input` (completions),
//! `max_tokens`, `stream` and the sampling inputs it declares; output `text_output`; its last
//! response's parameters carry `finish_reason`, `prompt_tokens` and `completion_tokens`.
//!
//! Streaming answers are Server-Sent Events ending with `data: [DONE]`; with
//! `stream_options.include_usage` a last chunk carries the usage. A client that goes away drops
//! the stream, which cancels the request down to the engine's sequence slot.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{Principal, Server};
use crate::infer::{ErrorKind, InferError, InferRequest, InferResponse, ParamValue};
use crate::signature::ModelMetadata;
use crate::tensor::{DataType, Tensor, TensorData};

/// Tokens generated when a request sets no `max_tokens` (chat: the model's own bound applies
/// too; completions: OpenAI's default is 16).
const DEFAULT_CHAT_MAX_TOKENS: i64 = 512;
const DEFAULT_COMPLETION_MAX_TOKENS: i64 = 16;

/// The longest chat role taken.
const MAX_ROLE_CHARS: usize = 32;

/// Whether `role` can be a chat message's role. The model's chat template renders it into the
/// prompt as it is, so it is a plain name (any: templates and clients use more than OpenAI's,
/// such as Llama's `ipython`), never text that could carry a template's markers.
fn is_role_name(role: &str) -> bool {
    (1..=MAX_ROLE_CHARS).contains(&role.len())
        && role
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// A string, or a list of them (`stop`, `prompt`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A chat message's content: text, or a list of parts of which only text is taken.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The fields of both endpoints' bodies that Tessera reads.
#[derive(Debug, Deserialize)]
struct Body {
    model: String,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    prompt: Option<OneOrMany>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    // `null` is "not set" (some SDKs send every field), as OpenAI takes it.
    #[serde(default, deserialize_with = "null_is_false")]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    stop: Option<OneOrMany>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    presence_penalty: Option<f64>,
    #[serde(default)]
    frequency_penalty: Option<f64>,
    #[serde(default)]
    seed: Option<i64>,
    // Not OpenAI's, but what vLLM and TGI take through `extra_body`.
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    min_tokens: Option<i64>,
    #[serde(default)]
    min_p: Option<f64>,
    #[serde(default)]
    repetition_penalty: Option<f64>,
    #[serde(default, deserialize_with = "null_is_false")]
    echo: bool,
    /// Chat: true or false; completions: how many alternatives (0: the chosen token only).
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    top_logprobs: Option<i64>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(default)]
    best_of: Option<i64>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    response_format: Option<Value>,
}

/// Whether `path` is one of the OpenAI API's, whose errors take OpenAI's shape.
pub fn is_openai_path(path: &str) -> bool {
    path == "/v1/chat/completions" || path == "/v1/completions" || path.starts_with("/v1/models")
}

/// A KServe error answer made before a request reaches the OpenAI handlers (a missing key, a
/// body over the limit), in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`,
/// which the `openai` client reads (`e.body["message"]`). Status and headers are kept.
pub async fn in_openai_shape(response: Response) -> Response {
    let status = response.status();
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return Response::from_parts(parts, axum::body::Body::empty());
    };
    let message = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(o)) => match o.get("error") {
            Some(Value::String(m)) => m.clone(),
            _ => return Response::from_parts(parts, axum::body::Body::from(bytes)),
        },
        _ => return Response::from_parts(parts, axum::body::Body::from(bytes)),
    };
    let (kind, code) = match status.as_u16() {
        401 => ("invalid_request_error", Value::from("invalid_api_key")),
        429 => ("rate_limit_error", Value::Null),
        400..=499 => ("invalid_request_error", Value::Null),
        _ => ("server_error", Value::Null),
    };
    let body =
        json!({ "error": { "message": message, "type": kind, "param": null, "code": code } });
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(
        parts,
        axum::body::Body::from(serde_json::to_vec(&body).unwrap_or_default()),
    )
}

fn null_is_false<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
}

/// An error in OpenAI's shape, with the status KServe errors get.
pub fn error_response(e: &InferError) -> Response {
    let (status, _) = super::error::status_of(e.kind);
    let body = json!({
        "error": {
            "message": crate::infer::bounded(&e.message, crate::infer::MAX_ERROR_MESSAGE_BYTES),
            "type": error_type(e.kind),
            "param": param_of(e),
            "code": null,
        }
    });
    let mut response = (status, axum::Json(body)).into_response();
    if let Some(seconds) = e.retry_after_secs()
        && let Ok(value) = seconds.to_string().parse()
    {
        response
            .headers_mut()
            .insert(axum::http::header::RETRY_AFTER, value);
    }
    response
}

/// The request field a refusal is about (OpenAI's `param`), when its message begins with one.
fn param_of(e: &InferError) -> Option<&'static str> {
    const FIELDS: &[&str] = &[
        "max_completion_tokens",
        "max_tokens",
        "min_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "stop",
        "n",
        "logprobs",
        "top_logprobs",
        "messages",
        "prompt",
        "stream_options",
    ];
    if e.kind != ErrorKind::InvalidArgument {
        return None;
    }
    FIELDS.iter().copied().find(|field| {
        e.message
            .strip_prefix(field)
            .is_some_and(|rest| rest.starts_with(' '))
    })
}

/// OpenAI's `type` of an error of `kind`, in an answer and in a stream's error event alike.
fn error_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidArgument | ErrorKind::Unsupported => "invalid_request_error",
        ErrorKind::NotFound => "not_found_error",
        ErrorKind::ResourceExhausted => "rate_limit_error",
        _ => "server_error",
    }
}

fn invalid(message: impl Into<String>) -> InferError {
    InferError::invalid(message)
}

fn scalar_tensor(name: &str, datatype: DataType, bytes: Vec<u8>) -> Tensor {
    Tensor::new(name, datatype, vec![1], TensorData::Raw(bytes.into()))
}

fn text_tensor(name: &str, values: Vec<Vec<u8>>) -> Tensor {
    let n = values.len() as i64;
    Tensor::new(
        name,
        DataType::Bytes,
        vec![n],
        TensorData::Elements(values.into_iter().map(Into::into).collect()),
    )
}

/// Whether `metadata`'s model takes text and streams text for `endpoint`; why not if it does not.
fn check_contract(metadata: &ModelMetadata, endpoint: Endpoint) -> Result<(), InferError> {
    let has_input = |name: &str| metadata.inputs.iter().any(|i| i.name == name);
    let prompt_input = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completions => "text_input",
    };
    let fits = has_input(prompt_input)
        && has_input("max_tokens")
        && metadata.outputs.iter().any(|o| o.name == "text_output");
    let path = match endpoint {
        Endpoint::Chat => "/v1/chat/completions",
        Endpoint::Completions => "/v1/completions",
    };
    // An ensemble's answer is its steps' outputs, without the engine's finish reason and with
    // no token counts: served, its answers would say `stop` where the token limit ended the
    // text and count zero tokens.
    if fits && metadata.platform == "ensemble" {
        return Err(InferError::invalid(format!(
            "model '{}' does not serve {path}: an ensemble does not report why generation \
             stopped nor how many tokens it took; use a model that does (tensorrt_llm_bls), or \
             this one through /v2/models/{}/generate",
            metadata.name, metadata.name
        )));
    }
    if fits {
        Ok(())
    } else {
        Err(InferError::new(
            ErrorKind::InvalidArgument,
            format!(
                "model '{}' does not serve {path}: the model needs inputs '{prompt_input}' and 'max_tokens' and output 'text_output' (as tensorrt_llm_bls has)",
                metadata.name,
            ),
        ))
    }
}

/// A parsed request: the model's request, and how to answer.
pub struct Prepared {
    pub model: String,
    pub request: InferRequest,
    pub stream: bool,
    pub include_usage: bool,
    pub endpoint: Endpoint,
    /// Answers carry each token's log-probability, with this many alternatives.
    pub logprobs: Option<u32>,
}

/// Reads a body for `endpoint` into a request of the model's text contract.
pub fn prepare(
    server: &Server,
    principal: &Principal,
    endpoint: Endpoint,
    body: &[u8],
) -> Result<Prepared, InferError> {
    let body: Body = serde_json::from_slice(body)
        .map_err(|e| invalid(format!("the request body is not a valid request: {e}")))?;
    let metadata = server.model_metadata(principal, &body.model, None)?;
    check_contract(&metadata, endpoint)?;
    // Every field the request sets that is not served, named at once.
    let unsupported: Vec<&str> = [
        ("n", body.n.is_some_and(|n| n != 1)),
        ("best_of", body.best_of.is_some_and(|n| n != 1)),
        ("echo", body.echo),
        ("suffix", body.suffix.is_some()),
        ("tools", body.tools.is_some()),
        ("response_format", body.response_format.is_some()),
    ]
    .into_iter()
    .filter_map(|(field, set)| set.then_some(field))
    .collect();
    if body.stream_options.is_some() && !body.stream {
        // OpenAI's answer too: the options are about a stream there is not.
        return Err(invalid(
            "stream_options is only allowed when stream is true",
        ));
    }
    if !unsupported.is_empty() {
        return Err(invalid(format!(
            "{} {} not supported (n and best_of only as 1)",
            unsupported.join(", "),
            if unsupported.len() == 1 { "is" } else { "are" }
        )));
    }
    let logprobs = wants_logprobs(endpoint, body.logprobs.as_ref(), body.top_logprobs)?;
    let mut inputs = Vec::new();
    match endpoint {
        Endpoint::Chat => {
            let messages = body
                .messages
                .ok_or_else(|| invalid("'messages' is required"))?;
            if messages.is_empty() {
                return Err(invalid("'messages' must not be empty"));
            }
            let mut plain = Vec::with_capacity(messages.len());
            for m in messages {
                if !is_role_name(&m.role) {
                    return Err(invalid(format!(
                        "message role '{}' must be a name of 1 to {MAX_ROLE_CHARS} letters, digits, '_' or '-' (system, user, assistant, tool...)",
                        m.role.escape_default()
                    )));
                }
                let content = match m.content {
                    None => String::new(),
                    Some(Content::Text(text)) => text,
                    Some(Content::Parts(parts)) => {
                        let mut text = String::new();
                        for part in parts {
                            if part.kind != "text" {
                                return Err(invalid(format!(
                                    "content parts of type '{}' are not supported (text only)",
                                    part.kind
                                )));
                            }
                            text.push_str(part.text.as_deref().unwrap_or_default());
                        }
                        text
                    }
                };
                plain.push(json!({ "role": m.role, "content": content }));
            }
            inputs.push(text_tensor(
                "messages",
                vec![Value::Array(plain).to_string().into_bytes()],
            ));
        }
        Endpoint::Completions => {
            let prompts = body
                .prompt
                .ok_or_else(|| invalid("'prompt' is required"))?
                .into_vec();
            let [prompt] = <[String; 1]>::try_from(prompts)
                .map_err(|_| invalid("one prompt per request (send a list of one, or a string)"))?;
            inputs.push(text_tensor("text_input", vec![prompt.into_bytes()]));
        }
    }
    let default = match endpoint {
        Endpoint::Chat => DEFAULT_CHAT_MAX_TOKENS,
        Endpoint::Completions => DEFAULT_COMPLETION_MAX_TOKENS,
    };
    let max_tokens = body
        .max_completion_tokens
        .or(body.max_tokens)
        .unwrap_or(default);
    if max_tokens < 1 {
        return Err(invalid(format!(
            "max_tokens must be at least 1, got {max_tokens}"
        )));
    }
    if max_tokens > i64::from(i32::MAX) {
        return Err(invalid(format!(
            "max_tokens {max_tokens} is more than any model's context holds"
        )));
    }
    inputs.push(scalar_tensor(
        "max_tokens",
        DataType::Int32,
        (max_tokens as i32).to_le_bytes().to_vec(),
    ));
    inputs.push(scalar_tensor(
        "stream",
        DataType::Bool,
        vec![u8::from(body.stream)],
    ));
    let has_input = |name: &str| metadata.inputs.iter().any(|i| i.name == name);
    let mut float = |name: &str, value: Option<f64>| -> Result<(), InferError> {
        if let Some(v) = value {
            if !has_input(name) {
                return Err(invalid(format!(
                    "model '{}' does not take '{name}'",
                    body.model
                )));
            }
            inputs.push(scalar_tensor(
                name,
                DataType::Fp32,
                (v as f32).to_le_bytes().to_vec(),
            ));
        }
        Ok(())
    };
    // OpenAI's default temperature is 1 (sampling); the engine's own default is greedy.
    float(
        "temperature",
        body.temperature
            .or_else(|| has_input("temperature").then_some(1.0)),
    )?;
    // OpenAI takes 0 to 1, and 0 keeps only the most likely token; the engine's `top_p` 0
    // means "off", so 0 goes to the engine as the smallest positive value (which keeps one).
    if body.top_p.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return Err(invalid(format!(
            "top_p must be between 0 and 1, got {}",
            body.top_p.unwrap_or_default()
        )));
    }
    float(
        "top_p",
        // (Also any p that would be 0 as the engine's f32.)
        body.top_p.map(|p| p.max(f64::from(f32::MIN_POSITIVE))),
    )?;
    float("presence_penalty", body.presence_penalty)?;
    float("frequency_penalty", body.frequency_penalty)?;
    float("min_p", body.min_p)?;
    float("repetition_penalty", body.repetition_penalty)?;
    if let Some(k) = body.top_k {
        let k = i32::try_from(k).map_err(|_| invalid(format!("top_k {k} is out of range")))?;
        inputs.push(scalar_tensor(
            "top_k",
            DataType::Int32,
            k.to_le_bytes().to_vec(),
        ));
    }
    if let Some(n) = body.min_tokens {
        let n = i32::try_from(n)
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| invalid(format!("min_tokens {n} is out of range")))?;
        inputs.push(scalar_tensor(
            "min_tokens",
            DataType::Int32,
            n.to_le_bytes().to_vec(),
        ));
    }
    // Without a seed each request samples differently, as OpenAI's does (the engine's own
    // default, TensorRT-LLM's, is one fixed seed).
    let seed = match body.seed {
        Some(seed) => Some(u64::try_from(seed).map_err(|_| invalid("seed must be >= 0"))?),
        None if metadata
            .inputs
            .iter()
            .any(|i| i.name == "seed" && i.datatype == DataType::Uint64) =>
        {
            getrandom::u64().ok()
        }
        None => None,
    };
    if let Some(seed) = seed {
        inputs.push(scalar_tensor(
            "seed",
            DataType::Uint64,
            seed.to_le_bytes().to_vec(),
        ));
    }
    if let Some(top) = logprobs {
        if !has_input("return_logprobs") {
            return Err(invalid(format!(
                "model '{}' does not return log-probabilities (it has no input 'return_logprobs', as tensorrt_llm_bls has)",
                body.model
            )));
        }
        inputs.push(scalar_tensor("return_logprobs", DataType::Bool, vec![1]));
        if top > 0 {
            if !has_input("top_logprobs") {
                return Err(invalid(format!(
                    "model '{}' does not return the most likely tokens (it has no input 'top_logprobs')",
                    body.model
                )));
            }
            inputs.push(scalar_tensor(
                "top_logprobs",
                DataType::Int32,
                (top as i32).to_le_bytes().to_vec(),
            ));
        }
    }
    if let Some(stop) = body.stop {
        let stops = stop.into_vec();
        if stops.len() > 4 {
            return Err(invalid("at most 4 stop sequences"));
        }
        if !stops.is_empty() {
            inputs.push(text_tensor(
                "stop",
                stops.into_iter().map(String::into_bytes).collect(),
            ));
        }
    }
    for input in &mut inputs {
        if !has_input(&input.name) {
            return Err(invalid(format!(
                "model '{}' does not take '{}'",
                body.model, input.name
            )));
        }
        // A model that batches (the TensorRT-LLM layout's ensemble) takes a batch of one.
        if metadata.batched {
            input.shape.insert(0, 1);
        }
    }
    Ok(Prepared {
        model: body.model,
        request: InferRequest {
            inputs,
            ..InferRequest::default()
        },
        stream: body.stream,
        include_usage: body.stream_options.is_some_and(|o| o.include_usage),
        endpoint,
        logprobs,
    })
}

/// Whether a request asks for the log-probabilities of the tokens it gets, and for how many
/// alternatives at each place. Chat takes `logprobs: true` and `top_logprobs` (0 to 20),
/// completions `logprobs: n` (0 to 5).
fn wants_logprobs(
    endpoint: Endpoint,
    logprobs: Option<&Value>,
    top_logprobs: Option<i64>,
) -> Result<Option<u32>, InferError> {
    match endpoint {
        Endpoint::Chat => {
            let wanted = match logprobs {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    return Err(invalid(format!(
                        "logprobs must be true or false, got {other}"
                    )));
                }
            };
            match top_logprobs {
                None => Ok(wanted.then_some(0)),
                Some(n) if !(0..=20).contains(&n) => Err(invalid(format!(
                    "top_logprobs must be from 0 to 20, got {n}"
                ))),
                Some(_) if !wanted => Err(invalid("top_logprobs needs logprobs: true")),
                Some(n) => Ok(Some(n as u32)),
            }
        }
        Endpoint::Completions => {
            if top_logprobs.is_some() {
                return Err(invalid(
                    "top_logprobs is a chat parameter; completions take logprobs: n",
                ));
            }
            match logprobs {
                None | Some(Value::Null | Value::Bool(false)) => Ok(None),
                Some(value) => value
                    .as_i64()
                    .filter(|n| (0..=5).contains(n))
                    .map(|n| Some(n as u32))
                    .ok_or_else(|| {
                        invalid(format!(
                            "logprobs must be an integer from 0 to 5, got {value}"
                        ))
                    }),
            }
        }
    }
}

/// Ids of completions: unique within this process, in OpenAI's shape.
fn completion_id(endpoint: Endpoint) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    format!("{prefix}-{nanos:x}{n:x}")
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The text, finish reason and token counts of one response of the model.
struct Piece {
    text: String,
    finish: Option<String>,
    usage: Option<(i64, i64)>,
    /// The tokens it releases, with their log-probabilities (when asked for).
    tokens: Vec<TokenLogprob>,
}

/// One generated token and its log-probability, and the most likely tokens at its place.
struct TokenLogprob {
    bytes: Vec<u8>,
    logprob: f32,
    top: Vec<TokenLogprob>,
}

impl TokenLogprob {
    /// The token as text: a token holding part of a character shows U+FFFD for it, as OpenAI's
    /// do; `bytes` has it whole.
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// The log-probability as JSON can carry it: an impossible token (-inf, which JSON has
    /// no number for) as OpenAI writes it, -9999.
    fn value(&self) -> f32 {
        if self.logprob.is_finite() {
            self.logprob
        } else {
            -9999.0
        }
    }
}

/// Tokens from the BYTES elements of one output and the FP32 log-probabilities of another,
/// when both are there.
fn paired(
    response: &InferResponse,
    bytes_name: &str,
    values_name: &str,
) -> Result<Option<Vec<TokenLogprob>>, InferError> {
    let output = |name: &str| response.outputs.iter().find(|t| t.name == name);
    match (output(bytes_name), output(values_name)) {
        (None, None) => Ok(None),
        (
            Some(Tensor {
                data: TensorData::Elements(bytes),
                ..
            }),
            Some(values),
        ) if values.datatype == DataType::Fp32 => {
            let values = values.to_f64_vec().unwrap_or_default();
            if bytes.len() != values.len() {
                return Err(InferError::internal(format!(
                    "{} elements in {bytes_name}, {} in {values_name}",
                    bytes.len(),
                    values.len()
                )));
            }
            Ok(Some(
                bytes
                    .iter()
                    .zip(values)
                    .map(|(b, logprob)| TokenLogprob {
                        bytes: b.to_vec(),
                        logprob: logprob as f32,
                        top: Vec::new(),
                    })
                    .collect(),
            ))
        }
        _ => Err(InferError::internal(format!(
            "{bytes_name} (BYTES) and {values_name} (FP32) must come together"
        ))),
    }
}

/// The tokens of a response with their log-probabilities (`token_bytes`, `token_logprobs`) and
/// alternatives (`top_token_bytes`, `top_token_logprobs`, as many per token).
fn token_logprobs(response: &InferResponse) -> Result<Vec<TokenLogprob>, InferError> {
    let Some(mut tokens) = paired(response, "token_bytes", "token_logprobs")? else {
        return Ok(Vec::new());
    };
    if let Some(alternatives) = paired(response, "top_token_bytes", "top_token_logprobs")?
        && !tokens.is_empty()
    {
        if alternatives.len() % tokens.len() != 0 {
            return Err(InferError::internal(format!(
                "{} alternatives for {} tokens",
                alternatives.len(),
                tokens.len()
            )));
        }
        let per_token = alternatives.len() / tokens.len();
        let mut alternatives = alternatives.into_iter();
        for token in &mut tokens {
            token.top = alternatives.by_ref().take(per_token).collect();
        }
    }
    Ok(tokens)
}

/// Where tokens begin in a completion's text, in characters (completions' `text_offset`). A
/// byte-level token can hold part of a character: the character counts once, when its last
/// byte comes, and a token that begins inside it begins at it.
#[derive(Default)]
struct TextOffset {
    /// Characters complete so far.
    chars: usize,
    /// The first bytes of a character not complete yet.
    partial: Vec<u8>,
}

impl TextOffset {
    /// Where a token holding `bytes` begins, and moves past it.
    fn advance(&mut self, bytes: &[u8]) -> usize {
        let begins = self.chars;
        self.partial.extend_from_slice(bytes);
        let mut rest = self.partial.as_slice();
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    self.chars += text.chars().count();
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    self.chars += std::str::from_utf8(valid).map_or(0, |t| t.chars().count());
                    match e.error_len() {
                        // Not UTF-8: one replacement character, as the text shows it.
                        Some(bad) => {
                            self.chars += 1;
                            rest = &after[bad..];
                        }
                        // A character still to be completed by the next tokens.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.partial = rest.to_vec();
        begins
    }
}

/// OpenAI's `logprobs` of a choice holding `tokens`; `offset` is where the first one begins in
/// the completion's text and moves past them.
fn logprobs_json(endpoint: Endpoint, tokens: &[TokenLogprob], offset: &mut TextOffset) -> Value {
    match endpoint {
        Endpoint::Chat => json!({
            "content": tokens
                .iter()
                .map(|t| json!({
                    "token": t.text(),
                    "logprob": t.value(),
                    "bytes": t.bytes,
                    "top_logprobs": t.top.iter().map(|a| json!({
                        "token": a.text(),
                        "logprob": a.value(),
                        "bytes": a.bytes,
                    })).collect::<Vec<_>>(),
                }))
                .collect::<Vec<_>>(),
            "refusal": null,
        }),
        Endpoint::Completions => {
            let mut offsets = Vec::with_capacity(tokens.len());
            for t in tokens {
                offsets.push(offset.advance(&t.bytes));
            }
            json!({
                "tokens": tokens.iter().map(TokenLogprob::text).collect::<Vec<_>>(),
                "token_logprobs": tokens.iter().map(TokenLogprob::value).collect::<Vec<_>>(),
                // One map per token, as OpenAI's: the chosen token always, beside the n most
                // likely (so up to n + 1); tokens whose text is the same (parts of different
                // characters) keep the first.
                "top_logprobs": tokens
                    .iter()
                    .map(|t| {
                        let mut top = serde_json::Map::new();
                        for a in std::iter::once(t).chain(&t.top) {
                            top.entry(a.text()).or_insert_with(|| json!(a.value()));
                        }
                        Value::Object(top)
                    })
                    .collect::<Vec<_>>(),
                "text_offset": offsets,
            })
        }
    }
}

fn piece(response: &InferResponse) -> Result<Piece, InferError> {
    let text = match response.outputs.iter().find(|t| t.name == "text_output") {
        Some(Tensor {
            data: TensorData::Elements(items),
            ..
        }) => items
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect(),
        Some(_) => return Err(InferError::internal("text_output is not BYTES")),
        None => String::new(),
    };
    let param = |key: &str| response.parameters.get(key);
    let finish = match param("finish_reason") {
        Some(ParamValue::String(reason)) => Some(reason.clone()),
        _ => None,
    };
    let count = |key: &str| match param(key) {
        Some(ParamValue::Int(n)) => Some(*n),
        _ => None,
    };
    let usage = count("prompt_tokens").zip(count("completion_tokens"));
    Ok(Piece {
        text,
        finish,
        usage,
        tokens: token_logprobs(response)?,
    })
}

fn usage_json(usage: Option<(i64, i64)>) -> Value {
    let (prompt, completion) = usage.unwrap_or((0, 0));
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// The one JSON answer of a request that does not stream.
pub async fn complete(prepared: &Prepared, mut stream: super::ClientStream) -> Response {
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    let mut tokens = Vec::new();
    while let Some(message) = stream.stream.next().await {
        match message.result {
            Some(Ok(response)) => match piece(&response) {
                Ok(p) => {
                    text.push_str(&p.text);
                    finish = p.finish.or(finish);
                    usage = p.usage.or(usage);
                    tokens.extend(p.tokens);
                }
                Err(e) => return error_response(&e),
            },
            Some(Err(e)) => return error_response(&e),
            None => {}
        }
    }
    let finish = finish.unwrap_or_else(|| "stop".into());
    let logprobs = if prepared.logprobs.is_some() {
        logprobs_json(prepared.endpoint, &tokens, &mut TextOffset::default())
    } else {
        Value::Null
    };
    let choice = match prepared.endpoint {
        Endpoint::Chat => json!({
            "index": 0,
            "message": { "role": "assistant", "content": text },
            "finish_reason": finish,
            "logprobs": logprobs,
        }),
        Endpoint::Completions => json!({
            "index": 0,
            "text": text,
            "finish_reason": finish,
            "logprobs": logprobs,
        }),
    };
    let object = match prepared.endpoint {
        Endpoint::Chat => "chat.completion",
        Endpoint::Completions => "text_completion",
    };
    axum::Json(json!({
        "id": completion_id(prepared.endpoint),
        "object": object,
        "created": now_secs(),
        "model": prepared.model,
        "choices": [choice],
        "usage": usage_json(usage),
    }))
    .into_response()
}

/// The Server-Sent Events of a streaming request, ending with `data: [DONE]`. The status waits
/// for the pipeline's first message: a request that the sandboxed pre-processing or the engine
/// refuses (a prompt over the context, say) is answered with its status (400), as OpenAI answers,
/// not with a 200 stream that holds the error.
pub async fn events(prepared: &Prepared, mut stream: super::ClientStream) -> Response {
    let head = match stream.stream.next().await {
        Some(crate::stream::StreamMessage {
            result: Some(Err(e)),
            ..
        }) => return error_response(&e),
        head => head,
    };
    let endpoint = prepared.endpoint;
    let include_usage = prepared.include_usage;
    let with_logprobs = prepared.logprobs.is_some();
    let id = completion_id(endpoint);
    let created = now_secs();
    let model = prepared.model.clone();
    let chunk = move |delta: Value, finish: Option<&str>, logprobs: Value| -> Value {
        match endpoint {
            Endpoint::Chat => json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{ "index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs }],
            }),
            Endpoint::Completions => json!({
                "id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{
                    "index": 0,
                    "text": delta.get("content").and_then(Value::as_str).unwrap_or_default(),
                    "finish_reason": finish,
                    "logprobs": logprobs,
                }],
            }),
        }
    };
    enum State {
        /// The stream, and its first message, already read.
        Start(
            crate::stream::ResponseStream,
            Option<crate::stream::StreamMessage>,
        ),
        Running(crate::stream::ResponseStream),
        Done,
    }
    let first = match endpoint {
        Endpoint::Chat => Some(chunk(
            json!({ "role": "assistant", "content": "" }),
            None,
            Value::Null,
        )),
        Endpoint::Completions => None,
    };
    // The state: where the stream is, the first chunk still to send, and (completions'
    // `text_offset`) how many characters the tokens sent so far hold.
    let events = futures::stream::unfold(
        (State::Start(stream.stream, head), first, TextOffset::default()),
        move |(state, first, mut offset)| {
            let chunk = chunk.clone();
            async move {
                let (mut stream, head) = match state {
                    State::Done => return None,
                    State::Start(stream, head) => {
                        if let Some(first) = first {
                            return Some((
                                vec![first.to_string()],
                                (State::Start(stream, head), None, offset),
                            ));
                        }
                        (stream, Some(head))
                    }
                    State::Running(stream) => (stream, None),
                };
                let next = match head {
                    Some(head) => head,
                    None => stream.next().await,
                };
                let Some(message) = next else {
                    return Some((vec!["[DONE]".to_owned()], (State::Done, None, offset)));
                };
                let mut out = Vec::new();
                match message.result.map(|r| r.and_then(|response| piece(&response))) {
                    Some(Ok(p)) => {
                        // Tokens that end generation may release no text: they still go out.
                        if !p.text.is_empty() || (with_logprobs && !p.tokens.is_empty()) {
                            let logprobs = if with_logprobs {
                                logprobs_json(endpoint, &p.tokens, &mut offset)
                            } else {
                                Value::Null
                            };
                            out.push(
                                chunk(json!({ "content": p.text }), None, logprobs).to_string(),
                            );
                        }
                        if let Some(reason) = &p.finish {
                            let mut last = chunk(json!({}), Some(reason), Value::Null);
                            if let (Endpoint::Completions, Some(c)) =
                                (endpoint, last["choices"][0].as_object_mut())
                            {
                                c.insert("text".into(), json!(""));
                            }
                            out.push(last.to_string());
                            if include_usage {
                                let mut usage = chunk(json!({}), None, Value::Null);
                                usage["choices"] = json!([]);
                                usage["usage"] = usage_json(p.usage);
                                out.push(usage.to_string());
                            }
                        }
                    }
                    Some(Err(e)) => {
                        out.push(
                            json!({ "error": {
                                "message": crate::infer::bounded(&e.message, crate::infer::MAX_ERROR_MESSAGE_BYTES),
                                "type": error_type(e.kind),
                            }})
                            .to_string(),
                        );
                    }
                    None => {}
                }
                Some((out, (State::Running(stream), None, offset)))
            }
        },
    )
    .flat_map(|datas| {
        futures::stream::iter(
            datas
                .into_iter()
                .map(|data| Ok::<_, std::convert::Infallible>(Event::default().data(data))),
        )
    });
    Sse::new(events).into_response()
}

/// `GET /v1/models`: the ready models that serve the chat or completions endpoint.
pub fn models(server: &Server, principal: &Principal) -> Response {
    let mut seen = BTreeMap::new();
    for row in server.repository_index(principal, true) {
        if seen.contains_key(&row.name) {
            continue;
        }
        let Ok(metadata) = server.model_metadata(principal, &row.name, None) else {
            continue;
        };
        let serves = check_contract(&metadata, Endpoint::Chat).is_ok()
            || check_contract(&metadata, Endpoint::Completions).is_ok();
        if serves {
            seen.insert(row.name.clone(), model_json(&row.name));
        }
    }
    axum::Json(json!({ "object": "list", "data": seen.into_values().collect::<Vec<_>>() }))
        .into_response()
}

/// `GET /v1/models/{model}`.
pub fn model(server: &Server, principal: &Principal, name: &str) -> Response {
    let serves = server.model_metadata(principal, name, None).is_ok_and(|m| {
        check_contract(&m, Endpoint::Chat).is_ok()
            || check_contract(&m, Endpoint::Completions).is_ok()
    });
    if serves {
        axum::Json(model_json(name)).into_response()
    } else {
        error_response(&InferError::not_found(format!(
            "The model '{name}' does not exist"
        )))
    }
}

fn model_json(name: &str) -> Value {
    json!({ "id": name, "object": "model", "created": 0, "owned_by": "tessera" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn errors_have_openais_shape() {
        let response = error_response(&InferError::invalid("bad"));
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let quota = InferError {
            retry_after: Some(std::time::Duration::from_secs(3)),
            ..InferError::new(ErrorKind::ResourceExhausted, "over quota")
        };
        let response = error_response(&quota);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[axum::http::header::RETRY_AFTER], "3");
    }

    #[test]
    fn a_refusal_names_the_field_it_is_about() {
        let param = |message: &str| param_of(&InferError::invalid(message));
        assert_eq!(param("top_p must be in (0, 1], got 2"), Some("top_p"));
        assert_eq!(param("top_k must be a whole number"), Some("top_k"));
        assert_eq!(
            param("n and best_of other than 1 are not supported"),
            Some("n")
        );
        assert_eq!(param("the prompt of 3001 tokens"), None);
        assert_eq!(param_of(&InferError::internal("top_p went wrong")), None);
    }

    #[test]
    fn a_character_split_over_tokens_counts_once_in_text_offsets() {
        let mut offset = TextOffset::default();
        let text = "a语b";
        let bytes = text.as_bytes();
        // "a", the first byte of 语, its last two with "b", then "!".
        let tokens: [&[u8]; 4] = [&bytes[..1], &bytes[1..2], &bytes[2..], b"!"];
        let offsets: Vec<usize> = tokens.iter().map(|t| offset.advance(t)).collect();
        assert_eq!(offsets, [0, 1, 1, 3]);
        assert_eq!(offset.chars, text.chars().count() + 1);
        // Bytes that are not UTF-8 are one replacement character each, as the text shows them.
        let mut offset = TextOffset::default();
        assert_eq!(offset.advance(b"\xff"), 0);
        assert_eq!(offset.advance(b"x"), 1);
        assert_eq!(offset.advance(b""), 2);
    }
}
