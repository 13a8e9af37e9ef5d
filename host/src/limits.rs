//! Server-wide limits, in one place. Each is a command-line flag and an environment variable;
//! `tessera check` prints them. Per-model limits stay with the model (`config.pbtxt`: the queue
//! policy, the Wasm sandbox parameters in `backend/wasm/limits.rs`).
//!
//! | flag / variable | unit | default | why |
//! |---|---|---|---|
//! | `--max-inflight-requests` / `TESSERA_MAX_INFLIGHT_REQUESTS` | requests | 4 096 | client requests (HTTP) admitted at once across all models; beyond it the answer is 503 at once. A saturated server refuses work instead of queueing it without end. The BLS calls and ensemble steps of an admitted request are not counted again (refusing them could fail a request already half done). |
//! | `--default-max-queue-size` / `TESSERA_DEFAULT_MAX_QUEUE_SIZE` | requests | 0 (unbounded) | the queue bound of a model whose queue policy sets no `max_queue_size`; 0 keeps Triton's unbounded default, since the in-flight limit bounds the total. |
//! | `--max-call-depth` / `TESSERA_MAX_CALL_DEPTH` | calls | 8 | nesting of BLS calls and ensembles (a handler calling a model that calls a model...). Every level holds an instance while it waits. |
//! | `--ensemble-concurrency` / `TESSERA_ENSEMBLE_CONCURRENCY` | requests | 256 | requests one ensemble runs at once; each waits on its steps' queues, so this bounds the ensemble's share of the in-flight work, not CPU. |
//! | `--drain-timeout-ms` / `TESSERA_DRAIN_TIMEOUT_MS` | ms | 10 000 | at shutdown, how long queued work and handlers' `finalize` may take before the process exits. |
//! | `--exit-timeout-secs` / `TESSERA_EXIT_TIMEOUT_SECS` | s | 30 | at shutdown (SIGTERM, Ctrl-C), how long open connections may take to finish their requests before they are closed (Triton's flag and default). Readiness drops at once. |
//! | `--max-connections` / `TESSERA_MAX_CONNECTIONS` | connections | 4 096 | open connections per listener (HTTP, gRPC, metrics); at it, a new client gets the slot of the connection idle the longest (closed for it), or waits until one closes when every connection has a request in progress. The soft file-descriptor limit is raised to the hard one at start so the bound, not the OS, decides. |
//! | `--http-header-read-timeout-secs` / `TESSERA_HTTP_HEADER_READ_TIMEOUT_SECS` | s | 10 | an HTTP request's headers (and a gRPC connection's HTTP/2 preface) must arrive within this; an idle keep-alive connection is closed after it too. A slowloris costs a socket for this long. |
//! | `--http-body-read-timeout-secs` / `TESSERA_HTTP_BODY_READ_TIMEOUT_SECS` | s | 120 | an HTTP request body must arrive in full within this (408 otherwise), however slowly it trickles; large deployments over slow links need more. |
//! | `--http-send-timeout-secs` / `TESSERA_HTTP_SEND_TIMEOUT_SECS` | s | 60 | a connection (HTTP or gRPC) whose writes have made no progress for this long is closed: its client has stopped reading (nginx's `send_timeout`, same default). What it held (answers not yet taken) is given back. Over HTTP/2 also per stream: a held answer that makes no progress (its client grants the stream no window) closes the connection. |
//! | `--http-max-buffered-bytes` / `TESSERA_HTTP_MAX_BUFFERED_BYTES` | bytes | 2 GiB | what the front-ends hold for clients at once, all connections together: request bodies being read (HTTP/1 bodies, gRPC messages) and responses not yet taken by their connections (`protocol::listen::WrittenBody`). A body that does not fit (its `Content-Length`, or `--http-max-input-size` when it gives none) is answered 503 at once; a gRPC message that does not fit (the length its prefix declares) ends its call with UNAVAILABLE; an HTTP answer that does not fit is a 503 instead. Without it, 4 096 connections each trickling a 64 MiB body could hold 256 GiB; one gRPC connection holding all but the last byte of a 60 MB message on each of its 1 024 streams, 60 GB; clients that send large requests and read nothing, their answers (20 clients of 50 MB held 1.1 GB, for good). |
//! | `--max-inflight-request-bytes` / `TESSERA_MAX_INFLIGHT_REQUEST_BYTES` | bytes | 4 GiB | what the client requests admitted at once hold (each one's input tensors, or the body or message it came in when larger), all models and front-ends together, from admission until the answer; past it the request is refused at once (503, gRPC UNAVAILABLE). `--max-inflight-requests` counts requests, not their size: 4 096 queued requests of 64 MiB each are 256 GiB. |
//! | `--epoch-tick-ms` / `TESSERA_EPOCH_TICK_MS` | ms | 5 | how often a running Wasm guest is interrupted to check its deadline and yield the thread: the granularity of `execute_deadline_ms`. Shorter costs more interrupts. |
//! | `--wasm-pool-instances` / `TESSERA_WASM_POOL_INSTANCES` | instances | 1 000 | Wasm instances alive at once, all models together (the pooling allocator's slots; each handler instance takes one). |
//! | `--wasm-function-cache-bytes` / `TESSERA_WASM_FUNCTION_CACHE_BYTES` | bytes | 256 MiB | compiled functions kept in memory (Cranelift's incremental cache): a component whose functions were compiled before, in any component, compiles from them. Every Python handler carries the same CPython, so the second one compiles about 3× faster (7.8 s, then 2.4-3.0 s in a release build on 2 cores); one such component fills about 41 MB. 0 turns it off. |
//! | `--wasm-fuel` / `TESSERA_WASM_FUEL` | on/off | off | meters wasmtime fuel in every guest, so a model may set `fuel_per_execute` (a deterministic CPU budget); without it such a model is refused at load. Metering costs every guest call 13-23 % of its time (measured on a Python handler, docs/benchmarks.md), while `execute_deadline_ms` (epoch interruption, near free) already stops a runaway guest. |
//! | `--worker-threads` / `TESSERA_WORKER_THREADS` | threads | 0 (one per CPU core) | the async runtime's workers: front-ends, batchers and Wasm guests run on them (ONNX Runtime and the LLM engine have threads of their own). With one per core, a lone request hops between idle workers, each hop a thread wake-up; one worker serves low concurrency with less CPU and more throughput, more workers serve high concurrency (measured: docs/benchmarks.md, "Python models"). |
//! | `--max-instances-per-model` / `TESSERA_MAX_INSTANCES_PER_MODEL` | instances | 64 | instances one model version may have (`instance_group` counts, times their GPUs); a configuration that asks for more is refused at load, before any is made. Each ONNX instance has a thread and its own session, each Wasm one a pool slot: without a bound, one configuration (a tenant's deployment, a load with a config override) could exhaust the server's threads and memory. |
//! | `--wasm-max-memory-bytes` / `TESSERA_WASM_MAX_MEMORY_BYTES` | bytes | 4 GiB | the largest `max_memory_bytes` a handler may be given. The pool reserves address space (not memory) for it in every memory slot (two per instance slot), so the reservation is about 2 × instances × this; lower both under `ulimit -v` or in containers that cap address space. |

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A number of bytes shared by everything that holds some of it at once (request bodies being
/// read, requests in flight). A reservation is refused at once when it does not fit, never
/// waited for: a saturated server answers "retry" rather than queueing memory.
#[derive(Clone, Debug)]
pub struct ByteBudget {
    /// One permit per KiB: a semaphore counts in `u32` per acquisition and `usize` in all.
    kib: Arc<Semaphore>,
    limit_kib: usize,
}

impl ByteBudget {
    pub fn new(bytes: u64) -> ByteBudget {
        let kib = usize::try_from(bytes.div_ceil(1024))
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        ByteBudget {
            kib: Arc::new(Semaphore::new(kib)),
            limit_kib: kib,
        }
    }

    /// Bytes held now, counted as reserved (whole KiB).
    pub fn held_bytes(&self) -> u64 {
        let held = self.limit_kib.saturating_sub(self.kib.available_permits());
        (held as u64).saturating_mul(1024)
    }

    /// Holds `bytes` (at least a KiB) until the permit is dropped; None when they do not fit.
    pub fn try_reserve(&self, bytes: u64) -> Option<OwnedSemaphorePermit> {
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        self.kib.clone().try_acquire_many_owned(kib.max(1)).ok()
    }
}

/// The bounds the front-ends' listeners apply to connections (`protocol::listen`).
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub send_timeout: Duration,
    pub exit_timeout: Duration,
}

