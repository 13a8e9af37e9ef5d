//! Functions: components of the `tessera:inference/function` world — standard `wasi:http`
//! handlers (`wasi:http/incoming-handler`) that may also call models and log.
//!
//! Every invocation runs in a fresh instance from the pooling allocator, made from the function's
//! pre-linked `ProxyPre`, so nothing a caller leaves in memory reaches the next one. Its limits:
//! wall time (epoch interruption, with the same ticker as handlers), memory, request and response
//! body size, and concurrent invocations.
//!
//! A function's `infer` enters the request path through [`Inference`] with a call chain of
//! `function/<name>`, so it is queued and batched with every other request of the model.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use wasmtime::component::Component;
use wasmtime::{Engine, Store};
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;

use super::host::{Guest, HostState, trap_cause};
use super::limits::{Counters, Limits, LogRate};
use super::{LoadError, WasmRuntime};
use crate::infer::{CallContext, Inference};

/// The export that makes a component a `wasi:http` handler (any 0.2 patch version).
const INCOMING_HANDLER: &str = "wasi:http/incoming-handler@0.2";

/// A response body as a function produces it (or an error in the middle of it).
pub type FunctionBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A function's response body, which ends only once the guest has: with an error when the
/// guest failed (trapped, ran out of time) after the head was sent.
struct GuardedBody {
    inner: FunctionBody,
    /// The guest's failure, if any; taken once the inner body has ended.
    outcome: Option<tokio::sync::oneshot::Receiver<Option<String>>>,
}

impl http_body::Body for GuardedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(None) => {}
            other => return other,
        }
        let Some(outcome) = self.outcome.as_mut() else {
            return Poll::Ready(None);
        };
        let failure = match std::pin::Pin::new(outcome).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(failure)) => failure,
            Poll::Ready(Err(_)) => Some("the function's task ended without an outcome".into()),
        };
        self.outcome = None;
        Poll::Ready(failure.map(|why| Err(format!("the function failed: {why}").into())))
    }
}

/// What a function may use; from its manifest, with documented defaults.
#[derive(Clone, Debug)]
pub struct FunctionLimits {
    /// Memory, wall time (`execute_deadline`), fuel, logs, host resources.
    pub sandbox: Limits,
    pub max_request_body_bytes: usize,
    pub max_response_body_bytes: usize,
    pub max_concurrency: usize,
}

/// A function ready to serve.
pub struct WasmFunction {
    pub name: String,
    pre: ProxyPre<HostState>,
    engine: Engine,
    ticker: Arc<super::epoch::EpochTicker>,
    pub limits: FunctionLimits,
    env: Vec<(String, String)>,
    allowed_hosts: Arc<[String]>,
    inference: Weak<dyn Inference>,
    counters: Arc<Counters>,
    custom_metrics: Arc<super::custom_metrics::CustomMetrics>,
    /// The series its invocations made: they live as long as this deployment of it.
    series: Arc<super::custom_metrics::SeriesKeeper>,
    log_rate: Arc<LogRate>,
    /// Invocations running; at `max_concurrency`, the next one is refused at once.
    running: Arc<tokio::sync::Semaphore>,
    pub stats: Arc<FunctionStats>,
}

/// Every function's [`FunctionStats`], by name, across its revisions.
#[derive(Debug, Default)]
pub struct StatsRegistry(std::sync::Mutex<std::collections::BTreeMap<String, Arc<FunctionStats>>>);

impl StatsRegistry {
    fn for_function(&self, name: &str) -> Arc<FunctionStats> {
        let mut stats = self.0.lock().unwrap_or_else(|p| p.into_inner());
        stats.entry(name.to_owned()).or_default().clone()
    }

    pub fn forget(&self, owned: impl Fn(&str) -> bool) {
        let mut stats = self.0.lock().unwrap_or_else(|p| p.into_inner());
        stats.retain(|name, _| !owned(name));
    }
}

/// Per-function figures for `/metrics`.
#[derive(Debug, Default)]
pub struct FunctionStats {
    /// Invocations by status class: 2xx, 3xx, 4xx, 5xx.
    pub by_class: [AtomicU64; 4],
    /// Time to the response's head, summed, in microseconds, and its count.
    pub duration_us: AtomicU64,
    /// Time to instantiate, summed, in microseconds (one per invocation that got that far).
    pub instantiation_us: AtomicU64,
    pub instantiations: AtomicU64,
    /// Invocations running now.
    pub live: AtomicU64,
}

