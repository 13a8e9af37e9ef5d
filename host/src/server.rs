//! The server core that every front-end shares: the repository, the single entry point of the
//! request path ([`Server::infer`], also the [`Inference`] that backends call back into), and
//! the small API front-ends use instead of reaching into internals.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;

use crate::backend::Backends;
use crate::backend::ensemble::EnsembleBackend;
use crate::backend::onnx::OnnxBackend;
use crate::backend::wasm::{WasmBackend, WasmRuntime};
use crate::config::{BackendKind, ModelConfig};
use crate::device::Devices;
use crate::infer::{
    BoxFuture, CallContext, ErrorKind, InferError, InferRequest, InferResult, Inference,
};
use crate::limits::ServerLimits;
use crate::metrics::StatsSnapshot;
use crate::namespace::{self, ModelKey};
use crate::repository::{
    ControlError, IndexRow, LoadOptions, LoadOutcome, ModelSource, Origin, Repository,
    StartupModels,
};
use crate::scheduler::rate_limit::RateLimiter;
use crate::signature::ModelMetadata;
use crate::store::{Store, check_model_name, check_relative_path};
use crate::stream::ResponseStream;
use crate::tenants::{AdminKey, Admitted, Principal, Tenants};

/// Triton's `--model-control-mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ControlMode {
    /// Every model loads at start; load and unload requests are refused.
    None,
    /// Load and unload on request, and deployments.
    #[default]
    Explicit,
    /// The repository folders are re-read every poll interval; requests are refused.
    Poll,
}

/// A `load` request, as Triton's repository extension takes it: an optional configuration (JSON)
/// that replaces `config.pbtxt`, and optional model files by path (`file:1/model.wasm`) that
/// replace the model directory (they need `config`).
#[derive(Clone, Debug, Default)]
pub struct LoadRequest {
    pub config: Option<String>,
    pub files: Vec<(String, Bytes)>,
}

pub use crate::deploy::Deployed;

/// Server-wide settings (the command line, minus the ports).
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    pub model_repositories: Vec<PathBuf>,
    pub load: LoadOptions,
    /// `--strict-readiness`: ready only when every model version is READY.
    pub strict_readiness: bool,
    /// Where compiled Wasm components are cached across restarts.
    pub wasm_cache_dir: Option<PathBuf>,
    /// `--rate-limit=execution_count`.
    pub rate_limit: bool,
    /// `--rate-limit-resource NAME:COUNT[:DEVICE]`, parsed.
    pub rate_limit_resources: Vec<crate::scheduler::rate_limit::ResourceLimit>,
    /// `--gpus`, `--min-supported-compute-capability`.
    pub devices: crate::device::DeviceOptions,
    /// `--allow-gpu-metrics`: the `nv_gpu_*` families on `/metrics` (through NVML).
    pub gpu_metrics: bool,
    pub limits: ServerLimits,
    pub control_mode: ControlMode,
    /// Repository models loaded at start (`--load-model`; every model outside explicit mode).
    pub startup_models: Option<Vec<String>>,
    /// `--repository-poll-secs`.
    pub poll_interval: Duration,
    /// `--store`: where deployments are kept; None serves without one (deployments refused).
    /// With `shared_store`, this replica's cache of it.
    pub store_dir: Option<PathBuf>,
    /// `--store s3://…` or `file://…`: the store replicas share (`crate::store::shared`).
    pub shared_store: Option<String>,
    /// `--store-poll-ms`: how often a replica looks for changes in the shared store.
    pub store_poll_interval: Duration,
    /// `--max-deployment-bytes`: the largest total of files one deployment may carry.
    pub max_deployment_bytes: usize,
    /// `--functions`: folders of functions (`<dir>/<name>/function.wasm`).
    pub function_dirs: Vec<PathBuf>,
    /// `TESSERA_ADMIN_KEY` / `--admin-key-file`: turns tenancy on (it needs the store).
    pub admin_key: Option<AdminKey>,
    /// `--server-name`: the `name` of the server metadata (empty: "tessera").
    pub server_name: String,
}

/// Why a function invocation got no answer from the function.
#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    #[error("function '{0}' is not found")]
    NotFound(String),
    #[error("function '{0}' is not available: {1}")]
    Unavailable(String, String),
    #[error(transparent)]
    Invoke(#[from] crate::backend::wasm::InvokeError),
    /// A tenant quota refused the invocation.
    #[error(transparent)]
    Quota(InferError),
}

/// The two kinds of deployments a tenant's quotas count.
#[derive(Clone, Copy, Debug)]
enum Area {
    Models,
    Functions,
}

/// Lowers a Wasm handler's own memory and time limits (its config parameters, or their
/// defaults) to a tenant's ceilings.
fn clamp_wasm_limits(config: &mut ModelConfig, ceiling: crate::tenants::WasmCeiling) {
    use crate::backend::wasm::Limits;
    let own = |key: &str, default: u64| {
        crate::config::string_parameter(config, key)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(default)
    };
    let defaults = Limits::default();
    let memory =
        own("max_memory_bytes", defaults.max_memory_bytes as u64).min(ceiling.max_memory_bytes);
    let time = own(
        "execute_deadline_ms",
        defaults.execute_deadline.as_millis() as u64,
    )
    .min(ceiling.max_time.as_millis() as u64);
    for (key, value) in [("max_memory_bytes", memory), ("execute_deadline_ms", time)] {
        config.parameters.insert(
            key.to_owned(),
            crate::config::pb::ModelParameter {
                string_value: value.to_string(),
            },
        );
    }
}

pub struct Server {
    options: ServerOptions,
    repository: Repository,
    wasm: Arc<WasmRuntime>,
    /// BLS calls in flight, to refuse calls that would deadlock across requests.
    waits: Arc<WaitGraph>,
    /// Admission control: one permit per client request in flight (`--max-inflight-requests`).
    inflight: Arc<tokio::sync::Semaphore>,
    /// The input bytes of those requests (`--max-inflight-request-bytes`).
    inflight_bytes: crate::limits::ByteBudget,
    /// What the front-ends hold for clients (`--http-max-buffered-bytes`).
    buffering: crate::limits::ByteBudget,
    functions: crate::functions::Functions,
    /// Who may call, in which namespace, within which quotas.
    tenants: Arc<Tenants>,
    /// System shared-memory regions, shared by the HTTP and gRPC front-ends.
    shared_memory: crate::shm::SharedMemory,
    /// NVML readings for `/metrics`, when the server uses GPUs and NVML loads.
    gpu_metrics: Option<crate::device::nvml::GpuMetrics>,
    /// This server as the functions' request path.
    functions_inference: Weak<dyn Inference>,
    /// Set when shutdown begins: readiness drops before anything else stops.
    stopping: std::sync::atomic::AtomicBool,
    /// The LLM engines' figures for `/metrics`.
    llm_metrics: Arc<crate::backend::llm::metrics::EngineRegistry>,
    /// Whether the shared store answered the watcher's last round.
    shared_store_reachable: std::sync::atomic::AtomicBool,
    /// Held while the server runs: one server per store folder.
    _store_lock: Option<std::fs::File>,
    /// Shared-store changes whose build failed on this replica, by key: the generation.
    shared_failures: Mutex<HashMap<String, FollowFailure>>,
    /// Held from a tenant's quota check to the end of its deployment, so that deployments sent
    /// at once cannot each pass the check before any of them counts.
    tenant_deploys: tokio::sync::Mutex<()>,
}

