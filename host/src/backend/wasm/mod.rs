//! Wasm handlers: `backend: "wasm"` models whose `<version>/model.wasm` is a component of the
//! `tessera:inference/model` world (see `wit/tessera.wit`).
//!
//! Lifetimes, as types:
//! - [`WasmRuntime`] — per server: the wasmtime `Engine` (pooling allocator, the epoch ticker
//!   of `epoch.rs`, which runs only while guest code does) and the compiled-code cache.
//! - [`WasmModel`] — per model version: the `InstancePre` and the sandbox [`Limits`].
//! - [`WasmInstance`] — per instance (`instance_group.count` of them): a `Store` with an
//!   instantiated, initialized guest, reused across executions and replaced after a trap.
//! - per execution: the epoch deadline, fuel, and the BLS call chain in [`host::HostState`].
//!
//! A guest's `infer` import enters the request path through [`crate::infer::Inference`], the same
//! path as HTTP.

mod cache;
mod completion;
mod convert;
pub mod custom_metrics;
mod decoupled;
mod epoch;
mod function;
mod function_cache;
mod host;
mod limits;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use sha2::Digest;
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store};

use super::{Backend, CompletionContext, Executed, LoadContext, LoadError, ModelInstance};
use crate::config::model_file;
use crate::infer::{BoxFuture, Call, CallContext, ErrorKind, InferError, InferResult, Inference};
use crate::metrics::ExecutionTiming;
pub use function::{FunctionBody, FunctionLimits, FunctionStats, InvokeError, WasmFunction};
use host::{HostState, WasmModel};
pub use limits::{Limits, MAX_EXECUTE_DEADLINE_MS};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "model",
    imports: { default: async },
    exports: { default: async },
    with: {
        "tessera:inference/inference.response-stream": host::BlsStream,
        "tessera:inference/metrics.metric-family": custom_metrics::GuestFamily,
        "tessera:inference/metrics.metric": custom_metrics::GuestMetric,
    },
});

/// The interface a handler exports (any 0.1 patch version).
const HANDLER_EXPORT: &str = "tessera:inference/handler@0.1";

/// Per-server Wasm state.
pub struct WasmRuntime {
    engine: Engine,
    /// The largest `max_memory_bytes` a handler may be given (`--wasm-max-memory-bytes`).
    max_memory_bytes: u64,
    /// `--wasm-fuel`: guests are compiled to meter fuel, so models may set `fuel_per_execute`.
    fuel_metered: bool,
    linker: Linker<HostState>,
    /// The function world: WASI, `wasi:http`, and Tessera's `inference`, `log` and `metrics`.
    function_linker: Linker<HostState>,
    cache_dir: Option<PathBuf>,
    pub counters: Arc<limits::CounterRegistry>,
    /// Each function's `tessera_function_*` figures, by name: they outlive its revisions, as the
    /// `tessera_wasm_*` counters do, so a deploy or rollback does not send them back to 0.
    function_stats: function::StatsRegistry,
    /// The families guests define (the WIT `metrics` interface), shown on `/metrics`.
    pub custom_metrics: Arc<custom_metrics::CustomMetrics>,
    instances: Arc<limits::InstanceTracker>,
    ticker: Arc<epoch::EpochTicker>,
    /// The component last compiled to complete a configuration, by content hash: the load that
    /// follows takes it instead of compiling again (there may be no compiled-code cache).
    compiled_for_load: std::sync::Mutex<Option<([u8; 32], Component)>>,
}

