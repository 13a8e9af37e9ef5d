//! The server core that every front-end shares: the repository and the single entry point of the
//! request path, [`Server::infer`].

use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::wasm::WasmRuntime;
use crate::infer::{ErrorKind, InferError, InferRequest, InferResult};
use crate::repository::{LoadOptions, Repository};
use crate::scheduler::rate_limit::RateLimiter;

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
}

/// Maximum depth of nested BLS calls (a handler calling a model that calls a model...).
pub const MAX_CALL_DEPTH: usize = 8;

pub struct Server {
    pub options: ServerOptions,
    pub repository: Repository,
    pub wasm: WasmRuntime,
    pub rate_limiter: Arc<RateLimiter>,
}

impl Server {
    /// Creates the server and loads every model of the repositories.
    pub async fn start(options: ServerOptions) -> anyhow::Result<Arc<Server>> {
        let wasm = WasmRuntime::new(options.wasm_cache_dir.clone())?;
        let server = Arc::new(Server {
            repository: Repository::new(options.model_repositories.clone()),
            rate_limiter: Arc::new(RateLimiter::new(
                options.rate_limit,
                &options.rate_limit_resources,
            )),
            options,
            wasm,
        });
        server
            .repository
            .load_all(Arc::downgrade(&server), &server.options.load)
            .await
            .map_err(anyhow::Error::msg)?;
        Ok(server)
    }

    /// Runs `request` on `model` (`version` None: the newest READY version). HTTP, ensemble steps
    /// and Wasm handlers' `infer` calls all come through here, into that model's queue.
    pub async fn infer(
        &self,
        model: &str,
        version: Option<i64>,
        request: InferRequest,
    ) -> InferResult {
        if request.call_chain.iter().any(|caller| caller == model) {
            return Err(InferError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "BLS cycle: {} -> {model} would wait on itself",
                    request.call_chain.join(" -> ")
                ),
            ));
        }
        if request.call_chain.len() >= MAX_CALL_DEPTH {
            return Err(InferError::new(
                ErrorKind::ResourceExhausted,
                format!("BLS call depth limit of {MAX_CALL_DEPTH} exceeded calling '{model}'"),
            ));
        }
        let target = self.repository.ready_model(model, version)?;
        target.infer(request).await
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
        crate::metrics::render_prometheus(&models, &self.wasm.counters.rows())
    }

    /// Liveness: the process answers.
    pub fn live(&self) -> bool {
        true
    }

    /// Readiness, as Triton defines it.
    pub fn ready(&self) -> bool {
        !self.options.strict_readiness || self.repository.all_ready()
    }
}
