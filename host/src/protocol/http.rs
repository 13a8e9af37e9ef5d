//! KServe v2 over HTTP/REST (with Triton's extensions: model configuration, statistics,
//! repository index, binary tensor data, classification).

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post, put};
use serde_json::{Value, json};

use super::ApiError;
use super::kserve::{Placement, decode_request_with, encode_response_placed};
use super::listen::{RESPONSE_SLICE_BYTES, WrittenBody};
use crate::api::Principal;
use crate::api::{ControlError, LoadOutcome};
use crate::api::{Deployed, FunctionError, LoadRequest, Server};
use crate::config;
use crate::infer::{CallContext, ErrorKind, InferError, ParamValue};
use crate::limits::ByteBudget;
use crate::signature::TensorSpec;

const HEADER_LENGTH: &str = "inference-header-content-length";

/// Extensions this server implements, as `GET /v2` lists them.
pub const EXTENSIONS: &[&str] = &[
    "classification",
    "binary_tensor_data",
    "model_configuration",
    "statistics",
    "model_repository",
    "system_shared_memory",
];

#[derive(Clone)]
struct AppState {
    server: Arc<Server>,
    max_body: usize,
    verbose_errors: bool,
    /// Request bodies being read at once (`--http-max-buffered-bytes`, shared with gRPC).
    reading: ByteBudget,
}

/// The HTTP routes. `max_body` bounds a request body in bytes, `reading` all the bodies
/// being read at once; `verbose_errors` sends internal error details to clients
/// (`--verbose-errors`).
pub fn router(
    server: Arc<Server>,
    max_body: usize,
    reading: ByteBudget,
    verbose_errors: bool,
) -> Router {
    let state = AppState {
        server,
        max_body,
        verbose_errors,
        reading,
    };
    let held = || axum::middleware::from_fn_with_state(state.clone(), hold_response);
    let held_kserve = || axum::middleware::from_fn_with_state(state.clone(), hold_kserve_response);
    let held_openai = || axum::middleware::from_fn_with_state(state.clone(), hold_openai_response);
    // Compression as Triton's HTTP front-end does it, on the inference APIs: request bodies
    // sent with `Content-Encoding: gzip|deflate` are read decompressed (within
    // --http-max-input-size), and inference answers are compressed when the client's
    // `Accept-Encoding` asks ([`CompressibleAnswer`]). The compressor wraps `hold_response`,
    // so that an answer waiting for it, and for the client, stays in the budget: it takes the
    // answer a slice at a time. Functions' bodies are their own business and pass as they are.
    let inference = kserve_routes()
        .layer(held_kserve())
        .merge(openai_routes().layer(held_openai()))
        .layer(
            tower_http::decompression::RequestDecompressionLayer::new()
                .gzip(true)
                .deflate(true)
                // Refused by `hold`, in the API's own error shape.
                .pass_through_unaccepted(true),
        )
        .layer(
            tower_http::compression::CompressionLayer::new()
                .gzip(true)
                .deflate(true)
                .compress_when(
                    |_: StatusCode,
                     _: axum::http::Version,
                     _: &HeaderMap,
                     extensions: &axum::http::Extensions| {
                        extensions.get::<CompressibleAnswer>().is_some()
                    },
                ),
        );
    // Who may call what is read here, not from where layers sit between routes: every route
    // but health needs a key once tenancy is on.
    let needs_key = inference.merge(function_routes().layer(held())).layer(
        axum::middleware::from_fn_with_state(state.clone(), authenticate),
    );
    needs_key
        .merge(health_routes().layer(held()))
        .layer(axum::middleware::from_fn(close_when_body_unread))
        .with_state(state)
}

/// Holds every response's large frames in the budget for buffered bytes until the connection
/// has taken them ([`WrittenBody`]); a response known whole that does not fit is a 503.
async fn hold_response(
    State(s): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    hold(s, request, next, Api::Other).await
}

/// The routes whose responses [`hold`] holds, for the shape of a refusal.
#[derive(Clone, Copy, PartialEq)]
enum Api {
    /// KServe v2, whose request bodies may be compressed.
    Kserve,
    /// OpenAI's, whose bodies may be compressed and whose errors have its shape.
    OpenAi,
    /// Functions (their bodies are their own business) and health.
    Other,
}

/// [`hold_response`] for the KServe routes.
async fn hold_kserve_response(
    State(s): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    hold(s, request, next, Api::Kserve).await
}

/// A body sent with a `Content-Encoding` the server does not read: 415 in the API's own error
/// shape, naming it.
fn unsupported_encoding(encoding: &HeaderValue, openai: bool) -> Response {
    let message = format!(
        "the request body's Content-Encoding '{}' is not supported: send it as it is, or \
         compressed with gzip or deflate",
        String::from_utf8_lossy(encoding.as_bytes())
    );
    let body = if openai {
        json!({ "error": { "message": message, "type": "invalid_request_error",
                           "param": null, "code": null } })
    } else {
        json!({ "error": message })
    };
    (StatusCode::UNSUPPORTED_MEDIA_TYPE, axum::Json(body)).into_response()
}

/// [`hold_response`] for the OpenAI routes, whose refusals have OpenAI's error shape.
async fn hold_openai_response(
    State(s): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    hold(s, request, next, Api::OpenAi).await
}

async fn hold(
    s: AppState,
    request: axum::extract::Request,
    next: axum::middleware::Next,
    api: Api,
) -> Response {
    let openai = api == Api::OpenAi;
    // The decompressor removed the encodings it read and passed the others on.
    if api != Api::Other
        && let Some(encoding) = request.headers().get(header::CONTENT_ENCODING)
        && encoding != "identity"
    {
        return unsupported_encoding(encoding, openai);
    }
    let (parts, body) = next.run(request).await.into_parts();
    let body = match http_body::Body::size_hint(&body).exact() {
        Some(size) if size > RESPONSE_SLICE_BYTES as u64 => {
            match WrittenBody::prepaid(body, s.reading.clone(), size as usize) {
                Ok(held) => Body::new(held),
                Err((_, over)) => {
                    tracing::warn!("{over}");
                    let error = InferError::unavailable(over.to_string());
                    let mut refused = if openai {
                        super::openai::error_response(&error)
                    } else {
                        error_response(error)
                    };
                    refused
                        .headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    return refused;
                }
            }
        }
        _ => Body::new(WrittenBody::new(body, s.reading.clone())),
    };
    Response::from_parts(parts, body)
}

