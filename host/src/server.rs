//! The server core that every front-end shares: the repository, the single entry point of the
//! request path ([`Server::infer`], also the [`Inference`] that backends call back into), and
//! the small API front-ends use instead of reaching into internals.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;

use crate::backend::Backends;
use crate::backend::ensemble::EnsembleBackend;
use crate::backend::onnx::OnnxBackend;
use crate::backend::wasm::{WasmBackend, WasmRuntime};
use crate::config::{BackendKind, ModelConfig};
use crate::infer::{
    BoxFuture, CallContext, ErrorKind, InferError, InferRequest, InferResult, Inference,
};
use crate::limits::ServerLimits;
use crate::metrics::StatsSnapshot;
use crate::repository::{
    ControlError, IndexRow, LoadOptions, LoadOutcome, ModelSource, Origin, Repository,
    StartupModels,
};
use crate::scheduler::rate_limit::RateLimiter;
use crate::signature::ModelMetadata;
use crate::store::{Store, check_model_name, check_relative_path};

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

/// What a load or rollback did, for the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployed {
    pub outcome: LoadOutcome,
    /// The store revision that serves, for a deployment.
    pub revision: Option<u64>,
}

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
    pub rate_limit_resources: Vec<(String, u64)>,
    pub limits: ServerLimits,
    pub control_mode: ControlMode,
    /// Repository models loaded at start (`--load-model`; every model outside explicit mode).
    pub startup_models: Option<Vec<String>>,
    /// `--repository-poll-secs`.
    pub poll_interval: Duration,
    /// `--store`: where deployments are kept; None serves without one (deployments refused).
    pub store_dir: Option<PathBuf>,
    /// `--max-deployment-bytes`: the largest total of files one deployment may carry.
    pub max_deployment_bytes: usize,
    /// `--functions`: folders of functions (`<dir>/<name>/function.wasm`).
    pub function_dirs: Vec<PathBuf>,
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
}

pub struct Server {
    options: ServerOptions,
    repository: Repository,
    wasm: Arc<WasmRuntime>,
    /// BLS calls in flight, to refuse calls that would deadlock across requests.
    waits: WaitGraph,
    /// Admission control: one permit per client request in flight (`--max-inflight-requests`).
    inflight: tokio::sync::Semaphore,
    functions: crate::functions::Functions,
    /// This server as the functions' request path.
    functions_inference: Weak<dyn Inference>,
}

/// The statistics of one model version.
pub struct VersionStatistics {
    pub name: String,
    pub version: i64,
    pub stats: StatsSnapshot,
}

impl Server {
    /// Creates the server and loads every model of the repositories.
    pub async fn start(options: ServerOptions) -> anyhow::Result<Arc<Server>> {
        let (store, function_store) = match &options.store_dir {
            Some(dir) => {
                let dir = dir.clone();
                let (models, functions) = tokio::task::spawn_blocking(move || {
                    Ok::<_, crate::store::StoreError>((
                        Store::open(&dir, "models")?,
                        Store::open(&dir, "functions")?,
                    ))
                })
                .await??;
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
        let backends = Backends::default()
            .with(BackendKind::Onnx, Arc::new(OnnxBackend))
            .with(BackendKind::Wasm, Arc::new(WasmBackend(wasm.clone())))
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
                ),
                inflight: tokio::sync::Semaphore::new(options.limits.max_inflight_requests),
                options,
                wasm,
                waits: WaitGraph::default(),
                functions: crate::functions::Functions::new(function_store),
                functions_inference: me.clone(),
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

    /// Runs `request` on `model` (`version` None: the newest READY version). HTTP, ensemble steps
    /// and Wasm handlers' `infer` calls all come through here, into that model's queue.
    pub async fn infer(
        &self,
        cx: CallContext,
        model: &str,
        version: Option<i64>,
        request: InferRequest,
    ) -> InferResult {
        if cx.call_chain.iter().any(|caller| caller == model) {
            return Err(InferError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "BLS cycle: {} -> {model} would wait on itself",
                    cx.call_chain.join(" -> ")
                ),
            ));
        }
        let max_depth = self.options.limits.max_call_depth;
        if cx.call_chain.len() >= max_depth {
            return Err(InferError::new(
                ErrorKind::ResourceExhausted,
                format!("BLS call depth limit of {max_depth} exceeded calling '{model}'"),
            ));
        }
        // Client requests are admitted here; the calls they make inside are part of them.
        let _admitted = if cx.call_chain.is_empty() && !cx.warmup {
            Some(self.inflight.try_acquire().map_err(|_| {
                InferError::unavailable(format!(
                    "the server has {} requests in flight, its limit (--max-inflight-requests); retry later",
                    self.options.limits.max_inflight_requests
                ))
            })?)
        } else {
            None
        };
        let target = self.repository.ready_model(model, version)?;
        let _waiting = match cx.caller() {
            Some(caller) => Some(self.waits.enter(caller, model).map_err(|cycle| {
                InferError::new(
                    ErrorKind::ResourceExhausted,
                    format!(
                        "BLS cycle across requests: {caller} -> {} would wait on a request that waits on it",
                        cycle.join(" -> ")
                    ),
                )
            })?),
            None => None,
        };
        target.infer(cx, request).await
    }

