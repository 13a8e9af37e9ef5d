//! Backends: what executes a batch of requests on one model instance.
//!
//! Every backend (ONNX Runtime on the CPU, Wasm handlers, ensembles) implements one trait,
//! [`ModelInstance`]. The scheduler owns the instances of a model version and hands each a batch
//! it formed from the model's queue; the instance returns one result per request, in order.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use crate::config::{BackendKind, ModelConfig};
use crate::infer::{BoxFuture, Call, InferResult, Inference};
use crate::metrics::ExecutionTiming;

pub mod ensemble;
pub mod onnx;
pub mod wasm;

/// What an instance returns for a batch: one result per request, in order.
pub struct Executed {
    pub results: Vec<InferResult>,
    pub timing: ExecutionTiming,
}

/// One execution context of a model version (Triton's "model instance").
///
/// `execute` receives the requests of one batch with the context of each call, already
/// validated against the configuration and compatible with each other (same non-batch shapes).
/// The returned responses carry only outputs; the caller fills in the model name, version and id,
/// and filters requested outputs.
pub trait ModelInstance: Send + 'static {
    fn execute(&mut self, batch: Vec<Call>) -> BoxFuture<'_, Executed>;

    /// Whether `execute` does its work in the calling task (a Wasm guest runs there) rather
    /// than handing it to a thread of its own (ONNX Runtime). The scheduler runs such an
    /// instance's batches in place when it is a model's only instance, saving a task hand-off;
    /// an instance with its own thread gains more from the next batch being handed over while
    /// the callers of the last one are answered.
    fn executes_in_task(&self) -> bool {
        false
    }
}

/// A kind of backend: creates the instances of a model version.
pub trait Backend: Send + Sync + 'static {
    fn load<'a>(
        &'a self,
        ctx: &'a LoadContext,
    ) -> BoxFuture<'a, Result<Vec<Box<dyn ModelInstance>>, LoadError>>;
}

/// The backends a server offers, by kind; owned by the server and handed to the repository.
#[derive(Default)]
pub struct Backends(HashMap<BackendKind, Arc<dyn Backend>>);

impl Backends {
    pub fn with(mut self, kind: BackendKind, backend: Arc<dyn Backend>) -> Backends {
        self.0.insert(kind, backend);
        self
    }

    /// Creates the instances of a model version with the backend its configuration names.
    pub async fn load_instances(
        &self,
        kind: BackendKind,
        ctx: &LoadContext,
    ) -> Result<Vec<Box<dyn ModelInstance>>, LoadError> {
        check_instance_groups(&ctx.config)?;
        let backend = self.0.get(&kind).ok_or_else(|| {
            LoadError::unsupported(format!("this server has no {kind:?} backend"))
        })?;
        backend.load(ctx).await
    }
}

/// Everything a backend needs to load one version of a model.
pub struct LoadContext {
    pub name: String,
    pub version: i64,
    pub config: Arc<ModelConfig>,
    pub model_dir: PathBuf,
    pub version_dir: PathBuf,
    /// The request path, for backends that call other models (Wasm BLS, ensembles).
    pub inference: Weak<dyn Inference>,
}

/// Why a model version could not load; it becomes UNAVAILABLE with this message. The kind tells
/// whose problem it is: the model's (`Invalid`), this server's (`Unsupported`), the runtime's
/// (`Runtime`), the handler's own `initialize` (`Initialize`).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The configuration or the model files are wrong or do not fit each other.
    #[error("{0}")]
    Invalid(String),
    /// This server cannot run what the configuration asks for (a GPU instance group, a missing
    /// runtime, an unsupported element type).
    #[error("{0}")]
    Unsupported(String),
    /// ONNX Runtime or wasmtime failed while loading.
    #[error("{0}")]
    Runtime(String),
    /// A Wasm handler's `initialize` failed, trapped or ran out of time.
    #[error("{0}")]
    Initialize(String),
    #[error("the server is shutting down")]
    ShuttingDown,
}

impl LoadError {
    pub fn invalid(message: impl Into<String>) -> Self {
        LoadError::Invalid(message.into())
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        LoadError::Unsupported(message.into())
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        LoadError::Runtime(message.into())
    }
    pub fn initialize(message: impl Into<String>) -> Self {
        LoadError::Initialize(message.into())
    }
}

/// The number of instances the configuration asks for: the sum of the CPU instance groups
/// (at least one). GPU groups are refused by [`check_instance_groups`] before we get here.
pub fn instance_count(config: &ModelConfig) -> usize {
    let total: i32 = config.instance_group.iter().map(|g| g.count.max(1)).sum();
    usize::try_from(total).unwrap_or(1).max(1)
}

/// Refuses instance kinds this build cannot serve, with a clear reason.
pub fn check_instance_groups(config: &ModelConfig) -> Result<(), LoadError> {
    use crate::config::pb::model_instance_group::Kind;
    for group in &config.instance_group {
        match Kind::try_from(group.kind) {
            Ok(Kind::Cpu | Kind::Auto) => {}
            Ok(Kind::Gpu) => {
                return Err(LoadError::unsupported(
                    "instance_group kind KIND_GPU is not available: this tessera build has no GPU backend (use KIND_CPU)",
                ));
            }
            Ok(kind) => {
                return Err(LoadError::unsupported(format!(
                    "instance_group kind {} is not supported",
                    kind.as_str_name()
                )));
            }
            Err(_) => {
                return Err(LoadError::unsupported(format!(
                    "unknown instance_group kind {}",
                    group.kind
                )));
            }
        }
    }
    Ok(())
}