/// An answer given without reading the request's body (a 401, an unknown route, a refusal
/// before the body was needed) ends the connection: hyper closes a connection whose body was
/// left unread, and the client must know it then, with `Connection: close`, rather than find
/// it out by writing its next request into a closed socket. Functions read their bodies as
/// they stream, after their answer may have started: they are left out.
async fn close_when_body_unread(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use http_body::Body as _;
    if request.body().is_end_stream() || request.uri().path().starts_with("/v1/functions/") {
        return next.run(request).await;
    }
    let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let request = request.map(|inner| {
        Body::new(ReadToEnd {
            inner,
            ended: ended.clone(),
        })
    });
    let mut response = next.run(request).await;
    if !ended.load(std::sync::atomic::Ordering::Relaxed) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that notes when it has been read to its end.
struct ReadToEnd {
    inner: Body,
    ended: Arc<std::sync::atomic::AtomicBool>,
}

impl http_body::Body for ReadToEnd {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None)) || self.inner.is_end_stream() {
            self.ended.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// KServe v2 and Triton's extensions, the admin API: every error answer has a KServe body.
fn kserve_routes() -> Router<AppState> {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/models/stats", get(all_stats))
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/repository/models/{model}/load", post(load_model))
        .route("/v2/repository/models/{model}/unload", post(unload_model))
        .route(
            "/v2/repository/models/{model}/rollback",
            post(rollback_model),
        )
        .route(
            "/v2/repository/functions/{function}/load",
            post(load_function),
        )
        .route(
            "/v2/repository/functions/{function}/unload",
            post(unload_function),
        )
        .route(
            "/v2/repository/functions/{function}/rollback",
            post(rollback_function),
        )
        .route("/v2/models/{model}", get(model_metadata))
        .route("/v2/models/{model}/ready", get(model_ready))
        .route("/v2/models/{model}/config", get(model_config))
        .route("/v2/models/{model}/stats", get(model_stats))
        .route("/v2/models/{model}/infer", post(infer))
        .route("/v2/models/{model}/versions/{version}", get(model_metadata))
        .route(
            "/v2/models/{model}/versions/{version}/ready",
            get(model_ready),
        )
        .route(
            "/v2/models/{model}/versions/{version}/config",
            get(model_config),
        )
        .route(
            "/v2/models/{model}/versions/{version}/stats",
            get(model_stats),
        )
        .route("/v2/models/{model}/versions/{version}/infer", post(infer))
        .route("/v2/models/{model}/generate", post(generate))
        .route("/v2/models/{model}/generate_stream", post(generate_stream))
        .route(
            "/v2/models/{model}/versions/{version}/generate",
            post(generate),
        )
        .route(
            "/v2/models/{model}/versions/{version}/generate_stream",
            post(generate_stream),
        )
        .route("/v2/systemsharedmemory/status", get(shm_status_all))
        .route(
            "/v2/systemsharedmemory/region/{region}/status",
            get(shm_status_one),
        )
        .route(
            "/v2/systemsharedmemory/region/{region}/register",
            post(shm_register),
        )
        .route(
            "/v2/systemsharedmemory/unregister",
            post(shm_unregister_all),
        )
        .route(
            "/v2/systemsharedmemory/region/{region}/unregister",
            post(shm_unregister_one),
        )
        .route("/v2/cudasharedmemory/status", get(cuda_status))
        .route("/v2/cudasharedmemory/unregister", post(cuda_unregister_all))
        .route("/v2/cudasharedmemory/{*rest}", any(cuda_unsupported))
        .route("/v1/tenants", get(list_tenants).post(create_tenant))
        .route(
            "/v1/tenants/{tenant}",
            get(show_tenant).delete(delete_tenant),
        )
        .route("/v1/tenants/{tenant}/keys", post(issue_key))
        .route("/v1/tenants/{tenant}/keys/{id}", delete(revoke_key))
        .route("/v1/tenants/{tenant}/quotas", put(set_quotas))
        .route(
            "/v1/tenants/{tenant}/grants/{model}",
            post(grant_model).delete(revoke_grant),
        )
        .fallback(not_found)
        // The infer handler enforces the limit itself, with a KServe error body.
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::map_response(kserve_error_body))
}

/// Functions: their answers reach the principal as the function wrote them.
/// The OpenAI-compatible API ([`super::openai`]).
fn openai_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions", post(openai_chat))
        .route("/v1/completions", post(openai_completions))
        .route("/v1/models", get(openai_models))
        .route("/v1/models/{model}", get(openai_model))
}

async fn openai_chat(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    openai_run(
        &s,
        &principal,
        super::openai::Endpoint::Chat,
        &headers,
        body,
    )
    .await
}

async fn openai_completions(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    openai_run(
        &s,
        &principal,
        super::openai::Endpoint::Completions,
        &headers,
        body,
    )
    .await
}

/// An OpenAI request through the same path as every other: the model's queue, as a stream.
async fn openai_run(
    s: &AppState,
    principal: &Principal,
    endpoint: super::openai::Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let body = match read_body(s, body, s.max_body, "--http-max-input-size").await {
        Ok(body) => body,
        Err(response) => return super::openai::in_openai_shape(response).await,
    };
    let mut prepared = match super::openai::prepare(&s.server, principal, endpoint, &body) {
        Ok(prepared) => prepared,
        Err(e) => return super::openai::error_response(&e),
    };
    let request = std::mem::take(&mut prepared.request);
    let started = super::client_infer_stream(
        &s.server,
        principal,
        super::ClientRequest {
            model: &prepared.model,
            version: None,
            trace: super::TraceContext::from_headers(headers),
            received_bytes: body.len(),
        },
        s.verbose_errors,
        |_| Ok(request),
    )
    .await;
    match started {
        Err(e) => super::openai::error_response(&e),
        Ok(stream) if prepared.stream => super::openai::events(&prepared, stream).await,
        Ok(stream) => super::openai::complete(&prepared, stream).await,
    }
}

async fn openai_models(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Response {
    super::openai::models(&s.server, &principal)
}

async fn openai_model(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(model): Path<String>,
) -> Response {
    super::openai::model(&s.server, &principal, &model)
}

fn function_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/functions", get(list_functions))
        .route("/v1/functions/{function}", any(invoke_function_root))
        .route("/v1/functions/{function}/", any(invoke_function_root))
        .route("/v1/functions/{function}/{*path}", any(invoke_function))
}

