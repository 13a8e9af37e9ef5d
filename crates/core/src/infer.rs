//! The inference request path's vocabulary: what every caller (HTTP, an ensemble step, a Wasm
//! handler's `infer` call) hands to an [`Inference`], and what comes back.
//!
//! [`Inference`] is how code low in the server (backends, the Wasm host, ensemble steps) calls
//! back into the request path without knowing the server: it is defined here, at the bottom, and
//! implemented at the top. Every call carries a [`CallContext`]: who is calling (the chain of
//! models waiting on this call), until when, and the trace span, kept out of the request itself.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::signature::ModelMetadata;
use crate::tensor::Tensor;

/// A request parameter (KServe v2 `parameters`).
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    Bool(bool),
    Int(i64),
    Double(f64),
    String(String),
}

/// An output the caller asked for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestedOutput {
    pub name: String,
    /// Classification extension: return the top `class_count` classes instead of the tensor.
    pub class_count: u32,
    /// Binary tensor data extension: return this output as binary (HTTP front-end only).
    pub binary: bool,
    /// System shared memory extension: the front-end writes this output into a registered
    /// region instead of the response.
    pub shared_memory: Option<SharedMemoryRef>,
}

/// A place in a registered shared-memory region (Triton's `shared_memory_region`,
/// `shared_memory_offset` and `shared_memory_byte_size` parameters).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedMemoryRef {
    pub region: String,
    pub offset: usize,
    pub byte_size: usize,
}

/// One inference request, already decoded from its wire format.
#[derive(Clone, Debug, Default)]
pub struct InferRequest {
    pub id: String,
    pub inputs: Vec<Tensor>,
    /// Empty means "every output of the model".
    pub outputs: Vec<RequestedOutput>,
    pub parameters: BTreeMap<String, ParamValue>,
    /// Scheduling priority (1 is highest); 0 means the model's default.
    pub priority: u32,
    /// Queue timeout override, honoured when the model's queue policy allows it.
    pub timeout: Option<Duration>,
}

/// The answer to one request.
#[derive(Clone, Debug, Default)]
pub struct InferResponse {
    pub model_name: String,
    pub model_version: String,
    pub id: String,
    pub outputs: Vec<Tensor>,
    pub parameters: BTreeMap<String, ParamValue>,
}

/// What went wrong, in the categories clients act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Unknown model or version.
    NotFound,
    /// The model exists but cannot serve now (not ready, unloading, queue full).
    Unavailable,
    /// The request is malformed or does not fit the model.
    InvalidArgument,
    /// A limit of the caller was hit (BLS depth or cycle, output size).
    ResourceExhausted,
    /// A deadline passed (queue timeout, execution deadline).
    Timeout,
    /// A failure inside the server or a backend (including a trapped guest).
    Internal,
    /// The request asks for what this endpoint or model does not do (one response from a
    /// decoupled model).
    Unsupported,
}

/// The longest error message a client is sent, on every protocol. Messages quote what the client
/// sent (names, shapes), and gRPC carries them in a header that clients refuse past a few KiB
/// ("stream removed"), so anything longer is cut with a note of how much was left out.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 4096;

/// `text` cut to at most `max` bytes (at a character boundary), saying how much was left out.
pub fn bounded(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let note = format!("... ({} more bytes)", text.len());
    let mut end = max.saturating_sub(note.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}... ({} more bytes)",
        &text[..end],
        text.len() - end
    ))
}

/// A failed inference, with a message meant for the client.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct InferError {
    pub kind: ErrorKind,
    pub message: String,
    /// What only the server's log should see: a guest's stderr and panic location, ONNX
    /// Runtime's own text, file paths. Logged with the request id where the request ends; sent
    /// to HTTP clients only with `--verbose-errors`, and never to guests.
    pub detail: Option<String>,
    /// When a quota refused the call: how long until a retry may succeed (HTTP `Retry-After`).
    pub retry_after: Option<Duration>,
}

impl InferError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        InferError {
            kind,
            message: message.into(),
            detail: None,
            retry_after: None,
        }
    }

    /// Attaches text for the server's log (see [`InferError::detail`]).
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    /// The error as a client sees it: with `verbose` the detail is appended; without, the
    /// message says where the detail went (the log line carries `request_id`).
    pub fn for_client(self, verbose: bool, request_id: u64) -> InferError {
        match (&self.detail, verbose) {
            (None, _) => self,
            (Some(detail), true) => InferError {
                message: format!("{}: {detail}", self.message),
                detail: None,
                ..self
            },
            (Some(_), false) => InferError {
                message: format!(
                    "{} (details in the server log, request {request_id})",
                    self.message
                ),
                detail: None,
                ..self
            },
        }
    }

    /// When a quota refused the call: whole seconds until a retry, rounded up, at least 1 (the
    /// value of HTTP's `Retry-After` and gRPC's `retry-after` metadata).
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after
            .map(|wait| (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1))
    }

    /// Prefixes the message, keeping the kind.
    pub fn context(self, prefix: impl std::fmt::Display) -> Self {
        InferError {
            message: format!("{prefix}: {}", self.message),
            ..self
        }
    }
}

