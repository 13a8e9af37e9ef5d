//! The `tessera` command: serve a model repository over KServe v2, or check one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{ArgAction, Args, Parser, Subcommand};
use tessera::limits::ServerLimits;
use tessera::repository::{LoadOptions, ModelState};
use tessera::server::{ControlMode, Server, ServerOptions};
use tessera::telemetry::{TraceConfig, Tracing};
use tessera::tenants::{AdminKey, Principal};
use tracing_subscriber::EnvFilter;

/// A KServe v2 inference server for Triton model repositories, with WebAssembly handlers.
///
/// Flags use tritonserver's spellings, so existing launch scripts keep working.
#[derive(Parser, Debug)]
#[command(name = "tessera", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Load every model (configuration, model files, Wasm `initialize`, warmup) without serving;
    /// print each model version's state and exit non-zero when any fails.
    Check(CheckArgs),
    /// Deploy a model directory (config.pbtxt and version folders), or a function's folder
    /// (function.wasm and function.toml), to a running server without a restart: uploads it,
    /// waits until it serves, and prints where to call it.
    Deploy(DeployArgs),
    /// Build a Triton Python model (backend "python", <version>/model.py) or a JavaScript handler
    /// (backend "wasm", <version>/model.js) into the Wasm component tessera serves,
    /// <version>/model.wasm (componentize-py, componentize-qjs).
    Build(BuildArgs),
    /// List the models of a running server with their state.
    Models(ClientArgs),
    /// Serve the previous deployed revision of a model again.
    Rollback(ModelArgs),
    /// Unload a model from a running server.
    Unload(UnloadArgs),
    /// Manage the tenants of a running server (needs the admin key in TESSERA_API_KEY).
    #[command(subcommand)]
    Tenants(TenantCommand),
}

#[derive(Subcommand, Debug)]
enum TenantCommand {
    /// List the tenants with their key ids, quotas and grants.
    List(ClientArgs),
    /// Create a tenant.
    Create(TenantArgs),
    /// Delete a tenant with its keys, models and functions.
    Delete(TenantArgs),
    /// Issue an API key for a tenant; the key is printed once.
    Key(TenantArgs),
    /// Revoke one of a tenant's API keys by id.
    Revoke {
        tenant: String,
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Set quotas: `tessera tenants quotas acme requests_per_second=50 max_models=4`.
    Quotas {
        tenant: String,
        /// `NAME=VALUE` pairs (docs/tenants.md lists the quotas).
        #[arg(required = true)]
        settings: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Let a tenant call one of the operator's models.
    Grant {
        tenant: String,
        model: String,
        /// Take the grant back instead.
        #[arg(long)]
        revoke: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `--rate-limit`, in tritonserver's spelling.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
#[value(rename_all = "snake_case")]
enum RateLimit {
    Off,
    ExecutionCount,
}

/// `--model-control-mode`, in tritonserver's spelling.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ControlModeArg {
    None,
    Explicit,
    Poll,
}

/// Who may read `/metrics` with tenancy on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum MetricsAuth {
    Admin,
    None,
}

#[derive(Args, Debug, Clone)]
struct TenantArgs {
    tenant: String,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Args, Debug, Clone)]
struct ClientArgs {
    /// The server's HTTP address.
    #[arg(long, env = "TESSERA_SERVER", default_value = "http://localhost:8000")]
    server: String,
}

#[derive(Args, Debug, Clone)]
struct DeployArgs {
    /// The model directory: `config.pbtxt`, version folders (`1/model.wasm`), label files.
    dir: PathBuf,
    /// The model name [default: the config's `name`, else the directory's name].
    #[arg(long)]
    name: Option<String>,
    /// Deploy the folder as it is: do not build a model.py, model.js or model.ts whose
    /// model.wasm is missing or older than its sources (`tessera build` does that first).
    #[arg(long)]
    no_build: bool,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Args, Debug)]
struct BuildArgs {
    /// The model directory: config.pbtxt and version folders holding model.py.
    dir: PathBuf,
    /// componentize-py to build a model.py with [default: $COMPONENTIZE_PY, else on PATH].
    #[arg(long)]
    componentize_py: Option<PathBuf>,
    /// componentize-qjs to build a model.js with [default: $COMPONENTIZE_QJS, else on PATH].
    #[arg(long)]
    componentize_qjs: Option<PathBuf>,
    /// Seconds a build tool may run before it is stopped (componentize-py runs the model's
    /// module at build time: code at module level that never ends would hold the build).
    #[arg(long, default_value_t = tessera::guest_build::DEFAULT_TIME_LIMIT.as_secs())]
    timeout_secs: u64,
}

