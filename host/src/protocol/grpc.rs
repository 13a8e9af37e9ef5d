//! KServe v2 over gRPC: Triton's `inference.GRPCInferenceService` (`proto/grpc_service.proto`)
//! and the standard `grpc.health.v1.Health`, on `--grpc-port`.
//!
//! Every RPC decodes its message, calls the same [`Server`] API as HTTP (`Server::infer` for
//! inference, so gRPC requests share each model's queue with everyone else's), and encodes the
//! answer. Errors carry the gRPC codes Triton uses. With tenancy on, the principal's key comes in
//! the `authorization` metadata (`Bearer <key>`), as tritonclient sends headers.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::api::Principal;
use crate::api::{LoadRequest, Server};
use crate::api::{StatsSnapshot, Tally};
use crate::infer::InferError;
use crate::limits::ByteBudget;
use crate::protocol::kserve::RegionReader;
use crate::protocol::listen::{
    ConnectionCloser, ConnectionState, GrpcConnection, Watchdog, WrittenBody,
};

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    //! The messages are tessera-core's; the service is generated here.
    pub use tessera_core::grpc::pb::*;
    tonic::include_proto!("inference");
}
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod health_pb {
    tonic::include_proto!("grpc.health.v1");
}

use pb::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
pub use tessera_core::grpc::{decode_request, encode_response};

/// How many requests of one stream run at once.
const STREAM_CONCURRENCY: usize = 64;

/// The gRPC services, ready to add to a tonic server. `max_message` bounds a message in bytes
/// both ways (`--grpc-max-message-size`, as large as `--http-max-input-size` by default: tonic's
/// own default of 4 MiB is too small for tensors).
pub fn services(
    server: Arc<Server>,
    max_message: usize,
    verbose_errors: bool,
) -> (
    GrpcInferenceServiceServer<Grpc>,
    health_pb::health_server::HealthServer<Health>,
) {
    let inference = GrpcInferenceServiceServer::new(Grpc {
        server: server.clone(),
        verbose_errors,
    })
    .max_decoding_message_size(max_message)
    .max_encoding_message_size(max_message)
    // Compressed requests when a client sends them (tritonclient's `compression_algorithm`).
    // Answers go uncompressed: gRPC clients advertise gzip by default, and compressing every
    // tensor costs far more CPU than loopback or LAN bandwidth saves (33 ms for 1 MiB).
    .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    (
        inference,
        health_pb::health_server::HealthServer::new(Health { server }),
    )
}

pub struct Grpc {
    server: Arc<Server>,
    verbose_errors: bool,
}

/// `grpc.health.v1.Health`: SERVING when the server is ready (open, like Triton's health RPCs).
pub struct Health {
    server: Arc<Server>,
}

#[tonic::async_trait]
impl health_pb::health_server::Health for Health {
    async fn check(
        &self,
        _request: Request<health_pb::HealthCheckRequest>,
    ) -> Result<Response<health_pb::HealthCheckResponse>, Status> {
        use health_pb::health_check_response::ServingStatus;
        let status = if self.server.ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        Ok(Response::new(health_pb::HealthCheckResponse {
            status: status as i32,
        }))
    }
}

/// An error as a gRPC status, with the code Triton uses (`protocol::error` maps every error once,
/// for HTTP and gRPC alike); a quota's wait goes in `retry-after` metadata.
fn status(e: impl Into<crate::protocol::ApiError>) -> Status {
    Status::from(e.into())
}

use tessera_core::kserve::parse_model_version as parse_version;

impl Grpc {
    /// Who sent `request` (its `authorization` metadata); without tenancy, the operator.
    fn principal<T>(&self, request: &Request<T>) -> Result<Principal, Status> {
        if let Some(Caller(caller)) = request.extensions().get::<Caller>() {
            return caller.clone();
        }
        let header = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes());
        self.server
            .tenants()
            .authenticate(header)
            .map_err(|e| Status::unauthenticated(e.to_string()))
    }

    /// Runs one `ModelInferRequest` through the single request path.
    async fn infer(
        &self,
        principal: &Principal,
        trace: crate::protocol::TraceContext,
        message: pb::ModelInferRequest,
    ) -> Result<pb::ModelInferResponse, InferError> {
        let (model, version) = target_of(&message)?;
        let received_bytes = prost::Message::encoded_len(&message);
        let decode = |regions: &dyn RegionReader| decode_request(message, regions);
        let request = crate::protocol::ClientRequest {
            model: &model,
            version,
            trace,
            received_bytes,
        };
        let answer = crate::protocol::client_infer(
            &self.server,
            principal,
            request,
            self.verbose_errors,
            decode,
        )
        .await?;
        let (response, placed) = (answer.response, answer.placed);
        encode_response(response, &placed)
    }
}