/// Health: open to anyone, with Triton's bare-status answers.
fn health_routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v2/health/live",
            get(live).fallback(health_method_not_allowed),
        )
        .route(
            "/v2/health/ready",
            get(ready).fallback(health_method_not_allowed),
        )
}

/// Finds who is calling (`Authorization: Bearer <key>`) and hands it to the route as a
/// [`Principal`]; 401 without a valid key once tenancy is on.
async fn authenticate(
    State(s): State<AppState>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    match s.server.tenants().authenticate(header) {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(e) if super::openai::is_openai_path(request.uri().path()) => {
            super::openai::in_openai_shape(error_response(&e)).await
        }
        Err(e) => error_response(&e),
    }
}

/// Every error answer carries a KServe v2 error body, `{"error": "..."}`, including those axum
/// produces before a handler runs (a path that is not UTF-8, a method a route does not take).
/// Health endpoints answer with a bare status, as Triton's do, and are left alone.
async fn kserve_error_body(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    if is_json {
        return bounded_error_json(response).await;
    }
    let (mut parts, body) = response.into_parts();
    // Rejection texts are short; anything long is not ours to forward.
    let text = axum::body::to_bytes(body, 4096)
        .await
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_owned());
    let body = serde_json::to_vec(&json!({ "error": text })).unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body))
}

/// An error answer whose message is longer than [`MAX_ERROR_MESSAGE_BYTES`] (it quotes what the
/// client sent: a name, a shape) has it cut, so no error answer grows with the request.
async fn bounded_error_json(response: Response) -> Response {
    use http_body::Body as _;
    use tessera_core::infer::{MAX_ERROR_MESSAGE_BYTES, bounded};
    let short = response
        .body()
        .size_hint()
        .upper()
        .is_some_and(|n| n <= MAX_ERROR_MESSAGE_BYTES as u64);
    if short {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Our own answer, already in memory: reading it whole costs nothing new.
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({ "error": "the error answer could not be produced" })),
        )
            .into_response();
    };
    let mut value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if let Some(Value::String(message)) = value.get_mut("error") {
        *message = bounded(message, MAX_ERROR_MESSAGE_BYTES).into_owned();
    }
    let body = match value {
        Value::Null => bytes,
        value => Bytes::from(serde_json::to_vec(&value).unwrap_or_default()),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// The metrics endpoint, served on `--metrics-port`.
/// `/metrics`; `summary_latencies` adds Triton's latency summaries (`--metrics-config
/// summary_latencies=true`); with `admin_only` (tenancy on, `--metrics-auth admin`) it needs the
/// admin key.
pub fn metrics_router(server: Arc<Server>, summary_latencies: bool, admin_only: bool) -> Router {
    Router::new().route("/metrics", get(metrics)).with_state((
        server,
        summary_latencies,
        admin_only,
    ))
}

async fn metrics(
    State((server, summaries, admin_only)): State<(Arc<Server>, bool, bool)>,
    headers: HeaderMap,
) -> Response {
    if admin_only {
        let header = headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        match server.tenants().authenticate(header) {
            Ok(Principal::Operator) => {}
            Ok(Principal::Tenant(_)) => return error_response(&crate::api::AuthError::Invalid),
            Err(e) => return error_response(&e),
        }
    }
    let mut r = Response::new(Body::from(server.metrics_text(summaries)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

/// An error as an HTTP answer: a KServe v2 `{"error": "..."}` body with the status Triton uses
/// (`protocol::error` maps every error once, for HTTP and gRPC alike).
fn error_response(e: impl Into<ApiError>) -> Response {
    e.into().into_response()
}

fn json_ok(v: Value) -> Response {
    axum::Json(v).into_response()
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({ "error": "Not Found" })),
    )
        .into_response()
}

/// A health route called with another method than GET: a KServe error body like every other
/// error (the health answers themselves stay bare statuses, as Triton's).
async fn health_method_not_allowed() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "GET,HEAD")],
        axum::Json(json!({ "error": "Method Not Allowed" })),
    )
        .into_response()
}

async fn server_metadata(State(s): State<AppState>) -> Response {
    json_ok(
        json!({ "name": s.server.name(), "version": env!("CARGO_PKG_VERSION"), "extensions": EXTENSIONS }),
    )
}

async fn live(State(s): State<AppState>) -> StatusCode {
    if s.server.live() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn ready(State(s): State<AppState>) -> Response {
    let status = if s.server.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    if s.server.shared_store_reachable() {
        return status.into_response();
    }
    // Ready (it serves), and saying what with: probes read the status, people the header.
    (
        status,
        [(
            "tessera-store",
            "unreachable; serving the deployments cached here",
        )],
    )
        .into_response()
}

/// A version from a `/versions/{version}` path (never empty there).
fn parse_version(v: &str) -> Result<i64, InferError> {
    super::kserve::parse_model_version(v)?.ok_or_else(|| {
        InferError::invalid(
            "invalid model version specified '' , version should be an integral value > 0",
        )
    })
}

/// The model a route names, and its version when the path has `/versions/{version}`: one
/// handler serves both forms of each route.
struct ModelRef {
    model: String,
    version: Option<i64>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ModelRef {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Response> {
        let Path(mut params) =
            Path::<std::collections::HashMap<String, String>>::from_request_parts(parts, state)
                .await
                .map_err(IntoResponse::into_response)?;
        let version = match params.get("version") {
            Some(v) => Some(parse_version(v).map_err(error_response)?),
            None => None,
        };
        Ok(ModelRef {
            model: params.remove("model").unwrap_or_default(),
            version,
        })
    }
}

fn metadata(
    s: &AppState,
    principal: &Principal,
    model: &str,
    version: Option<i64>,
) -> Result<Value, InferError> {
    let m = s.server.model_metadata(principal, model, version)?;
    let tensors = |specs: &[TensorSpec]| -> Vec<Value> {
        specs
            .iter()
            .map(|t| json!({ "name": t.name, "datatype": t.datatype.name(), "shape": t.client_shape(m.batched) }))
            .collect()
    };
    Ok(json!({
        "name": m.name,
        "versions": m.versions.iter().map(i64::to_string).collect::<Vec<_>>(),
        "platform": m.platform,
        "inputs": tensors(&m.inputs),
        "outputs": tensors(&m.outputs),
    }))
}

async fn model_metadata(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    target: ModelRef,
) -> Response {
    metadata(&s, &principal, &target.model, target.version).map_or_else(error_response, json_ok)
}

fn readiness(s: &AppState, principal: &Principal, model: &str, version: Option<i64>) -> Response {
    match s.server.model_ready(principal, model, version) {
        Ok(()) => StatusCode::OK.into_response(),
        // Triton answers 400 for a model that exists but is not ready.
        Err(e) if e.kind == ErrorKind::Unavailable => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({ "error": e.message })),
        )
            .into_response(),
        Err(e) => error_response(&e),
    }
}