impl WasmRuntime {
    /// The engine and its pooling allocator, sized from the server's limits: each memory slot
    /// reserves address space (not memory) for the largest memory a handler may have.
    pub fn new(
        cache_dir: Option<PathBuf>,
        limits: &crate::limits::ServerLimits,
    ) -> anyhow::Result<WasmRuntime> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        // Fuel metering slows every guest by 13-23 % (docs/benchmarks.md); the epoch deadline
        // already stops a runaway one, so fuel is for servers that ask for it.
        config.consume_fuel(limits.wasm_fuel);
        // `perf record` then names guest functions (from /tmp/perf-<pid>.map): how a handler's
        // author sees where its time goes. Off unless asked for.
        if std::env::var("TESSERA_WASM_PROFILER").as_deref() == Ok("perfmap") {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let max_memory = usize::try_from(limits.wasm_max_memory_bytes)?;
        // A memory needs no more reservation than it may grow to.
        config.memory_reservation(limits.wasm_max_memory_bytes);
        let instances = limits.wasm_pool_instances;
        let mut pool = wasmtime::PoolingAllocationConfig::default();
        pool.total_component_instances(instances);
        pool.total_core_instances(instances.saturating_mul(10));
        pool.max_core_instances_per_component(64);
        pool.total_memories(limits.wasm_memory_slots());
        pool.max_memories_per_component(8);
        pool.total_tables(instances.saturating_mul(4));
        pool.max_tables_per_component(32);
        pool.max_memory_size(max_memory);
        pool.total_stacks(instances);
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
        if limits.wasm_function_cache_bytes > 0 {
            config.enable_incremental_compilation(Arc::new(function_cache::FunctionCache::new(
                limits.wasm_function_cache_bytes,
            )))?;
        }
        let engine = Engine::new(&config).map_err(|e| {
            anyhow::anyhow!(
                "the Wasm instance pool could not reserve {} GiB of address space: {e:#}. Lower \
                 --wasm-pool-instances or --wasm-max-memory-bytes (under `ulimit -v`, or in a \
                 container that caps address space)",
                limits.wasm_reservation_bytes() >> 30
            )
        })?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        Model::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |s| s)?;
        // The one import a decoupled handler has beyond a handler's.
        decoupled::bindings::tessera::inference::streaming::add_to_linker::<
            _,
            wasmtime::component::HasSelf<_>,
        >(&mut linker, |s| s)?;
        let mut function_linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut function_linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut function_linker)?;
        Model::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut function_linker, |s| s)?;
        let ticker = epoch::EpochTicker::start(&engine, limits.epoch_tick())?;
        Ok(WasmRuntime {
            ticker,
            engine,
            max_memory_bytes: limits.wasm_max_memory_bytes,
            fuel_metered: limits.wasm_fuel,
            linker,
            function_linker,
            cache_dir,
            counters: Arc::default(),
            function_stats: function::StatsRegistry::default(),
            custom_metrics: Arc::default(),
            instances: Arc::default(),
            compiled_for_load: std::sync::Mutex::default(),
        })
    }

    /// Forgets the figures of a deleted tenant's models and functions: its names leave
    /// `/metrics`, and a tenant created later under the same name starts from nothing.
    pub fn forget_tenant(&self, tenant: &str) {
        let prefix = crate::namespace::ModelKey::tenant_prefix(tenant);
        // A function's `tessera_wasm_*` counters are those of its call-chain entry.
        let function_entry = crate::namespace::Caller::function_entry("");
        let owned = |key: &str| {
            key.strip_prefix(function_entry.as_str())
                .unwrap_or(key)
                .starts_with(&prefix)
        };
        self.counters.forget(owned);
        self.function_stats.forget(owned);
    }

    /// Waits until every Wasm instance has been dropped and finalized, at most `limit`.
    pub async fn drain(&self, limit: Duration) {
        // A limit of centuries (`--drain-timeout-ms` is the operator's) would overflow.
        let deadline = tokio::time::Instant::now()
            .checked_add(limit)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(1 << 30));
        loop {
            let dropped = self.instances.dropped.notified();
            if self
                .instances
                .live
                .load(std::sync::atomic::Ordering::Acquire)
                == 0
            {
                return;
            }
            if tokio::time::timeout_at(deadline, dropped).await.is_err() {
                tracing::warn!("some Wasm instances did not finalize in time");
                return;
            }
        }
    }

    /// Compiles a component, or loads it from the compiled-code cache.
    fn component(&self, bytes: &[u8], name: &str) -> Result<Component, LoadError> {
        let kept = self
            .compiled_for_load
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        // Hashed only when a component is kept: a load without a completion before it pays
        // nothing.
        if let Some((kept_digest, component)) = kept
            && kept_digest == content_digest(bytes)
        {
            return Ok(component);
        }
        cache::load_or_compile(
            &self.engine,
            self.cache_dir.as_deref(),
            bytes,
            name,
            &self.counters.for_model(name),
        )
    }

    /// As [`WasmRuntime::component`], and kept for the load that follows.
    fn component_kept_for_load(&self, bytes: &[u8], name: &str) -> Result<Component, LoadError> {
        let component = self.component(bytes, name)?;
        *self
            .compiled_for_load
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((content_digest(bytes), component.clone()));
        Ok(component)
    }
}