/// The statistics of one model version.
pub struct VersionStatistics {
    pub name: String,
    pub version: i64,
    pub stats: StatsSnapshot,
}

impl Server {
    /// The `name` the server metadata (`GET /v2`, gRPC `ServerMetadata`) answers with.
    pub fn name(&self) -> &str {
        match self.options.server_name.as_str() {
            "" => "tessera",
            name => name,
        }
    }

    /// Creates the server and loads every model of the repositories.
    pub async fn start(options: ServerOptions) -> anyhow::Result<Arc<Server>> {
        // Before the stores open: it removes what a crash left of a deleted tenant.
        // Before anything reads or cleans the store folder (the tenant registry does both).
        let store_lock = match &options.store_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                Some(crate::store::lock_area(dir, "server")?)
            }
            None => None,
        };
        let shared = match &options.shared_store {
            Some(url) => {
                let replica = replica_name();
                Some(Arc::new(crate::store::shared::SharedStore::open(
                    url, &replica,
                )?))
            }
            None => None,
        };
        let tenants = Arc::new(match (&options.admin_key, &options.store_dir) {
            (None, _) => Tenants::disabled(),
            (Some(_), None) => {
                anyhow::bail!("tenancy (an admin key) needs a deployment store (--store)")
            }
            (Some(key), Some(dir)) => match &shared {
                Some(shared) => Tenants::open_shared(dir, &key.0, shared.clone()).await?,
                None => {
                    let (key, dir) = (key.0.clone(), dir.clone());
                    tokio::task::spawn_blocking(move || Tenants::open(&dir, &key)).await??
                }
            },
        });
        let (store, function_store) = match &options.store_dir {
            Some(dir) => {
                let (dir, with_tenants) = (dir.clone(), tenants.enabled());
                let (mut models, mut functions) = tokio::task::spawn_blocking(move || {
                    Ok::<_, crate::store::StoreError>((
                        Store::open(&dir, "models", with_tenants)?,
                        Store::open(&dir, "functions", with_tenants)?,
                    ))
                })
                .await??;
                if let Some(shared) = &shared {
                    models = models.with_shared(shared.area("models"));
                    functions = functions.with_shared(shared.area("functions"));
                }
                (Some(Arc::new(models)), Some(Arc::new(functions)))
            }
            None => (None, None),
        };
        let wasm = Arc::new(WasmRuntime::new(
            options.wasm_cache_dir.clone(),
            &options.limits,
        )?);
        let limiter = Arc::new(RateLimiter::new(
            options.rate_limit,
            &options.rate_limit_resources,
        ));
        let device_options = options.devices.clone();
        let devices = Arc::new(
            tokio::task::spawn_blocking(move || Devices::discover(&device_options)).await?,
        );
        match devices.unavailable() {
            Some(reason) => tracing::info!("no GPU in use: {reason}"),
            None => {
                for line in devices.describe() {
                    tracing::info!(
                        driver = devices.driver_version().as_deref().unwrap_or("?"),
                        "{line}"
                    );
                }
            }
        }
        let gpu_metrics = if options.gpu_metrics {
            crate::device::nvml::GpuMetrics::start(&devices)
        } else {
            None
        };
        let llm_metrics = Arc::new(crate::backend::llm::metrics::EngineRegistry::default());
        let backends = Backends::new(devices.clone(), options.limits.max_instances_per_model)
            .with(BackendKind::Onnx, Arc::new(OnnxBackend))
            .with(BackendKind::Wasm, Arc::new(WasmBackend(wasm.clone())))
            .with(
                BackendKind::Llm,
                Arc::new(crate::backend::llm::LlmBackend {
                    metrics: llm_metrics.clone(),
                    meter: tenants.clone(),
                }),
            )
            .with(
                BackendKind::Ensemble,
                Arc::new(EnsembleBackend {
                    concurrency: options.limits.ensemble_concurrency,
                }),
            );
        // Models hold the request path weakly: they are owned by the server they call into.
        let server = Arc::new_cyclic(|me: &Weak<Server>| {
            let inference: Weak<dyn Inference> = me.clone();
            Server {
                repository: Repository::new(
                    options.model_repositories.clone(),
                    store,
                    backends,
                    limiter,
                    inference,
                    &options.load,
                    tenants.clone(),
                ),
                inflight_bytes: crate::limits::ByteBudget::new(
                    options.limits.max_inflight_request_bytes,
                ),
                buffering: crate::limits::ByteBudget::new(options.limits.http_max_buffered_bytes),
                inflight: Arc::new(tokio::sync::Semaphore::new(
                    options.limits.max_inflight_requests,
                )),
                options,
                wasm,
                waits: Arc::default(),
                functions: crate::functions::Functions::new(function_store, tenants.clone()),
                tenants,
                shared_memory: crate::shm::SharedMemory::default(),
                functions_inference: me.clone(),
                tenant_deploys: tokio::sync::Mutex::new(()),
                gpu_metrics,
                stopping: std::sync::atomic::AtomicBool::new(false),
                llm_metrics,
                shared_store_reachable: std::sync::atomic::AtomicBool::new(true),
                shared_failures: Mutex::default(),
                _store_lock: store_lock,
            }
        });
        let startup = match (&server.options.startup_models, server.options.control_mode) {
            (Some(names), ControlMode::Explicit) if !names.iter().any(|n| n == "*") => {
                StartupModels::Named(names.clone())
            }
            _ => StartupModels::All,
        };
        server
            .repository
            .control()
            .await
            .load_startup(&startup)
            .await
            .map_err(anyhow::Error::msg)?;
        // Functions call models: they load after them.
        server
            .functions
            .load(
                &server.wasm,
                &server.options.function_dirs,
                server.inference(),
            )
            .await;
        if server.options.shared_store.is_some() {
            // A replica that starts later serves everything before it says it is ready; one
            // that cannot reach the store serves its cache.
            server.follow_shared_store().await;
            let (me, interval) = (
                Arc::downgrade(&server),
                server
                    .options
                    .store_poll_interval
                    .max(Duration::from_millis(50)),
            );
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(interval).await;
                    let Some(server) = me.upgrade() else { break };
                    server.follow_shared_store().await;
                }
            });
        }
        if server.options.control_mode == ControlMode::Poll {
            let (me, interval) = (Arc::downgrade(&server), server.options.poll_interval);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(interval).await;
                    let Some(server) = me.upgrade() else { break };
                    server.repository.control().await.poll().await;
                }
            });
        }
        Ok(server)
    }

    /// One round of following the shared store: applies every deployment whose newest
    /// generation this replica has not applied, models first (functions call them).
    async fn follow_shared_store(&self) {
        self.follow_shared_tenants().await;
        let stores = [
            (self.repository.store().cloned(), true),
            (self.functions.store().cloned(), false),
        ];
        for (store, models) in stores {
            let Some(store) = store else { continue };
            let Some(shared) = store.shared() else {
                continue;
            };
            let generations = match shared.generations().await {
                Ok(g) => {
                    if !self.shared_store_reachable.swap(true, Ordering::Relaxed) {
                        tracing::info!(
                            store = shared.url(),
                            "the shared deployment store is reachable"
                        );
                    }
                    g
                }
                Err(e) => {
                    if self.shared_store_reachable.swap(false, Ordering::Relaxed) {
                        tracing::error!(
                            store = shared.url(),
                            "{e}; serving the deployments cached here until it is back"
                        );
                    }
                    return;
                }
            };
            for (key, generation) in generations {
                if let Some(tenant) = ModelKey::parse(&key).tenant
                    && self.tenants.get(tenant).is_none()
                {
                    // A tenant this replica does not know (no tenancy here, or one being
                    // deleted): nobody could call it, and a later tenant of that name must not
                    // inherit it.
                    continue;
                }
                let applied = store.manifest(&key).map_or(0, |m| m.generation);
                let waiting = self.shared_failures.lock().ok().is_some_and(|f| {
                    f.get(&key).is_some_and(|failure| {
                        failure.generation == generation
                            && std::time::Instant::now() < failure.retry_at
                    })
                });
                if applied >= generation || waiting {
                    continue;
                }
                let followed = match shared.manifest(&key, generation).await {
                    Err(e) => Err(ControlError::from(e)),
                    Ok(manifest) if models => {
                        let control = self.repository.control().await;
                        crate::deploy::follow(&store, &ModelTarget(&control), &key, &manifest).await
                    }
                    Ok(manifest) => {
                        self.functions
                            .follow(&self.wasm, &key, &manifest, self.inference())
                            .await
                    }
                };
                let Ok(mut failures) = self.shared_failures.lock() else {
                    continue;
                };
                match followed {
                    Ok(()) => {
                        failures.remove(&key);
                    }
                    // A store that fails to answer is asked again next round.
                    Err(e @ ControlError::Unavailable(_)) => {
                        tracing::warn!(
                            key,
                            generation,
                            "cannot apply a change of the shared store: {e}"
                        );
                    }
                    // One that cannot be applied here (its build fails, its files are damaged,
                    // the disk is full) is tried again later, less and less often.
                    Err(e) => {
                        let attempts = failures
                            .get(&key)
                            .filter(|f| f.generation == generation)
                            .map_or(0, |f| f.attempts)
                            + 1;
                        let wait =
                            Duration::from_secs(5 << attempts.min(6)).min(Duration::from_secs(300));
                        tracing::error!(
                            key,
                            generation,
                            attempts,
                            retry_in_s = wait.as_secs(),
                            "cannot apply a change of the shared store: {e}"
                        );
                        failures.insert(
                            key,
                            FollowFailure {
                                generation,
                                attempts,
                                retry_at: std::time::Instant::now() + wait,
                            },
                        );
                    }
                }
            }
        }
    }

    /// The tenants round of [`Server::follow_shared_store`]: a newer registry serves here, and
    /// the deployments of tenants it no longer names are removed here.
    async fn follow_shared_tenants(&self) {
        let Some(shared) = self.tenants.shared() else {
            return;
        };
        let generation = match shared.registry_generation().await {
            Ok(g) if g > self.tenants.generation() => g,
            _ => return,
        };
        let followed = match shared.registry(generation).await {
            Ok(bytes) => crate::deploy::disk(|| self.tenants.follow(generation, &bytes))
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = followed {
            tracing::error!(generation, "cannot serve the shared tenant registry: {e}");
        }
        // Before the deployments' round: a new tenant of a deleted one's name starts empty.
        for tenant in self.tenants.take_removed() {
            if let Err(e) = self.remove_tenant_here(&tenant).await {
                tracing::error!(tenant, "removing a deleted tenant's deployments: {e}");
            }
        }
    }

    /// Whether the shared store answered the last time it was asked (true without one).
    pub fn shared_store_reachable(&self) -> bool {
        self.shared_store_reachable.load(Ordering::Relaxed)
    }

    /// The tenants of this server (the admin API's).
    pub fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// The system shared-memory regions the front-ends read inputs from and write outputs to.
    /// The operator's only: a region's key reaches any shared-memory object of the server's
    /// user, so with tenancy on, tenants' requests get no regions.
    pub fn shared_memory(&self, principal: &Principal) -> Option<&crate::shm::SharedMemory> {
        matches!(principal, Principal::Operator).then_some(&self.shared_memory)
    }

    /// The key a model name means in `namespace` ([`Repository::resolve`]).
    fn resolve(&self, namespace: Option<&str>, name: &str) -> Result<String, InferError> {
        match namespace {
            // A key names a tenant's model; the operator reaches tenants' models only through
            // the admin API.
            None if ModelKey::is_key(name) => Err(InferError::not_found(format!(
                "Request for unknown model: '{name}' is not found"
            ))),
            None => Ok(name.to_owned()),
            Some(_) => Ok(self.repository.resolve(namespace, name)),
        }
    }

    /// Whether `key` is visible in `namespace`: its own, or granted to it.
    fn visible(&self, namespace: Option<&str>, key: &str) -> bool {
        match (namespace, ModelKey::parse(key)) {
            (None, key) => key.tenant.is_none(),
            (
                Some(tenant),
                ModelKey {
                    tenant: Some(owner),
                    ..
                },
            ) => owner == tenant,
            (Some(tenant), ModelKey { tenant: None, name }) => self.tenants.granted(tenant, name),
        }
    }

    /// Runs `request` on `model` (`version` None: the newest READY version). HTTP, ensemble steps
    /// and Wasm handlers' `infer` calls all come through here, into that model's queue.
    ///
    /// The one choke point of tenancy: the name resolves in the caller's namespace (grants
    /// checked), and a tenant's client request is admitted within its quotas, whoever sent it.
    pub async fn infer(
        &self,
        mut cx: CallContext,
        model: &str,
        version: Option<i64>,
        request: InferRequest,
    ) -> InferResult {
        use tracing::Instrument;
        // One span per model a request reaches: the client's, each ensemble step, each BLS call.
        let hop = tracing::debug_span!(
            target: crate::telemetry::TARGET,
            parent: &cx.span,
            "infer",
            model,
            version = version.unwrap_or(-1),
            caller = cx.caller().unwrap_or(""),
            request_id = cx.request_id,
        );
        cx.span = hop.clone();
        self.infer_key(cx, model, version, request)
            .instrument(hop)
            .await
    }

    async fn infer_key(
        &self,
        cx: CallContext,
        model: &str,
        version: Option<i64>,
        mut request: InferRequest,
    ) -> InferResult {
        let admission = self.admit(&cx, model, version, &mut request)?;
        let result = admission.target.infer(cx, request).await;
        if let Some(admitted) = admission.tenant {
            admitted.finish(result.is_ok());
        }
        result
    }

    /// Runs `request` on `model` and reads its responses as a stream: every response of a
    /// decoupled model, the one result of any other. A client's request, through the same
    /// resolution, admission and queue as [`Server::infer`]; it stays admitted until its
    /// stream ends or is dropped (which cancels it).
    pub async fn infer_stream(
        &self,
        mut cx: CallContext,
        model: &str,
        version: Option<i64>,
        mut request: InferRequest,
    ) -> Result<ResponseStream, InferError> {
        let hop = tracing::debug_span!(
            target: crate::telemetry::TARGET,
            parent: &cx.span,
            "infer",
            model,
            version = version.unwrap_or(-1),
            streamed = true,
            request_id = cx.request_id,
        );
        cx.span = hop;
        let Admission {
            target,
            inflight,
            inflight_bytes,
            tenant,
            waiting,
        } = self.admit(&cx, model, version, &mut request)?;
        match target.infer_stream(cx, request).await {
            // What the request holds, it holds while its stream is read: a BLS call's wait
            // edge too, so a cycle through a stream is seen as through any call.
            Ok(stream) => Ok(stream
                .hold(inflight)
                .hold(inflight_bytes)
                .hold(tenant.map(Admitted::started))
                .hold(waiting)),
            Err(e) => {
                if let Some(admitted) = tenant {
                    admitted.finish(false);
                }
                Err(e)
            }
        }
    }

    /// The checks every request passes before it is queued: the name resolves in the caller's
    /// namespace, no BLS cycle or excess depth, the server's and the tenant's admission, a
    /// READY version. What it returns is held while the request runs.
    fn admit(
        &self,
        cx: &CallContext,
        model: &str,
        version: Option<i64>,
        request: &mut InferRequest,
    ) -> Result<Admission, InferError> {
        let key = self.resolve(cx.namespace(), model)?;
        let model = key.as_str();
        if cx.call_chain.iter().any(|caller| caller == model) {
            return Err(InferError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "BLS cycle: {} -> {} would wait on itself",
                    namespace::shown_chain(cx.call_chain.iter().map(String::as_str)),
                    namespace::shown(model)
                ),
            ));
        }
        let max_depth = self.options.limits.max_call_depth;
        if cx.call_chain.len() >= max_depth {
            return Err(InferError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "BLS call depth limit of {max_depth} exceeded calling '{}'",
                    namespace::shown(model)
                ),
            ));
        }
        // Client requests are admitted here; the calls they make inside are part of them.
        let client_request = cx.call_chain.is_empty() && !cx.warmup;
        let (inflight, inflight_bytes) = if client_request {
            let inflight = self.inflight.clone().try_acquire_owned().map_err(|_| {
                InferError::unavailable(format!(
                    "the server has {} requests in flight, its limit (--max-inflight-requests); retry later",
                    self.options.limits.max_inflight_requests
                ))
            })?;
            // What the request holds: its input tensors, or the body or message they came in
            // when that is larger (it stays in memory with them; a JSON body padded with spaces
            // around a small tensor is all body).
            let tensors: usize = request.inputs.iter().map(|t| t.byte_size()).sum();
            let bytes = tensors.max(cx.received_bytes);
            let limit = self.options.limits.max_inflight_request_bytes;
            let held = self.inflight_bytes.try_reserve(bytes as u64).ok_or_else(|| {
                if bytes as u64 > limit {
                    InferError::new(
                        ErrorKind::ResourceExhausted,
                        format!(
                            "the request's inputs hold {bytes} bytes, more than the server \
                             holds for all requests in flight ({limit}, --max-inflight-request-bytes)"
                        ),
                    )
                } else {
                    InferError::unavailable(format!(
                        "the requests in flight hold as many input bytes as the server allows \
                         ({limit}, --max-inflight-request-bytes); this one has {bytes}; retry later"
                    ))
                }
            })?;
            (Some(inflight), Some(held))
        } else {
            (None, None)
        };
        let tenant = match (&cx.tenant, client_request) {
            (Some(name), true) => {
                let tenant = self.tenant(name)?;
                if request.priority == 0 {
                    request.priority = tenant.quotas().priority;
                }
                Some(tenant.admit()?)
            }
            _ => None,
        };
        let target = self.repository.ready_model(model, version)?;
        let waiting = match cx.caller() {
            Some(caller) => Some(self.waits.enter(caller, model).map_err(|cycle| {
                InferError::new(
                    ErrorKind::ResourceExhausted,
                    format!(
                        "BLS cycle across requests: {} -> {} would wait on a request that waits on it",
                        namespace::Caller::parse(caller),
                        namespace::shown_chain(cycle.iter().map(String::as_str))
                    ),
                )
            })?),
            None => None,
        };
        Ok(Admission {
            target,
            inflight,
            inflight_bytes,
            tenant,
            waiting,
        })
    }

    /// The tenant a request was authenticated as, if it is still registered.
    fn tenant(&self, name: &str) -> Result<Arc<crate::tenants::Tenant>, InferError> {
        self.tenants
            .get(name)
            .ok_or_else(|| InferError::unavailable(format!("tenant '{name}' was deleted")))
    }

    /// The metadata of a READY version (`version` None: the newest), named as the caller
    /// named it.
    pub fn model_metadata(
        &self,
        principal: &Principal,
        model: &str,
        version: Option<i64>,
    ) -> Result<ModelMetadata, InferError> {
        Inference::metadata(
            self,
            &CallContext::root_for(principal.tenant()),
            model,
            version,
        )
    }

    fn metadata_in(
        &self,
        namespace: Option<&str>,
        model: &str,
        version: Option<i64>,
    ) -> Result<ModelMetadata, InferError> {
        let key = self.resolve(namespace, model)?;
        let m = self.repository.ready_model(&key, version)?;
        let versions = match version {
            Some(v) => vec![v],
            None => self.repository.versions(&key),
        };
        Ok(ModelMetadata::new(
            namespace::shown(&m.name),
            &m.config,
            &m.signature,
            versions,
        ))
    }

    /// Ok when the version is READY. Err `NotFound` when the model or version does not exist,
    /// `Unavailable` when it exists but is not ready.
    pub fn model_ready(
        &self,
        principal: &Principal,
        model: &str,
        version: Option<i64>,
    ) -> Result<(), InferError> {
        let namespace = principal.namespace();
        let key = self.resolve(namespace, model)?;
        match self.repository.ready_model(&key, version) {
            Ok(_) => Ok(()),
            Err(e) if !self.repository.contains(&key, version) => Err(e),
            Err(e) => Err(InferError::unavailable(e.message)),
        }
    }

    /// The configuration of a model, even when no version is ready (named as the caller named
    /// it).
    pub fn model_config(
        &self,
        principal: &Principal,
        model: &str,
        version: Option<i64>,
    ) -> Result<Arc<ModelConfig>, InferError> {
        let namespace = principal.namespace();
        let key = self.resolve(namespace, model)?;
        if !self.repository.contains(&key, version) {
            return Err(unknown_model(model, version));
        }
        let config = self.repository.config(&key).ok_or_else(|| {
            InferError::unavailable(format!("model '{model}' has no usable configuration"))
        })?;
        if namespace.is_none() {
            return Ok(config);
        }
        let mut shown = ModelConfig::clone(&config);
        shown.name = namespace::shown(&config.name).to_owned();
        Ok(Arc::new(shown))
    }

    /// Statistics of the READY versions of `model` (every model the caller sees when `None`).
    pub fn statistics(
        &self,
        principal: &Principal,
        model: Option<&str>,
        version: Option<i64>,
    ) -> Result<Vec<VersionStatistics>, InferError> {
        let namespace = principal.namespace();
        let key = model.map(|m| self.resolve(namespace, m)).transpose()?;
        if let (Some(m), Some(key)) = (model, &key)
            && !self.repository.contains(key, version)
        {
            return Err(unknown_model(m, version));
        }
        Ok(self
            .repository
            .ready_versions()
            .iter()
            .filter(|m| {
                key.as_deref()
                    .map_or_else(|| self.visible(namespace, &m.name), |key| m.name == key)
                    && version.is_none_or(|v| m.version == v)
            })
            .map(|m| VersionStatistics {
                name: namespace::shown(&m.name).to_owned(),
                version: m.version,
                stats: m.stats.snapshot(),
            })
            .collect())
    }

    /// Every model and version the caller sees, with its state (`ready_only`: the READY
    /// versions).
    pub fn repository_index(&self, principal: &Principal, ready_only: bool) -> Vec<IndexRow> {
        let namespace = principal.namespace();
        self.repository
            .index(ready_only)
            .into_iter()
            .filter(|row| self.visible(namespace, &row.name))
            .map(|row| IndexRow {
                name: namespace::shown(&row.name).to_owned(),
                ..row
            })
            .collect()
    }

    /// The key of `name` in the principal's namespace, for a control request (`what` says
    /// which, for the refusal): the mode allows it and the name is one a user may give.
    fn control_key(
        &self,
        principal: &Principal,
        what: &str,
        name: &str,
    ) -> Result<String, ControlError> {
        self.check_control(&format!("{what} '{name}'"))?;
        check_model_name(name)?;
        Ok(ModelKey::new(principal.namespace(), name).key())
    }

    fn check_control(&self, what: &str) -> Result<(), ControlError> {
        match self.options.control_mode {
            ControlMode::Explicit => Ok(()),
            ControlMode::None => Err(ControlError::NotAllowed(format!(
                "failed to {what}: explicit model load / unload is not allowed with --model-control-mode none"
            ))),
            ControlMode::Poll => Err(ControlError::NotAllowed(format!(
                "failed to {what}: explicit model load / unload is not allowed if polling is enabled"
            ))),
        }
    }

    /// Loads or reloads a model (Triton's `POST /v2/repository/models/{m}/load`). With `files`,
    /// it is a deployment: validated, written durably to the store, loaded beside the serving
    /// version, and swapped in; the answer comes only after all of that.
    pub async fn load_model(
        &self,
        principal: &Principal,
        name: &str,
        request: LoadRequest,
    ) -> Result<Deployed, ControlError> {
        let key = &self.control_key(principal, "load", name)?;
        // Messages name the model as its owner does (`shown`); the server works on its key.
        let (shown, name) = (name, key.as_str());
        let config = request
            .config
            .as_deref()
            .map(|json| {
                let mut config = crate::config::from_json(json)
                    .map_err(|e| ControlError::Invalid(format!("failed to load '{shown}': {e}")))?;
                if !config.name.is_empty() && config.name != shown {
                    return Err(ControlError::Invalid(format!(
                        "failed to load '{shown}': the config names the model '{}'",
                        config.name
                    )));
                }
                config.name = key.to_owned();
                if let Some(ceiling) = self.tenants.ceiling(key) {
                    clamp_wasm_limits(&mut config, ceiling);
                }
                Ok(config)
            })
            .transpose()?;
        if request.files.is_empty() {
            let control = self.repository.control().await;
            let outcome = control.load(name, config).await?;
            if let (Some(store), Some(Origin::Store { revision })) =
                (self.repository.store(), self.repository.origin(name))
            {
                if let Err(e) = crate::deploy::set_loaded(store, name, true).await {
                    if store.shared().is_some() {
                        // Not published: not loaded here either, like on every other replica.
                        let _ = control.unload(name, false).await;
                    }
                    return Err(e);
                }
                return Ok(Deployed {
                    outcome,
                    revision: Some(revision),
                    replaces: None,
                });
            }
            return Ok(Deployed {
                outcome,
                revision: None,
                replaces: None,
            });
        }
        let config = config.ok_or_else(|| {
            ControlError::Invalid(format!(
                "failed to load '{shown}': model files need the 'config' parameter too (as in Triton)"
            ))
        })?;
        let store = self.repository.store().cloned().ok_or_else(|| {
            ControlError::NotAllowed(format!(
                "failed to load '{shown}': this server runs without a deployment store (--store)"
            ))
        })?;
        let mut files = self.check_files(shown, request.files)?;
        let _quota_held = match principal.namespace() {
            Some(tenant) => {
                let held = self.tenant_deploys.lock().await;
                let bytes = files.iter().map(|(_, b)| b.len() as u64).sum();
                self.check_deployment_quota(tenant, Area::Models, key, bytes)?;
                Some(held)
            }
            None => None,
        };
        files.push((
            PathBuf::from("config.pbtxt"),
            Bytes::from(crate::config::to_text(&config)),
        ));
        let control = self.repository.control().await;
        let mut deployed =
            crate::deploy::deploy(&store, &ModelTarget(&control), name, files).await?;
        // Said, not silent: a deployment named like a repository model serves instead of it,
        // which is how a hot fix replaces a model, and a surprise when the name was a mistake.
        deployed.replaces = self.repository.repository_folder(name);
        if let Some(folder) = &deployed.replaces {
            tracing::warn!(
                model = shown,
                folder = %folder.display(),
                "the deployment serves instead of the repository's model of the same name"
            );
        }
        Ok(deployed)
    }

    /// Checks the paths and the total size of a deployment's files.
    fn check_files(
        &self,
        name: &str,
        files: Vec<(String, Bytes)>,
    ) -> Result<Vec<(PathBuf, Bytes)>, ControlError> {
        let total: usize = files.iter().map(|(_, b)| b.len()).sum();
        let limit = self.options.max_deployment_bytes;
        if total > limit {
            return Err(ControlError::TooLarge(format!(
                "failed to load '{name}': the files total {total} bytes, over the limit of {limit} (--max-deployment-bytes)"
            )));
        }
        let mut checked = Vec::with_capacity(files.len());
        for (path, bytes) in files {
            let relative = check_relative_path(&path)?;
            if relative == std::path::Path::new("config.pbtxt") {
                return Err(ControlError::Invalid(format!(
                    "failed to load '{name}': give the configuration in the 'config' parameter, not as file:config.pbtxt"
                )));
            }
            if relative.extension().is_some_and(|e| e == "wasm") {
                crate::backend::wasm::check_component_binary(&path, &bytes)
                    .map_err(|e| ControlError::Invalid(format!("failed to load '{name}': {e}")))?;
            }
            checked.push((relative, bytes));
        }
        // Two names of one file (`1/x` and `1//x`): one would be dropped without a word.
        let mut paths = std::collections::HashSet::with_capacity(checked.len());
        for (path, _) in &checked {
            if !paths.insert(path.as_path()) {
                return Err(ControlError::Invalid(format!(
                    "failed to load '{name}': the file '{}' is given twice",
                    path.display()
                )));
            }
        }
        // One file's path may not be a folder of another's (`1` beside `1/model.wasm`).
        for (path, _) in &checked {
            if let Some(clash) = path.ancestors().skip(1).find(|a| paths.contains(a)) {
                return Err(ControlError::Invalid(format!(
                    "failed to load '{name}': '{}' is a file, so it cannot also be the folder of '{}'",
                    clash.display(),
                    path.display()
                )));
            }
        }
        Ok(checked)
    }

    /// Unloads a model (Triton's `.../unload`); a deployment stays in the store, unloaded, and
    /// does not load at the next start.
    pub async fn unload_model(
        &self,
        principal: &Principal,
        name: &str,
        unload_dependents: bool,
    ) -> Result<Vec<String>, ControlError> {
        let key = self.control_key(principal, "unload", name)?;
        let unloaded = self.unload_key(&key, unload_dependents).await?;
        Ok(unloaded
            .iter()
            .filter(|k| self.visible(principal.namespace(), k))
            .map(|k| namespace::shown(k).to_owned())
            .collect())
    }

    async fn unload_key(
        &self,
        name: &str,
        unload_dependents: bool,
    ) -> Result<Vec<String>, ControlError> {
        let control = self.repository.control().await;
        let store = self.repository.store();
        let deployed =
            |model: &str| matches!(self.repository.origin(model), Some(Origin::Store { .. }));
        // With a shared store, the unload is published before it happens here: if the store
        // refuses it (away, or another replica's change), nothing changes anywhere.
        let published_first = store.is_some_and(|s| s.shared().is_some()) && deployed(name);
        if let Some(store) = store
            && published_first
        {
            crate::deploy::set_loaded(store, name, false).await?;
        }
        let unloaded = control.unload(name, unload_dependents).await?;
        if let Some(store) = store {
            for model in &unloaded {
                if deployed(model) && !(published_first && model == name) {
                    crate::deploy::set_loaded(store, model, false).await?;
                }
            }
        }
        Ok(unloaded)
    }

    /// Serves the deployment's previous revision again.
    pub async fn rollback(
        &self,
        principal: &Principal,
        name: &str,
    ) -> Result<Deployed, ControlError> {
        let name = &self.control_key(principal, "roll back", name)?;
        let store = self.repository.store().cloned().ok_or_else(|| {
            ControlError::NotAllowed("this server runs without a deployment store (--store)".into())
        })?;
        let control = self.repository.control().await;
        crate::deploy::rollback(&store, &ModelTarget(&control), name).await
    }

    /// Prometheus text for `/metrics`, with latency summaries when `summaries` is set.
    pub fn metrics_text(&self, summaries: bool) -> String {
        let versions = self.repository.ready_versions();
        let models: Vec<crate::metrics::ModelMetrics<'_>> = versions
            .iter()
            .map(|m| crate::metrics::ModelMetrics {
                name: &m.name,
                version: m.version,
                stats: m.stats.snapshot(),
                pending: m.pending_count(),
                quantiles: summaries.then(|| m.stats.quantiles()),
                sequences: m.sequencer.as_ref().map(|s| s.snapshot()),
            })
            .collect();
        let mut text = crate::metrics::render_prometheus(&models, &self.wasm.counters.families());
        self.functions.render_metrics(&mut text);
        self.llm_metrics.render(&mut text);
        self.wasm.custom_metrics.render(&mut text);
        self.tenants.render_metrics(&mut text);
        let admitted = self.options.limits.max_inflight_requests;
        crate::metrics::Family::start(
            &mut text,
            "tessera_inflight_requests",
            "gauge",
            "Client requests admitted and not yet answered, all models and front-ends (--max-inflight-requests)",
        )
        .sample(&[], admitted.saturating_sub(self.inflight.available_permits()));
        crate::metrics::Family::start(
            &mut text,
            "tessera_inflight_request_bytes",
            "gauge",
            "Input bytes of those requests, in whole KiB each (--max-inflight-request-bytes)",
        )
        .sample(&[], self.inflight_bytes.held_bytes());
        crate::metrics::Family::start(
            &mut text,
            "tessera_buffered_bytes",
            "gauge",
            "Bytes the front-ends hold for clients: request bodies being read and large answers their connections have not taken, in whole KiB each (--http-max-buffered-bytes)",
        )
        .sample(&[], self.buffering.held_bytes());
        crate::metrics::Family::start(
            &mut text,
            "tessera_connections_shed_total",
            "counter",
            "Idle connections closed so that a new client got their slot (--max-connections), all listeners",
        )
        .sample(
            &[],
            crate::limits::SHED_CONNECTIONS.load(std::sync::atomic::Ordering::Relaxed),
        );
        let damaged = |store: Option<&Arc<Store>>| store.map_or(0, |s| s.damaged().len());
        let mut family = crate::metrics::Family::start(
            &mut text,
            "tessera_store_damaged_deployments",
            "gauge",
            "Deployments the store cannot serve: their manifest is damaged or missing (see the log)",
        );
        family.sample(&[("area", "models")], damaged(self.repository.store()));
        family.sample(&[("area", "functions")], damaged(self.functions.store()));
        if self.options.shared_store.is_some() {
            crate::metrics::Family::start(
                &mut text,
                "tessera_shared_store_reachable",
                "gauge",
                "1 when the shared deployment store answered the last look for changes; 0 while it does not (the replica serves its cache)",
            )
            .sample(&[], u64::from(self.shared_store_reachable()));
            let unapplied = self.shared_failures.lock().map_or(0, |f| f.len());
            crate::metrics::Family::start(
                &mut text,
                "tessera_shared_store_unapplied_changes",
                "gauge",
                "Deployments whose newest change in the shared store this replica failed to apply (it serves the previous one and tries again; see the log)",
            )
            .sample(&[], unapplied);
        }
        if let Some(gpus) = &self.gpu_metrics {
            gpus.render(&mut text);
        }
        text
    }

    /// Liveness: the process answers.
    pub fn live(&self) -> bool {
        true
    }

    /// Readiness, as Triton defines it; false from the moment shutdown begins.
    pub fn ready(&self) -> bool {
        !self.stopping.load(std::sync::atomic::Ordering::Relaxed)
            && (!self.options.strict_readiness || self.repository.all_ready())
    }

    /// Shutdown begins: readiness drops at once, so a load balancer stops sending work while
    /// the front-ends drain.
    pub fn begin_shutdown(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::info!("shutting down: readiness dropped, draining connections");
    }

    /// Invokes a function with an HTTP request whose URI is what the function sees. A tenant's
    /// invocation is admitted within its quotas, as its inferences are.
    pub async fn invoke_function<B>(
        &self,
        cx: &CallContext,
        name: &str,
        request: http::Request<B>,
    ) -> Result<http::Response<crate::backend::wasm::FunctionBody>, FunctionError>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        use crate::functions::FunctionEntry;
        let key = ModelKey::new(cx.tenant.as_deref(), name).key();
        let entry = match self.functions.get(&key) {
            _ if ModelKey::is_key(name) => None,
            entry => entry,
        };
        let function = match entry {
            None => return Err(FunctionError::NotFound(name.to_owned())),
            Some(FunctionEntry::Failed(reason)) => {
                return Err(FunctionError::Unavailable(name.to_owned(), reason));
            }
            Some(FunctionEntry::Ready(function)) => function,
        };
        let admitted = match &cx.tenant {
            Some(tenant) => Some(
                self.tenant(tenant)
                    .and_then(|t| t.admit())
                    .map_err(FunctionError::Quota)?,
            ),
            None => None,
        };
        let result = function.invoke(request, cx).await;
        if let Some(admitted) = admitted {
            admitted.finish(result.as_ref().is_ok_and(|r| !r.status().is_server_error()));
        }
        Ok(result?)
    }

    /// Every function the caller sees, with its state.
    pub fn functions(&self, principal: &Principal) -> Vec<(String, Result<(), String>)> {
        let namespace = principal.namespace();
        self.functions
            .list()
            .into_iter()
            .filter(|(key, _)| ModelKey::parse(key).tenant == namespace)
            .map(|(key, state)| (namespace::shown(&key).to_owned(), state))
            .collect()
    }

    fn inference(&self) -> Weak<dyn Inference> {
        self.functions_inference.clone()
    }

    /// Deploys a function (its component and manifest) into the store and swaps it in; with no
    /// component, loads it again from its folder or the store.
    pub async fn load_function(
        &self,
        principal: &Principal,
        name: &str,
        upload: Option<crate::functions::FunctionUpload>,
    ) -> Result<Deployed, ControlError> {
        let name = &self.control_key(principal, "load function", name)?;
        let Some(upload) = upload else {
            self.functions
                .reload(&self.wasm, name, self.inference())
                .await?;
            return Ok(Deployed {
                outcome: LoadOutcome::Loaded,
                revision: None,
                replaces: None,
            });
        };
        let size = upload.component.len() + upload.manifest.as_ref().map_or(0, String::len);
        let limit = self.options.max_deployment_bytes;
        if size > limit {
            return Err(ControlError::TooLarge(format!(
                "failed to deploy function '{name}': {size} bytes, over the limit of {limit} (--max-deployment-bytes)"
            )));
        }
        let _quota_held = match principal.namespace() {
            Some(tenant) => {
                let held = self.tenant_deploys.lock().await;
                self.check_deployment_quota(tenant, Area::Functions, name, size as u64)?;
                Some(held)
            }
            None => None,
        };
        let (outcome, revision) = self
            .functions
            .deploy(&self.wasm, name, upload, self.inference())
            .await?;
        Ok(Deployed {
            outcome,
            revision: Some(revision),
            replaces: None,
        })
    }

    /// Stops serving a function; a deployed one stays in the store, unloaded.
    pub async fn unload_function(
        &self,
        principal: &Principal,
        name: &str,
    ) -> Result<(), ControlError> {
        let key = self.control_key(principal, "unload function", name)?;
        self.functions.unload(&key).await
    }

    /// Serves a deployed function's previous revision again.
    pub async fn rollback_function(
        &self,
        principal: &Principal,
        name: &str,
    ) -> Result<Deployed, ControlError> {
        let key = self.control_key(principal, "roll back function", name)?;
        let revision = self
            .functions
            .rollback(&self.wasm, &key, self.inference())
            .await?;
        Ok(Deployed {
            outcome: LoadOutcome::Loaded,
            revision: Some(revision),
            replaces: None,
        })
    }

    /// Refuses a deployment of `key` into `tenant`'s namespace that its quotas do not allow:
    /// 403 for the number of deployments, 413 for their bytes.
    fn check_deployment_quota(
        &self,
        tenant: &str,
        area: Area,
        key: &str,
        new_bytes: u64,
    ) -> Result<(), ControlError> {
        let quotas = self
            .tenants
            .get(tenant)
            .map(|t| t.quotas().clone())
            .ok_or_else(|| ControlError::NotFound(format!("tenant '{tenant}' was deleted")))?;
        let (models, model_bytes) = self
            .repository
            .store()
            .map_or((0, 0), |s| s.usage(tenant, key));
        let (functions, function_bytes) = self.functions.usage(tenant, key);
        let (count, limit, quota) = match area {
            Area::Models => (models, quotas.max_models, "max_models"),
            Area::Functions => (functions, quotas.max_functions, "max_functions"),
        };
        let shown = namespace::shown(key);
        if count >= limit as usize {
            return Err(ControlError::Forbidden(format!(
                "failed to deploy '{shown}': tenant '{tenant}' has {count} deployed, its quota {quota} ({limit})"
            )));
        }
        let total = model_bytes + function_bytes + new_bytes;
        if total > quotas.max_deployed_bytes {
            return Err(ControlError::TooLarge(format!(
                "failed to deploy '{shown}': tenant '{tenant}' would have {total} bytes deployed, over its quota max_deployed_bytes ({})",
                quotas.max_deployed_bytes
            )));
        }
        Ok(())
    }

    /// Deletes a tenant: its keys stop working at once (the registry is written first), then its
    /// models and functions are unloaded and their files removed. A crash in between leaves
    /// files that the next start removes.
    pub async fn delete_tenant(&self, name: &str) -> Result<(), crate::tenants::TenantError> {
        crate::deploy::disk(|| self.tenants.delete(name))?;
        if let Some(shared) = self.tenants.shared() {
            // Its keys stopped with the registry's new generation; its deployments leave the
            // shared store, and every replica removes its copies when it sees the registry. If
            // this fails, creating a tenant of that name clears what is left first.
            if let Err(e) = shared.remove_tenant(name).await {
                tracing::error!(
                    tenant = name,
                    "removing its deployments from the shared store: {e}"
                );
            }
        }
        self.remove_tenant_here(name).await?;
        // Done here already: not again when the watcher comes by.
        self.tenants.removed_here(name);
        Ok(())
    }

    /// Unloads a deleted tenant's models and functions on this server and removes their files.
    async fn remove_tenant_here(&self, name: &str) -> Result<(), crate::tenants::TenantError> {
        let prefix = ModelKey::tenant_prefix(name);
        // One hold of model control for all of it: no deployment of the tenant lands between
        // the unloads and the removal of its files. Unloaded here only: nothing is recorded in
        // the store (a shared one would pass an unload to every replica), whose files go.
        let control = self.repository.control().await;
        let models: Vec<String> = self
            .repository
            .index(false)
            .into_iter()
            .map(|row| row.name)
            .filter(|key| key.starts_with(&prefix))
            .collect();
        for key in models {
            if let Err(e) = control.unload(&key, true).await {
                tracing::warn!(model = %key, "deleting tenant '{name}': {e}");
            }
            control.forget(&key);
        }
        self.functions.remove_tenant(name).await;
        self.wasm.forget_tenant(name);
        crate::deploy::disk(|| {
            if let Some(store) = self.repository.store() {
                store.remove_tenant(name)?;
            }
            self.tenants.remove_files(name)
        })?;
        drop(control);
        tracing::info!(tenant = name, "deleted");
        Ok(())
    }

    /// `--max-deployment-bytes`.
    pub fn max_deployment_bytes(&self) -> usize {
        self.options.max_deployment_bytes
    }

    /// The budget the front-ends hold request bodies and unsent answers in
    /// (`--http-max-buffered-bytes`), one for HTTP and gRPC alike.
    pub fn buffering(&self) -> crate::limits::ByteBudget {
        self.buffering.clone()
    }

    /// The server-wide limits it runs with.
    pub fn limits(&self) -> &ServerLimits {
        &self.options.limits
    }

    /// Unloads every model: queued work finishes, then instances are dropped, and Wasm handlers'
    /// `finalize` runs; waits for those at most the drain timeout.
    pub async fn shutdown(&self) {
        self.repository.unload_all();
        self.wasm.drain(self.options.limits.drain_timeout()).await;
    }
}