async fn model_ready(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    target: ModelRef,
) -> Response {
    readiness(&s, &principal, &target.model, target.version)
}

fn model_config_json(
    s: &AppState,
    principal: &Principal,
    model: &str,
    version: Option<i64>,
) -> Result<Value, InferError> {
    s.server
        .model_config(principal, model, version)
        .map(|c| config::to_json(&c))
}

async fn model_config(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    target: ModelRef,
) -> Response {
    model_config_json(&s, &principal, &target.model, target.version)
        .map_or_else(error_response, json_ok)
}

fn stats_json(
    s: &AppState,
    principal: &Principal,
    model: Option<&str>,
    version: Option<i64>,
) -> Result<Value, InferError> {
    let entries: Vec<Value> = s
        .server
        .statistics(principal, model, version)?
        .iter()
        .map(|v| v.stats.to_json(&v.name, &v.version.to_string()))
        .collect();
    Ok(json!({ "model_stats": entries }))
}

async fn all_stats(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Response {
    stats_json(&s, &principal, None, None).map_or_else(|e| error_response(&e), json_ok)
}

async fn model_stats(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    target: ModelRef,
) -> Response {
    stats_json(&s, &principal, Some(&target.model), target.version)
        .map_or_else(error_response, json_ok)
}

/// `POST /v2/repository/index`, body `{"ready": true}` optional.
async fn repository_index(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    body: Bytes,
) -> Response {
    let ready_only = if body.iter().all(u8::is_ascii_whitespace) {
        false
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(o)) => match o.get("ready") {
                None => false,
                Some(Value::Bool(ready)) => *ready,
                // Triton refuses it too: a misspelt `true` listing everything misleads.
                Some(_) => {
                    return error_response(InferError::invalid(
                        "the index request's 'ready' must be true or false",
                    ));
                }
            },
            _ => {
                return error_response(InferError::invalid(
                    "the index request body must be a JSON object, e.g. {\"ready\": true}",
                ));
            }
        }
    };
    let rows: Vec<Value> = s
        .server
        .repository_index(&principal, ready_only)
        .into_iter()
        .map(|r| {
            let mut row = json!({ "name": r.name });
            if !r.version.is_empty() {
                row["version"] = Value::from(r.version);
            }
            if let Some(state) = r.state {
                row["state"] = Value::from(state.as_str());
            }
            if !r.reason.is_empty() {
                row["reason"] = Value::from(r.reason);
            }
            row
        })
        .collect();
    json_ok(Value::Array(rows))
}

/// `GET /v1/functions`: every function with its state.
async fn list_functions(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Response {
    let rows: Vec<Value> = s
        .server
        .functions(&principal)
        .into_iter()
        .map(|(name, state)| match state {
            Ok(()) => {
                json!({ "name": name, "state": "READY", "url": format!("/v1/functions/{name}/") })
            }
            Err(reason) => json!({ "name": name, "state": "UNAVAILABLE", "reason": reason }),
        })
        .collect();
    json_ok(Value::Array(rows))
}

async fn invoke_function_root(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(function): Path<String>,
    request: axum::extract::Request,
) -> Response {
    run_function(s, principal, function, request).await
}

async fn invoke_function(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((function, _decoded_path)): Path<(String, String)>,
    request: axum::extract::Request,
) -> Response {
    run_function(s, principal, function, request).await
}

/// The part of a function request's path after `/v1/functions/{function}`, as the client wrote
/// it: still percent-encoded, as `wasmtime serve` passes it on. Decoded, a `%3F` would start a
/// query and a `%2F` or `..` would pass a guest's routing.
fn raw_function_path(uri: &axum::http::Uri) -> &str {
    let rest = uri
        .path()
        .strip_prefix("/v1/functions/")
        .unwrap_or_default();
    rest.split_once('/').map_or("", |(_, path)| path)
}

/// Any method on `/v1/functions/{function}/{path}`: the function sees `/{path}?{query}` with the
/// request's headers and body, as `wasmtime serve` would show it.
async fn run_function(
    s: AppState,
    principal: Principal,
    function: String,
    request: axum::extract::Request,
) -> Response {
    let mut cx = CallContext::root_for(principal.tenant());
    cx.span = super::TraceContext::from_headers(request.headers())
        .function_span(&function, cx.request_id);
    let (mut parts, body) = request.into_parts();
    let mut uri = format!("/{}", raw_function_path(&parts.uri));
    if let Some(query) = parts.uri.query() {
        uri.push('?');
        uri.push_str(query);
    }
    parts.uri = match uri.parse() {
        Ok(u) => u,
        Err(e) => {
            return error_response(InferError::invalid(format!("invalid path: {e}")));
        }
    };
    let had_body = !http_body::Body::is_end_stream(&body);
    let request = axum::http::Request::from_parts(parts, body);
    let span = cx.span.clone();
    let invoked =
        tracing::Instrument::instrument(s.server.invoke_function(&cx, &function, request), span);
    match invoked.await {
        Ok(response) => response.map(Body::new),
        Err(e) => {
            let mut response = function_error(&e, s.verbose_errors, cx.request_id);
            // The server answered for the function (unknown, over a limit, refused): its body
            // may be unread, and hyper then closes the connection; the client is told so
            // (`close_when_body_unread` leaves functions to this).
            if had_body {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            response
        }
    }
}

/// A function that gave no answer: JSON `{"error"}` with the status of the reason. What a guest
/// printed or trapped with goes to the log, with the request id, unless `--verbose-errors`.
fn function_error(e: &FunctionError, verbose: bool, request_id: u64) -> Response {
    use crate::api::InvokeError;
    let status = match e {
        FunctionError::NotFound(_) => StatusCode::NOT_FOUND,
        FunctionError::Unavailable(..) => StatusCode::SERVICE_UNAVAILABLE,
        FunctionError::Quota(e) => return error_response(e),
        FunctionError::Invoke(e) => {
            StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        }
    };
    let message = match e {
        FunctionError::Invoke(InvokeError::Failed { name, .. }) if !verbose => {
            tracing::warn!(request = request_id, "{e}");
            format!("function '{name}' failed (details in the server log, request {request_id})")
        }
        _ => {
            if status.is_server_error() {
                tracing::warn!(request = request_id, "{e}");
            }
            e.to_string()
        }
    };
    let mut response = (status, axum::Json(json!({ "error": message }))).into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// The `parameters` object of a repository request body (empty body: none).
fn control_parameters(body: &[u8]) -> Result<serde_json::Map<String, Value>, ControlError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    let invalid = ControlError::Invalid;
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(mut o)) => match o.remove("parameters") {
            None | Some(Value::Null) => Ok(serde_json::Map::new()),
            Some(Value::Object(p)) => Ok(p),
            Some(_) => Err(invalid("'parameters' must be a JSON object".into())),
        },
        Ok(_) => Err(invalid("the request body must be a JSON object".into())),
        Err(e) => Err(invalid(format!("the request body is not valid JSON: {e}"))),
    }
}