impl FunctionStats {
    fn record(&self, status: u16, elapsed: Duration) {
        let class = usize::from(status / 100).clamp(2, 5) - 2;
        self.by_class[class].fetch_add(1, Ordering::Relaxed);
        self.duration_us
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn invocations(&self) -> u64 {
        self.by_class
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

/// Why an invocation got no response from the guest; each has its HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("function '{0}' is at its limit of {1} concurrent invocations; retry later")]
    Busy(String, usize),
    #[error("the request body is over the function's limit of {0} bytes (max_request_body_bytes)")]
    RequestTooLarge(usize),
    #[error("function '{0}' did not answer within its time limit of {1} ms (timeout_ms)")]
    Timeout(String, u128),
    #[error(
        "function '{name}' exceeded its memory limit of {limit} bytes (max_memory_bytes) and was stopped"
    )]
    Memory { name: String, limit: usize },
    #[error("function '{name}' failed: {message}")]
    Failed { name: String, message: String },
    #[error("the server is shutting down")]
    ShuttingDown,
}

impl InvokeError {
    pub fn status(&self) -> u16 {
        match self {
            InvokeError::Busy(..) => 429,
            InvokeError::RequestTooLarge(_) => 413,
            InvokeError::Timeout(..) => 504,
            InvokeError::ShuttingDown => 503,
            InvokeError::Memory { .. } | InvokeError::Failed { .. } => 500,
        }
    }
}

impl WasmRuntime {
    /// Compiles (or takes from the cache) a function's component and links it against the
    /// function world. A core module, or a component that does not export
    /// `wasi:http/incoming-handler` or imports what the host does not offer, is refused with the
    /// reason.
    pub fn prepare_function(
        &self,
        name: &str,
        bytes: &[u8],
        mut limits: FunctionLimits,
        env: Vec<(String, String)>,
        allowed_hosts: Vec<String>,
        inference: Weak<dyn Inference>,
    ) -> Result<Arc<WasmFunction>, LoadError> {
        let shown = crate::namespace::shown(name);
        super::check_component_binary(&format!("function '{shown}'"), bytes)
            .map_err(LoadError::invalid)?;
        if limits.sandbox.max_memory_bytes as u64 > self.max_memory_bytes {
            return Err(LoadError::invalid(format!(
                "max_memory_bytes {} exceeds the server's cap of {} (--wasm-max-memory-bytes)",
                limits.sandbox.max_memory_bytes, self.max_memory_bytes
            )));
        }
        // A function has no fuel budget of its own; a metering server's stores need fuel.
        limits.sandbox.fuel_per_execute = self.fuel_metered.then_some(u64::MAX);
        let counter_key = crate::namespace::Caller::function_entry(name);
        let component: Component = super::cache::load_or_compile(
            &self.engine,
            self.cache_dir.as_deref(),
            bytes,
            &counter_key,
            &self.counters.for_model(&counter_key),
        )?;
        // A memory that starts above the limit could never be made: every call would fail. Each
        // memory is held to the limit on its own (`memory_growing`), so the largest counts.
        let initial = component
            .resources_required()
            .and_then(|r| r.max_initial_memory_size)
            .map_or(0, |pages| pages.saturating_mul(64 << 10));
        if initial > limits.sandbox.max_memory_bytes as u64 {
            return Err(LoadError::invalid(format!(
                "function '{shown}' starts with {initial} bytes of memory, more than its max_memory_bytes of {} (the manifest's, or its tenant's ceiling): raise the limit",
                limits.sandbox.max_memory_bytes
            )));
        }
        super::check_export(
            &self.engine,
            &component,
            INCOMING_HANDLER,
            &format!("function '{shown}' is not a wasi:http component"),
        )?;
        let instance_pre = self
            .function_linker
            .instantiate_pre(&component)
            .map_err(|e| {
                LoadError::invalid(format!(
                    "function '{shown}' does not fit the tessera:inference/function world: {e:#}"
                ))
            })?;
        let pre = ProxyPre::new(instance_pre).map_err(|e| {
            LoadError::invalid(format!(
                "function '{shown}' is not a wasi:http handler: {e:#}"
            ))
        })?;
        Ok(Arc::new(WasmFunction {
            name: name.to_owned(),
            pre,
            engine: self.engine.clone(),
            ticker: self.ticker.clone(),
            log_rate: Arc::new(LogRate::new(limits.sandbox.max_log_bytes_per_second)),
            running: Arc::new(tokio::sync::Semaphore::new(limits.max_concurrency)),
            limits,
            env,
            allowed_hosts: Arc::from(allowed_hosts),
            inference,
            counters: self.counters.for_model(&counter_key),
            custom_metrics: self.custom_metrics.clone(),
            series: Arc::default(),
            stats: self.function_stats.for_function(name),
        }))
    }
}