#[derive(Args, Debug, Clone)]
struct ModelArgs {
    model: String,
    /// It is a function, not a model.
    #[arg(long)]
    function: bool,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Args, Debug, Clone)]
struct UnloadArgs {
    model: String,
    /// Unload the models that depend on it (ensembles) too.
    #[arg(long)]
    unload_dependents: bool,
    /// It is a function, not a model.
    #[arg(long)]
    function: bool,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Args, Debug, Clone)]
struct RepositoryArgs {
    /// Model repository path; give it several times to serve several repositories. A server
    /// may start without one and serve only what is deployed to its store.
    #[arg(long = "model-repository")]
    model_repository: Vec<PathBuf>,
    /// Require complete `config.pbtxt` files; `false` derives inputs, outputs and
    /// max_batch_size of ONNX models from the model file (Triton's auto-complete).
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    strict_model_config: bool,
    /// The ONNX Runtime shared library (`libonnxruntime.so.*` from the `onnxruntime` wheel).
    #[arg(long, env = "ORT_DYLIB_PATH")]
    onnxruntime_library: Option<PathBuf>,
    /// Where compiled Wasm handlers are cached between runs [default: ~/.cache/tessera/wasm].
    #[arg(long, env = "TESSERA_WASM_CACHE_DIR")]
    wasm_cache_dir: Option<PathBuf>,
    /// Rate limiting of executions: `off`, or `execution_count` to run an instance only when the
    /// resources of its instance group's `rate_limiter` are free.
    #[arg(long, value_enum, default_value_t = RateLimit::Off)]
    rate_limit: RateLimit,
    /// A rate-limiter resource total, `NAME:COUNT[:DEVICE]`; repeatable.
    #[arg(long, value_parser = tessera::scheduler::rate_limit::parse_resource)]
    rate_limit_resource: Vec<tessera::scheduler::rate_limit::ResourceLimit>,
    /// The CUDA devices the server may use: `all`, `none`, or ids like `0,1` (counted after
    /// `CUDA_VISIBLE_DEVICES`, which the driver applies first).
    #[arg(long, default_value = "all", env = "TESSERA_GPUS")]
    gpus: tessera::device::GpuSelection,
    /// GPUs below this compute capability are not used (Triton's flag and default).
    #[arg(long, default_value_t = 7.5)]
    min_supported_compute_capability: f64,
    /// GPU metrics (`nv_gpu_*`, through NVML) on `/metrics`.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    allow_gpu_metrics: bool,
    /// Log detail: 0 = info, 1 = debug, 2 and more = trace. `RUST_LOG` overrides.
    #[arg(long, default_value_t = 0)]
    log_verbose: u8,
}

impl RepositoryArgs {
    /// Every flag at its default (and its environment variable): a server started with none of
    /// the repository flags.
    fn parse_from_defaults() -> Result<RepositoryArgs, clap::Error> {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            repository: RepositoryArgs,
        }
        Only::try_parse_from(["tessera"]).map(|o| o.repository)
    }
}

/// `tessera check`: the repository flags and the limits it would serve with.
#[derive(Args, Debug, Clone)]
struct CheckArgs {
    #[command(flatten)]
    repository: RepositoryArgs,
    #[command(flatten)]
    limits: ServerLimits,
}