/// The `parameters` of a deployment request, its body bounded by `--max-deployment-bytes`
/// (base64 is 4/3 of the files, plus a config or manifest and the JSON around them).
async fn deployment_parameters(
    s: &AppState,
    body: Body,
) -> Result<serde_json::Map<String, Value>, Box<Response>> {
    let limit = s
        .server
        .max_deployment_bytes()
        .saturating_mul(4)
        .div_ceil(3)
        .saturating_add(1 << 20);
    let body = read_body(s, body, limit, "--max-deployment-bytes")
        .await
        .map_err(Box::new)?;
    control_parameters(&body).map_err(|e| Box::new(error_response(&e)))
}

/// `POST /v2/repository/models/{m}/load`: `config` (a JSON string) and `file:<path>` (base64)
/// parameters, as Triton takes them.
async fn load_model(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(model): Path<String>,
    body: Body,
) -> Response {
    use base64::Engine as _;
    let parameters = match deployment_parameters(&s, body).await {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let mut request = LoadRequest::default();
    for (key, value) in parameters {
        let invalid = |m: String| error_response(&ControlError::Invalid(m));
        if key == "config" {
            match value {
                Value::String(text) => request.config = Some(text),
                _ => return invalid("the 'config' parameter must be a string of JSON".into()),
            }
        } else if let Some(path) = key.strip_prefix("file:") {
            let Value::String(encoded) = value else {
                return invalid(format!("the '{key}' parameter must be a base64 string"));
            };
            match base64::engine::general_purpose::STANDARD.decode(encoded.as_bytes()) {
                Ok(bytes) => request.files.push((path.to_owned(), Bytes::from(bytes))),
                Err(e) => {
                    return invalid(format!("the '{key}' parameter is not valid base64: {e}"));
                }
            }
        } else {
            return invalid(format!(
                "unknown load parameter '{key}' (expected 'config' or 'file:<path>')"
            ));
        }
    }
    match s.server.load_model(&principal, &model, request).await {
        Ok(d) => json_ok(deployed_json(&model, &d)),
        Err(e) => error_response(&e),
    }
}

fn deployed_json(model: &str, d: &Deployed) -> Value {
    let mut v = json!({
        "model": model,
        "outcome": match d.outcome {
            LoadOutcome::Loaded => "loaded",
            LoadOutcome::Unchanged => "unchanged",
        },
    });
    if let Some(r) = d.revision {
        v["revision"] = Value::from(r);
    }
    if let Some(folder) = &d.replaces {
        v["replaces"] = Value::from(folder.display().to_string());
    }
    v
}

/// `POST /v2/repository/models/{m}/unload`, with the `unload_dependents` parameter.
async fn unload_model(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(model): Path<String>,
    body: Bytes,
) -> Response {
    let parameters = match control_parameters(&body) {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
    let dependents = match parameters.get("unload_dependents") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return error_response(&ControlError::Invalid(
                "'unload_dependents' must be true or false".into(),
            ));
        }
    };
    match s.server.unload_model(&principal, &model, dependents).await {
        Ok(unloaded) => json_ok(json!({ "model": model, "unloaded": unloaded })),
        Err(e) => error_response(&e),
    }
}