impl Grpc {
    /// Runs one request of a `ModelStreamInfer` stream: the stream messages that answer it.
    async fn stream_infer(
        &self,
        principal: &Principal,
        trace: crate::protocol::TraceContext,
        message: pb::ModelInferRequest,
    ) -> impl Stream<Item = pb::ModelStreamInferResponse> + Send + use<> {
        let id = message.id.clone();
        let failed = |id: String, e: &InferError| pb::ModelStreamInferResponse {
            error_message: tessera_core::infer::bounded(
                &e.message,
                tessera_core::infer::MAX_ERROR_MESSAGE_BYTES,
            )
            .into_owned(),
            // The request id, so the client can tell which request failed.
            infer_response: Some(pb::ModelInferResponse {
                id,
                ..Default::default()
            }),
        };
        let started = async {
            let (model, version) = target_of(&message)?;
            let received_bytes = prost::Message::encoded_len(&message);
            let decode = |regions: &dyn RegionReader| decode_request(message, regions);
            let request = crate::protocol::ClientRequest {
                model: &model,
                version,
                trace,
                received_bytes,
            };
            crate::protocol::client_infer_stream(
                &self.server,
                principal,
                request,
                self.verbose_errors,
                decode,
            )
            .await
        };
        let client = match started.await {
            Ok(client) => client,
            Err(e) => return futures::stream::iter([failed(id, &e)]).left_stream(),
        };
        let empty_final = matches!(
            client.parameters.get("triton_enable_empty_final_response"),
            Some(crate::infer::ParamValue::Bool(true))
        );
        let (verbose, request_id) = (self.verbose_errors, client.request_id);
        futures::stream::unfold(client.stream, |mut stream| async move {
            let message = stream.next().await?;
            Some((message, stream))
        })
        .filter_map(move |message| {
            let id = id.clone();
            let last = message.last;
            let answer = match message.result {
                Some(Ok(response)) => match encode_response(response, &[]) {
                    Ok(response) => Some(final_marked(response, last)),
                    Err(e) => Some(failed(id, &e)),
                },
                Some(Err(e)) => {
                    let mut answer = failed(id, &e.for_client(verbose, request_id));
                    // An error that ends a stream is its final response, and says so.
                    if let Some(response) = answer.infer_response.as_mut() {
                        response.parameters.insert(
                            "triton_final_response".to_owned(),
                            tessera_core::grpc::to_pb_parameter(&crate::infer::ParamValue::Bool(
                                last,
                            )),
                        );
                    }
                    Some(answer)
                }
                None if empty_final => Some(final_marked(
                    pb::ModelInferResponse {
                        id,
                        ..Default::default()
                    },
                    true,
                )),
                None => None,
            };
            async move { answer }
        })
        .right_stream()
    }
}

/// The model and version a request names.
fn target_of(message: &pb::ModelInferRequest) -> Result<(String, Option<i64>), InferError> {
    Ok((
        message.model_name.clone(),
        parse_version(&message.model_version)?,
    ))
}

/// A stream message with Triton's `triton_final_response` parameter.
fn final_marked(mut response: pb::ModelInferResponse, last: bool) -> pb::ModelStreamInferResponse {
    response.parameters.insert(
        "triton_final_response".to_owned(),
        tessera_core::grpc::to_pb_parameter(&crate::infer::ParamValue::Bool(last)),
    );
    pb::ModelStreamInferResponse {
        error_message: String::new(),
        infer_response: Some(response),
    }
}