impl WasmFunction {
    /// The function's name as messages show it (its owner's name for it, not the key).
    fn shown_name(&self) -> String {
        crate::namespace::shown(&self.name).to_owned()
    }

    /// Runs one invocation in a fresh instance. `path_and_query` is what the guest sees as the
    /// request's path (the part after `/v1/functions/<name>`).
    pub async fn invoke<B>(
        self: &Arc<Self>,
        request: http::Request<B>,
        cx: &CallContext,
    ) -> Result<http::Response<FunctionBody>, InvokeError>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let started = Instant::now();
        let result = self.run(request, cx, started).await;
        let status = match &result {
            Ok(response) => response.status().as_u16(),
            Err(e) => e.status(),
        };
        self.stats.record(status, started.elapsed());
        result
    }

    async fn run<B>(
        self: &Arc<Self>,
        request: http::Request<B>,
        cx: &CallContext,
        started: Instant,
    ) -> Result<http::Response<FunctionBody>, InvokeError>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let permit = self
            .running
            .clone()
            .try_acquire_owned()
            .map_err(|_| InvokeError::Busy(self.shown_name(), self.limits.max_concurrency))?;
        let max_request = self.limits.max_request_body_bytes;
        let declared = request
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max_request as u64) {
            return Err(InvokeError::RequestTooLarge(max_request));
        }
        let (mut parts, body) = request.into_parts();
        // wasi:http needs an authority; an HTTP/1.0 client may send no Host.
        if parts.uri.authority().is_none() && !parts.headers.contains_key(http::header::HOST) {
            parts.headers.insert(
                http::header::HOST,
                http::HeaderValue::from_static("localhost"),
            );
        }
        // A body without a length is cut at the limit: the guest's read fails there.
        let body = http_body_util::Limited::new(body, max_request).map_err(move |e| {
            if e.is::<http_body_util::LengthLimitError>() {
                wasmtime_wasi_http::Error::HttpRequestBodySize(Some(max_request as u64))
            } else {
                wasmtime_wasi_http::Error::InternalError(Some(e.to_string()))
            }
        });
        let request = http::Request::from_parts(parts, body);

        let limits = &self.limits.sandbox;
        let state = HostState::for_guest(&Guest {
            name: &self.name,
            version: 0,
            limits,
            inference: self.inference.clone(),
            counters: self.counters.clone(),
            custom_metrics: self.custom_metrics.clone(),
            series_keeper: Some(self.series.clone()),
            log_rate: self.log_rate.clone(),
            ticker: self.ticker.clone(),
            env: &self.env,
            allowed_hosts: self.allowed_hosts.clone(),
            files: None,
        });
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        // Each epoch tick yields, so the time limit can fire while the guest computes.
        super::epoch::yield_each_tick(&mut store);
        limits
            .refuel(&mut store)
            .map_err(|e| self.failed(format!("{e:#}")))?;
        store.data_mut().begin_execution(
            vec![crate::namespace::Caller::function_entry(&self.name)],
            limits.execute_deadline,
            cx.request_id,
            cx.tenant.clone(),
            cx.span.clone(),
        );
        let incoming = store
            .data_mut()
            .http()
            .new_incoming_request(Scheme::Http, request)
            .map_err(|e| self.failed(format!("the request cannot be passed on: {e:#}")))?;
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let outparam = store
            .data_mut()
            .http()
            .new_response_outparam(sender)
            .map_err(|e| self.failed(format!("{e:#}")))?;

        let deadline = tokio::time::Instant::from_std(started) + limits.execute_deadline;
        let this = self.clone();
        // The guest runs in its own task: it may go on writing the body after the head is sent.
        let task = tokio::spawn(async move {
            let _permit = permit;
            // Counted down on every way out, an abort at the time limit included.
            let _live = LiveInvocation::enter(this.clone());
            let running = store.data().guest_running();
            let instantiating = Instant::now();
            let outcome = match this.pre.instantiate_async(&mut store).await {
                Ok(proxy) => {
                    Counters::bump(&this.counters.instantiations);
                    this.stats.instantiation_us.fetch_add(
                        instantiating.elapsed().as_micros() as u64,
                        Ordering::Relaxed,
                    );
                    this.stats.instantiations.fetch_add(1, Ordering::Relaxed);
                    let handled = proxy
                        .wasi_http_incoming_handler()
                        .call_handle(&mut store, incoming, outparam);
                    match tokio::time::timeout_at(deadline, handled).await {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(trap)) => Err(this.describe_trap(&trap, store.data())),
                        Err(_) => {
                            Counters::bump(&this.counters.deadline_kills);
                            Err(InvokeError::Timeout(
                                this.shown_name(),
                                this.limits.sandbox.execute_deadline.as_millis(),
                            ))
                        }
                    }
                }
                Err(e) => Err(this.failed(format!("cannot instantiate: {e:#}"))),
            };
            drop(running);
            store.data_mut().flush_output(&this.name, 0);
            store.data_mut().end_execution();
            outcome
        });

        match tokio::time::timeout_at(deadline, receiver).await {
            Ok(Ok(Ok(response))) if !(200..=599).contains(&response.status().as_u16()) => {
                // hyper would send a 101 as a protocol switch, and the connection is lost; a
                // status past 599 is no HTTP status clients know.
                let status = response.status().as_u16();
                drop(response);
                task.abort();
                let kind = if status < 200 {
                    "an informational status"
                } else {
                    "not an HTTP status"
                };
                Err(self.failed(format!(
                    "it answered with status {status}, {kind}; a function answers with a final status (200-599)"
                )))
            }
            Ok(Ok(Ok(response))) => {
                let max_response = self.limits.max_response_body_bytes;
                // The guest goes on writing the body after the head is sent; if it then
                // traps or runs out of time, the body must end in an error (the connection
                // aborted), not as if it were complete.
                let (ended, outcome) = tokio::sync::oneshot::channel();
                let name = self.shown_name();
                tokio::spawn(async move {
                    let failure = match task.await {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e.to_string()),
                        Err(e) => Some(e.to_string()),
                    };
                    if let Some(why) = &failure {
                        tracing::warn!(function = %name, "the function failed after its response began; the response is cut: {why}");
                    }
                    let _ = ended.send(failure);
                });
                Ok(response.map(|body| {
                    GuardedBody {
                        inner: http_body_util::Limited::new(
                            body.map_err(|code| std::io::Error::other(format!("{code:?}"))),
                            max_response,
                        )
                        .boxed_unsync(),
                        outcome: Some(outcome),
                    }
                    .boxed_unsync()
                }))
            }
            // The guest answered with an error code instead of a response.
            Ok(Ok(Err(code))) => Err(self.failed(format!("{code:?}"))),
            // The guest never set a response: what happened to it says why.
            Ok(Err(_)) => match task.await {
                Ok(Err(e)) => Err(e),
                Ok(Ok(())) => Err(self.failed("it returned without setting a response".into())),
                Err(e) => Err(self.failed(format!("{e}"))),
            },
            Err(_) => {
                // Waits for the guest to be gone (it yields at every epoch tick), so its
                // concurrency slot is free when the caller hears of the timeout.
                task.abort();
                if !matches!(task.await, Ok(Err(InvokeError::Timeout(..)))) {
                    Counters::bump(&self.counters.deadline_kills);
                }
                Err(InvokeError::Timeout(
                    self.shown_name(),
                    limits.execute_deadline.as_millis(),
                ))
            }
        }
    }

    fn failed(&self, message: String) -> InvokeError {
        InvokeError::Failed {
            name: self.shown_name(),
            message,
        }
    }

    fn describe_trap(&self, trap: &wasmtime::Error, host: &HostState) -> InvokeError {
        Counters::bump(&self.counters.traps);
        if host.limiter.memory_exceeded {
            Counters::bump(&self.counters.memory_kills);
            return InvokeError::Memory {
                name: self.shown_name(),
                limit: self.limits.sandbox.max_memory_bytes,
            };
        }
        if trap.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::OutOfFuel) {
            Counters::bump(&self.counters.fuel_kills);
        }
        let mut message = trap_cause(trap);
        if !host.last_stderr.is_empty() {
            message = format!("{message} (stderr: {})", host.last_stderr);
        }
        self.failed(message)
    }
}

/// One invocation running, in `tessera_function_instances_live`.
struct LiveInvocation(Arc<WasmFunction>);

impl LiveInvocation {
    fn enter(function: Arc<WasmFunction>) -> LiveInvocation {
        function.stats.live.fetch_add(1, Ordering::Relaxed);
        LiveInvocation(function)
    }
}

impl Drop for LiveInvocation {
    fn drop(&mut self) {
        self.0.stats.live.fetch_sub(1, Ordering::Relaxed);
    }
}