fn content_digest(bytes: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(bytes).into()
}

/// The likely fix for a component that does not compile or link here, from wasmtime's reason:
/// what guest toolchains put in by default that the host does not offer.
fn likely_fix(reason: &str) -> Option<&'static str> {
    if reason.contains("component model async") {
        // jco's QuickJS backend and async wit-bindgen exports use it; wasmtime 48 does not
        // enable it.
        Some(
            "it uses the component model's async ABI, which this server does not enable: build it without (jco: --backend-qjs-disable-async; wit-bindgen: no async exports)",
        )
    } else if reason.contains("wasi:http/") {
        Some(
            "model handlers cannot make HTTP requests: build without wasi:http (componentize-js and jco import it for fetch unless given `-d http`), or deploy the code that calls out as a function, which may (docs/functions.md)",
        )
    } else {
        None
    }
}

/// `reason`, with the likely fix after it when there is one.
pub(crate) fn with_likely_fix(reason: String) -> String {
    match likely_fix(&reason) {
        Some(fix) => format!("{reason}. {fix}"),
        None => reason,
    }
}

/// A handler must be a component: a core module is refused with what to do instead.
pub fn check_component_binary(path: &str, bytes: &[u8]) -> Result<(), String> {
    const MAGIC: &[u8] = b"\0asm";
    match bytes.get(..8) {
        Some(header) if header.starts_with(MAGIC) && header[6..8] == [1, 0] => Ok(()),
        Some(header) if header.starts_with(MAGIC) => Err(format!(
            "{path} is a core Wasm module, not a component: build the handler for wasm32-wasip2 (or wrap it with `wasm-tools component new`)"
        )),
        _ => Err(format!("{path} is not a Wasm binary")),
    }
}

/// Checks from the component's type, before anything is instantiated, that it exports an
/// interface named `wanted` (a prefix: any patch version), so a component built for another
/// world is refused as such, naming what it exports instead. `what` starts the message.
fn check_export(
    engine: &Engine,
    component: &Component,
    wanted: &str,
    what: &str,
) -> Result<(), LoadError> {
    let exports: Vec<String> = component
        .component_type()
        .exports(engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    if exports.iter().any(|e| e.starts_with(wanted)) {
        return Ok(());
    }
    let list = if exports.is_empty() {
        "nothing".to_owned()
    } else {
        exports.join(", ")
    };
    Err(LoadError::invalid(format!(
        "{what}: it does not export {wanted} (it exports: {list})"
    )))
}

/// Compiles (or takes from the cache) and pre-instantiates one model version.
fn prepare(
    runtime: &WasmRuntime,
    name: &str,
    version: i64,
    config: &crate::config::ModelConfig,
    component_path: &std::path::Path,
    inference: std::sync::Weak<dyn Inference>,
    files: Option<std::path::PathBuf>,
) -> Result<Arc<WasmModel>, LoadError> {
    let limits = Limits::from_config(config, runtime.max_memory_bytes, runtime.fuel_metered)
        .map_err(LoadError::invalid)?;
    let bytes = std::fs::read(component_path).map_err(|e| {
        // The OS's words go to the log; the load error says what (D9).
        tracing::warn!(path = %component_path.display(), "cannot read a component: {e}");
        LoadError::invalid(format!(
            "cannot read {} ({}; build the handler for wasm32-wasip2 and place it there)",
            component_path.display(),
            e.kind()
        ))
    })?;
    check_component_binary(&component_path.display().to_string(), &bytes)
        .map_err(LoadError::invalid)?;
    let component = runtime.component(&bytes, name)?;
    // A decoupled model's handler is of the decoupled-model world; every other of the model
    // world. The configuration says which, and the component must agree.
    let decoupled = config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled);
    let (export, world) = if decoupled {
        (decoupled::DECOUPLED_HANDLER_EXPORT, "decoupled-model")
    } else {
        (HANDLER_EXPORT, "model")
    };
    let hint = if decoupled {
        " (the config sets model_transaction_policy { decoupled: true })"
    } else {
        ""
    };
    check_export(
        &runtime.engine,
        &component,
        export,
        &format!(
            "{} is not a component of the tessera:inference/{world} world{hint}",
            component_path.display()
        ),
    )?;
    let instance_pre = runtime.linker.instantiate_pre(&component).map_err(|e| {
        LoadError::invalid(with_likely_fix(format!(
            "{} does not fit the tessera:inference/{world} world: {e:#}",
            component_path.display()
        )))
    })?;
    let runtime_error = |e: wasmtime::Error| LoadError::runtime(format!("{e:#}"));
    let pre = if decoupled {
        Pre::Decoupled(decoupled::DecoupledModelPre::new(instance_pre).map_err(runtime_error)?)
    } else {
        Pre::Unary(ModelPre::new(instance_pre).map_err(runtime_error)?)
    };
    let log_rate = Arc::new(limits::LogRate::new(limits.max_log_bytes_per_second));
    // The handler sees its configuration as its owner wrote it: a tenant's model is named by
    // its own name there, not by the key the server keeps it under.
    let mut config_json = crate::config::to_json(config);
    config_json["name"] = crate::namespace::shown(&config.name).into();
    Ok(Arc::new(WasmModel {
        log_rate,
        pre,
        engine: runtime.engine.clone(),
        limits,
        name: name.to_owned(),
        version,
        config_json: config_json.to_string(),
        inference,
        counters: runtime.counters.for_model(name),
        custom_metrics: runtime.custom_metrics.clone(),
        instances: runtime.instances.clone(),
        ticker: runtime.ticker.clone(),
        files,
    }))
}