#[derive(Args, Debug)]
struct ServeArgs {
    #[command(flatten)]
    repository: Option<RepositoryArgs>,
    // Not inside RepositoryArgs: clap cannot tell an Option'al flattened group is present when it
    // holds another flattened group.
    #[command(flatten)]
    limits: ServerLimits,
    /// Address the HTTP and metrics endpoints listen on.
    #[arg(long, default_value = "0.0.0.0")]
    http_address: String,
    /// KServe v2 HTTP/REST port; `PORT` is what Knative and similar platforms set.
    #[arg(long, env = "PORT", default_value_t = 8000)]
    http_port: u16,
    /// Model control, as in tritonserver: `none` (load everything at start, refuse load and
    /// unload), `explicit` (load and unload on request; at start only the `--load-model`
    /// models), `poll` (re-read the repositories every --repository-poll-secs). Without this
    /// flag, tessera runs explicit mode with every model loaded at start, so deployments work
    /// out of the box.
    #[arg(long, value_enum)]
    model_control_mode: Option<ControlModeArg>,
    /// In explicit mode, a model to load at start; repeatable; `*` loads every model.
    #[arg(long)]
    load_model: Vec<String>,
    /// In poll mode, seconds between two reads of the repositories.
    #[arg(long, default_value_t = 15)]
    repository_poll_secs: u64,
    /// A folder of functions, `<dir>/<name>/function.wasm` (+ optional `function.toml`), served at
    /// `/v1/functions/<name>/`; repeatable.
    #[arg(long)]
    functions: Vec<PathBuf>,
    /// Where deployed models are kept [default: ~/.local/share/tessera/store]: a directory of
    /// this server's own (created if missing), or a store that replicas share:
    /// `s3://bucket/prefix` (S3 or an S3-compatible server; credentials, region and endpoint from
    /// the AWS_* environment), `az://container/prefix` (Azure Blob Storage, AZURE_STORAGE_*) or
    /// `file:///shared/dir` (a shared mount).
    #[arg(long, env = "TESSERA_STORE", value_parser = parse_store)]
    store: Option<StoreLocation>,
    /// With a shared --store: this replica's cache of it, which it serves from (also while the
    /// shared store is unreachable) [default: ~/.cache/tessera/store/<hash of the URL>].
    #[arg(long, env = "TESSERA_STORE_CACHE")]
    store_cache: Option<PathBuf>,
    /// With a shared --store: milliseconds between two looks for changes other replicas made.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(50..=600_000))]
    store_poll_ms: u64,
    /// A file holding the admin key; it turns tenancy on (as the TESSERA_ADMIN_KEY environment
    /// variable does). Never pass the key itself on the command line.
    #[arg(long, env = "TESSERA_ADMIN_KEY_FILE")]
    admin_key_file: Option<PathBuf>,
    /// Who may read `/metrics` with tenancy on: `admin` (the admin key) or `none` (anyone who
    /// reaches --metrics-port).
    #[arg(long, value_enum, default_value_t = MetricsAuth::Admin)]
    metrics_auth: MetricsAuth,
    /// The largest total size, in bytes, of the files of one deployment (413 beyond).
    #[arg(long, env = "TESSERA_MAX_DEPLOYMENT_BYTES", default_value_t = 256 * 1024 * 1024)]
    max_deployment_bytes: usize,
    /// The `name` in the server metadata (`GET /v2`). Clients that check for Triton's (its own
    /// health-and-metadata examples do) pass with `--server-name triton`.
    #[arg(long, env = "TESSERA_SERVER_NAME", default_value = "tessera")]
    server_name: String,
    /// KServe v2 gRPC port (Triton's `inference.GRPCInferenceService`).
    #[arg(long, default_value_t = 8001)]
    grpc_port: u16,
    /// Address the gRPC listener binds to.
    #[arg(long, default_value = "0.0.0.0")]
    grpc_address: String,
    /// Serve gRPC on --grpc-port.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    allow_grpc: bool,
    /// Accepted for tritonserver compatibility and ignored: tessera keeps no pool of response
    /// messages (each answer is built once and handed to tonic).
    #[arg(long, default_value_t = 8)]
    grpc_infer_allocation_pool_size: u32,
    /// Prometheus metrics port (`/metrics`).
    #[arg(long, default_value_t = 8002)]
    metrics_port: u16,
    /// Serve Prometheus metrics on --metrics-port.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    allow_metrics: bool,
    /// Metrics settings, `KEY=VALUE`; repeatable. Supported: `summary_latencies=true|false`
    /// (Triton's latency summaries, quantiles 0.5/0.9/0.95/0.99 over the last minute; default false).
    #[arg(long, value_parser = parse_metrics_config)]
    metrics_config: Vec<(String, bool)>,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    http_max_input_size: usize,
    /// Report ready only when every model version is READY (Triton's `--strict-readiness`).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    strict_readiness: bool,
    /// Exit at start-up when any model fails to load. Tessera defaults to false, unlike Triton:
    /// one broken model should not take the others down.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    exit_on_error: bool,
    /// Send internal error details to HTTP clients: a guest's stderr and panic location, ONNX
    /// Runtime's messages. For development; by default they are only logged, with the request id.
    #[arg(long, env = "TESSERA_VERBOSE_ERRORS", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    verbose_errors: bool,
    /// Request tracing, as in tritonserver; repeatable: `mode=opentelemetry`, `rate=N`,
    /// `level=OFF|TIMESTAMPS`, `opentelemetry,url=URL`, `opentelemetry,resource=NAME=VALUE`,
    /// `opentelemetry,bsp_schedule_delay=MS` (docs/configuration.md#tracing).
    #[arg(long)]
    trace_config: Vec<String>,
}

