//! What the host lends a guest: its store state, the `inference` and `log` imports, and a WASI
//! context with nothing in it (no files, no network, no arguments, no environment beyond what a
//! function's manifest sets; stdout and stderr captured into bounded buffers that end up in the
//! server's log). A function's guest also gets `wasi:http`, whose outgoing requests go only to the
//! hosts its manifest allows.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime::component::{Resource, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

use super::epoch::{EpochTicker, Running};
use super::limits::{Counters, InstanceTracker, Limits, LogRate, StoreLimiter};
use super::tessera::inference::{inference, log, types};
use super::{Bindings, Live, Pre, convert};
use crate::infer::{CallContext, ErrorKind, InferError, Inference};
use crate::stream::ResponseSender;

use super::custom_metrics::{CustomMetrics, GuestFamily, GuestMetric, Series, SeriesKeeper};
use super::tessera::inference::metrics::{self, MetricKind};

/// Per model version: everything needed to create instances.
pub struct WasmModel {
    pub pre: Pre,
    pub engine: Engine,
    pub limits: Limits,
    pub name: String,
    pub version: i64,
    pub config_json: String,
    pub inference: Weak<dyn Inference>,
    pub counters: Arc<Counters>,
    /// The server's guest-defined metric families.
    pub custom_metrics: Arc<CustomMetrics>,
    /// Instances alive across every Wasm model.
    pub instances: Arc<InstanceTracker>,
    pub ticker: Arc<EpochTicker>,
    /// The model's log allowance, shared by its instances.
    pub log_rate: Arc<LogRate>,
    /// The version's folder, which the handler reads (only reads) as `/model`: its tokenizer,
    /// vocabulary or labels, as a Triton model.py reads files beside itself.
    pub files: Option<std::path::PathBuf>,
}

/// What one `log` call costs besides its message: a log line is not free even when empty.
const LOG_CALL_OVERHEAD: usize = 64;

/// The longest `initialize` error kept (it ends up in the repository index and the log).
pub(super) const MAX_INIT_ERROR_CHARS: usize = 4096;

impl WasmModel {
    /// A fresh store with the component instantiated from the `InstancePre`; no guest code has
    /// run yet.
    pub async fn instantiate_bare(&self) -> Result<(Store<HostState>, Bindings), String> {
        let state = HostState::new(self);
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        // Each epoch tick yields to the executor, so the deadline timer can fire and a
        // looping guest never holds a worker thread for longer than a tick.
        super::epoch::yield_each_tick(&mut store);
        self.limits.refuel(&mut store).map_err(|e| e.to_string())?;
        let running = store.data().guest_running();
        let instantiated = match &self.pre {
            Pre::Unary(pre) => pre.instantiate_async(&mut store).await.map(Bindings::Unary),
            Pre::Decoupled(pre) => pre
                .instantiate_async(&mut store)
                .await
                .map(Bindings::Decoupled),
        };
        drop(running);
        let bindings = instantiated.map_err(|e| {
            format!(
                "cannot instantiate handler '{}': {e:#}",
                crate::namespace::shown(&self.name)
            )
        })?;
        Ok((store, bindings))
    }

    /// Instantiates the component in a fresh store and calls `initialize`.
    pub async fn instantiate(&self) -> Result<Live, String> {
        let (mut store, bindings) = self.instantiate_bare().await?;
        Counters::bump(&self.counters.instantiations);
        // `initialize` may call models too: its calls carry this model as their caller, so a
        // call back into it is refused as a cycle instead of waiting out the deadline.
        store.data_mut().begin_execution(
            vec![self.name.clone()],
            self.limits.execute_deadline,
            0,
            None,
            tracing::Span::none(),
        );
        let init = bindings.initialize(&mut store, &self.config_json);
        let outcome = tokio::time::timeout(self.limits.execute_deadline, init).await;
        store.data_mut().flush_output(&self.name, self.version);
        store.data_mut().end_execution();
        match outcome {
            Ok(Ok(Ok(()))) => Ok(Live { store, bindings }),
            Ok(Ok(Err(message))) => Err(format!(
                "handler '{}' initialize failed: {}",
                crate::namespace::shown(&self.name),
                truncate_chars(&message, MAX_INIT_ERROR_CHARS)
            )),
            // Named and counted as in `execute`, so a memory limit reads as one.
            Ok(Err(trap)) => Err(format!(
                "{} (in initialize)",
                self.describe_trap(&trap, store.data()).message
            )),
            Err(_) => {
                Counters::bump(&self.counters.deadline_kills);
                Err(format!(
                    "handler '{}' initialize exceeded its deadline",
                    crate::namespace::shown(&self.name)
                ))
            }
        }
    }