/// A change of the shared store this replica could not apply, and when it tries again.
struct FollowFailure {
    generation: u64,
    attempts: u32,
    retry_at: std::time::Instant,
}

/// This replica's name in the shared store's manifests and logs: the host (a pod's name on
/// Kubernetes) and the process.
fn replica_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "replica".into());
    format!("{host}:{}", std::process::id())
}

/// A model deployment: built beside what serves by the repository's control, swapped into the
/// model table.
struct ModelTarget<'c>(&'c crate::repository::Control<'c>);

impl crate::deploy::Target for ModelTarget<'_> {
    type Built = crate::repository::Candidate;

    async fn build(
        &self,
        key: &str,
        revision: u64,
        dir: &std::path::Path,
    ) -> Result<Option<Self::Built>, ControlError> {
        let source = ModelSource {
            dir: dir.to_owned(),
            origin: Origin::Store { revision },
            config_override: None,
        };
        let Some(candidate) = self.0.build(key, source).await? else {
            return Ok(None);
        };
        if candidate.failures().is_empty() {
            return Ok(Some(candidate));
        }
        // A deployment that fails changes nothing in the table; publishing it says why.
        Err(self
            .0
            .publish(candidate)
            .await
            .err()
            .unwrap_or_else(|| ControlError::Internal(format!("failed to load '{key}'"))))
    }

    fn hash(&self, built: &Self::Built) -> String {
        built.fingerprint().sha256_hex()
    }

    async fn swap(&self, _key: &str, built: Self::Built) -> Result<(), ControlError> {
        self.0.publish(built).await
    }

    fn serving(&self, key: &str) -> Option<u64> {
        self.0.serving_revision(key)
    }

    async fn unload(&self, key: &str) -> Result<(), ControlError> {
        self.0.unload(key, false).await.map(|_| ())
    }
}