/// The log on stderr, and with `trace` the OpenTelemetry export of request spans. Each has its
/// own filter: the request spans (`telemetry::TARGET`, DEBUG) are enabled only for the exporter,
/// so without `--trace-config` nothing is interested in them and they cost nothing.
fn init_logging(verbose: u8, trace: Option<&TraceConfig>) -> anyhow::Result<Option<Tracing>> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{default},cranelift_codegen=warn,wasmtime_cranelift=warn,ort=warn,{}=off",
            tessera::telemetry::TARGET
        ))
    });
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let Some(config) = trace.filter(|t| t.enabled) else {
        // Without tracing, the plain subscriber: one global filter, nothing per layer.
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_target(false)
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .init();
        return Ok(None);
    };
    let log = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_filter(filter);
    let (tracing, tracer) =
        Tracing::start(config, tokio::runtime::Handle::current()).map_err(anyhow::Error::msg)?;
    let spans = tracing_subscriber::filter::Targets::new()
        .with_target(tessera::telemetry::TARGET, tracing::Level::DEBUG);
    let export = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(spans);
    tracing_subscriber::registry().with(log).with(export).init();
    tracing::info!(
        url = %config.url,
        rate = config.rate,
        "tracing requests with OpenTelemetry"
    );
    Ok(Some(tracing))
}

fn server_options(
    args: &RepositoryArgs,
    limits: &ServerLimits,
    strict_readiness: bool,
    latency_summaries: bool,
) -> ServerOptions {
    ServerOptions {
        model_repositories: args.model_repository.clone(),
        load: LoadOptions {
            strict_model_config: args.strict_model_config,
            latency_summaries,
            default_max_queue_size: limits.default_max_queue_size,
        },
        strict_readiness,
        wasm_cache_dir: args.wasm_cache_dir.clone().or_else(default_cache_dir),
        rate_limit: args.rate_limit == RateLimit::ExecutionCount,
        rate_limit_resources: args.rate_limit_resource.clone(),
        gpu_metrics: args.allow_gpu_metrics,
        devices: tessera::device::DeviceOptions {
            selection: args.gpus.clone(),
            min_compute_capability: args.min_supported_compute_capability,
        },
        limits: limits.clone(),
        ..Default::default()
    }
}

/// The admin key, from `--admin-key-file` or `TESSERA_ADMIN_KEY` (the file wins); None: no
/// tenancy.
fn admin_key(file: Option<&std::path::Path>) -> anyhow::Result<Option<AdminKey>> {
    let key = match file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the admin key file {}", path.display()))?
                .trim()
                .to_owned(),
        ),
        None => std::env::var("TESSERA_ADMIN_KEY")
            .ok()
            .map(|k| k.trim().to_owned()),
    };
    Ok(key.filter(|k| !k.is_empty()).map(AdminKey))
}

async fn tenants(command: TenantCommand) -> anyhow::Result<()> {
    use tessera::cli::tenants as t;
    match command {
        TenantCommand::List(c) => t::list(&c.server).await,
        TenantCommand::Create(a) => t::create(&a.client.server, &a.tenant).await,
        TenantCommand::Delete(a) => t::delete(&a.client.server, &a.tenant).await,
        TenantCommand::Key(a) => t::issue_key(&a.client.server, &a.tenant).await,
        TenantCommand::Revoke { tenant, id, client } => {
            t::revoke_key(&client.server, &tenant, &id).await
        }
        TenantCommand::Quotas {
            tenant,
            settings,
            client,
        } => t::set_quotas(&client.server, &tenant, &settings).await,
        TenantCommand::Grant {
            tenant,
            model,
            revoke,
            client,
        } => t::grant(&client.server, &tenant, &model, !revoke).await,
    }
}