    /// Turns a trap into the error its requests get, counting the kind of kill.
    pub fn describe_trap(&self, trap: &wasmtime::Error, host: &HostState) -> InferError {
        Counters::bump(&self.counters.traps);
        let name = crate::namespace::shown(&self.name);
        if host.limiter.memory_exceeded {
            Counters::bump(&self.counters.memory_kills);
            return InferError::new(
                ErrorKind::Internal,
                format!(
                    "handler '{name}' exceeded its memory limit of {} bytes (max_memory_bytes) and was stopped",
                    self.limits.max_memory_bytes
                ),
            );
        }
        if trap.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::OutOfFuel) {
            Counters::bump(&self.counters.fuel_kills);
            return InferError::new(
                ErrorKind::Internal,
                format!(
                    "handler '{name}' ran out of fuel ({} per execute) and was stopped",
                    self.limits.fuel_per_execute.unwrap_or(u64::MAX)
                ),
            );
        }
        tracing::warn!(model = %name, version = self.version, "guest trapped: {trap:?}");
        // The cause is the host's words; the guest's stderr (a panic's message and source
        // location) is the guest's, so it goes to the log, not to the client.
        let error = InferError::internal(format!("handler '{name}' trapped: {}", trap_cause(trap)));
        match host.last_stderr.trim() {
            "" => error,
            stderr => error.with_detail(format!("stderr: {stderr}")),
        }
    }
}

/// A trap's whole cause chain ("resource table has no free keys" under "failed to push..."),
/// without the Wasm backtrace wasmtime attaches (the log has it; clients need the cause).
pub(super) fn trap_cause(trap: &wasmtime::Error) -> String {
    let causes: Vec<String> = trap
        .chain()
        .map(ToString::to_string)
        .filter(|text| !text.starts_with("error while executing at wasm backtrace"))
        .collect();
    if causes.is_empty() {
        trap.to_string()
    } else {
        causes.join(": ")
    }
}

/// The first `max` characters of `text`, saying how much was cut.
pub(super) fn truncate_chars(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => text.into(),
        Some((cut, _)) => format!("{}… ({} more bytes)", &text[..cut], text.len() - cut).into(),
    }
}

/// Control characters escaped, so a guest cannot forge log lines with newlines or terminal codes.
fn sanitize_log(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().any(char::is_control) {
        text.chars()
            .flat_map(|c| {
                if c.is_control() {
                    c.escape_default().collect::<Vec<_>>()
                } else {
                    vec![c]
                }
            })
            .collect::<String>()
            .into()
    } else {
        text.into()
    }
}

/// A bounded in-memory stdout/stderr: writes past `capacity` are dropped and counted.
#[derive(Clone)]
pub struct OutputSink {
    state: Arc<Mutex<(Vec<u8>, usize)>>,
    capacity: usize,
}

impl OutputSink {
    fn new(capacity: usize) -> Self {
        OutputSink {
            state: Arc::default(),
            capacity,
        }
    }

    /// Takes what was written and how many bytes were dropped.
    fn take(&self) -> (Vec<u8>, usize) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (std::mem::take(&mut state.0), std::mem::take(&mut state.1))
    }
}

impl IsTerminal for OutputSink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for OutputSink {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl AsyncWrite for OutputSink {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let room = self.capacity.saturating_sub(state.0.len());
        let kept = room.min(buf.len());
        state.0.extend_from_slice(&buf[..kept]);
        state.1 += buf.len() - kept;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The `infer-stream` calls one instance may hold open at once. An LLM BLS holds one per
/// generation in flight, generating or waiting for a slot (`max_num_seqs` is at most 256);
/// each is a request in its model's queue. Past it, the call is refused (429 to a client).
pub const MAX_OPEN_CALL_STREAMS: usize = 1024;

/// The response senders a decoupled handler holds (see `decoupled`).
pub struct Streams {
    /// The senders the guest holds, by resource index; removed when it drops them.
    open: HashMap<u32, ResponseSender>,
    /// Held senders whose callers went away before the guest's last `resume`, so it could see
    /// they had: no more work for the instance.
    noticed: std::collections::HashSet<u32>,
    /// The BLS streams the guest reads (`infer-stream`), by resource index.
    reading: std::collections::BTreeSet<u32>,
    /// Time sends spent waiting for readers (not charged to the execution deadline).
    pub blocked: Arc<BlockedTime>,
    /// How long one send may wait for its reader (the execution deadline).
    pub(super) max_send_wait: std::time::Duration,
    pub(super) max_output_bytes: usize,
}

impl Streams {
    pub fn new(max_output_bytes: usize, max_send_wait: std::time::Duration) -> Streams {
        Streams {
            open: HashMap::new(),
            noticed: std::collections::HashSet::new(),
            reading: std::collections::BTreeSet::new(),
            blocked: Arc::default(),
            max_send_wait,
            max_output_bytes,
        }
    }