/// The Wasm backend: handlers run in the server's one [`WasmRuntime`].
pub struct WasmBackend(pub Arc<WasmRuntime>);

impl Backend for WasmBackend {
    /// Compiles (or takes from the cache) and pre-instantiates the component, then creates and
    /// initializes `instance_group.count` instances.
    fn load<'a>(
        &'a self,
        ctx: &'a LoadContext,
    ) -> BoxFuture<'a, Result<Vec<Box<dyn ModelInstance>>, LoadError>> {
        Box::pin(async move {
            let path = model_file(&ctx.config, &ctx.version_dir, "model.wasm");
            if !path.exists() {
                // A Python or JavaScript source that was never built: say how.
                let source = ["model.py", "model.js", "model.ts"]
                    .into_iter()
                    .find(|s| ctx.version_dir.join(s).is_file());
                if let Some(source) = source {
                    return Err(LoadError::runtime(format!(
                        "backend '{}': {} has no model.wasm; build the {source} into one with `tessera build <model-dir>`",
                        ctx.config.backend,
                        ctx.version_dir.display()
                    )));
                }
            }
            let runtime = self.0.clone();
            let (name, version, config, inference, files) = (
                ctx.name.clone(),
                ctx.version,
                ctx.config.clone(),
                ctx.inference.clone(),
                ctx.version_dir.clone(),
            );
            // Reading and compiling a component is blocking work: off the async workers.
            let pre = tokio::task::spawn_blocking(move || {
                prepare(
                    &runtime,
                    &name,
                    version,
                    &config,
                    &path,
                    inference,
                    Some(files),
                )
            })
            .await
            .map_err(|e| LoadError::runtime(format!("compiling the component failed: {e}")))??;
            let mut instances: Vec<Box<dyn ModelInstance>> = Vec::new();
            // A slot on a GPU still runs here, on the CPU: the guest has no device access, and the
            // device only counts for placement and rate-limiter resources.
            for _ in &ctx.instances {
                let live = pre.instantiate().await.map_err(LoadError::initialize)?;
                instances.push(Box::new(WasmInstance::new(pre.clone(), live)));
            }
            Ok(instances)
        })
    }

    /// A handler that exports `config-completion` completes its configuration
    /// (Triton's `auto_complete_config`).
    fn complete_config<'a>(
        &'a self,
        ctx: &'a CompletionContext,
    ) -> BoxFuture<'a, Result<Option<crate::config::ModelConfig>, LoadError>> {
        Box::pin(completion::complete(&self.0, ctx))
    }
}

/// A Wasm model version outside any server, for benchmarks and tools. Its `infer` calls fail
/// (there is no server to call into).
pub struct Standalone(Arc<WasmModel>);

impl Standalone {
    pub fn load(
        runtime: &WasmRuntime,
        name: &str,
        component: &std::path::Path,
        config: &crate::config::ModelConfig,
    ) -> Result<Standalone, LoadError> {
        let nothing: std::sync::Weak<dyn Inference> = std::sync::Weak::<NoInference>::new();
        prepare(runtime, name, 1, config, component, nothing, None).map(Standalone)
    }