/// `--store`: a directory of this server's own, or the URL of a store replicas share.
#[derive(Clone, Debug)]
enum StoreLocation {
    Dir(PathBuf),
    Shared(String),
}

/// Parses `--store`. A URL of a scheme the store does not speak is refused (it was once taken
/// for a relative path: `s3://b/x` made a local folder named `s3:`).
fn parse_store(spec: &str) -> Result<StoreLocation, String> {
    match spec.split_once("://") {
        Some(("s3" | "s3a" | "az" | "azure" | "file", _)) => {
            Ok(StoreLocation::Shared(spec.to_owned()))
        }
        Some((scheme, _)) => Err(format!(
            "'{spec}': {scheme}:// is not supported; the store is a directory, s3://bucket/prefix (S3 or an S3-compatible server), az://container/prefix (Azure Blob Storage) or file:///shared/dir"
        )),
        None => Ok(StoreLocation::Dir(PathBuf::from(spec))),
    }
}

/// Where a replica caches a shared store: one folder per store URL.
fn default_store_cache(url: &str) -> Option<PathBuf> {
    use sha2::Digest;
    let hash = hex::encode(sha2::Sha256::digest(url.as_bytes()));
    default_cache_dir().map(|wasm| wasm.with_file_name("store").join(&hash[..16]))
}

fn default_store_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
    Some(base.join("tessera").join("store"))
}

/// Parses `--metrics-config KEY=VALUE`.
fn parse_metrics_config(spec: &str) -> Result<(String, bool), String> {
    let (key, value) = spec
        .split_once('=')
        .ok_or_else(|| format!("'{spec}': expected KEY=VALUE"))?;
    if key != "summary_latencies" {
        return Err(format!(
            "'{key}': unsupported metrics setting (supported: summary_latencies)"
        ));
    }
    let on = value
        .parse::<bool>()
        .map_err(|_| format!("'{spec}': the value must be true or false"))?;
    Ok((key.to_owned(), on))
}

fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("tessera").join("wasm"))
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let workers = match &cli.command {
        None => cli.serve.limits.workers(),
        Some(Command::Check(args)) => args.limits.workers(),
        Some(_) => ServerLimits::default().workers(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli));
    // The connections the drain closed are gone; a blocking task still running (a model load
    // on a blocking thread) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    // One clear line per error, with its causes, and a non-zero exit code.
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Raises the soft limit on open files to the hard one, so that `--max-connections`, not the
/// common default of 1 024 descriptors, bounds the connections.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct passed, nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::debug!(
                    "cannot raise the open-file limit: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Check(args)) => check(args).await,
        Some(Command::Deploy(args)) => {
            if !args.no_build
                && let Some(why) = tessera::guest_build::stale(&args.dir)?
            {
                println!("building first: {why}");
                for path in tessera::guest_build::build(&args.dir, &Default::default())? {
                    println!("built {}", path.display());
                }
            }
            tessera::cli::deploy(&args.client.server, &args.dir, args.name.as_deref()).await
        }
        Some(Command::Build(args)) => {
            let tools = tessera::guest_build::Tools {
                componentize_py: args.componentize_py,
                componentize_qjs: args.componentize_qjs,
                time_limit: Some(std::time::Duration::from_secs(args.timeout_secs)),
            };
            let built = tessera::guest_build::build(&args.dir, &tools)?;
            for path in built {
                println!("built {}", path.display());
            }
            Ok(())
        }
        Some(Command::Models(args)) => tessera::cli::models(&args.server).await,
        Some(Command::Rollback(args)) => {
            tessera::cli::rollback(&args.client.server, &args.model, args.function).await
        }
        Some(Command::Tenants(command)) => tenants(command).await,
        Some(Command::Unload(args)) => {
            tessera::cli::unload(
                &args.client.server,
                &args.model,
                args.unload_dependents,
                args.function,
            )
            .await
        }
        None => {
            let args = cli.serve.repository.clone().unwrap_or_else(|| {
                RepositoryArgs::parse_from_defaults().unwrap_or_else(|e| e.exit())
            });
            serve(args, cli.serve).await
        }
    }
}