    /// The guest holds `sender` as resource `rep`.
    pub(super) fn hold(&mut self, rep: u32, sender: ResponseSender) {
        self.open.insert(rep, sender);
    }

    /// The guest dropped resource `rep`.
    pub(super) fn release(&mut self, rep: u32) {
        self.open.remove(&rep);
        self.noticed.remove(&rep);
    }

    /// Whether the guest has work: a sender it holds has a caller waiting, or a caller went
    /// away since the guest last ran. The guest is resumed once after a caller leaves, so it
    /// can see it (`is-cancelled`, a send that fails) and let go of what it holds for that
    /// request, such as a stream from an LLM engine whose sequence slot stays taken until the
    /// stream is dropped. A guest that keeps a sender after that is not resumed for it again.
    pub fn any_open(&self) -> bool {
        self.open
            .iter()
            .any(|(rep, s)| !s.is_finished() && (!s.is_cancelled() || !self.noticed.contains(rep)))
    }

    /// The held senders whose callers have gone, as the guest is about to run: after the run
    /// they count as seen ([`Streams::guest_ran`]). One that goes while the guest runs may have
    /// been checked before it went, so it is left for the next run.
    pub(super) fn cancelled_now(&self) -> Vec<u32> {
        self.open
            .iter()
            .filter(|(_, s)| !s.is_finished() && s.is_cancelled())
            .map(|(rep, _)| *rep)
            .collect()
    }

    /// The guest has run: the cancellations from before the run are its to have seen.
    pub(super) fn guest_ran(&mut self, cancelled_before: Vec<u32>) {
        self.noticed.extend(cancelled_before);
    }

    /// Whether a sender the guest holds still has a caller waiting for its final response.
    pub fn any_caller_waiting(&self) -> bool {
        self.open
            .values()
            .any(|s| !s.is_finished() && !s.is_cancelled())
    }

    /// Whether a caller went away that the guest has not run since: it is resumed at once.
    pub fn unnoticed_cancellation(&self) -> bool {
        self.open
            .iter()
            .any(|(rep, s)| !s.is_finished() && s.is_cancelled() && !self.noticed.contains(rep))
    }

    /// The held senders whose callers are still there: the instance wakes when one leaves.
    pub fn waiting_callers(&self) -> Vec<ResponseSender> {
        self.open
            .values()
            .filter(|s| !s.is_finished() && !s.is_cancelled())
            .cloned()
            .collect()
    }

    /// Ends every stream still open with `error` (the guest trapped, or has nothing more to do).
    pub fn fail_open(&mut self, error: &InferError) {
        for sender in self.open.values() {
            sender.fail(error.clone());
        }
    }
}

/// Time a guest's sends spent waiting for their readers, the current wait included.
#[derive(Default)]
pub struct BlockedTime {
    total_ns: AtomicU64,
    since: Mutex<Option<std::time::Instant>>,
}

impl BlockedTime {
    /// A send starts waiting.
    pub fn begin(&self) {
        *self.since.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    }

    /// The send is done.
    pub fn end(&self) {
        if let Some(since) = self.since.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let waited = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.total_ns.fetch_add(waited, Ordering::Relaxed);
        }
    }