/// `POST /v2/repository/functions/{f}/load` (tessera): deploys a function, with the parameters
/// `file:function.wasm` (base64) and `manifest` (the `function.toml` text, optional); without a
/// component, loads the function again from its folder or the store.
async fn load_function(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(function): Path<String>,
    body: Body,
) -> Response {
    use base64::Engine as _;
    let parameters = match deployment_parameters(&s, body).await {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let (mut component, mut manifest) = (None, None);
    for (key, value) in parameters {
        let invalid = |m: String| error_response(&ControlError::Invalid(m));
        match (key.as_str(), value) {
            ("manifest", Value::String(text)) => manifest = Some(text),
            ("file:function.wasm", Value::String(encoded)) => {
                match base64::engine::general_purpose::STANDARD.decode(encoded.as_bytes()) {
                    Ok(bytes) => component = Some(Bytes::from(bytes)),
                    Err(e) => {
                        return invalid(format!("'file:function.wasm' is not valid base64: {e}"));
                    }
                }
            }
            (key, _) => {
                return invalid(format!(
                    "unknown or malformed parameter '{key}' (expected 'file:function.wasm' as base64 and 'manifest' as text)"
                ));
            }
        }
    }
    let upload = match (component, manifest) {
        (Some(component), manifest) => Some(crate::api::FunctionUpload {
            component,
            manifest,
        }),
        (None, Some(_)) => {
            return error_response(&ControlError::Invalid(
                "a manifest needs its component ('file:function.wasm')".into(),
            ));
        }
        (None, None) => None,
    };
    match s.server.load_function(&principal, &function, upload).await {
        Ok(d) => json_ok(deployed_json(&function, &d)),
        Err(e) => error_response(&e),
    }
}

async fn unload_function(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(function): Path<String>,
) -> Response {
    match s.server.unload_function(&principal, &function).await {
        Ok(()) => json_ok(json!({ "function": function, "unloaded": true })),
        Err(e) => error_response(&e),
    }
}

async fn rollback_function(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(function): Path<String>,
) -> Response {
    match s.server.rollback_function(&principal, &function).await {
        Ok(d) => json_ok(deployed_json(&function, &d)),
        Err(e) => error_response(&e),
    }
}

/// `POST /v2/repository/models/{m}/rollback` (tessera): serve the previous deployed revision.
async fn rollback_model(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(model): Path<String>,
) -> Response {
    match s.server.rollback(&principal, &model).await {
        Ok(d) => json_ok(deployed_json(&model, &d)),
        Err(e) => error_response(&e),
    }
}

async fn infer(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    target: ModelRef,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run_infer(s, principal, target.model, target.version, headers, body).await
}

/// Triton's generate extension: one response, as JSON ([`super::generate`]).
async fn generate(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    target: ModelRef,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = match start_generate(&s, &principal, &target, &headers, body).await {
        Ok(started) => started,
        Err(response) => return response,
    };
    super::generate::single(started)
        .await
        .map_or_else(|e| error_response(&e), json_ok)
}

/// Triton's generate extension: every response, as Server-Sent Events.
async fn generate_stream(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    target: ModelRef,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match start_generate(&s, &principal, &target, &headers, body).await {
        Ok(started) => super::generate::events(started).into_response(),
        Err(response) => response,
    }
}

async fn start_generate(
    s: &AppState,
    principal: &Principal,
    target: &ModelRef,
    headers: &HeaderMap,
    body: Body,
) -> Result<super::ClientStream, Response> {
    let body = read_body(s, body, s.max_body, "--http-max-input-size").await?;
    super::generate::start(
        &s.server,
        principal,
        &target.model,
        target.version,
        &body,
        super::TraceContext::from_headers(headers),
        s.verbose_errors,
    )
    .await
    .map_err(|e| error_response(&e))
}

/// Reads a request body whole, within `limit` bytes and the server's budget for bodies being
/// read at once (`s.reading`): a body whose `Content-Length` is over the limit is refused
/// before a byte of it is read (and before hyper says `100 Continue`).
async fn read_body(s: &AppState, body: Body, limit: usize, flag: &str) -> Result<Bytes, Response> {
    use http_body::Body as _;
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            axum::Json(json!({ "error": format!("request body exceeds the limit of {limit} bytes ({flag})") })),
        )
            .into_response()
    };
    let declared = body.size_hint().exact();
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    // A body of unknown length may take up to the limit.
    let _reserved = match s.reading.try_reserve(declared.unwrap_or(limit as u64)) {
        Some(permit) => permit,
        None => {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                axum::Json(json!({ "error": "the server is reading as many request bodies as it may hold at once (--http-max-buffered-bytes); retry" })),
            )
                .into_response());
        }
    };
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let over = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if over {
            too_large()
        } else {
            error_response(InferError::invalid(format!(
                "failed to read the request body: {e}"
            )))
        }
    })
}

async fn run_infer(
    s: AppState,
    principal: Principal,
    model: String,
    version: Option<i64>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = match read_body(&s, body, s.max_body, "--http-max-input-size").await {
        Ok(b) => b,
        Err(response) => return response,
    };
    let header_length = match headers
        .get(HEADER_LENGTH)
        .map(|v| v.to_str().ok().and_then(|v| v.trim().parse::<usize>().ok()))
    {
        None => None,
        Some(Some(n)) => Some(n),
        Some(None) => {
            return error_response(InferError::invalid(
                "Inference-Header-Content-Length must be a non-negative integer",
            ));
        }
    };
    let decode = |regions: &dyn super::kserve::RegionReader| {
        decode_request_with(&body, header_length, regions)
    };
    let request = super::ClientRequest {
        model: &model,
        version,
        trace: super::TraceContext::from_headers(&headers),
        received_bytes: body.len(),
    };
    let answer =
        match super::client_infer(&s.server, &principal, request, s.verbose_errors, decode).await {
            Ok(answer) => answer,
            Err(e) => return error_response(&e),
        };
    let (response, placed) = (answer.response, answer.placed);
    let all_binary = matches!(
        answer.parameters.get("binary_data_output"),
        Some(ParamValue::Bool(true))
    );
    let placement = |name: &str| {
        if placed.iter().any(|(n, _, _)| n == name) {
            return Placement::SharedMemory;
        }
        let binary = answer
            .requested
            .iter()
            .find(|o| o.name == name)
            .map_or(all_binary, |o| o.binary);
        if binary {
            Placement::Binary
        } else {
            Placement::Json
        }
    };
    match encode_response_placed(&response, placement) {
        Ok(encoded) => {
            let mut r = Response::new(Body::from(encoded.body));
            let content_type = match encoded.header_length {
                Some(n) => {
                    r.headers_mut().insert(HEADER_LENGTH, HeaderValue::from(n));
                    "application/octet-stream"
                }
                None => "application/json",
            };
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            r.extensions_mut().insert(CompressibleAnswer);
            r
        }
        Err(e) => error_response(&e),
    }
}

/// Marks an inference answer, the one answer compressed when the client's `Accept-Encoding`
/// asks, as Triton does: its other answers go as they are (tritonclient's asyncio client sends
/// aiohttp's default `Accept-Encoding` and parses statistics and metadata without decompressing).
#[derive(Clone, Copy, Debug)]
struct CompressibleAnswer;

/// The admin API is the operator's: the refusal a tenant gets.
fn refuse_tenant(principal: &Principal) -> Option<Response> {
    match principal {
        Principal::Operator => None,
        Principal::Tenant(_) => Some(
            (
                StatusCode::FORBIDDEN,
                axum::Json(json!({ "error": "the tenant API needs the admin key" })),
            )
                .into_response(),
        ),
    }
}

/// Runs an admin request (blocking on the registry's disk write) and answers its JSON.
fn admin<T: serde::Serialize>(
    principal: &Principal,
    status: StatusCode,
    run: impl FnOnce() -> Result<T, crate::api::TenantError>,
) -> Response {
    if let Some(refused) = refuse_tenant(principal) {
        return refused;
    }
    match tokio::task::block_in_place(run) {
        Ok(v) => (status, axum::Json(v)).into_response(),
        Err(e) => error_response(&e),
    }
}