impl Inference for Server {
    fn infer<'a>(
        &'a self,
        cx: CallContext,
        model: &'a str,
        version: Option<i64>,
        request: InferRequest,
    ) -> BoxFuture<'a, InferResult> {
        Box::pin(Server::infer(self, cx, model, version, request))
    }

    fn infer_stream<'a>(
        &'a self,
        cx: CallContext,
        model: &'a str,
        version: Option<i64>,
        request: InferRequest,
    ) -> BoxFuture<'a, Result<ResponseStream, InferError>> {
        Box::pin(Server::infer_stream(self, cx, model, version, request))
    }

    fn metadata(
        &self,
        cx: &CallContext,
        model: &str,
        version: Option<i64>,
    ) -> Result<ModelMetadata, InferError> {
        self.metadata_in(cx.namespace(), model, version)
    }
}

/// What an admitted request holds while it runs ([`Server::admit`]).
struct Admission {
    target: Arc<crate::model::ModelVersion>,
    /// Its place under `--max-inflight-requests` (client requests).
    inflight: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Its input bytes under `--max-inflight-request-bytes` (client requests).
    inflight_bytes: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Its tenant's admission (a tenant's client requests).
    tenant: Option<Admitted>,
    /// Its edge in the wait graph (BLS calls).
    waiting: Option<WaitEdge>,
}

