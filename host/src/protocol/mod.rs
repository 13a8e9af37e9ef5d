//! Protocol front-ends: decode a request, call [`crate::server::Server::infer`], encode the answer.
//!
//! - [`kserve`]: the KServe v2 request/response bodies (JSON and the binary extension).
//! - [`http`]: KServe v2 over HTTP/REST.
//! - [`grpc`]: KServe v2 over gRPC.
//! - [`listen`]: accepting and closing connections within bounds (timeouts, limits, drain).

pub mod grpc;
pub mod http;
pub mod listen;
pub use tessera_core::kserve;

use axum::http::StatusCode;

use crate::infer::ErrorKind;

/// The HTTP status Triton uses for each kind of error.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Unavailable | ErrorKind::Timeout => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorKind::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