/// The W3C trace context a gRPC client sent in its metadata.
fn trace_context<T>(request: &Request<T>) -> crate::protocol::TraceContext {
    let text = |name: &str| {
        request
            .metadata()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    crate::protocol::TraceContext {
        traceparent: text("traceparent"),
        tracestate: text("tracestate"),
    }
}

impl Grpc {
    /// The shared-memory registry, for the operator only.
    fn shared_memory(&self, principal: &Principal) -> Result<&crate::api::SharedMemory, Status> {
        self.server
            .shared_memory(principal)
            .ok_or_else(|| Status::permission_denied(crate::api::SHARED_MEMORY_OPERATOR_ONLY))
    }
}

type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<pb::ModelStreamInferResponse, Status>> + Send>>;

#[tonic::async_trait]
impl GrpcInferenceService for Grpc {
    async fn server_live(
        &self,
        _request: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        Ok(Response::new(pb::ServerLiveResponse {
            live: self.server.live(),
        }))
    }

    async fn server_ready(
        &self,
        _request: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        Ok(Response::new(pb::ServerReadyResponse {
            ready: self.server.ready(),
        }))
    }

    async fn model_ready(
        &self,
        request: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let principal = self.principal(&request)?;
        let r = request.into_inner();
        let version = parse_version(&r.version).map_err(|e| status(&e))?;
        // Triton answers `ready: false` for a model that does not exist too.
        let ready = self
            .server
            .model_ready(&principal, &r.name, version)
            .is_ok();
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        request: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        self.principal(&request)?;
        Ok(Response::new(pb::ServerMetadataResponse {
            name: self.server.name().into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: super::http::EXTENSIONS
                .iter()
                .map(|e| (*e).to_owned())
                .collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        use pb::model_metadata_response::TensorMetadata;
        let principal = self.principal(&request)?;
        let r = request.into_inner();
        let version = parse_version(&r.version).map_err(|e| status(&e))?;
        let m = self
            .server
            .model_metadata(&principal, &r.name, version)
            .map_err(|e| status(&e))?;
        let tensors = |specs: &[crate::signature::TensorSpec]| {
            specs
                .iter()
                .map(|t| TensorMetadata {
                    name: t.name.clone(),
                    datatype: t.datatype.name().into(),
                    shape: t.client_shape(m.batched),
                })
                .collect()
        };
        Ok(Response::new(pb::ModelMetadataResponse {
            inputs: tensors(&m.inputs),
            outputs: tensors(&m.outputs),
            versions: m.versions.iter().map(i64::to_string).collect(),
            name: m.name,
            platform: m.platform,
        }))
    }

    async fn model_infer(
        &self,
        request: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        let principal = self.principal(&request)?;
        let trace = trace_context(&request);
        self.infer(&principal, trace, request.into_inner())
            .await
            .map(Response::new)
            .map_err(|e| status(&e))
    }

    type ModelStreamInferStream = ResponseStream;

    /// Up to [`STREAM_CONCURRENCY`] requests of a stream run at once. Each is answered by every
    /// response its model sends (one, unless the model is decoupled), each marked with
    /// Triton's `triton_final_response`; a decoupled model's final response without outputs is
    /// sent only when the request sets `triton_enable_empty_final_response`. A failed request
    /// answers with its error in `error_message` and the stream goes on, as in Triton.
    /// Cancelling the RPC drops the streams of its requests, which cancels them.
    async fn model_stream_infer(
        &self,
        request: Request<Streaming<pb::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let principal = self.principal(&request)?;
        // Each request of the stream is its own trace, under the stream's trace context.
        let trace = trace_context(&request);
        let this = Arc::new(Grpc {
            server: self.server.clone(),
            verbose_errors: self.verbose_errors,
        });
        let answers = request
            .into_inner()
            .map(move |message| {
                let (this, principal, trace) = (this.clone(), principal.clone(), trace.clone());
                async move {
                    let message = message?;
                    Ok::<_, Status>(this.stream_infer(&principal, trace, message).await)
                }
            })
            .buffered(STREAM_CONCURRENCY)
            .map(|answers| match answers {
                Ok(answers) => answers.map(Ok).boxed(),
                Err(status) => futures::stream::once(async { Err(status) }).boxed(),
            })
            // Every request that was started is read: a limit here would leave a started
            // stream unread while its model waits on it to take more (a decoupled handler
            // interleaving its streams would stall them all). What bounds them is admission
            // (--max-inflight-requests) and `buffered`'s limit on requests being started.
            .flatten_unordered(None);
        Ok(Response::new(Box::pin(answers)))
    }

    async fn model_config(
        &self,
        request: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        let principal = self.principal(&request)?;
        let r = request.into_inner();
        let version = parse_version(&r.version).map_err(|e| status(&e))?;
        let config = self
            .server
            .model_config(&principal, &r.name, version)
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(crate::config::ModelConfig::clone(&config)),
        }))
    }

    async fn model_statistics(
        &self,
        request: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        let principal = self.principal(&request)?;
        let r = request.into_inner();
        let version = parse_version(&r.version).map_err(|e| status(&e))?;
        let model = (!r.name.is_empty()).then_some(r.name.as_str());
        let stats = self
            .server
            .statistics(&principal, model, version)
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::ModelStatisticsResponse {
            model_stats: stats
                .iter()
                .map(|v| statistics(&v.name, v.version, &v.stats))
                .collect(),
        }))
    }

    async fn repository_index(
        &self,
        request: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        use pb::repository_index_response::ModelIndex;
        let principal = self.principal(&request)?;
        let ready = request.into_inner().ready;
        let models = self
            .server
            .repository_index(&principal, ready)
            .into_iter()
            .map(|row| ModelIndex {
                name: row.name,
                version: row.version,
                state: row.state.map(|s| s.as_str().to_owned()).unwrap_or_default(),
                reason: row.reason,
            })
            .collect();
        Ok(Response::new(pb::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        use pb::model_repository_parameter::ParameterChoice;
        let principal = self.principal(&request)?;
        let r = request.into_inner();
        let mut load = LoadRequest::default();
        for (key, value) in r.parameters {
            match (key.as_str(), value.parameter_choice) {
                ("config", Some(ParameterChoice::StringParam(json))) => load.config = Some(json),
                (path, Some(ParameterChoice::BytesParam(bytes))) if path.starts_with("file:") => {
                    load.files.push((path["file:".len()..].to_owned(), bytes));
                }
                (key, _) => {
                    return Err(Status::invalid_argument(format!(
                        "unknown or malformed load parameter '{key}' (expected 'config' as a string or 'file:<path>' as bytes)"
                    )));
                }
            }
        }
        self.server
            .load_model(&principal, &r.model_name, load)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        use pb::model_repository_parameter::ParameterChoice;
        let principal = self.principal(&request)?;
        let r = request.into_inner();
        let mut dependents = false;
        for (key, value) in r.parameters {
            match (key.as_str(), value.parameter_choice) {
                ("unload_dependents", Some(ParameterChoice::BoolParam(b))) => dependents = b,
                (key, _) => {
                    return Err(Status::invalid_argument(format!(
                        "unknown or malformed unload parameter '{key}' (expected 'unload_dependents' as a bool)"
                    )));
                }
            }
        }
        self.server
            .unload_model(&principal, &r.model_name, dependents)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<pb::SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryStatusResponse>, Status> {
        use pb::system_shared_memory_status_response::RegionStatus;
        let principal = self.principal(&request)?;
        let shm = self.shared_memory(&principal)?;
        let name = request.into_inner().name;
        let regions = shm
            .status((!name.is_empty()).then_some(name.as_str()))
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::SystemSharedMemoryStatusResponse {
            regions: regions
                .into_iter()
                .map(|r| {
                    let status = RegionStatus {
                        name: r.name.clone(),
                        key: r.key,
                        offset: r.offset as u64,
                        byte_size: r.byte_size as u64,
                    };
                    (r.name, status)
                })
                .collect(),
        }))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<pb::SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryRegisterResponse>, Status> {
        let principal = self.principal(&request)?;
        let shm = self.shared_memory(&principal)?;
        let r = request.into_inner();
        let size = |n: u64| {
            usize::try_from(n).map_err(|_| Status::invalid_argument("offset or size too large"))
        };
        shm.register(&r.name, &r.key, size(r.offset)?, size(r.byte_size)?)
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        request: Request<pb::SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryUnregisterResponse>, Status> {
        let principal = self.principal(&request)?;
        let shm = self.shared_memory(&principal)?;
        let name = request.into_inner().name;
        shm.unregister((!name.is_empty()).then_some(name.as_str()));
        Ok(Response::new(pb::SystemSharedMemoryUnregisterResponse {}))
    }

    /// No CUDA regions can exist: the status is empty (clients that clean up every kind of
    /// region, as perf_analyzer does, succeed).
    async fn cuda_shared_memory_status(
        &self,
        request: Request<pb::CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryStatusResponse>, Status> {
        self.principal(&request)?;
        match request.into_inner().name.as_str() {
            "" => Ok(Response::new(pb::CudaSharedMemoryStatusResponse::default())),
            name => Err(Status::not_found(format!(
                "Unable to find CUDA shared memory region: '{name}'"
            ))),
        }
    }

    async fn cuda_shared_memory_register(
        &self,
        _request: Request<pb::CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryRegisterResponse>, Status> {
        Err(cuda_unsupported())
    }

    async fn cuda_shared_memory_unregister(
        &self,
        request: Request<pb::CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryUnregisterResponse>, Status> {
        self.principal(&request)?;
        match request.into_inner().name.as_str() {
            "" => Ok(Response::new(pb::CudaSharedMemoryUnregisterResponse {})),
            name => Err(Status::not_found(format!(
                "Unable to find CUDA shared memory region: '{name}'"
            ))),
        }
    }

    async fn trace_setting(
        &self,
        _request: Request<pb::TraceSettingRequest>,
    ) -> Result<Response<pb::TraceSettingResponse>, Status> {
        Err(Status::unimplemented("trace settings are not supported"))
    }

    async fn log_settings(
        &self,
        _request: Request<pb::LogSettingsRequest>,
    ) -> Result<Response<pb::LogSettingsResponse>, Status> {
        Err(Status::unimplemented(
            "log settings are not supported (use --log-verbose or RUST_LOG)",
        ))
    }
}

fn cuda_unsupported() -> Status {
    Status::unimplemented("CUDA shared memory is not supported: this server has no GPU support")
}

fn duration(t: &Tally) -> Option<pb::StatisticDuration> {
    Some(pb::StatisticDuration {
        count: t.count,
        ns: t.ns,
    })
}

/// One version's statistics as Triton's `ModelStatistics`.
fn statistics(name: &str, version: i64, s: &StatsSnapshot) -> pb::ModelStatistics {
    pb::ModelStatistics {
        name: name.to_owned(),
        version: version.to_string(),
        last_inference: s.last_inference_ms,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(pb::InferStatistics {
            success: duration(&s.success),
            fail: duration(&s.fail),
            queue: duration(&s.queue),
            compute_input: duration(&s.compute_input),
            compute_infer: duration(&s.compute_infer),
            compute_output: duration(&s.compute_output),
            cache_hit: duration(&Tally::default()),
            cache_miss: duration(&Tally::default()),
        }),
        batch_stats: s
            .batch
            .iter()
            .map(|(size, b)| pb::InferBatchStatistics {
                batch_size: *size as u64,
                compute_input: duration(&b.compute_input),
                compute_infer: duration(&b.compute_infer),
                compute_output: duration(&b.compute_output),
            })
            .collect(),
        memory_usage: Vec::new(),
        response_stats: HashMap::new(),
    }
}

/// Streams one gRPC connection may have open at once (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS;
/// clients queue past it). Each open stream costs the server about 11 KB even while idle:
/// unbounded, one connection opening 80,000 streams held 870 MB.
pub const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// The largest header block HTTP/2 reads before refusing a whole connection; above
/// [`MAX_METADATA_BYTES`] and below this, only the call is refused.
pub const MAX_HEADER_LIST_BYTES: u32 = 256 * 1024;

/// The largest request metadata (headers) a call may carry, counted as HTTP/2 does (name, value
/// and 32 bytes each); beyond it the call is RESOURCE_EXHAUSTED, as gRPC's own servers answer.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;

/// Bounds what crosses the gRPC boundary, for every RPC and whatever produced the status:
/// request metadata ([`MAX_METADATA_BYTES`]), request messages being read ([`MessageBudget`])
/// and response messages being written ([`WrittenBody`]),
/// status messages ([`tessera_core::infer::MAX_ERROR_MESSAGE_BYTES`], since clients drop a
/// response whose header is too large and report only "stream removed"), and the code of an
/// oversized message (tonic says OUT_OF_RANGE; gRPC's status table and Triton say
/// RESOURCE_EXHAUSTED). It also reads the caller's key, before any message: a caller without a
/// valid one is refused at once but for the open calls ([`OPEN_CALLS`]), whose messages may
/// hold [`UNAUTHENTICATED_MESSAGE_BYTES`] at most, so that no one without a key holds more than
/// a few buffered bytes.
#[derive(Clone)]
pub struct GrpcBoundsLayer {
    /// The server, for its tenants' keys.
    pub server: Arc<Server>,
    /// Request bodies being read at once, shared with HTTP/1 (`--http-max-buffered-bytes`).
    pub reading: ByteBudget,
    /// The largest message tonic decodes; a longer one is left for tonic to refuse.
    pub max_message: usize,
    /// How long one message may take to arrive once begun (`--http-body-read-timeout-secs`).
    pub message_timeout: Duration,
    /// How long a held response message may make no progress (`--http-send-timeout-secs`).
    pub send_timeout: Duration,
}

impl<S> tower_layer::Layer<S> for GrpcBoundsLayer {
    type Service = GrpcBounds<S>;

    fn layer(&self, inner: S) -> GrpcBounds<S> {
        GrpcBounds {
            inner,
            bounds: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct GrpcBounds<S> {
    inner: S,
    bounds: GrpcBoundsLayer,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, ResBody> tower_service::Service<http::Request<tonic::body::Body>> for GrpcBounds<S>
where
    S: tower_service::Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let metadata: usize = request
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 32)
            .sum();
        if metadata > MAX_METADATA_BYTES {
            let status = Status::resource_exhausted(format!(
                "the request metadata holds {metadata} bytes, over the limit of {MAX_METADATA_BYTES}"
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let bounds = &self.bounds;
        let caller = Caller(
            bounds
                .server
                .tenants()
                .authenticate(request.headers().get("authorization").map(|v| v.as_bytes()))
                .map_err(|e| Status::unauthenticated(e.to_string())),
        );
        let unauthenticated = caller.0.as_ref().err().cloned();
        if let Some(status) = &unauthenticated
            && !OPEN_CALLS.contains(&request.uri().path())
        {
            let status = status.clone();
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let mut request = request;
        request.extensions_mut().insert(caller);
        // Only ModelStreamInfer takes a stream of messages; every other call takes one.
        let unary = !request.uri().path().ends_with("/ModelStreamInfer");
        let connection = request
            .extensions()
            .get::<GrpcConnection>()
            .map(|connection| connection.state.clone());
        let closer = connection.as_ref().map(|state| state.closer.clone());
        // The call is in progress on its connection until its response is dropped.
        let in_progress = connection.as_ref().map(ConnectionState::begin);
        let request = request.map(|body| {
            let mut budget = MessageBudget::new(
                body,
                bounds.reading.clone(),
                bounds.max_message,
                bounds.message_timeout,
                closer.clone(),
            );
            budget.unauthenticated = unauthenticated;
            tonic::body::Body::new(if unary { budget.unary() } else { budget })
        });
        let answer = self.inner.call(request);
        let writing = bounds.reading.clone();
        let send_timeout = bounds.send_timeout;
        Box::pin(async move {
            use http_body_util::BodyExt;
            let (mut parts, body) = answer.await?.into_parts();
            bound_status(&mut parts.headers);
            let body = body.map_frame(|frame| match frame.into_trailers() {
                Ok(mut trailers) => {
                    bound_status(&mut trailers);
                    http_body::Frame::trailers(trailers)
                }
                Err(frame) => frame,
            });
            // Response messages a client has not taken stay in the budget for buffered bytes.
            let mut body = WrittenBody::new(tonic::body::Body::new(body), writing).grpc();
            if let Some(closer) = closer {
                body = body.watched(closer, send_timeout);
            }
            if let Some(in_progress) = in_progress {
                body = body.in_progress(in_progress);
            }
            Ok(http::Response::from_parts(
                parts,
                tonic::body::Body::new(body),
            ))
        })
    }
}

/// A gRPC request body that holds, while a message is being read, the bytes its prefix declares
/// in the server's budget for bodies being read, and fails the call when they do not fit or when
/// the message has not arrived in full within the timeout. tonic buffers a message until its
/// last byte: without this, a client holding all but one byte of a 60 MB message on each of a
/// connection's 1,024 streams held 60 GB of the server's memory, for as long as it liked.
///
/// On a stream, the bytes are reserved, and the deadline starts, when the server asks for more
/// of a message than came with the frame its prefix was in: a stream's next request may arrive
/// with the previous one and wait its turn, unreserved (it holds no more than that frame). From
/// then on the deadline holds even when the body is not polled (a `ModelStreamInfer` client
/// that grants its answers no window stops the reading of its requests): past it, and a short
/// grace for the call to fail on its own, the connection is closed ([`ConnectionCloser`]).
///
/// Messages are framed as one compression flag byte, a 4-byte big-endian length and that many
/// bytes (gRPC over HTTP/2, "Length-Prefixed-Message").
pub struct MessageBudget<B> {
    inner: B,
    reading: ByteBudget,
    max_message: usize,
    timeout: Duration,
    /// The prefix of the next message, as far as it has arrived.
    prefix: [u8; 5],
    prefix_seen: usize,
    /// Bytes of the current message still to come (0 between messages).
    remaining: u64,
    /// What the current message is to hold in the budget, until it is reserved.
    unreserved: Option<u64>,
    /// The current message's place in the budget.
    held: Option<Held>,
    /// When the current message (a unary call: the whole request, from its start) must have
    /// arrived.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A unary call's deadline, made a timer only once its body has to be waited for (most
    /// arrive whole with their headers: no timer to set and cancel).
    unary_deadline: Option<tokio::time::Instant>,
    /// The connection, for the deadline when the body is not polled.
    closer: Option<ConnectionCloser>,
    /// Why the caller has no valid key, if it has none: its messages may not be larger than
    /// [`UNAUTHENTICATED_MESSAGE_BYTES`].
    unauthenticated: Option<Status>,
    /// A unary call: its one message stays held, under the same deadline, until the request
    /// ends (tonic keeps the decoded message while it waits for the end of the stream, so a
    /// client that never ended it held the message for good).
    unary: bool,
}

/// A message's place in the read budget.
struct Held {
    _permit: tokio::sync::OwnedSemaphorePermit,
    /// Closes the connection a little after the deadline if the body is not polled by then.
    _watchdog: Option<Watchdog>,
}

/// The calls a caller without a valid key may make once tenancy is on: liveness and readiness,
/// as over HTTP. Any other is refused with UNAUTHENTICATED before its message is read.
const OPEN_CALLS: &[&str] = &[
    "/inference.GRPCInferenceService/ServerLive",
    "/inference.GRPCInferenceService/ServerReady",
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
];

/// The largest message a caller without a valid key may send to an open call (they need a few
/// bytes), uncompressed; a larger or compressed one ends the call with UNAUTHENTICATED before
/// it is read.
pub const UNAUTHENTICATED_MESSAGE_BYTES: u64 = 1024;

/// Who called, as [`GrpcBounds`] found it from the call's `authorization` metadata before
/// reading any message (request extensions).
#[derive(Clone)]
struct Caller(Result<Principal, Status>);

/// How long after a message's deadline its connection is closed if the call has not failed on
/// its own (its body was not polled).
const UNPOLLED_MESSAGE_GRACE: Duration = Duration::from_secs(1);

impl<B> MessageBudget<B> {
    pub fn new(
        inner: B,
        reading: ByteBudget,
        max_message: usize,
        timeout: Duration,
        closer: Option<ConnectionCloser>,
    ) -> Self {
        MessageBudget {
            inner,
            reading,
            max_message,
            timeout,
            prefix: [0; 5],
            prefix_seen: 0,
            remaining: 0,
            unreserved: None,
            held: None,
            deadline: None,
            unary_deadline: None,
            closer,
            unauthenticated: None,
            unary: false,
        }
    }

    /// For a unary call's body: see [`MessageBudget::unary`]'s field. Its deadline runs from
    /// now: tonic reads a unary request to its end, so a call whose message never comes (or
    /// never ends) fails then rather than holding its connection's slot for good.
    pub fn unary(mut self) -> Self {
        self.unary = true;
        self.unary_deadline = tokio::time::Instant::now().checked_add(self.timeout);
        self
    }

    /// Follows the framing through `data`, reserving each message's length as its prefix
    /// completes and releasing it with its last byte.
    fn read(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let taken = data
                    .len()
                    .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
                data = &data[taken..];
                self.remaining -= taken as u64;
                if self.remaining == 0 {
                    // Arrived with the frame its prefix was in: nothing to reserve.
                    self.unreserved = None;
                    if !self.unary {
                        self.held = None;
                        self.deadline = None;
                    }
                }
                continue;
            }
            let taken = data.len().min(self.prefix.len() - self.prefix_seen);
            self.prefix[self.prefix_seen..self.prefix_seen + taken].copy_from_slice(&data[..taken]);
            self.prefix_seen += taken;
            data = &data[taken..];
            if self.prefix_seen < self.prefix.len() {
                continue;
            }
            self.prefix_seen = 0;
            let [compressed, a, b, c, d] = self.prefix;
            let compressed = compressed != 0;
            self.remaining = u64::from(u32::from_be_bytes([a, b, c, d]));
            if let Some(status) = &self.unauthenticated
                && (compressed || self.remaining > UNAUTHENTICATED_MESSAGE_BYTES)
            {
                return Err(status.clone());
            }
            // tonic refuses a message over its limit as soon as it reads the prefix.
            if self.remaining == 0 || self.remaining > self.max_message as u64 {
                continue;
            }
            // A compressed message is decompressed whole, up to tonic's limit, whatever its
            // prefix says: that is what it may hold.
            let holds = if compressed {
                self.max_message as u64
            } else {
                self.remaining
            };
            if self.unary {
                // One message, read to the end of the request without a pause.
                self.reserve(holds)?;
            } else {
                self.unreserved = Some(holds);
            }
        }
        Ok(())
    }

    /// The server asks for more of the body: a message begun in the last frame is reserved.
    fn asked_for_more(&mut self) -> Result<(), Status> {
        match self.unreserved.take() {
            Some(declared) => self.reserve(declared),
            None => Ok(()),
        }
    }

    /// Reserves what the current message may hold and, on a stream, starts its deadline and
    /// the watchdog behind it (a unary call's deadline runs from its start, and tonic polls
    /// its body to the end: no watchdog needed).
    fn reserve(&mut self, holds: u64) -> Result<(), Status> {
        let permit = self.reading.try_reserve(holds).ok_or_else(|| {
            Status::unavailable(format!(
                "the server is reading as many request messages as it may hold at once \
                 (--http-max-buffered-bytes); this one may hold {holds} bytes; retry"
            ))
        })?;
        let secs = self.timeout.as_secs();
        let watchdog = match &self.closer {
            Some(closer) if !self.unary => Some(closer.close_after(
                self.timeout.saturating_add(UNPOLLED_MESSAGE_GRACE),
                format!(
                    "a request message of {holds} bytes did not arrive in full within {secs} s \
                     (--http-body-read-timeout-secs) while its stream was stalled"
                ),
            )),
            _ => None,
        };
        if !self.unary {
            self.deadline = Some(Box::pin(tokio::time::sleep(self.timeout)));
        }
        self.held = Some(Held {
            _permit: permit,
            _watchdog: watchdog,
        });
        Ok(())
    }
}

impl<B> http_body::Body for MessageBudget<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        if let Err(status) = this.asked_for_more() {
            // Boxed as itself, so tonic finds the status (a boxed box it would not).
            return Poll::Ready(Some(Err(Box::new(status))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                match frame.data_ref() {
                    Some(data) => {
                        if let Err(status) = this.read(data) {
                            return Poll::Ready(Some(Err(Box::new(status))));
                        }
                    }
                    // Trailers end the request.
                    None => {
                        this.held = None;
                        this.deadline = None;
                        this.unreserved = None;
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.held = None;
                this.deadline = None;
                this.unreserved = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                // Checked only while waiting for the client: a message the server has not
                // asked to read yet (a stream's requests wait their turn) is not late.
                if this.deadline.is_none()
                    && let Some(at) = this.unary_deadline.take()
                {
                    this.deadline = Some(Box::pin(tokio::time::sleep_until(at)));
                }
                if let Some(deadline) = &mut this.deadline
                    && deadline.as_mut().poll(cx).is_ready()
                {
                    this.held = None;
                    this.deadline = None;
                    let secs = this.timeout.as_secs();
                    return Poll::Ready(Some(Err(Box::new(Status::deadline_exceeded(format!(
                        "the request message did not arrive in full within {secs} s \
                         (--http-body-read-timeout-secs)"
                    ))))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Applies [`GrpcBoundsLayer`]'s rules to the status in `headers` (or trailers), if any.
fn bound_status(headers: &mut http::HeaderMap) {
    const TOO_LARGE: &[&str] = &[
        "Error, decoded message length too large",
        "Error, encoded message length too large",
    ];
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()));
    if headers.get("grpc-status").is_some_and(|c| c == "11")
        && message
            .as_deref()
            .is_some_and(|m| TOO_LARGE.iter().any(|p| m.starts_with(p)))
    {
        headers.insert(
            "grpc-status",
            http::HeaderValue::from_static(RESOURCE_EXHAUSTED),
        );
    }
    if let Some(message) = message
        && message.len() > tessera_core::infer::MAX_ERROR_MESSAGE_BYTES
    {
        let bounded =
            tessera_core::infer::bounded(&message, tessera_core::infer::MAX_ERROR_MESSAGE_BYTES);
        if let Ok(value) = http::HeaderValue::from_str(&percent_encode(&bounded)) {
            headers.insert("grpc-message", value);
        }
    }
}

/// `Code::ResourceExhausted` as the header value.
const RESOURCE_EXHAUSTED: &str = "8";

/// gRPC's percent-decoding of `grpc-message` (invalid escapes are kept as they are).
fn percent_decode(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push(((hex(h).unwrap_or(0) << 4) | hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// gRPC's percent-encoding for `grpc-message`: printable ASCII but `%` stays, the rest is
/// escaped byte by byte.
fn percent_encode(text: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod bounds_tests {
    use super::*;

    fn prefix(len: u32) -> Vec<u8> {
        let mut p = vec![0u8];
        p.extend_from_slice(&len.to_be_bytes());
        p
    }

    fn budget_of(budget: &ByteBudget) -> MessageBudget<()> {
        MessageBudget::new((), budget.clone(), 1 << 20, Duration::from_secs(60), None)
    }

    #[tokio::test]
    async fn a_message_holds_its_declared_length_from_when_it_is_asked_for_to_its_last_byte() {
        let budget = ByteBudget::new(10 * 1024);
        let mut body = budget_of(&budget);
        // A prefix split across frames, then part of its 4 KiB message.
        let first = prefix(4096);
        body.read(&first[..2]).expect("fits");
        body.asked_for_more().expect("nothing to reserve");
        assert_eq!(budget.held_bytes(), 0);
        body.read(&first[2..]).expect("fits");
        // Not held until the server asks for more of it.
        assert_eq!(budget.held_bytes(), 0);
        body.asked_for_more().expect("fits");
        assert_eq!(budget.held_bytes(), 4096);
        body.read(&[7; 4000]).expect("fits");
        body.asked_for_more().expect("fits");
        assert_eq!(budget.held_bytes(), 4096);
        // Its last bytes, a whole 1-byte message and the start of the next, in one frame: the
        // next waits its turn unreserved, and is reserved once asked for.
        let mut frame = vec![7; 96];
        frame.extend(prefix(1));
        frame.push(7);
        frame.extend(prefix(8 * 1024));
        body.read(&frame).expect("fits");
        assert_eq!(budget.held_bytes(), 0);
        body.asked_for_more().expect("fits");
        assert_eq!(budget.held_bytes(), 8 * 1024);
        // A message that does not fit beside it is refused as UNAVAILABLE.
        let mut other = budget_of(&budget);
        other.read(&prefix(4096)).expect("not reserved yet");
        let refused = other.asked_for_more().expect_err("over the budget");
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert!(refused.message().contains("--http-max-buffered-bytes"));
        // A message over tonic's own limit is left for tonic to refuse; an empty one holds
        // nothing; one whole in its frame needs nothing either.
        other.read(&prefix(2 << 20)).expect("not reserved");
        other.asked_for_more().expect("not reserved");
        let mut third = budget_of(&budget);
        third.read(&prefix(0)).expect("empty");
        let mut whole = prefix(2048);
        whole.extend([7; 2048]);
        third.read(&whole).expect("whole");
        third.asked_for_more().expect("nothing to reserve");
        assert_eq!(budget.held_bytes(), 8 * 1024);
        drop(body);
        assert_eq!(budget.held_bytes(), 0);
        // A unary call's message is held from its prefix, and after its last byte until the
        // request ends.
        let mut unary = budget_of(&budget).unary();
        unary.read(&whole).expect("fits");
        assert_eq!(budget.held_bytes(), 2048);
        let mut over = budget_of(&budget).unary();
        let refused = over.read(&prefix(9 * 1024)).expect_err("over the budget");
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        drop((unary, over));
        // A compressed message holds what it may decompress to (tonic's limit, 1 MiB here).
        let roomy = ByteBudget::new(4 << 20);
        let mut compressed = budget_of(&roomy).unary();
        let mut gzip = prefix(100);
        gzip[0] = 1;
        compressed.read(&gzip).expect("fits");
        assert_eq!(roomy.held_bytes(), 1 << 20);
        // A caller without a key may send neither a compressed message nor a large one.
        let mut keyless = budget_of(&roomy).unary();
        keyless.unauthenticated = Some(Status::unauthenticated("no key"));
        let refused = keyless.read(&gzip).expect_err("compressed");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        let mut keyless = budget_of(&roomy).unary();
        keyless.unauthenticated = Some(Status::unauthenticated("no key"));
        keyless.read(&prefix(100)).expect("small");
        let mut keyless = budget_of(&roomy).unary();
        keyless.unauthenticated = Some(Status::unauthenticated("no key"));
        let refused = keyless.read(&prefix(4096)).expect_err("large");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_not_read_past_its_deadline_closes_its_connection() {
        let budget = ByteBudget::new(10 * 1024);
        let closer = ConnectionCloser::default();
        let mut body = MessageBudget::new(
            (),
            budget.clone(),
            1 << 20,
            Duration::from_secs(5),
            Some(closer.clone()),
        );
        body.read(&prefix(4096)).expect("fits");
        body.asked_for_more().expect("fits");
        tokio::time::sleep(Duration::from_secs(5) + UNPOLLED_MESSAGE_GRACE / 2).await;
        assert!(!closer.is_closed());
        tokio::time::sleep(UNPOLLED_MESSAGE_GRACE).await;
        assert!(closer.is_closed());
        // A message that arrives in time leaves the connection be.
        let other = ConnectionCloser::default();
        let mut body = MessageBudget::new(
            (),
            budget.clone(),
            1 << 20,
            Duration::from_secs(5),
            Some(other.clone()),
        );
        body.read(&prefix(4096)).expect("fits");
        body.asked_for_more().expect("fits");
        body.read(&[7; 4096]).expect("fits");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!other.is_closed());
    }

    #[test]
    fn long_status_messages_are_bounded_and_oversized_messages_are_resource_exhausted() {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
        let long = format!("bad shape [{}]", "1,".repeat(200_000));
        headers.insert(
            "grpc-message",
            http::HeaderValue::from_str(&percent_encode(&long)).expect("ascii"),
        );
        bound_status(&mut headers);
        let shown = headers.get("grpc-message").map(|m| m.len()).unwrap_or(0);
        assert!(
            shown <= 3 * tessera_core::infer::MAX_ERROR_MESSAGE_BYTES,
            "{shown}"
        );
        assert!(shown > 1000);

        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", http::HeaderValue::from_static("11"));
        headers.insert(
            "grpc-message",
            http::HeaderValue::from_static(
                "Error, decoded message length too large: found 9 bytes, the limit is: 4 bytes",
            ),
        );
        bound_status(&mut headers);
        assert_eq!(headers["grpc-status"], RESOURCE_EXHAUSTED);
        assert_eq!(percent_decode(b"a%20b%zz%"), "a b%zz%");
        assert_eq!(percent_encode("é 100%"), "%C3%A9 100%25");
    }
}