async fn start_core(
    args: &RepositoryArgs,
    options: ServerOptions,
    trace: Option<&TraceConfig>,
) -> anyhow::Result<(Arc<Server>, Option<Tracing>)> {
    let tracing = init_logging(args.log_verbose, trace)?;
    if let Err(e) = tessera::backend::onnx::init_runtime(args.onnxruntime_library.as_deref()) {
        tracing::warn!("{e}");
    }
    Ok((Server::start(options).await?, tracing))
}

async fn check(args: CheckArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.repository.model_repository.is_empty(),
        "tessera check needs --model-repository"
    );
    let options = server_options(&args.repository, &args.limits, true, false);
    let (server, _) = start_core(&args.repository, options, None).await?;
    for line in server.limits().describe() {
        println!("limit\t{line}");
    }
    let rows = server.repository_index(&Principal::Operator, false);
    let mut failed = 0;
    for row in &rows {
        let version = if row.version.is_empty() {
            "-"
        } else {
            &row.version
        };
        match row.state {
            Some(ModelState::Ready) => println!("{}\t{version}\tREADY-to-load", row.name),
            state => {
                failed += 1;
                println!(
                    "{}\t{version}\t{}: {}",
                    row.name,
                    state.map_or("UNKNOWN", ModelState::as_str),
                    row.reason
                );
            }
        }
    }
    server.shutdown().await;
    if failed > 0 {
        anyhow::bail!("{failed} of {} model versions cannot load", rows.len());
    }
    Ok(())
}