    /// The metadata of a READY version (`version` None: the newest).
    pub fn model_metadata(
        &self,
        model: &str,
        version: Option<i64>,
    ) -> Result<ModelMetadata, InferError> {
        let m = self.repository.ready_model(model, version)?;
        let versions = match version {
            Some(v) => vec![v],
            None => self.repository.versions(model),
        };
        Ok(ModelMetadata::new(
            &m.name,
            &m.config,
            &m.signature,
            versions,
        ))
    }

    /// Ok when the version is READY. Err `NotFound` when the model or version does not exist,
    /// `Unavailable` when it exists but is not ready.
    pub fn model_ready(&self, model: &str, version: Option<i64>) -> Result<(), InferError> {
        match self.repository.ready_model(model, version) {
            Ok(_) => Ok(()),
            Err(e) if !self.repository.contains(model, version) => Err(e),
            Err(e) => Err(InferError::unavailable(e.message)),
        }
    }

    /// The configuration of a model, even when no version is ready.
    pub fn model_config(
        &self,
        model: &str,
        version: Option<i64>,
    ) -> Result<Arc<ModelConfig>, InferError> {
        if !self.repository.contains(model, version) {
            return Err(InferError::not_found(format!(
                "Request for unknown model: '{model}' is not found"
            )));
        }
        self.repository.config(model).ok_or_else(|| {
            InferError::unavailable(format!("model '{model}' has no usable configuration"))
        })
    }

    /// Statistics of the READY versions of `model` (every model when `None`).
    pub fn statistics(
        &self,
        model: Option<&str>,
        version: Option<i64>,
    ) -> Result<Vec<VersionStatistics>, InferError> {
        if let Some(m) = model
            && !self.repository.contains(m, version)
        {
            return Err(InferError::not_found(format!(
                "Request for unknown model: '{m}' is not found"
            )));
        }
        Ok(self
            .repository
            .ready_versions()
            .iter()
            .filter(|m| {
                model.is_none_or(|name| m.name == name) && version.is_none_or(|v| m.version == v)
            })
            .map(|m| VersionStatistics {
                name: m.name.clone(),
                version: m.version,
                stats: m.stats.snapshot(),
            })
            .collect())
    }

