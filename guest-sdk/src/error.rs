//! The error a handler returns for one request, and what `infer` returns when another model fails.

use std::fmt;

/// Why an inference failed. The host maps each kind to a KServe v2 status code.
///
/// Mirrors the WIT `error-kind` enum; new kinds may be added, so match with a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No model of that name or version exists (HTTP 404).
    ModelNotFound,
    /// The model exists but is not ready: loading, unloading or failed (HTTP 503).
    ModelNotReady,
    /// The request does not fit the model: names, datatypes, shapes, values (HTTP 400).
    InvalidInput,
    /// A limit of the caller was hit: BLS depth or cycle (HTTP 429).
    QuotaExceeded,
    /// A deadline passed: queue timeout or the execution deadline (HTTP 503).
    Timeout,
    /// Anything else: a bug in a handler, an unexpected host failure (HTTP 500).
    Internal,
}

impl ErrorKind {
    /// The kind's name as the WIT spells it, e.g. `"invalid-input"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::ModelNotFound => "model-not-found",
            ErrorKind::ModelNotReady => "model-not-ready",
            ErrorKind::InvalidInput => "invalid-input",
            ErrorKind::QuotaExceeded => "quota-exceeded",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed request: a [kind](ErrorKind) that picks the status code, and a message meant for the
/// client.
///
/// Build one with the constructor named after its kind:
///
/// ```
/// use tessera_guest::{Error, ErrorKind};
///
/// let err = Error::invalid_input("INPUT0 must hold 16 values");
/// assert_eq!(err.kind(), ErrorKind::InvalidInput);
/// assert_eq!(err.to_string(), "INPUT0 must hold 16 values");
/// // Context goes in front of the message and keeps the kind.
/// let err = err.context("request 'abc'");
/// assert_eq!(err.message(), "request 'abc': INPUT0 must hold 16 values");
/// ```
///
/// `Display` prints the message alone (the kind travels separately to the host); `Debug` shows
/// both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// An error of any kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// [`ErrorKind::ModelNotFound`]: no model of that name or version exists.
    pub fn model_not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::ModelNotFound, message)
    }

    /// [`ErrorKind::ModelNotReady`]: the model exists but cannot serve now.
    pub fn model_not_ready(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::ModelNotReady, message)
    }

    /// [`ErrorKind::InvalidInput`]: the request does not fit the model (HTTP 400).
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    /// [`ErrorKind::QuotaExceeded`]: a limit was hit.
    pub fn quota_exceeded(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::QuotaExceeded, message)
    }

    /// [`ErrorKind::Timeout`]: a deadline passed.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }

    /// [`ErrorKind::Internal`]: anything else (HTTP 500).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// The kind, which the host maps to a status code.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message meant for the client.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether this is an [`ErrorKind::InvalidInput`] error.
    pub fn is_invalid_input(&self) -> bool {
        self.kind == ErrorKind::InvalidInput
    }

    /// Whether this is an [`ErrorKind::ModelNotFound`] error.
    pub fn is_model_not_found(&self) -> bool {
        self.kind == ErrorKind::ModelNotFound
    }

    /// Whether this is an [`ErrorKind::QuotaExceeded`] error.
    pub fn is_quota_exceeded(&self) -> bool {
        self.kind == ErrorKind::QuotaExceeded
    }

    /// Whether this is an [`ErrorKind::Timeout`] error.
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    /// Whether this is an [`ErrorKind::Internal`] error.
    pub fn is_internal(&self) -> bool {
        self.kind == ErrorKind::Internal
    }

    /// Puts `context` in front of the message (`"{context}: {message}"`), keeping the kind.
    #[must_use]
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// The same message with another kind, e.g. to report a downstream model's
    /// `invalid-input` as this model's `internal` error.
    #[must_use]
    pub fn with_kind(mut self, kind: ErrorKind) -> Self {
        self.kind = kind;
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Adds context to the error of a `Result<T, Error>`, keeping its kind.
///
/// ```
/// use tessera_guest::{Error, ResultExt};
///
/// let r: Result<(), Error> = Err(Error::timeout("deadline passed"));
/// let r = r.context("step A (add_sub)");
/// assert_eq!(r.unwrap_err().message(), "step A (add_sub): deadline passed");
/// ```
pub trait ResultExt<T> {
    /// Prefixes the error's message with `context`.
    fn context(self, context: impl fmt::Display) -> Result<T, Error>;

    /// Prefixes the error's message with the context `f` computes, only on error.
    fn with_context<C: fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T, Error>;
}

impl<T> ResultExt<T> for Result<T, Error> {
    fn context(self, context: impl fmt::Display) -> Result<T, Error> {
        self.map_err(|e| e.context(context))
    }

    fn with_context<C: fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T, Error> {
        self.map_err(|e| e.context(f()))
    }
}
