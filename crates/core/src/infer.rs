//! The inference request path's vocabulary: what every front-end (HTTP, an ensemble step, a Wasm
//! handler's `infer` call) hands to [`crate::server::Server::infer`], and what comes back.

use std::collections::BTreeMap;
use std::time::Duration;

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
    /// Models this request was issued from by BLS calls, outermost first; guards cycles and depth.
    pub call_chain: Vec<String>,
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
}

/// A failed inference, with a message meant for the client.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct InferError {
    pub kind: ErrorKind,
    pub message: String,
}

impl InferError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        InferError {
            kind,
            message: message.into(),
        }
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
    /// Prefixes the message, keeping the kind.
    pub fn context(self, prefix: impl std::fmt::Display) -> Self {
        InferError {
            kind: self.kind,
            message: format!("{prefix}: {}", self.message),
        }
    }
}

pub type InferResult = Result<InferResponse, InferError>;