pub type InferResult = Result<InferResponse, InferError>;

/// The context a request is made in: it travels beside the request through the queue to the
/// instance that runs it, and on into any call that instance makes.
#[derive(Clone, Debug)]
pub struct CallContext {
    /// The client request this call serves, for the log (a BLS call keeps its client's id).
    pub request_id: u64,
    /// Models waiting on this call, outermost first (a handler or ensemble that called it, and
    /// their callers). Empty for a client's request. Guards BLS cycles and depth.
    pub call_chain: Vec<String>,
    /// When the caller stops waiting, if it does (the execution deadline of a calling handler).
    pub deadline: Option<Instant>,
    /// A warmup request: it runs like any other but is not counted in statistics or metrics.
    pub warmup: bool,
    /// The span of the call, so work done for it is logged under it.
    pub span: tracing::Span,
    /// The tenant the client request came from (None: the operator, or a server without
    /// tenants). It stays the same through every call the request makes: quotas, fair queueing
    /// and metering follow it. Names resolve in the namespace of the innermost caller instead.
    pub tenant: Option<Arc<str>>,
    /// The size of a client's request as it arrived (its HTTP body or gRPC message), which
    /// stays in memory with it while it runs (binary tensors are slices of it); 0 for the calls
    /// a model makes.
    pub received_bytes: usize,
}

impl CallContext {
    /// A client's request: no caller, no deadline, logged under the current span.
    pub fn root() -> CallContext {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        CallContext {
            request_id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            call_chain: Vec::new(),
            deadline: None,
            warmup: false,
            span: tracing::Span::current(),
            tenant: None,
            received_bytes: 0,
        }
    }

    /// A client's request made by `tenant`.
    pub fn root_for(tenant: Option<Arc<str>>) -> CallContext {
        CallContext {
            tenant,
            ..CallContext::root()
        }
    }

    /// The namespace the names of this call resolve in: the innermost caller's owner, or for a
    /// client's request, its tenant's.
    pub fn namespace(&self) -> Option<&str> {
        match self.caller() {
            Some(caller) => crate::namespace::Caller::parse(caller).namespace(),
            None => self.tenant.as_deref(),
        }
    }

    /// The context of a call that `model` makes while serving this one.
    pub fn call_from(&self, model: &str) -> CallContext {
        let mut call_chain = self.call_chain.clone();
        call_chain.push(model.to_owned());
        CallContext {
            request_id: self.request_id,
            call_chain,
            deadline: self.deadline,
            warmup: self.warmup,
            span: self.span.clone(),
            tenant: self.tenant.clone(),
            received_bytes: 0,
        }
    }

    /// The model that made this call, if a model did.
    pub fn caller(&self) -> Option<&str> {
        self.call_chain.last().map(String::as_str)
    }
}

/// A request and the context it was made in: what a model's queue holds and what an instance
/// executes.
#[derive(Debug)]
pub struct Call {
    pub cx: CallContext,
    pub request: InferRequest,
    /// Where a decoupled model sends this request's responses (None: the model answers with
    /// the one result its instance returns).
    pub stream: Option<crate::stream::ResponseSender>,
}

/// A boxed future, as trait objects return them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The request path, as anything below the server sees it: run a model, or look one up.
///
/// Implemented by the server. Backends, the Wasm host and ensemble steps hold a
/// `Weak<dyn Inference>`, never the server itself, so they depend only on this layer.
pub trait Inference: Send + Sync + 'static {
    /// Runs `request` on `model` (`version` `None`: the newest READY version), through that
    /// model's queue.
    fn infer<'a>(
        &'a self,
        cx: CallContext,
        model: &'a str,
        version: Option<i64>,
        request: InferRequest,
    ) -> BoxFuture<'a, InferResult>;

    /// Runs `request` on `model` through its queue and returns its responses as a stream:
    /// every response of a decoupled model, the one of any other. Dropping the stream cancels
    /// the call.
    fn infer_stream<'a>(
        &'a self,
        cx: CallContext,
        model: &'a str,
        version: Option<i64>,
        request: InferRequest,
    ) -> BoxFuture<'a, Result<crate::stream::ResponseStream, InferError>>;

    /// The metadata of a READY version of `model`.
    fn metadata(
        &self,
        cx: &CallContext,
        model: &str,
        version: Option<i64>,
    ) -> Result<ModelMetadata, InferError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_bounded_at_a_character_boundary() {
        assert_eq!(bounded("short", 4096), "short");
        let long = "é".repeat(10_000);
        let cut = bounded(&long, MAX_ERROR_MESSAGE_BYTES);
        assert!(cut.len() <= MAX_ERROR_MESSAGE_BYTES, "{}", cut.len());
        assert!(cut.ends_with("more bytes)"), "{cut}");
        let kept = cut.split("...").next().map_or(0, str::len);
        assert_eq!(
            cut,
            format!("{}... ({} more bytes)", &long[..kept], long.len() - kept)
        );
    }
}