    /// Every model and version with its state (`ready_only`: the READY versions).
    pub fn repository_index(&self, ready_only: bool) -> Vec<IndexRow> {
        self.repository.index(ready_only)
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
        name: &str,
        request: LoadRequest,
    ) -> Result<Deployed, ControlError> {
        self.check_control(&format!("load '{name}'"))?;
        check_model_name(name)?;
        let config = request
            .config
            .as_deref()
            .map(|json| {
                let mut config = crate::config::from_json(json)
                    .map_err(|e| ControlError::Invalid(format!("failed to load '{name}': {e}")))?;
                if config.name.is_empty() {
                    config.name = name.to_owned();
                } else if config.name != name {
                    return Err(ControlError::Invalid(format!(
                        "failed to load '{name}': the config names the model '{}'",
                        config.name
                    )));
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
                tokio::task::block_in_place(|| store.set_loaded(name, true))?;
                return Ok(Deployed {
                    outcome,
                    revision: Some(revision),
                });
            }
            return Ok(Deployed {
                outcome,
                revision: None,
            });
        }
        let config = config.ok_or_else(|| {
            ControlError::Invalid(format!(
                "failed to load '{name}': model files need the 'config' parameter too (as in Triton)"
            ))
        })?;
        let store = self.repository.store().cloned().ok_or_else(|| {
            ControlError::NotAllowed(format!(
                "failed to load '{name}': this server runs without a deployment store (--store)"
            ))
        })?;
        let mut files = self.check_files(name, request.files)?;
        files.push((
            PathBuf::from("config.pbtxt"),
            Bytes::from(crate::config::to_text(&config)),
        ));
        let control = self.repository.control().await;
        let (stage_store, stage_name) = (store.clone(), name.to_owned());
        let (revision, dir) = tokio::task::spawn_blocking(move || {
            let staged = stage_store.stage(&stage_name, &files)?;
            stage_store.commit(staged)
        })
        .await
        .map_err(|e| ControlError::Internal(e.to_string()))??;
        let source = ModelSource {
            dir,
            origin: Origin::Store { revision },
            config_override: None,
        };
        self.swap_in(&control, &store, name, source, revision, None)
            .await
    }

    /// Builds a store revision beside what serves, records it as current, then swaps it in.
    /// `sha256`: the revision's hash when it is already in the manifest (a rollback).
    async fn swap_in(
        &self,
        control: &crate::repository::Control<'_>,
        store: &Store,
        name: &str,
        source: ModelSource,
        revision: u64,
        sha256: Option<String>,
    ) -> Result<Deployed, ControlError> {
        let rollback = sha256.is_some();
        let built = match control.build(name, source).await {
            Ok(built) => built,
            Err(e) => {
                if !rollback {
                    tokio::task::block_in_place(|| store.discard(name, revision));
                }
                return Err(e);
            }
        };
        let Some(candidate) = built else {
            if !rollback {
                tokio::task::block_in_place(|| store.discard(name, revision));
            }
            return Ok(Deployed {
                outcome: LoadOutcome::Unchanged,
                revision: None,
            });
        };
        if !candidate.failures().is_empty() {
            let result = control.publish(candidate).await;
            if !rollback {
                tokio::task::block_in_place(|| store.discard(name, revision));
            }
            return Err(result
                .err()
                .unwrap_or_else(|| ControlError::Internal(format!("failed to load '{name}'"))));
        }
        // Durable before it serves: a crash from here on restarts with this revision.
        let hash = sha256.unwrap_or_else(|| candidate.fingerprint().sha256_hex());
        if let Err(e) = tokio::task::block_in_place(|| store.publish(name, revision, &hash)) {
            if !rollback {
                tokio::task::block_in_place(|| store.discard(name, revision));
            }
            return Err(e.into());
        }
        control.publish(candidate).await?;
        tracing::info!(model = name, revision, "deployed");
        Ok(Deployed {
            outcome: LoadOutcome::Loaded,
            revision: Some(revision),
        })
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
        Ok(checked)
    }

    /// Unloads a model (Triton's `.../unload`); a deployment stays in the store, unloaded, and
    /// does not load at the next start.
    pub async fn unload_model(
        &self,
        name: &str,
        unload_dependents: bool,
    ) -> Result<Vec<String>, ControlError> {
        self.check_control(&format!("unload '{name}'"))?;
        let control = self.repository.control().await;
        let unloaded = control.unload(name, unload_dependents).await?;
        if let Some(store) = self.repository.store() {
            for model in &unloaded {
                if matches!(self.repository.origin(model), Some(Origin::Store { .. })) {
                    tokio::task::block_in_place(|| store.set_loaded(model, false))?;
                }
            }
        }
        Ok(unloaded)
    }

    /// Serves the deployment's previous revision again.
    pub async fn rollback(&self, name: &str) -> Result<Deployed, ControlError> {
        self.check_control(&format!("roll back '{name}'"))?;
        check_model_name(name)?;
        let store = self.repository.store().cloned().ok_or_else(|| {
            ControlError::NotAllowed("this server runs without a deployment store (--store)".into())
        })?;
        let control = self.repository.control().await;
        let (revision, dir, sha256) = store.previous(name)?;
        let source = ModelSource {
            dir,
            origin: Origin::Store { revision },
            config_override: None,
        };
        self.swap_in(&control, &store, name, source, revision, Some(sha256))
            .await
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
            })
            .collect();
        let mut text = crate::metrics::render_prometheus(&models, &self.wasm.counters.families());
        self.functions.render_metrics(&mut text);
        text
    }

    /// Liveness: the process answers.
    pub fn live(&self) -> bool {
        true
    }

    /// Readiness, as Triton defines it.
    pub fn ready(&self) -> bool {
        !self.options.strict_readiness || self.repository.all_ready()
    }

    /// Invokes a function with an HTTP request whose URI is what the function sees.
    pub async fn invoke_function<B>(
        &self,
        name: &str,
        request: http::Request<B>,
        request_id: u64,
    ) -> Result<http::Response<crate::backend::wasm::FunctionBody>, FunctionError>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        use crate::functions::FunctionEntry;
        match self.functions.get(name) {
            None => Err(FunctionError::NotFound(name.to_owned())),
            Some(FunctionEntry::Failed(reason)) => {
                Err(FunctionError::Unavailable(name.to_owned(), reason))
            }
            Some(FunctionEntry::Ready(function)) => {
                Ok(function.invoke(request, request_id).await?)
            }
        }
    }

    /// Every function with its state.
    pub fn functions(&self) -> Vec<(String, Result<(), String>)> {
        self.functions.list()
    }

    fn inference(&self) -> Weak<dyn Inference> {
        self.functions_inference.clone()
    }

    /// Deploys a function (its component and manifest) into the store and swaps it in; with no
    /// component, loads it again from its folder or the store.
    pub async fn load_function(
        &self,
        name: &str,
        upload: Option<crate::functions::FunctionUpload>,
    ) -> Result<Deployed, ControlError> {
        self.check_control(&format!("load function '{name}'"))?;
        let Some(upload) = upload else {
            self.functions
                .reload(&self.wasm, name, self.inference())
                .await?;
            return Ok(Deployed {
                outcome: LoadOutcome::Loaded,
                revision: None,
            });
        };
        let size = upload.component.len() + upload.manifest.as_ref().map_or(0, String::len);
        let limit = self.options.max_deployment_bytes;
        if size > limit {
            return Err(ControlError::TooLarge(format!(
                "failed to deploy function '{name}': {size} bytes, over the limit of {limit} (--max-deployment-bytes)"
            )));
        }
        let (outcome, revision) = self
            .functions
            .deploy(&self.wasm, name, upload, self.inference())
            .await?;
        Ok(Deployed {
            outcome,
            revision: Some(revision),
        })
    }

    /// Stops serving a function; a deployed one stays in the store, unloaded.
    pub async fn unload_function(&self, name: &str) -> Result<(), ControlError> {
        self.check_control(&format!("unload function '{name}'"))?;
        self.functions.unload(name).await
    }

    /// Serves a deployed function's previous revision again.
    pub async fn rollback_function(&self, name: &str) -> Result<Deployed, ControlError> {
        self.check_control(&format!("roll back function '{name}'"))?;
        let revision = self
            .functions
            .rollback(&self.wasm, name, self.inference())
            .await?;
        Ok(Deployed {
            outcome: LoadOutcome::Loaded,
            revision: Some(revision),
        })
    }

    /// `--max-deployment-bytes`.
    pub fn max_deployment_bytes(&self) -> usize {
        self.options.max_deployment_bytes
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

    fn metadata(
        &self,
        _cx: &CallContext,
        model: &str,
        version: Option<i64>,
    ) -> Result<ModelMetadata, InferError> {
        self.model_metadata(model, version)
    }
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
    fn enter<'g>(&'g self, caller: &str, target: &str) -> Result<WaitEdge<'g>, Vec<String>> {
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
            graph: self,
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
struct WaitEdge<'g> {
    graph: &'g WaitGraph,
    caller: String,
    target: String,
}

impl Drop for WaitEdge<'_> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_that_closes_a_cycle_is_refused() {
        let graph = WaitGraph::default();
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