/// A count, size or timeout that must be at least 1: at 0 it would refuse or time out
/// everything (it does not mean "off").
fn at_least_one<T>() -> clap::builder::RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: std::error::Error + Send + Sync + 'static,
{
    clap::builder::RangedU64ValueParser::new().range(1..)
}

/// Idle connections closed so that a new client got their slot (`--max-connections`), all
/// listeners, since start: `tessera_connections_shed_total` (`protocol::listen` sheds them).
pub static SHED_CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The server-wide limits (see the module documentation for each one's reason).
#[derive(Clone, Debug, clap::Args)]
pub struct ServerLimits {
    /// Client requests in flight at once, all models together; beyond it: 503.
    #[arg(
        long,
        env = "TESSERA_MAX_INFLIGHT_REQUESTS",
        default_value_t = 4096,
        value_parser = at_least_one::<usize>()
    )]
    pub max_inflight_requests: usize,
    /// Queue bound of models whose queue policy sets no max_queue_size (0: unbounded).
    #[arg(long, env = "TESSERA_DEFAULT_MAX_QUEUE_SIZE", default_value_t = 0)]
    pub default_max_queue_size: usize,
    /// Deepest nesting of BLS calls and ensembles.
    #[arg(long, env = "TESSERA_MAX_CALL_DEPTH", default_value_t = 8)]
    pub max_call_depth: usize,
    /// Requests one ensemble runs at once.
    #[arg(long, env = "TESSERA_ENSEMBLE_CONCURRENCY", default_value_t = 256)]
    pub ensemble_concurrency: usize,
    /// Milliseconds queued work and handlers' finalize may take at shutdown.
    #[arg(long, env = "TESSERA_DRAIN_TIMEOUT_MS", default_value_t = 10_000)]
    pub drain_timeout_ms: u64,
    /// Seconds open connections may take to finish at shutdown before they are closed.
    #[arg(long, env = "TESSERA_EXIT_TIMEOUT_SECS", default_value_t = 30)]
    pub exit_timeout_secs: u64,
    /// Open connections per listener (HTTP, gRPC, metrics).
    #[arg(
        long,
        env = "TESSERA_MAX_CONNECTIONS",
        default_value_t = 4096,
        value_parser = at_least_one::<usize>()
    )]
    pub max_connections: usize,
    /// Seconds an HTTP request's headers (or a gRPC connection's preface) may take to arrive.
    #[arg(
        long,
        env = "TESSERA_HTTP_HEADER_READ_TIMEOUT_SECS",
        default_value_t = 10,
        value_parser = at_least_one::<u64>()
    )]
    pub http_header_read_timeout_secs: u64,
    /// Seconds an HTTP request body may take to arrive in full (408 beyond).
    #[arg(
        long,
        env = "TESSERA_HTTP_BODY_READ_TIMEOUT_SECS",
        default_value_t = 120,
        value_parser = at_least_one::<u64>()
    )]
    pub http_body_read_timeout_secs: u64,
    /// Seconds a connection's writes may make no progress before it is closed.
    #[arg(
        long,
        env = "TESSERA_HTTP_SEND_TIMEOUT_SECS",
        default_value_t = 60,
        value_parser = at_least_one::<u64>()
    )]
    pub http_send_timeout_secs: u64,
    /// Bytes the front-ends hold for clients at once: request bodies being read and responses
    /// not yet taken (503 beyond).
    #[arg(
        long,
        env = "TESSERA_HTTP_MAX_BUFFERED_BYTES",
        default_value_t = 2 << 30,
        value_parser = at_least_one::<u64>()
    )]
    pub http_max_buffered_bytes: u64,
    /// Bytes the client requests in flight hold (tensors or bodies), all models together (503
    /// beyond).
    #[arg(
        long,
        env = "TESSERA_MAX_INFLIGHT_REQUEST_BYTES",
        default_value_t = 4 << 30,
        value_parser = at_least_one::<u64>()
    )]
    pub max_inflight_request_bytes: u64,
    /// Milliseconds between interruptions of a running Wasm guest.
    #[arg(long, env = "TESSERA_EPOCH_TICK_MS", default_value_t = 5)]
    pub epoch_tick_ms: u64,
    /// Wasm instances alive at once, all models together.
    #[arg(long, env = "TESSERA_WASM_POOL_INSTANCES", default_value_t = 1000)]
    pub wasm_pool_instances: u32,
    /// Largest max_memory_bytes a Wasm handler may be given, in bytes.
    #[arg(long, env = "TESSERA_WASM_MAX_MEMORY_BYTES", default_value_t = 4 << 30)]
    pub wasm_max_memory_bytes: u64,
    /// Bytes of compiled functions kept in memory to compile later components faster (0: off).
    #[arg(long, env = "TESSERA_WASM_FUNCTION_CACHE_BYTES", default_value_t = 256 << 20)]
    pub wasm_function_cache_bytes: usize,
    /// Meter wasmtime fuel in every guest, so models may set fuel_per_execute (costs every guest
    /// call 13-23 % of its speed).
    #[arg(long, env = "TESSERA_WASM_FUEL", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub wasm_fuel: bool,
    /// Instances one model version may have (its instance groups' counts, times their GPUs).
    #[arg(long, env = "TESSERA_MAX_INSTANCES_PER_MODEL", default_value_t = 64)]
    pub max_instances_per_model: usize,
    /// Threads that run the front-ends, the batchers and the Wasm guests (0: one per CPU core).
    #[arg(long, env = "TESSERA_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_inflight_requests: 4096,
            default_max_queue_size: 0,
            max_call_depth: 8,
            ensemble_concurrency: 256,
            drain_timeout_ms: 10_000,
            exit_timeout_secs: 30,
            max_connections: 4096,
            http_header_read_timeout_secs: 10,
            http_body_read_timeout_secs: 120,
            http_send_timeout_secs: 60,
            http_max_buffered_bytes: 2 << 30,
            max_inflight_request_bytes: 4 << 30,
            epoch_tick_ms: 5,
            wasm_pool_instances: 1000,
            wasm_max_memory_bytes: 4 << 30,
            wasm_function_cache_bytes: 256 << 20,
            wasm_fuel: false,
            max_instances_per_model: 64,
            worker_threads: 0,
        }
    }
}