    /// All the waiting so far, a send still waiting included.
    pub fn so_far(&self) -> std::time::Duration {
        let ongoing = self
            .since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map_or(std::time::Duration::ZERO, |since| since.elapsed());
        std::time::Duration::from_nanos(self.total_ns.load(Ordering::Relaxed)) + ongoing
    }
}

/// The state of one guest's store.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limiter: StoreLimiter,
    stdout: OutputSink,
    stderr: OutputSink,
    /// The tail of stderr of the last execution (a Rust guest's panic message lands here).
    pub last_stderr: String,
    inference: Weak<dyn Inference>,
    model: String,
    version: i64,
    counters: Arc<Counters>,
    custom_metrics: Arc<CustomMetrics>,
    /// A function's: what holds the series its invocations make (a model's instance holds its
    /// own as long as it lives).
    series_keeper: Option<Arc<SeriesKeeper>>,
    ticker: Arc<EpochTicker>,
    log_rate: Arc<LogRate>,
    max_log_bytes: usize,
    /// What the `log` import may still write during this execution.
    log_budget: usize,
    log_drop_reported: bool,
    /// Models waiting on the current execution, this one last: BLS calls must not reach them.
    chain: Vec<String>,
    /// When the current execution's deadline passes.
    deadline: Option<std::time::Instant>,
    /// The client request the current execution serves (the first of its batch).
    request_id: u64,
    /// The tenant the current execution serves (the first of its batch), for its BLS calls.
    tenant: Option<std::sync::Arc<str>>,
    /// The span of the request the current execution serves (the first of its batch): its BLS
    /// calls are traced under it.
    span: tracing::Span,
    /// `wasi:http` state (used by functions only: a model's linker has no `wasi:http`).
    http: WasiHttpCtx,
    outgoing: OutgoingPolicy,
    /// The response senders a decoupled handler holds.
    pub streams: Streams,
}

/// Who a store belongs to, and what it may do: a model version's handler or a function.
pub struct Guest<'a> {
    pub name: &'a str,
    /// The model version; 0 for a function.
    pub version: i64,
    pub limits: &'a Limits,
    pub inference: Weak<dyn Inference>,
    pub counters: Arc<Counters>,
    pub custom_metrics: Arc<CustomMetrics>,
    /// A function's keeper of the series its invocations make; None for a model.
    pub series_keeper: Option<Arc<SeriesKeeper>>,
    pub log_rate: Arc<LogRate>,
    pub ticker: Arc<EpochTicker>,
    /// Environment variables the guest sees (a function's manifest; none for a model).
    pub env: &'a [(String, String)],
    /// Hosts (`host` or `host:port`) outgoing `wasi:http` requests may reach.
    pub allowed_hosts: Arc<[String]>,
    /// A folder the guest may read as `/model` (a model version's own folder).
    pub files: Option<&'a std::path::Path>,
}

/// Where a handler finds its version's folder.
pub const MODEL_FILES: &str = "/model";

impl HostState {
    fn new(model: &WasmModel) -> HostState {
        HostState::for_guest(&Guest {
            name: &model.name,
            version: model.version,
            limits: &model.limits,
            inference: model.inference.clone(),
            counters: model.counters.clone(),
            custom_metrics: model.custom_metrics.clone(),
            series_keeper: None,
            log_rate: model.log_rate.clone(),
            ticker: model.ticker.clone(),
            env: &[],
            allowed_hosts: Arc::from(Vec::new()),
            files: model.files.as_deref(),
        })
    }