/// `GET /v1/tenants`.
async fn list_tenants(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Response {
    admin(&principal, StatusCode::OK, || {
        if s.server.tenants().enabled() {
            Ok(s.server.tenants().list())
        } else {
            Err(crate::api::TenantError::Disabled)
        }
    })
}

/// `POST /v1/tenants` with `{"name": "..."}`.
async fn create_tenant(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    body: Bytes,
) -> Response {
    let name = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("name").and_then(Value::as_str).map(str::to_owned));
    let Some(name) = name else {
        return error_response(&crate::api::TenantError::Invalid(
            "the body must be a JSON object with the tenant's name, e.g. {\"name\": \"acme\"}"
                .into(),
        ));
    };
    admin(&principal, StatusCode::CREATED, || {
        s.server.tenants().create(&name)
    })
}

/// `GET /v1/tenants/{tenant}`.
async fn show_tenant(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(tenant): Path<String>,
) -> Response {
    admin(&principal, StatusCode::OK, || {
        s.server.tenants().info(&tenant)
    })
}

/// `DELETE /v1/tenants/{tenant}`: its keys, models, functions and files go.
async fn delete_tenant(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(tenant): Path<String>,
) -> Response {
    if let Some(refused) = refuse_tenant(&principal) {
        return refused;
    }
    match s.server.delete_tenant(&tenant).await {
        Ok(()) => json_ok(json!({ "tenant": tenant, "deleted": true })),
        Err(e) => error_response(&e),
    }
}

/// `POST /v1/tenants/{tenant}/keys`: `{"id", "key"}`, the key shown only now.
async fn issue_key(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(tenant): Path<String>,
) -> Response {
    admin(&principal, StatusCode::CREATED, || {
        s.server
            .tenants()
            .issue_key(&tenant)
            .map(|(id, key)| json!({ "id": id, "key": key }))
    })
}

/// `DELETE /v1/tenants/{tenant}/keys/{id}`: the key stops working at once.
async fn revoke_key(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((tenant, id)): Path<(String, String)>,
) -> Response {
    admin(&principal, StatusCode::OK, || {
        s.server
            .tenants()
            .revoke_key(&tenant, &id)
            .map(|()| json!({ "tenant": tenant, "revoked": id }))
    })
}

/// `PUT /v1/tenants/{tenant}/quotas`: the fields given change; answers every quota.
async fn set_quotas(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(tenant): Path<String>,
    body: Bytes,
) -> Response {
    let patch = match serde_json::from_slice::<Value>(&body) {
        Ok(v) => v,
        Err(e) => {
            return error_response(&crate::api::TenantError::Invalid(format!(
                "the body is not valid JSON: {e}"
            )));
        }
    };
    admin(&principal, StatusCode::OK, || {
        s.server.tenants().set_quotas(&tenant, patch)
    })
}

/// `POST /v1/tenants/{tenant}/grants/{model}`: the tenant may call the operator's model.
async fn grant_model(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((tenant, model)): Path<(String, String)>,
) -> Response {
    admin(&principal, StatusCode::OK, || {
        s.server
            .tenants()
            .set_grant(&tenant, &model, true)
            .map(|()| json!({ "tenant": tenant, "granted": model }))
    })
}

/// `DELETE /v1/tenants/{tenant}/grants/{model}`.
async fn revoke_grant(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((tenant, model)): Path<(String, String)>,
) -> Response {
    admin(&principal, StatusCode::OK, || {
        s.server
            .tenants()
            .set_grant(&tenant, &model, false)
            .map(|()| json!({ "tenant": tenant, "revoked": model }))
    })
}

/// The registry, for the operator only (403 for a tenant).
fn shared_memory<'s>(
    s: &'s AppState,
    principal: &Principal,
) -> Result<&'s crate::api::SharedMemory, Box<Response>> {
    s.server.shared_memory(principal).ok_or_else(|| {
        Box::new(
            (
                StatusCode::FORBIDDEN,
                axum::Json(json!({ "error": crate::api::SHARED_MEMORY_OPERATOR_ONLY })),
            )
                .into_response(),
        )
    })
}

fn shm_status(s: &AppState, principal: &Principal, region: Option<&str>) -> Response {
    let shm = match shared_memory(s, principal) {
        Ok(shm) => shm,
        Err(r) => return *r,
    };
    match shm.status(region) {
        Ok(regions) => json_ok(Value::Array(
            regions
                .into_iter()
                .map(|r| {
                    json!({ "name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size })
                })
                .collect(),
        )),
        Err(e) => error_response(&e),
    }
}

/// `GET /v2/systemsharedmemory/status`.
async fn shm_status_all(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Response {
    shm_status(&s, &principal, None)
}

/// `GET /v2/systemsharedmemory/region/{region}/status`.
async fn shm_status_one(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(region): Path<String>,
) -> Response {
    shm_status(&s, &principal, Some(&region))
}

/// `POST /v2/systemsharedmemory/region/{region}/register` with `{"key", "offset", "byte_size"}`.
async fn shm_register(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(region): Path<String>,
    body: Bytes,
) -> Response {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Register {
        key: String,
        #[serde(default)]
        offset: usize,
        byte_size: usize,
    }
    let shm = match shared_memory(&s, &principal) {
        Ok(shm) => shm,
        Err(r) => return *r,
    };
    let r: Register = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error_response(InferError::invalid(format!(
                "the register request must be {{\"key\", \"offset\", \"byte_size\"}}: {e}"
            )));
        }
    };
    match shm.register(&region, &r.key, r.offset, r.byte_size) {
        Ok(()) => json_ok(json!({})),
        Err(e) => error_response(&e),
    }
}

fn shm_unregister(s: &AppState, principal: &Principal, region: Option<&str>) -> Response {
    let shm = match shared_memory(s, principal) {
        Ok(shm) => shm,
        Err(r) => return *r,
    };
    shm.unregister(region);
    json_ok(json!({}))
}

/// `POST /v2/systemsharedmemory/unregister`: every region.
async fn shm_unregister_all(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Response {
    shm_unregister(&s, &principal, None)
}

/// `POST /v2/systemsharedmemory/region/{region}/unregister`.
async fn shm_unregister_one(
    State(s): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(region): Path<String>,
) -> Response {
    shm_unregister(&s, &principal, Some(&region))
}

/// `GET /v2/cudasharedmemory/status`: no CUDA region can exist.
async fn cuda_status() -> Response {
    json_ok(json!([]))
}

/// `POST /v2/cudasharedmemory/unregister`: nothing to unregister (clients that clean up every
/// kind of region succeed).
async fn cuda_unregister_all() -> Response {
    json_ok(json!({}))
}

/// `/v2/cudasharedmemory/...` otherwise: there is no GPU support yet.
async fn cuda_unsupported() -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({ "error": "CUDA shared memory is not supported: this server has no GPU support" })),
    )
        .into_response()
}