/// Which models wait on which, across every BLS call in flight.
///
/// The call chain catches a cycle within one request (a → b → a). Two requests can still
/// deadlock each other: a's instance calls b while b's instance calls a, each waiting for the
/// instance the other holds, until their deadlines. So each BLS call records an edge
/// caller → target while it waits, and a call whose target already waits, directly or through
/// other models, on the caller is refused at once. This is conservative (with a spare instance
/// the wait might have ended), and consistent: the same model-level cycle on one chain is
/// refused too.
#[derive(Default)]
struct WaitGraph {
    /// caller → (target → calls in flight).
    edges: Mutex<HashMap<String, HashMap<String, usize>>>,
}

impl WaitGraph {
    /// Records that `caller` waits on `target`, or returns the path target → … → caller that
    /// this wait would close into a cycle.
    fn enter(self: &Arc<Self>, caller: &str, target: &str) -> Result<WaitEdge, Vec<String>> {
        let mut edges = self.edges.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(path) = path_between(&edges, target, caller) {
            return Err(path);
        }
        *edges
            .entry(caller.to_owned())
            .or_default()
            .entry(target.to_owned())
            .or_default() += 1;
        Ok(WaitEdge {
            graph: self.clone(),
            caller: caller.to_owned(),
            target: target.to_owned(),
        })
    }
}