    pub fn for_guest(guest: &Guest<'_>) -> HostState {
        let limits = guest.limits;
        let stdout = OutputSink::new(limits.max_log_bytes);
        let stderr = OutputSink::new(limits.max_log_bytes);
        let mut wasi = WasiCtx::builder();
        wasi.stdout(stdout.clone())
            .stderr(stderr.clone())
            .envs(guest.env)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if let Some(files) = guest.files
            && let Err(e) = wasi.preopened_dir(files, MODEL_FILES, wasmtime_wasi::FsPerms::ReadOnly)
        {
            // The folder went away (an unload raced the start): the guest sees no files.
            tracing::warn!(
                model = guest.name,
                "cannot open {} for the guest: {e:#}",
                files.display()
            );
        }
        let wasi = wasi.build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.max_host_resources);
        HostState {
            wasi,
            table,
            limiter: StoreLimiter {
                max_memory_bytes: limits.max_memory_bytes,
                max_table_elements: limits.max_table_elements,
                max_instances: limits.max_instances,
                memory_exceeded: false,
                high_water: 0,
            },
            stdout,
            stderr,
            last_stderr: String::new(),
            inference: guest.inference.clone(),
            model: guest.name.to_owned(),
            version: guest.version,
            counters: guest.counters.clone(),
            custom_metrics: guest.custom_metrics.clone(),
            series_keeper: guest.series_keeper.clone(),
            ticker: guest.ticker.clone(),
            log_rate: guest.log_rate.clone(),
            max_log_bytes: limits.max_log_bytes,
            log_budget: limits.max_log_bytes,
            log_drop_reported: false,
            chain: Vec::new(),
            deadline: None,
            request_id: 0,
            tenant: None,
            span: tracing::Span::none(),
            http: WasiHttpCtx::new(),
            outgoing: OutgoingPolicy {
                allowed_hosts: guest.allowed_hosts.clone(),
            },
            streams: Streams::new(limits.max_output_bytes, limits.execute_deadline),
        }
    }

    /// The tenant the current execution serves.
    pub(super) fn tenant(&self) -> Option<Arc<str>> {
        self.tenant.clone()
    }

    /// The guest's resource table (its response senders live there).
    pub(super) fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    /// The key of the model or function this store belongs to.
    pub(super) fn custom_metrics(&self) -> &CustomMetrics {
        &self.custom_metrics
    }

    pub(super) fn model(&self) -> &str {
        &self.model
    }

    /// Prepares for one `execute`.
    pub fn begin_execution(
        &mut self,
        chain: Vec<String>,
        deadline: std::time::Duration,
        request_id: u64,
        tenant: Option<std::sync::Arc<str>>,
        span: tracing::Span,
    ) {
        self.span = span;
        self.chain = chain;
        self.tenant = tenant;
        self.request_id = request_id;
        self.deadline = Some(std::time::Instant::now() + deadline);
        self.limiter.memory_exceeded = false;
        self.last_stderr.clear();
        self.log_budget = self.max_log_bytes;
        self.log_drop_reported = false;
    }

    fn count_dropped_log(&self, bytes: usize) {
        self.counters
            .log_dropped_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn end_execution(&mut self) {
        self.chain.clear();
        self.deadline = None;
        // A long-lived instance must not hold the last request's span open.
        self.span = tracing::Span::none();
        self.counters
            .memory_high_water_bytes
            .fetch_max(self.limiter.high_water as u64, Ordering::Relaxed);
    }

    /// Moves captured stdout/stderr into the log, tagged with the model.
    pub fn flush_output(&mut self, model: &str, version: i64) {
        for (stream, sink) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            let (bytes, mut dropped) = sink.take();
            let text = String::from_utf8_lossy(&bytes);
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                if self.log_rate.take(line.len() + LOG_CALL_OVERHEAD) {
                    tracing::info!(model, version, stream, "guest: {}", sanitize_log(line));
                } else {
                    dropped += line.len();
                }
            }
            if dropped > 0 {
                self.count_dropped_log(dropped);
                tracing::warn!(
                    model,
                    version,
                    stream,
                    dropped,
                    "guest output over max_log_bytes or max_log_bytes_per_second was dropped"
                );
            }
            if stream == "stderr" {
                let tail: Vec<&str> = text.lines().rev().take(3).collect();
                let tail = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
                // It is logged later with the request id: no guest control characters in it.
                self.last_stderr = sanitize_log(&tail).into_owned();
            }
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.outgoing,
        }
    }
}

/// Outgoing HTTP from a function: denied unless the request's authority is in its manifest's
/// `allowed_hosts` (`host` allows any port, `host:port` that port only).
struct OutgoingPolicy {
    allowed_hosts: Arc<[String]>,
}

impl OutgoingPolicy {
    fn allows(&self, uri: &http::Uri) -> bool {
        let Some(authority) = uri.authority() else {
            return false;
        };
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(match uri.scheme_str() {
            Some("http") => 80,
            _ => 443,
        });
        self.allowed_hosts
            .iter()
            .any(|allowed| match allowed.rsplit_once(':') {
                Some((h, p)) if p.parse::<u16>().is_ok() => {
                    h.eq_ignore_ascii_case(host) && p.parse::<u16>().ok() == Some(port)
                }
                _ => allowed.eq_ignore_ascii_case(host),
            })
    }
}