async fn serve(args: RepositoryArgs, serve: ServeArgs) -> anyhow::Result<()> {
    let summaries = serve
        .metrics_config
        .iter()
        .rev()
        .find(|(key, _)| key == "summary_latencies")
        .is_some_and(|(_, on)| *on);
    let mut options = server_options(&args, &serve.limits, serve.strict_readiness, summaries);
    options.control_mode = match serve.model_control_mode {
        Some(ControlModeArg::None) => ControlMode::None,
        Some(ControlModeArg::Poll) => ControlMode::Poll,
        Some(ControlModeArg::Explicit) | None => ControlMode::Explicit,
    };
    // Without --model-control-mode: explicit, with every model loaded at start.
    options.startup_models = serve
        .model_control_mode
        .is_some()
        .then(|| serve.load_model.clone());
    options.poll_interval = std::time::Duration::from_secs(serve.repository_poll_secs.max(1));
    match serve.store.clone() {
        Some(StoreLocation::Shared(url)) => {
            options.store_dir = serve
                .store_cache
                .clone()
                .or_else(|| default_store_cache(&url));
            anyhow::ensure!(
                options.store_dir.is_some(),
                "a shared --store needs a cache folder: give --store-cache"
            );
            options.shared_store = Some(url);
        }
        Some(StoreLocation::Dir(dir)) => options.store_dir = Some(dir),
        None => options.store_dir = default_store_dir(),
    }
    options.store_poll_interval = std::time::Duration::from_millis(serve.store_poll_ms);
    options.max_deployment_bytes = serve.max_deployment_bytes;
    options.function_dirs = serve.functions.clone();
    options.admin_key = admin_key(serve.admin_key_file.as_deref())?;
    options.server_name = serve.server_name.clone();
    let trace = TraceConfig::parse(&serve.trace_config)?;
    let (server, tracing) = start_core(&args, options, Some(&trace)).await?;
    let broken: Vec<_> = server
        .repository_index(&Principal::Operator, false)
        .into_iter()
        .filter(|r| r.state.is_some_and(|s| s != ModelState::Ready))
        .collect();
    for row in &broken {
        let state = row.state.map_or("UNKNOWN", ModelState::as_str);
        tracing::warn!(model = %row.name, version = %row.version, "{state}: {}", row.reason);
    }
    if serve.exit_on_error && !broken.is_empty() {
        anyhow::bail!(
            "{} model versions failed to load and --exit-on-error is set",
            broken.len()
        );
    }
    raise_open_file_limit();
    let connections = serve.limits.connections();
    // One signal stops every listener; readiness drops first.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let addr: SocketAddr = format!("{}:{}", serve.http_address, serve.http_port)
        .parse()
        .with_context(|| format!("invalid --http-address '{}'", serve.http_address))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(
        workers = tokio::runtime::Handle::current().metrics().num_workers(),
        "KServe v2 HTTP on {}",
        listener.local_addr()?
    );
    let mut front_ends = tokio::task::JoinSet::new();
    // HTTP/1 bodies and gRPC messages being read share one budget.
    let reading = server.buffering();
    if serve.allow_metrics {
        let metrics_addr: SocketAddr =
            format!("{}:{}", serve.http_address, serve.metrics_port).parse()?;
        let metrics_listener = tokio::net::TcpListener::bind(metrics_addr)
            .await
            .with_context(|| format!("cannot listen on {metrics_addr} for metrics"))?;
        tracing::info!(
            "Prometheus metrics on {}/metrics",
            metrics_listener.local_addr()?
        );
        let admin_only = server.tenants().enabled() && serve.metrics_auth == MetricsAuth::Admin;
        let metrics_app =
            tessera::protocol::http::metrics_router(server.clone(), summaries, admin_only);
        front_ends.spawn(tessera::protocol::listen::serve_http(
            metrics_listener,
            metrics_app,
            connections.clone(),
            stopped.clone(),
        ));
    }
    if serve.allow_grpc {
        let grpc_addr: SocketAddr = format!("{}:{}", serve.grpc_address, serve.grpc_port)
            .parse()
            .with_context(|| format!("invalid --grpc-address '{}'", serve.grpc_address))?;
        let grpc_listener = tokio::net::TcpListener::bind(grpc_addr)
            .await
            .with_context(|| format!("cannot listen on {grpc_addr} for gRPC"))?;
        tracing::info!("KServe v2 gRPC on {}", grpc_listener.local_addr()?);
        let (inference, health) = tessera::protocol::grpc::services(
            server.clone(),
            serve.http_max_input_size,
            serve.verbose_errors,
        );
        let incoming =
            tessera::protocol::listen::grpc_incoming(grpc_listener, &connections, stopped.clone());
        let (mut grpc_stopped, mut drain_started) = (stopped.clone(), stopped.clone());
        let exit_timeout = connections.exit_timeout;
        let bounds = tessera::protocol::grpc::GrpcBoundsLayer {
            server: server.clone(),
            reading: reading.clone(),
            max_message: serve.http_max_input_size,
            message_timeout: connections.body_read_timeout,
            send_timeout: connections.send_timeout,
        };
        front_ends.spawn(async move {
            let served = tonic::transport::Server::builder()
                // Tensors are large: grow HTTP/2 flow-control windows with the measured
                // bandwidth instead of stalling on 64 KiB ones.
                .http2_adaptive_window(Some(true))
                // Room to read a large header block and refuse the call (GrpcBounds), rather
                // than h2 dropping the whole connection past its 16 KiB default.
                .http2_max_header_list_size(tessera::protocol::grpc::MAX_HEADER_LIST_BYTES)
                .max_concurrent_streams(tessera::protocol::grpc::MAX_CONCURRENT_STREAMS)
                .layer(bounds)
                .add_service(inference)
                .add_service(health)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = grpc_stopped.wait_for(|s| *s).await;
                });
            // tonic waits for every connection to close; the drain is bounded here.
            let drained = async {
                let _ = drain_started.wait_for(|s| *s).await;
                tokio::time::sleep(exit_timeout).await;
            };
            tokio::select! {
                served = served => {
                    if let Err(e) = served {
                        tracing::error!("gRPC server failed: {e}");
                    }
                }
                () = drained => {
                    tracing::warn!("closing gRPC connections still open after --exit-timeout-secs");
                }
            }
        });
    }
    let app = tessera::protocol::http::router(
        server.clone(),
        serve.http_max_input_size,
        reading,
        serve.verbose_errors,
    );
    front_ends.spawn(tessera::protocol::listen::serve_http(
        listener,
        app,
        connections,
        stopped,
    ));
    shutdown_signal().await;
    server.begin_shutdown();
    let _ = stop.send(true);
    // Each front-end drains within --exit-timeout-secs.
    while front_ends.join_next().await.is_some() {}
    tracing::info!("shutting down");
    // Let queued work finish and handlers' `finalize` run before the process exits.
    server.shutdown().await;
    if let Some(tracing) = tracing {
        tokio::task::spawn_blocking(move || tracing.shutdown()).await?;
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.unwrap_or(());
}