    /// Instantiates from the `InstancePre` into a fresh store, running no guest code, and drops it.
    pub async fn instantiate_bare(&self) -> Result<(), String> {
        self.0.instantiate_bare().await.map(drop)
    }

    /// A ready instance: instantiated and initialized.
    pub async fn instance(&self) -> Result<WasmInstance, String> {
        let live = self.0.instantiate().await?;
        Ok(WasmInstance::new(self.0.clone(), live))
    }
}

/// The request path of a [`Standalone`] model, or of a handler completing its configuration:
/// there is none, for the reason it holds.
struct NoInference(&'static str);

impl Inference for NoInference {
    fn infer<'a>(
        &'a self,
        _cx: CallContext,
        _model: &'a str,
        _version: Option<i64>,
        _request: crate::infer::InferRequest,
    ) -> BoxFuture<'a, InferResult> {
        Box::pin(async move { Err(InferError::unavailable(self.0)) })
    }

    fn infer_stream<'a>(
        &'a self,
        _cx: CallContext,
        _model: &'a str,
        _version: Option<i64>,
        _request: crate::infer::InferRequest,
    ) -> BoxFuture<'a, Result<crate::stream::ResponseStream, InferError>> {
        Box::pin(async move { Err(InferError::unavailable(self.0)) })
    }

    fn metadata(
        &self,
        _cx: &CallContext,
        _model: &str,
        _version: Option<i64>,
    ) -> Result<crate::signature::ModelMetadata, InferError> {
        Err(InferError::unavailable(self.0))
    }
}

/// A model version's component, pre-instantiated: a handler, or a decoupled handler.
pub enum Pre {
    Unary(ModelPre<HostState>),
    Decoupled(decoupled::DecoupledModelPre<HostState>),
}

/// The exports of one live guest.
pub enum Bindings {
    Unary(Model),
    Decoupled(decoupled::DecoupledModel),
}

impl Bindings {
    async fn initialize(
        &self,
        store: &mut Store<HostState>,
        config_json: &str,
    ) -> wasmtime::Result<Result<(), String>> {
        let _running = store.data().guest_running();
        match self {
            Bindings::Unary(b) => {
                b.tessera_inference_handler()
                    .call_initialize(store, config_json)
                    .await
            }
            Bindings::Decoupled(b) => {
                b.tessera_inference_decoupled_handler()
                    .call_initialize(store, config_json)
                    .await
            }
        }
    }

    async fn finalize(&self, store: &mut Store<HostState>) -> wasmtime::Result<()> {
        let _running = store.data().guest_running();
        match self {
            Bindings::Unary(b) => b.tessera_inference_handler().call_finalize(store).await,
            Bindings::Decoupled(b) => {
                b.tessera_inference_decoupled_handler()
                    .call_finalize(store)
                    .await
            }
        }
    }
}

/// One live guest: its store and bindings.
pub struct Live {
    store: Store<HostState>,
    bindings: Bindings,
}

/// One instance of a Wasm model version.
pub struct WasmInstance {
    pre: Arc<WasmModel>,
    /// `None` after a trap or a deadline: the next execution starts a fresh instance.
    live: Option<Live>,
    /// Whom a decoupled handler's `resume` works for: the request id and tenant of the last
    /// batch it took (its BLS calls are metered and logged under them).
    resume_for: (u64, Option<Arc<str>>),
}

impl ModelInstance for WasmInstance {
    fn execute(&mut self, batch: Vec<Call>) -> BoxFuture<'_, Executed> {
        async move { self.run(batch).await }.boxed()
    }

    fn executes_in_task(&self) -> bool {
        true
    }

    fn has_open_work(&self) -> bool {
        self.live
            .as_ref()
            .is_some_and(|live| live.store.data().streams.any_open())
    }

    fn resume(&mut self) -> BoxFuture<'_, Option<Duration>> {
        async move { self.resume_decoupled().await }.boxed()
    }

    fn work_ready(&mut self) -> BoxFuture<'_, ()> {
        async move {
            match self.live.as_mut() {
                Some(live) => {
                    if live.store.data().streams.unnoticed_cancellation() {
                        return; // a caller left while the guest ran: it has yet to see that
                    }
                    // A BLS stream has more, or a caller went away (the guest lets go of what
                    // it holds for it).
                    let callers = live.store.data().streams.waiting_callers();
                    let caller_left = async {
                        if callers.is_empty() {
                            std::future::pending::<()>().await;
                        }
                        futures::future::select_all(
                            callers.iter().map(|s| Box::pin(s.cancelled())),
                        )
                        .await;
                    };
                    let streams_ready =
                        std::future::poll_fn(|cx| live.store.data_mut().poll_streams_ready(cx));
                    tokio::select! {
                        () = streams_ready => {}
                        () = caller_left => {}
                    }
                }
                None => std::future::pending().await,
            }
        }
        .boxed()
    }
}