impl WasiHttpHooks for OutgoingPolicy {
    fn send_request(
        &mut self,
        request: http::Request<wasmtime_wasi_http::WasiBody>,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
    ) -> Box<
        dyn Future<
                Output = Result<
                    (
                        http::Response<wasmtime_wasi_http::WasiBody>,
                        Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
                    ),
                    wasmtime_wasi_http::Error,
                >,
            > + Send,
    > {
        let allowed = self.allows(request.uri());
        let target = request.uri().to_string();
        Box::new(async move {
            use http_body_util::BodyExt;
            drop(fut);
            if !allowed {
                tracing::warn!("outgoing request to {target} denied: not in allowed_hosts");
                // Let the guest finish writing its request body first (up to a bound): dropping
                // the body while the guest still writes it makes the guest see "connection reset"
                // from its write instead of the denial.
                let body = http_body_util::Limited::new(request.into_body(), 64 * 1024);
                let _ =
                    tokio::time::timeout(std::time::Duration::from_secs(1), body.collect()).await;
                return Err(wasmtime_wasi_http::Error::HttpRequestDenied);
            }
            let request = whole_body_if_bodiless(request).await?;
            let (response, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn Future<Output = _> + Send>,
            ))
        })
    }
}

/// A GET or HEAD has no body to stream, but the guest still closes its (empty) body stream after
/// sending the request. Streamed, the request goes out chunked and open-ended, and a server that
/// answers at once and closes makes the guest's late close fail ("connection reset"). So the
/// body of these methods is read first, bounded, and sent whole with its length.
async fn whole_body_if_bodiless(
    request: http::Request<wasmtime_wasi_http::WasiBody>,
) -> Result<http::Request<wasmtime_wasi_http::WasiBody>, wasmtime_wasi_http::Error> {
    use http_body_util::BodyExt;
    const LIMIT: usize = 64 * 1024;
    if !matches!(*request.method(), http::Method::GET | http::Method::HEAD) {
        return Ok(request);
    }
    let (parts, body) = request.into_parts();
    let bytes = http_body_util::Limited::new(body, LIMIT)
        .collect()
        .await
        .map_err(|_| wasmtime_wasi_http::Error::HttpRequestBodySize(Some(LIMIT as u64)))?
        .to_bytes();
    let body = http_body_util::Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync();
    Ok(http::Request::from_parts(parts, body))
}

impl types::Host for HostState {}

/// A guest's handle on the responses of a streamed BLS call (`inference.infer-stream`).
pub struct BlsStream {
    stream: crate::stream::ResponseStream,
    /// A message taken while the host waited for any stream to have one, not read yet.
    arrived: Option<Option<crate::stream::StreamMessage>>,
    max_output_bytes: usize,
}

impl BlsStream {
    fn take(&mut self, message: Option<crate::stream::StreamMessage>) -> inference::Polled {
        let Some(message) = message else {
            return inference::Polled::Ended;
        };
        match message.result {
            // A final message without a response: the stream has ended.
            None => inference::Polled::Ended,
            Some(Ok(response)) => inference::Polled::Ready(Ok(convert::response_to_wit(response))),
            Some(Err(e)) => inference::Polled::Ready(Err(convert::error_to_wit(bounded_error(
                e,
                self.max_output_bytes,
            )))),
        }
    }
}

impl HostState {
    /// Hold while this store's guest code may run: the epoch ticker ticks only then.
    pub fn guest_running(&self) -> Running {
        self.ticker.running()
    }
}

impl HostState {
    /// The context of a BLS call made during the current execution.
    fn call_context(&self) -> CallContext {
        CallContext {
            request_id: self.request_id,
            call_chain: self.chain.clone(),
            deadline: self.deadline,
            warmup: false,
            span: self.span.clone(),
            tenant: self.tenant.clone(),
            received_bytes: 0,
        }
    }

    /// Ready once a BLS stream the guest reads has a message (kept for its next read): what a
    /// decoupled handler waits on between `resume` calls, besides time and new requests.
    pub fn poll_streams_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        for &rep in &self.streams.reading {
            let handle = wasmtime::component::Resource::<BlsStream>::new_borrow(rep);
            let Ok(held) = self.table.get_mut(&handle) else {
                continue;
            };
            if held.arrived.is_some() {
                return std::task::Poll::Ready(());
            }
            if let std::task::Poll::Ready(message) = held.stream.poll_next(cx) {
                held.arrived = Some(message);
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    }

    fn inference(&self) -> Result<std::sync::Arc<dyn Inference>, types::Error> {
        self.inference.upgrade().ok_or_else(|| {
            convert::error_to_wit(InferError::unavailable("the server is shutting down"))
        })
    }
}

impl inference::Host for HostState {
    async fn infer(
        &mut self,
        model: String,
        version: Option<i64>,
        request: types::Request,
    ) -> Result<types::Response, types::Error> {
        let inference = self.inference()?;
        let request = convert::request_from_wit(request).map_err(convert::error_to_wit)?;
        match inference
            .infer(self.call_context(), &model, version, request)
            .await
        {
            Ok(response) => Ok(convert::response_to_wit(response)),
            Err(e) => Err(convert::error_to_wit(e)),
        }
    }