impl ServerLimits {
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }

    /// The bounds the listeners apply to connections.
    pub fn connections(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.max_connections.max(1),
            header_read_timeout: Duration::from_secs(self.http_header_read_timeout_secs.max(1)),
            body_read_timeout: Duration::from_secs(self.http_body_read_timeout_secs.max(1)),
            send_timeout: Duration::from_secs(self.http_send_timeout_secs.max(1)),
            exit_timeout: Duration::from_secs(self.exit_timeout_secs),
        }
    }

    /// The async runtime's worker threads: as set, or one per CPU core.
    pub fn workers(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }

    pub fn epoch_tick(&self) -> Duration {
        Duration::from_millis(self.epoch_tick_ms.max(1))
    }

    /// Memory slots of the Wasm pool: two per instance (a component may hold more than one
    /// core memory).
    pub fn wasm_memory_slots(&self) -> u32 {
        self.wasm_pool_instances.saturating_mul(2)
    }

    /// Address space the Wasm pool reserves up front, in bytes (memory slots × the largest
    /// memory, plus a 32 MiB guard each).
    pub fn wasm_reservation_bytes(&self) -> u64 {
        u64::from(self.wasm_memory_slots()).saturating_mul(self.wasm_max_memory_bytes + (32 << 20))
    }

    /// One line per limit, for `tessera check`.
    pub fn describe(&self) -> Vec<String> {
        vec![
            format!("max_inflight_requests\t{}", self.max_inflight_requests),
            format!(
                "default_max_queue_size\t{}",
                match self.default_max_queue_size {
                    0 => "unbounded".to_owned(),
                    n => n.to_string(),
                }
            ),
            format!("max_call_depth\t{}", self.max_call_depth),
            format!("ensemble_concurrency\t{}", self.ensemble_concurrency),
            format!("drain_timeout_ms\t{}", self.drain_timeout_ms),
            format!("exit_timeout_secs\t{}", self.exit_timeout_secs),
            format!("max_connections\t{}", self.max_connections),
            format!(
                "http_header_read_timeout_secs\t{}",
                self.http_header_read_timeout_secs
            ),
            format!(
                "http_body_read_timeout_secs\t{}",
                self.http_body_read_timeout_secs
            ),
            format!("http_send_timeout_secs\t{}", self.http_send_timeout_secs),
            format!("http_max_buffered_bytes\t{}", self.http_max_buffered_bytes),
            format!(
                "max_inflight_request_bytes\t{}",
                self.max_inflight_request_bytes
            ),
            format!("epoch_tick_ms\t{}", self.epoch_tick_ms),
            format!("wasm_pool_instances\t{}", self.wasm_pool_instances),
            format!("wasm_max_memory_bytes\t{}", self.wasm_max_memory_bytes),
            format!(
                "wasm_function_cache_bytes\t{}",
                self.wasm_function_cache_bytes
            ),
            format!("wasm_fuel\t{}", self.wasm_fuel),
            format!("max_instances_per_model\t{}", self.max_instances_per_model),
            format!("worker_threads\t{}", self.workers()),
            format!(
                "wasm_address_space_reserved\t{} GiB",
                self.wasm_reservation_bytes() >> 30
            ),
        ]
    }
}