impl WasmInstance {
    fn new(pre: Arc<WasmModel>, live: Live) -> WasmInstance {
        pre.counters
            .live_instances
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        pre.instances
            .live
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        WasmInstance {
            pre,
            live: Some(live),
            resume_for: (0, None),
        }
    }

    async fn run(&mut self, batch: Vec<Call>) -> Executed {
        let n = batch.len();
        let fail_all = |error: InferError, timing: ExecutionTiming| Executed {
            results: (0..n).map(|_| Err(error.clone())).collect(),
            timing,
        };
        let t0 = Instant::now();
        let mut live = match self.live.take() {
            Some(live) => live,
            None => match self.pre.instantiate().await {
                Ok(live) => live,
                Err(e) => return fail_all(InferError::internal(e), ExecutionTiming::default()),
            },
        };
        let chain = call_chain(&batch, &self.pre.name);
        // A batch may mix tenants of a shared model: its calls are metered to the first one's.
        // Its BLS calls are traced under the first request's span.
        let (request_id, tenant, span) =
            batch.first().map_or((0, None, tracing::Span::none()), |c| {
                (c.cx.request_id, c.cx.tenant.clone(), c.cx.span.clone())
            });
        live.store.data_mut().begin_execution(
            chain,
            self.pre.limits.execute_deadline,
            request_id,
            tenant,
            span,
        );
        let limits = &self.pre.limits;
        live.store.set_epoch_deadline(1);
        if let Err(e) = limits.refuel(&mut live.store) {
            return fail_all(
                InferError::internal(e.to_string()),
                ExecutionTiming::default(),
            );
        }
        if matches!(live.bindings, Bindings::Decoupled(_)) {
            self.resume_for = (request_id, live.store.data().tenant());
            return self.run_decoupled(live, batch, t0).await;
        }
        let requests: Vec<_> = batch
            .into_iter()
            .map(|c| convert::request_to_wit(c.request))
            .collect();
        let t1 = Instant::now();
        let Bindings::Unary(bindings) = &live.bindings else {
            unreachable!("decoupled handlers returned above");
        };
        let running = live.store.data().guest_running();
        let call = bindings
            .tessera_inference_handler()
            .call_execute(&mut live.store, &requests);
        let outcome = tokio::time::timeout(limits.execute_deadline, call).await;
        drop(running);
        let t2 = Instant::now();
        let host = live.store.data_mut();
        host.flush_output(&self.pre.name, self.pre.version);
        let timing = |t3: Instant| ExecutionTiming {
            input: t1 - t0,
            infer: t2 - t1,
            output: t3 - t2,
        };
        match outcome {
            Ok(Ok(results)) => {
                host.end_execution();
                self.live = Some(live);
                if results.len() != n {
                    let e = InferError::internal(format!(
                        "handler '{}' returned {} responses for {n} requests",
                        crate::namespace::shown(&self.pre.name),
                        results.len()
                    ));
                    return fail_all(e, timing(Instant::now()));
                }
                let results: Vec<InferResult> = results
                    .into_iter()
                    .map(|r| match r {
                        Ok(response) => {
                            convert::response_from_wit(response, limits.max_output_bytes)
                        }
                        Err(e) => Err(convert::error_from_wit(e, limits.max_output_bytes)),
                    })
                    .collect();
                self.replace_if_grown();
                Executed {
                    results,
                    timing: timing(Instant::now()),
                }
            }
            Ok(Err(trap)) => {
                let error = self.pre.describe_trap(&trap, host);
                // The store may be corrupt: drop it; the next execution instantiates afresh.
                fail_all(error, timing(Instant::now()))
            }
            Err(_elapsed) => fail_all(self.deadline_error(), timing(Instant::now())),
        }
    }