/// The routes and their rules, in process: a real server and the real router, requests through
/// `oneshot` without a socket (the process-level behaviour is in `tests/e2e`).
#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    const ADMIN: &str = "admin-key-for-http-tests";

    /// A server with `add_sub_wasm` (built by host/build.rs), tenancy on, and `limits`.
    async fn server(limits: crate::limits::ServerLimits) -> (Arc<Server>, tempfile::TempDir) {
        let scratch = tempfile::tempdir().expect("a scratch folder");
        let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../model_repository/add_sub_wasm");
        let model = scratch.path().join("repo/add_sub_wasm");
        std::fs::create_dir_all(model.join("1")).expect("repository");
        std::fs::copy(example.join("config.pbtxt"), model.join("config.pbtxt")).expect("config");
        std::fs::copy(example.join("1/model.wasm"), model.join("1/model.wasm"))
            .expect("model.wasm");
        let server = Server::start(crate::server::ServerOptions {
            model_repositories: vec![scratch.path().join("repo")],
            store_dir: Some(scratch.path().join("store")),
            wasm_cache_dir: Some(scratch.path().join("cache")),
            admin_key: Some(crate::tenants::AdminKey(ADMIN.into())),
            limits,
            ..Default::default()
        })
        .await
        .expect("server starts");
        (server, scratch)
    }

    async fn call(
        app: &Router,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Value,
    ) -> (StatusCode, Value) {
        let mut request = axum::http::Request::builder().method(method).uri(path);
        if let Some(key) = key {
            request = request.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let body = if body.is_null() {
            Body::empty()
        } else {
            Body::from(body.to_string())
        };
        let response = app
            .clone()
            .oneshot(request.body(body).expect("request"))
            .await
            .expect("answers");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    fn add_sub_request() -> Value {
        let data: Vec<f32> = (0..16).map(|i| i as f32).collect();
        json!({ "inputs": [
            { "name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": data },
            { "name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": data },
        ]})
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn health_is_open_every_other_route_needs_a_key() {
        let (server, _scratch) = server(Default::default()).await;
        let app = router(server.clone(), 1 << 20, ByteBudget::new(1 << 30), false);
        for path in ["/v2/health/live", "/v2/health/ready"] {
            assert_eq!(
                call(&app, "GET", path, None, Value::Null).await.0,
                StatusCode::OK
            );
            let (status, body) = call(&app, "POST", path, None, Value::Null).await;
            assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
            assert!(body["error"].is_string(), "{body}");
        }
        for (method, path) in [
            ("GET", "/v2"),
            ("GET", "/v2/models/add_sub_wasm"),
            ("POST", "/v2/repository/index"),
            ("GET", "/v1/functions"),
            ("GET", "/v2/no/such/route"),
        ] {
            let (status, body) = call(&app, method, path, None, Value::Null).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}");
            assert!(body["error"].is_string(), "{method} {path}: {body}");
        }
        let (status, _) = call(&app, "GET", "/v2", Some(ADMIN), Value::Null).await;
        assert_eq!(status, StatusCode::OK);
        server.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn each_model_route_takes_a_version_or_none() {
        let (server, _scratch) = server(Default::default()).await;
        let app = router(server.clone(), 1 << 20, ByteBudget::new(1 << 30), false);
        let key = Some(ADMIN);
        for suffix in ["", "/ready", "/config", "/stats"] {
            let plain = format!("/v2/models/add_sub_wasm{suffix}");
            let versioned = format!("/v2/models/add_sub_wasm/versions/1{suffix}");
            assert_eq!(
                call(&app, "GET", &plain, key, Value::Null).await.0,
                StatusCode::OK,
                "{plain}"
            );
            assert_eq!(
                call(&app, "GET", &versioned, key, Value::Null).await.0,
                StatusCode::OK,
                "{versioned}"
            );
            let wrong = format!("/v2/models/add_sub_wasm/versions/wrong{suffix}");
            let (status, body) = call(&app, "GET", &wrong, key, Value::Null).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{wrong}");
            assert!(
                body["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("failed to get model version")),
                "{body}"
            );
        }
        for path in [
            "/v2/models/add_sub_wasm/infer",
            "/v2/models/add_sub_wasm/versions/1/infer",
        ] {
            let (status, body) = call(&app, "POST", path, key, add_sub_request()).await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
            assert_eq!(body["model_version"], "1");
        }
        let (status, _) = call(
            &app,
            "POST",
            "/v2/models/add_sub_wasm/versions/7/infer",
            key,
            add_sub_request(),
        )
        .await;
        assert!(status.is_client_error());
        server.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn admission_refuses_past_the_limits() {
        let limits = crate::limits::ServerLimits {
            max_inflight_requests: 0,
            ..Default::default()
        };
        let (server, _scratch) = server(limits).await;
        let infer = |max_body: usize| {
            let app = router(server.clone(), max_body, ByteBudget::new(1 << 30), false);
            async move {
                let path = "/v2/models/add_sub_wasm/infer";
                call(&app, "POST", path, Some(ADMIN), add_sub_request()).await
            }
        };
        // A body over --http-max-input-size: 413 before decoding.
        let (status, body) = infer(64).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
        // No room left to read bodies into: 503 at once, naming the limit.
        let full = router(server.clone(), 1 << 20, ByteBudget::new(0), false);
        let path = "/v2/models/add_sub_wasm/infer";
        let (status, body) = call(&full, "POST", path, Some(ADMIN), add_sub_request()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("--http-max-buffered-bytes")),
            "{body}"
        );
        // No request may be in flight: 503 at once, naming the limit.
        let (status, body) = infer(1 << 20).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("--max-inflight-requests")),
            "{body}"
        );
        server.shutdown().await;
    }
}
