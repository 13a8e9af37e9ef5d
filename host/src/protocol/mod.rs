//! Protocol front-ends: decode a request, call [`crate::api::Server::infer`], encode the answer.
//!
//! Every client front-end runs the same inference step, [`client_infer`]; only decoding and
//! encoding differ between protocols.
//!
//! - [`kserve`]: the KServe v2 request/response bodies (JSON and the binary extension).
//! - [`http`]: KServe v2 over HTTP/REST.
//! - [`grpc`]: KServe v2 over gRPC.
//! - [`generate`]: Triton's generate extension (`/generate`, `/generate_stream` with SSE).
//! - [`openai`]: the OpenAI-compatible API (`/v1/chat/completions`, `/v1/completions`,
//!   `/v1/models`).
//! - [`error`]: the one error type both answer with.
//! - [`listen`]: accepting and closing connections within bounds (timeouts, limits, drain).

pub mod error;
pub mod generate;
pub mod grpc;
pub mod grpc_codec;
pub mod http;
pub mod listen;
pub mod openai;
pub use error::ApiError;
pub use tessera_core::kserve;

use std::collections::BTreeMap;

use crate::api::Principal;
use crate::api::Server;
use crate::infer::{CallContext, InferError, InferRequest, InferResponse, ParamValue};
use crate::infer::{RequestedOutput, SharedMemoryRef};
use crate::stream::ResponseStream;
use kserve::{NoSharedMemory, RegionReader};

/// What a client asked to run, and the W3C trace context it sent.
pub struct ClientRequest<'a> {
    pub model: &'a str,
    pub version: Option<i64>,
    pub trace: TraceContext,
    /// The request's size as it arrived (its body or message): see
    /// [`CallContext::received_bytes`].
    pub received_bytes: usize,
}

/// A client's W3C trace context (`traceparent`, `tracestate` headers or gRPC metadata).
#[derive(Clone, Debug, Default)]
pub struct TraceContext {
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// From HTTP headers or gRPC metadata, read as headers.
    pub fn from_headers(headers: &axum::http::HeaderMap) -> TraceContext {
        let text = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        TraceContext {
            traceparent: text("traceparent"),
            tracestate: text("tracestate"),
        }
    }

    /// The root span of a client's inference, a child of the client's trace when it sent one.
    pub fn request_span(&self, model: &str, request_id: u64) -> tracing::Span {
        let span = tracing::debug_span!(
            target: crate::telemetry::TARGET,
            parent: None,
            "request",
            model,
            request_id
        );
        self.follow(span)
    }

    /// The root span of a function invocation.
    pub fn function_span(&self, function: &str, request_id: u64) -> tracing::Span {
        let span = tracing::debug_span!(
            target: crate::telemetry::TARGET,
            parent: None,
            "function",
            function,
            request_id
        );
        self.follow(span)
    }

    fn follow(&self, span: tracing::Span) -> tracing::Span {
        crate::telemetry::follow_client(
            &span,
            self.traceparent.as_deref(),
            self.tracestate.as_deref(),
        );
        span
    }
}

/// What a client front-end gets back from [`client_infer`].
pub struct ClientAnswer {
    pub response: InferResponse,
    /// The outputs written to shared memory: name, region, bytes written.
    pub placed: Vec<(String, String, usize)>,
    /// What the request asked of its outputs (HTTP's binary flags, classification).
    pub requested: Vec<RequestedOutput>,
    /// The request's own parameters (HTTP's `binary_data_output`).
    pub parameters: BTreeMap<String, ParamValue>,
}

/// The one inference step of every client front-end: `decode` reads the request with the
/// principal's shared-memory regions (the operator's only), the request runs on the single request
/// path ([`Server::infer`]) as a root call of the principal, internal details stay in the log
/// unless `verbose_errors`, and outputs asked in shared memory are written there.
pub async fn client_infer(
    server: &Server,
    principal: &Principal,
    request: ClientRequest<'_>,
    verbose_errors: bool,
    decode: impl FnOnce(&dyn RegionReader) -> Result<InferRequest, InferError>,
) -> Result<ClientAnswer, InferError> {
    let ClientRequest {
        model,
        version,
        trace,
        received_bytes,
    } = request;
    let shm = server.shared_memory(principal);
    let regions: &dyn RegionReader = match shm {
        Some(shm) => shm,
        None => &NoSharedMemory,
    };
    let request = decode(regions)?;
    let in_shared_memory: Vec<(String, SharedMemoryRef)> =
        crate::api::requested_outputs(&request.outputs);
    let (requested, parameters) = (request.outputs.clone(), request.parameters.clone());
    let (mut cx, request_id) = root_context(principal, &trace, model);
    cx.received_bytes = received_bytes;
    let response = server
        .infer(cx, model, version, request)
        .await
        .map_err(|e| e.for_client(verbose_errors, request_id))?;
    let placed = crate::api::write_outputs(shm, &in_shared_memory, &response.outputs)?;
    Ok(ClientAnswer {
        response,
        placed,
        requested,
        parameters,
    })
}

/// The context of a client's request: a root call of the principal, traced under the client's
/// trace context.
fn root_context(principal: &Principal, trace: &TraceContext, model: &str) -> (CallContext, u64) {
    let mut cx = CallContext::root_for(principal.tenant());
    let request_id = cx.request_id;
    cx.span = trace.request_span(model, request_id);
    (cx, request_id)
}

/// What a streaming front-end gets back from [`client_infer_stream`].
pub struct ClientStream {
    /// The responses: every one a decoupled model sends, or the one of any other model.
    pub stream: ResponseStream,
    /// The request's own parameters (gRPC's `triton_enable_empty_final_response`).
    pub parameters: BTreeMap<String, ParamValue>,
    /// What the request asked of its outputs (HTTP's binary flags).
    pub requested: Vec<RequestedOutput>,
    /// The request id, for errors' "details in the server log" note.
    pub request_id: u64,
}

/// The streaming counterpart of [`client_infer`]: the same decoding and request path
/// ([`Server::infer_stream`]), answered by a stream. Shared-memory inputs are read; outputs
/// come back in the responses (a streamed response is never written to a region).
pub async fn client_infer_stream(
    server: &Server,
    principal: &Principal,
    request: ClientRequest<'_>,
    verbose_errors: bool,
    decode: impl FnOnce(&dyn RegionReader) -> Result<InferRequest, InferError>,
) -> Result<ClientStream, InferError> {
    let ClientRequest {
        model,
        version,
        trace,
        received_bytes,
    } = request;
    let regions: &dyn RegionReader = match server.shared_memory(principal) {
        Some(shm) => shm,
        None => &NoSharedMemory,
    };
    let request = decode(regions)?;
    if let Some(output) = request.outputs.iter().find(|o| o.shared_memory.is_some()) {
        return Err(InferError::invalid(format!(
            "output '{}' is asked in shared memory, which a streamed response does not use",
            output.name
        )));
    }
    let (requested, parameters) = (request.outputs.clone(), request.parameters.clone());
    let (mut cx, request_id) = root_context(principal, &trace, model);
    cx.received_bytes = received_bytes;
    let stream = server
        .infer_stream(cx, model, version, request)
        .await
        .map_err(|e| e.for_client(verbose_errors, request_id))?;
    Ok(ClientStream {
        stream,
        parameters,
        requested,
        request_id,
    })
}
