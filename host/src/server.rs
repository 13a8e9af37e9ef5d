//! The server core that every front-end shares: the repository, the single entry point of the
//! request path ([`Server::infer`], also the [`Inference`] that backends call back into), and
//! the small API front-ends use instead of reaching into internals.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

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
use crate::repository::{IndexRow, LoadOptions, Repository};
use crate::scheduler::rate_limit::RateLimiter;
use crate::signature::ModelMetadata;

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
}

pub struct Server {
    options: ServerOptions,
    repository: Repository,
    wasm: Arc<WasmRuntime>,
    /// BLS calls in flight, to refuse calls that would deadlock across requests.
    waits: WaitGraph,
    /// Admission control: one permit per client request in flight (`--max-inflight-requests`).
    inflight: tokio::sync::Semaphore,
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
                    backends,
                    limiter,
                    inference,
                    &options.load,
                ),
                inflight: tokio::sync::Semaphore::new(options.limits.max_inflight_requests),
                options,
                wasm,
                waits: WaitGraph::default(),
            }
        });
        server
            .repository
            .load_all(&server.options.load)
            .await
            .map_err(anyhow::Error::msg)?;
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

    /// Every model and version with its state.
    pub fn repository_index(&self) -> Vec<IndexRow> {
        self.repository.index()
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
        crate::metrics::render_prometheus(&models, &self.wasm.counters.families())
    }

    /// Liveness: the process answers.
    pub fn live(&self) -> bool {
        true
    }

    /// Readiness, as Triton defines it.
    pub fn ready(&self) -> bool {
        !self.options.strict_readiness || self.repository.all_ready()
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