    async fn infer_stream(
        &mut self,
        model: String,
        version: Option<i64>,
        request: types::Request,
    ) -> Result<wasmtime::component::Resource<BlsStream>, types::Error> {
        if self.streams.reading.len() >= MAX_OPEN_CALL_STREAMS {
            // Each open stream is a request queued or running in its model, counted by no
            // admission limit: without a bound, one handler queued 360,000 of them (2.6 GB).
            return Err(convert::error_to_wit(InferError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "this instance holds {MAX_OPEN_CALL_STREAMS} open infer-stream calls, the most at once: read them to their end or drop them first"
                ),
            )));
        }
        let inference = self.inference()?;
        let request = convert::request_from_wit(request).map_err(convert::error_to_wit)?;
        let stream = inference
            .infer_stream(self.call_context(), &model, version, request)
            .await
            .map_err(convert::error_to_wit)?;
        let handle = self
            .table
            .push(BlsStream {
                stream,
                arrived: None,
                max_output_bytes: self.streams.max_output_bytes,
            })
            .map_err(|e| {
                convert::error_to_wit(InferError::new(
                    ErrorKind::ResourceExhausted,
                    format!("cannot hold another stream: {e}"),
                ))
            })?;
        self.streams.reading.insert(handle.rep());
        Ok(handle)
    }

    async fn model_metadata(
        &mut self,
        model: String,
        version: Option<i64>,
    ) -> Result<types::ModelMetadata, types::Error> {
        let metadata = self
            .inference()?
            .metadata(&self.call_context(), &model, version)
            .map_err(convert::error_to_wit)?;
        Ok(convert::metadata_to_wit(&metadata))
    }
}

impl inference::HostResponseStream for HostState {
    async fn next(
        &mut self,
        this: wasmtime::component::Resource<BlsStream>,
    ) -> Option<Result<types::Response, types::Error>> {
        let held = self.table.get_mut(&this).ok()?;
        let message = match held.arrived.take() {
            Some(message) => message,
            None => held.stream.next().await,
        };
        match held.take(message) {
            inference::Polled::Ready(result) => Some(result),
            inference::Polled::Ended | inference::Polled::Pending => None,
        }
    }

    async fn try_next(
        &mut self,
        this: wasmtime::component::Resource<BlsStream>,
    ) -> inference::Polled {
        let Ok(held) = self.table.get_mut(&this) else {
            return inference::Polled::Ended;
        };
        let message = match held.arrived.take() {
            Some(message) => message,
            None => match held.stream.try_next() {
                Some(message) => message,
                None => return inference::Polled::Pending,
            },
        };
        held.take(message)
    }

    async fn drop(
        &mut self,
        this: wasmtime::component::Resource<BlsStream>,
    ) -> wasmtime::Result<()> {
        // Dropping the stream cancels the call.
        self.streams.reading.remove(&this.rep());
        self.table.delete(this)?;
        Ok(())
    }
}

/// An error as a guest reads it: its message within the guest's output limit.
fn bounded_error(e: InferError, max: usize) -> InferError {
    InferError {
        message: crate::infer::bounded(&e.message, max.max(64)).into_owned(),
        ..e
    }
}

impl log::Host for HostState {
    async fn log(&mut self, level: log::Level, message: String) {
        // Counted against the execution's budget and the model's rate; what does not fit is
        // dropped and counted (the first drop of an execution is reported once).
        let cost = message.len().saturating_add(LOG_CALL_OVERHEAD);
        if cost > self.log_budget || !self.log_rate.take(cost) {
            if !self.log_drop_reported {
                self.log_drop_reported = true;
                tracing::warn!(
                    model = %self.model,
                    version = self.version,
                    "guest log messages over max_log_bytes or max_log_bytes_per_second are dropped"
                );
            }
            self.count_dropped_log(message.len());
            return;
        }
        self.log_budget -= cost;
        let message = sanitize_log(&message);
        let (model, version) = (&self.model, self.version);
        match level {
            log::Level::Trace => tracing::trace!(model, version, "{message}"),
            log::Level::Debug => tracing::debug!(model, version, "{message}"),
            log::Level::Info => tracing::info!(model, version, "{message}"),
            log::Level::Warn => tracing::warn!(model, version, "{message}"),
            log::Level::Error => tracing::error!(model, version, "{message}"),
        }
    }
}