    /// The error of an execution stopped at its deadline, counted.
    fn deadline_error(&self) -> InferError {
        self.pre
            .counters
            .deadline_kills
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        InferError::new(
            ErrorKind::Timeout,
            format!(
                "handler '{}' exceeded its execution deadline of {} ms and was stopped",
                crate::namespace::shown(&self.pre.name),
                self.pre.limits.execute_deadline.as_millis()
            ),
        )
    }

    /// A decoupled handler's `execute`: each request goes with its response sender; what the
    /// scheduler gets back per request is only whether the handler failed (the responses went
    /// through the stream).
    async fn run_decoupled(&mut self, mut live: Live, batch: Vec<Call>, t0: Instant) -> Executed {
        let mut results = Vec::with_capacity(batch.len());
        let mut requests = Vec::with_capacity(batch.len());
        let mut senders = Vec::with_capacity(batch.len());
        for call in batch {
            match call.stream {
                Some(sender) => {
                    requests.push(convert::request_to_wit(call.request));
                    senders.push(sender);
                    results.push(Ok(crate::infer::InferResponse::default()));
                }
                // The request path sends only streamed calls here (ModelVersion::infer refuses).
                None => results.push(Err(InferError::new(
                    ErrorKind::Unsupported,
                    "a decoupled model answers through a stream",
                ))),
            }
        }
        let fail_all = |results: &mut Vec<InferResult>, error: &InferError| {
            for result in results.iter_mut() {
                *result = Err(error.clone());
            }
        };
        let host = live.store.data_mut();
        let resources = match decoupled::senders_for(host, senders) {
            Ok(resources) => resources,
            Err(e) => {
                // The guest's resource table is full (max_host_resources): these requests fail.
                let error =
                    InferError::internal(format!("cannot hand the handler its senders: {e}"));
                fail_all(&mut results, &error);
                self.live = Some(live);
                return Executed {
                    results,
                    timing: ExecutionTiming::default(),
                };
            }
        };
        let pairs: Vec<_> = requests.into_iter().zip(resources).collect();
        let blocked = host.streams.blocked.clone();
        let t1 = Instant::now();
        let Bindings::Decoupled(bindings) = &live.bindings else {
            unreachable!("run_decoupled is called for decoupled handlers");
        };
        let running = live.store.data().guest_running();
        let call = bindings
            .tessera_inference_decoupled_handler()
            .call_execute(&mut live.store, &pairs);
        let outcome =
            decoupled::within_deadline(call, self.pre.limits.execute_deadline, &blocked).await;
        drop(running);
        let t2 = Instant::now();
        let host = live.store.data_mut();
        host.flush_output(&self.pre.name, self.pre.version);
        match outcome {
            Some(Ok(())) => {
                host.end_execution();
                self.live = Some(live);
            }
            Some(Err(trap)) => {
                let error = self.pre.describe_trap(&trap, host);
                host.streams.fail_open(&error);
                fail_all(&mut results, &error);
            }
            None => {
                let error = self.deadline_error();
                live.store.data_mut().streams.fail_open(&error);
                fail_all(&mut results, &error);
            }
        }
        Executed {
            results,
            timing: ExecutionTiming {
                input: t1 - t0,
                infer: t2 - t1,
                output: Instant::now() - t2,
            },
        }
    }

    /// A decoupled handler's `resume`: it goes on with the streams it holds.
    async fn resume_decoupled(&mut self) -> Option<Duration> {
        let mut live = self.live.take()?;
        let limits = &self.pre.limits;
        let (request_id, tenant) = self.resume_for.clone();
        live.store.data_mut().begin_execution(
            vec![self.pre.name.clone()],
            limits.execute_deadline,
            request_id,
            tenant,
            tracing::Span::none(),
        );
        live.store.set_epoch_deadline(1);
        if limits.refuel(&mut live.store).is_err() {
            self.live = Some(live);
            return None;
        }
        let blocked = live.store.data().streams.blocked.clone();
        let Bindings::Decoupled(bindings) = &live.bindings else {
            self.live = Some(live);
            return None;
        };
        let cancelled_before = live.store.data().streams.cancelled_now();
        let running = live.store.data().guest_running();
        let call = bindings
            .tessera_inference_decoupled_handler()
            .call_resume(&mut live.store);
        let outcome = decoupled::within_deadline(call, limits.execute_deadline, &blocked).await;
        drop(running);
        let host = live.store.data_mut();
        host.flush_output(&self.pre.name, self.pre.version);
        host.streams.guest_ran(cancelled_before);
        match outcome {
            Some(Ok(after)) => {
                host.end_execution();
                if after.is_none() && host.streams.any_caller_waiting() {
                    host.streams.fail_open(&InferError::internal(format!(
                        "handler '{}' has nothing more to do but did not send the final response",
                        crate::namespace::shown(&self.pre.name)
                    )));
                }
                self.live = Some(live);
                self.replace_if_grown();
                after.map(|ms| Duration::from_millis(u64::from(ms)))
            }
            Some(Err(trap)) => {
                let error = self.pre.describe_trap(&trap, host);
                host.streams.fail_open(&error);
                None
            }
            None => {
                let error = self.deadline_error();
                live.store.data_mut().streams.fail_open(&error);
                None
            }
        }
    }
}

