//! Backends: what executes a batch of requests on one model instance.
//!
//! Every backend (ONNX Runtime on the CPU, Wasm handlers, ensembles) implements one trait,
//! [`ModelInstance`]. The scheduler owns the instances of a model version and hands each a batch
//! it formed from the model's queue; the instance returns one result per request, in order.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use crate::config::{BackendKind, ModelConfig};
use crate::device::Devices;
use crate::device::placement::{self, InstanceSlot, PlacementError};
use crate::infer::{BoxFuture, Call, InferResult, Inference};
use crate::metrics::ExecutionTiming;

pub mod ensemble;
pub mod llm;
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

    /// Whether the instance still works on requests of earlier batches: a decoupled handler
    /// with streams it has not finished. The scheduler then calls [`ModelInstance::resume`]
    /// between batches until it has none, instead of handing the instance a batch and waiting.
    fn has_open_work(&self) -> bool {
        false
    }

    /// Lets the instance go on with its open work. Returns when it wants to go on again
    /// (`None`: it has nothing more to do).
    fn resume(&mut self) -> BoxFuture<'_, Option<std::time::Duration>> {
        Box::pin(async { None })
    }

    /// Ready when something the instance's open work waits on has happened (a decoupled
    /// handler: a response arrived on a stream it reads), so the scheduler resumes it then
    /// rather than only when the time it asked for is up.
    fn work_ready(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }

    /// How many more requests the instance takes while it has open work (an LLM engine: its
    /// free sequence slots). Requests beyond it wait in the queue.
    fn capacity(&self) -> usize {
        usize::MAX
    }

    /// Whether the instance answers every request through its stream, a unary call included
    /// (an LLM engine). The scheduler then queues unary calls as streams and reads their one
    /// response.
    fn answers_through_streams(&self) -> bool {
        false
    }
}

/// A kind of backend: creates the instances of a model version.
pub trait Backend: Send + Sync + 'static {
    /// Creates one instance for each of `ctx.instances`, in that order.
    fn load<'a>(
        &'a self,
        ctx: &'a LoadContext,
    ) -> BoxFuture<'a, Result<Vec<Box<dyn ModelInstance>>, LoadError>>;

    /// Whether this backend executes models on a GPU when one is usable; decides where
    /// `KIND_AUTO` instances go. A backend that does not may still accept `KIND_GPU` groups (a
    /// Wasm handler's instances then count on that GPU, like Triton's Python backend's).
    fn executes_on_gpu(&self) -> bool {
        false
    }

    /// Triton's auto-complete: what the model itself says about its configuration (an ONNX
    /// file's inputs and outputs, a handler's `auto_complete_config`), filled into `ctx.config`.
    /// `None`: nothing to add. Called once per load, before any instance is made, unless the
    /// server runs with `--strict-model-config`.
    fn complete_config<'a>(
        &'a self,
        _ctx: &'a CompletionContext,
    ) -> BoxFuture<'a, Result<Option<ModelConfig>, LoadError>> {
        Box::pin(async { Ok(None) })
    }
}

/// What a backend completes a configuration from: the configuration as read and the folder of
/// the latest version that loads (whose model file speaks for the model, as in Triton).
pub struct CompletionContext {
    pub name: String,
    pub config: ModelConfig,
    pub version_dir: PathBuf,
}

/// The backends a server offers, by kind, and the GPUs they may place instances on; owned by the
/// server and handed to the repository.
#[derive(Default)]
pub struct Backends {
    kinds: HashMap<BackendKind, Arc<dyn Backend>>,
    devices: Arc<Devices>,
    /// `--max-instances-per-model`.
    max_instances: usize,
}

impl Backends {
    pub fn new(devices: Arc<Devices>, max_instances: usize) -> Backends {
        Backends {
            kinds: HashMap::new(),
            devices,
            max_instances,
        }
    }

    pub fn with(mut self, kind: BackendKind, backend: Arc<dyn Backend>) -> Backends {
        self.kinds.insert(kind, backend);
        self
    }

    pub fn devices(&self) -> &Arc<Devices> {
        &self.devices
    }

    fn backend(&self, kind: BackendKind) -> Result<&Arc<dyn Backend>, LoadError> {
        self.kinds
            .get(&kind)
            .ok_or_else(|| LoadError::unsupported(format!("this server has no {kind:?} backend")))
    }

    /// The configuration with its instance groups placed on this server's devices
    /// ([`placement::normalize`]): what the model loads with and what its config endpoint shows.
    pub fn place(&self, kind: BackendKind, config: &ModelConfig) -> Result<ModelConfig, LoadError> {
        let mut placed = config.clone();
        if kind == BackendKind::Ensemble {
            return Ok(placed); // an ensemble has no instances of its own
        }
        let uses_gpu = self.backend(kind)?.executes_on_gpu();
        placement::normalize(&mut placed, &self.devices, uses_gpu).map_err(|e| match e {
            PlacementError::Invalid(m) => LoadError::Invalid(m),
            PlacementError::NoGpu(m) | PlacementError::Unsupported(m) => LoadError::Unsupported(m),
        })?;
        let instances = placement::instance_count(&placed);
        if instances > self.max_instances as u64 {
            return Err(LoadError::Invalid(format!(
                "instance_group asks for {instances} instances, over this server's limit of {} per model (--max-instances-per-model)",
                self.max_instances
            )));
        }
        Ok(placed)
    }

    /// The configuration completed by the backend of `kind` ([`Backend::complete_config`]).
    pub async fn complete_config(
        &self,
        kind: BackendKind,
        ctx: &CompletionContext,
    ) -> Result<Option<ModelConfig>, LoadError> {
        match self.kinds.get(&kind) {
            Some(backend) => backend.complete_config(ctx).await,
            // Loading says that this server has no such backend.
            None => Ok(None),
        }
    }

    /// Creates the instances of a model version (its configuration placed by [`Backends::place`])
    /// with the backend its configuration names, each paired with its slot.
    pub async fn load_instances(
        &self,
        kind: BackendKind,
        ctx: &LoadContext,
    ) -> Result<Vec<(InstanceSlot, Box<dyn ModelInstance>)>, LoadError> {
        let instances = self.backend(kind)?.load(ctx).await?;
        if kind == BackendKind::Ensemble {
            // Its one instance schedules steps on other models; it runs nowhere in particular.
            let slot = InstanceSlot {
                group: usize::MAX,
                name: ctx.name.clone(),
                gpu: None,
            };
            return Ok(instances.into_iter().map(|i| (slot.clone(), i)).collect());
        }
        if instances.len() != ctx.instances.len() {
            return Err(LoadError::runtime(format!(
                "the backend created {} instances for {} slots",
                instances.len(),
                ctx.instances.len()
            )));
        }
        Ok(ctx.instances.iter().cloned().zip(instances).collect())
    }
}

/// Everything a backend needs to load one version of a model.
pub struct LoadContext {
    pub name: String,
    pub version: i64,
    pub config: Arc<ModelConfig>,
    pub model_dir: PathBuf,
    pub version_dir: PathBuf,
    /// The instances to create and where each runs ([`placement::slots`] of `config`).
    pub instances: Vec<InstanceSlot>,
    /// The GPUs instances may be placed on.
    pub devices: Arc<Devices>,
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