/// A path from `from` to `to` along the edges, both ends included.
fn path_between(
    edges: &HashMap<String, HashMap<String, usize>>,
    from: &str,
    to: &str,
) -> Option<Vec<String>> {
    let mut came_from: HashMap<&str, &str> = HashMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(node) = queue.pop_front() {
        if node == to {
            let mut path = vec![to.to_owned()];
            let mut at = to;
            while at != from {
                at = came_from[at];
                path.push(at.to_owned());
            }
            path.reverse();
            return Some(path);
        }
        for next in edges.get(node).into_iter().flat_map(HashMap::keys) {
            if next != from && !came_from.contains_key(next.as_str()) {
                came_from.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    None
}

/// One BLS call waiting; removes its edge when the call ends (or is dropped).
struct WaitEdge {
    graph: Arc<WaitGraph>,
    caller: String,
    target: String,
}

impl Drop for WaitEdge {
    fn drop(&mut self) {
        let mut edges = self.graph.edges.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(targets) = edges.get_mut(&self.caller) {
            if let Some(n) = targets.get_mut(&self.target) {
                *n -= 1;
                if *n == 0 {
                    targets.remove(&self.target);
                }
            }
            if targets.is_empty() {
                edges.remove(&self.caller);
            }
        }
    }
}

/// Triton's words for a model (or a version of it) that is not in the repository.
fn unknown_model(model: &str, version: Option<i64>) -> InferError {
    match version {
        Some(v) => InferError::not_found(format!(
            "Request for unknown model: '{model}' version {v} is not found"
        )),
        None => InferError::not_found(format!("Request for unknown model: '{model}' is not found")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_that_closes_a_cycle_is_refused() {
        let graph = Arc::new(WaitGraph::default());
        let ab = graph.enter("a", "b").expect("a waits on b");
        let bc = graph.enter("b", "c").expect("b waits on c");
        assert_eq!(
            graph.enter("c", "a").err(),
            Some(vec!["a".to_owned(), "b".to_owned(), "c".to_owned()])
        );
        // Unrelated and repeated waits are fine.
        let ab2 = graph.enter("a", "b").expect("a second a -> b");
        let _dc = graph.enter("d", "c").expect("d waits on c");
        drop(bc);
        let ca = graph.enter("c", "a").expect("b no longer waits on c");
        drop((ab, ab2, ca));
        assert!(graph.enter("b", "a").is_ok(), "every edge is gone");
    }
}