/// The callers of a batch's requests plus this model: a BLS call from here must not reach any
/// of them again (that would wait on itself).
fn call_chain(batch: &[Call], model: &str) -> Vec<String> {
    let mut chain: Vec<String> = Vec::new();
    for call in batch {
        for caller in &call.cx.call_chain {
            if !chain.contains(caller) {
                chain.push(caller.clone());
            }
        }
    }
    chain.push(model.to_owned());
    chain
}

impl WasmInstance {
    /// Replaces the live instance, between calls, once its linear memory has grown past three
    /// quarters of `max_memory_bytes`: the next call starts a fresh one (with `initialize`),
    /// instead of a later call failing at the limit. Guests whose memory only grows are not
    /// rare: componentize-py 0.25 never frees the buffers of a returned `list<u8>`, so a Python
    /// handler leaks the size of every output it returns. A decoupled instance is replaced
    /// only when it holds no stream.
    fn replace_if_grown(&mut self) {
        let Some(live) = self.live.as_ref() else {
            return;
        };
        let host = live.store.data();
        let limit = self.pre.limits.max_memory_bytes;
        if host.limiter.high_water <= limit / 4 * 3 || host.streams.any_open() {
            return;
        }
        tracing::info!(
            model = self.pre.name,
            version = self.pre.version,
            "replacing an instance whose memory reached {} of its {limit} bytes",
            host.limiter.high_water
        );
        self.pre
            .counters
            .memory_replacements
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(live) = self.live.take() {
            self.finalize_in_background(live, || {});
        }
    }

    /// Runs `finalize` on the runtime (unload, shutdown, replacement), then `done`; the server
    /// waits for these at shutdown (`WasmRuntime::drain`).
    fn finalize_in_background(&self, mut live: Live, done: impl FnOnce() + Send + 'static) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return done();
        };
        let deadline = self.pre.limits.execute_deadline;
        let limits_metered = self.pre.limits.fuel_per_execute.is_some();
        let (name, version) = (self.pre.name.clone(), self.pre.version);
        handle.spawn(async move {
            live.store.set_epoch_deadline(1);
            if limits_metered {
                let _ = live.store.set_fuel(u64::MAX);
            }
            let call = live.bindings.finalize(&mut live.store);
            let _ = tokio::time::timeout(deadline, call).await;
            live.store.data_mut().flush_output(&name, version);
            drop(live);
            done();
        });
    }
}

impl Drop for WasmInstance {
    fn drop(&mut self) {
        let (counters, instances) = (self.pre.counters.clone(), self.pre.instances.clone());
        let done = move || {
            counters
                .live_instances
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            instances
                .live
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            instances.dropped.notify_waiters();
        };
        // A trapped instance has nothing to finalize.
        match self.live.take() {
            Some(live) => self.finalize_in_background(live, done),
            None => done(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_likely_fix_follows_what_toolchains_put_in_by_default() {
        // wasmparser's words for a component built with the async ABI (jco's QuickJS default).
        let async_abi = "not a valid Wasm component: canonical option `async` requires the component model async feature";
        assert!(with_likely_fix(async_abi.into()).ends_with(
            "build it without (jco: --backend-qjs-disable-async; wit-bindgen: no async exports)"
        ));
        // wasmtime's words for an import the model world lacks (componentize-js's fetch).
        let http = "component imports instance `wasi:http/types@0.2.3`, but a matching implementation was not found in the linker";
        assert!(with_likely_fix(http.into()).contains("`-d http`"));
        let other = "component imports instance `acme:thing/x`, but a matching implementation was not found in the linker";
        assert_eq!(with_likely_fix(other.into()), other);
    }
}