// --- custom metrics (the registry is custom_metrics.rs) ---

impl HostState {
    fn tenant_of_guest(&self) -> Option<&str> {
        crate::namespace::ModelKey::parse(self.model()).tenant
    }

    fn guest_series(&mut self, this: &Resource<GuestMetric>) -> Result<Arc<Series>, String> {
        self.table()
            .get(this)
            .map(|m| m.0.clone())
            .map_err(|e| format!("no such metric: {e}"))
    }
}

impl metrics::Host for HostState {
    async fn family(
        &mut self,
        name: String,
        description: String,
        kind: MetricKind,
    ) -> Result<Resource<GuestFamily>, String> {
        let tenant = self.tenant_of_guest().map(str::to_owned);
        let family =
            self.custom_metrics()
                .family_for(&name, &description, kind, tenant.as_deref())?;
        self.table()
            .push(GuestFamily(family))
            .map_err(|e| format!("cannot hold another metric family: {e}"))
    }
}

impl metrics::HostMetricFamily for HostState {
    async fn metric(
        &mut self,
        this: Resource<GuestFamily>,
        labels: Vec<(String, String)>,
        buckets: Option<Vec<f64>>,
    ) -> Result<Resource<GuestMetric>, String> {
        let family = self
            .table()
            .get(&this)
            .map(|f| f.0.clone())
            .map_err(|e| format!("no such metric family: {e}"))?;
        let tenant = self.tenant_of_guest().map(str::to_owned);
        let series = self
            .custom_metrics()
            .series(&family, tenant.as_deref(), labels, buckets)?;
        if let Some(keeper) = &self.series_keeper {
            keeper.keep(&series);
        }
        self.table()
            .push(GuestMetric(series))
            .map_err(|e| format!("cannot hold another metric: {e}"))
    }

    async fn drop(&mut self, this: Resource<GuestFamily>) -> wasmtime::Result<()> {
        self.table().delete(this)?;
        Ok(())
    }
}

impl metrics::HostMetric for HostState {
    async fn increment(&mut self, this: Resource<GuestMetric>, value: f64) -> Result<(), String> {
        self.guest_series(&this)?.update("increment", value)
    }

    async fn set(&mut self, this: Resource<GuestMetric>, value: f64) -> Result<(), String> {
        self.guest_series(&this)?.update("set", value)
    }

    async fn observe(&mut self, this: Resource<GuestMetric>, value: f64) -> Result<(), String> {
        self.guest_series(&this)?.update("observe", value)
    }

    async fn value(&mut self, this: Resource<GuestMetric>) -> Result<f64, String> {
        self.guest_series(&this)?.value()
    }

    async fn drop(&mut self, this: Resource<GuestMetric>) -> wasmtime::Result<()> {
        self.table().delete(this)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_who_leaves_while_the_guest_runs_is_left_for_its_next_run() {
        let mut streams = Streams::new(1 << 20, std::time::Duration::from_secs(1));
        let (sender, caller) = crate::stream::channel();
        streams.hold(7, sender);
        // The guest is about to run: nobody has left yet.
        let before = streams.cancelled_now();
        assert!(before.is_empty());
        // The caller leaves while it runs, perhaps after the guest checked.
        drop(caller);
        streams.guest_ran(before);
        assert!(
            streams.unnoticed_cancellation(),
            "the guest never saw the caller leave"
        );
        assert!(
            streams.any_open(),
            "the instance has work: resume the guest once more"
        );
        assert!(!streams.any_caller_waiting());
        // The next run started after the caller left: now it is the guest's to have seen.
        let before = streams.cancelled_now();
        assert_eq!(before, [7]);
        streams.guest_ran(before);
        assert!(!streams.unnoticed_cancellation());
        assert!(
            !streams.any_open(),
            "a guest that keeps the sender is not resumed for it again"
        );
    }
}
