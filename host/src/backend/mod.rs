//! Backends: what executes a batch of requests on one model instance.
//!
//! Every backend (ONNX Runtime on the CPU, Wasm handlers, ensembles) implements one trait,
//! [`ModelInstance`]. The scheduler owns the instances of a model version and hands each a batch
//! it formed from the model's queue; the instance returns one result per request, in order.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::config::{BackendKind, ModelConfig};
use crate::infer::{InferRequest, InferResult};
use crate::server::Server;

pub mod ensemble;
pub mod onnx;
pub mod wasm;

/// Time spent in the three phases Triton reports, for one batch.
#[derive(Clone, Copy, Debug, Default)]
pub struct ComputeTiming {
    pub input: Duration,
    pub infer: Duration,
    pub output: Duration,
}

/// What an instance returns for a batch: one result per request, in order.
pub struct Executed {
    pub results: Vec<InferResult>,
    pub timing: ComputeTiming,
}

/// One execution context of a model version (Triton's "model instance").
///
/// `execute` receives the requests of one batch, already validated against the configuration
/// and compatible with each other (same non-batch shapes). The returned responses carry only
/// outputs; the caller fills in the model name, version and id, and filters requested outputs.
pub trait ModelInstance: Send + 'static {
    fn execute(&mut self, batch: Vec<InferRequest>) -> BoxFuture<'_, Executed>;
}

/// Everything a backend needs to load one version of a model.
pub struct LoadContext {
    pub name: String,
    pub version: i64,
    pub config: Arc<ModelConfig>,
    pub model_dir: PathBuf,
    pub version_dir: PathBuf,
    /// The server, for backends that call other models (Wasm BLS, ensembles).
    pub server: Weak<Server>,
}

/// A load failure; the version becomes UNAVAILABLE with this message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(pub String);

impl LoadError {
    pub fn new(message: impl Into<String>) -> Self {
        LoadError(message.into())
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
                return Err(LoadError::new(
                    "instance_group kind KIND_GPU is not available: this tessera build has no GPU backend (use KIND_CPU)",
                ));
            }
            Ok(kind) => {
                return Err(LoadError::new(format!(
                    "instance_group kind {} is not supported",
                    kind.as_str_name()
                )));
            }
            Err(_) => {
                return Err(LoadError::new(format!(
                    "unknown instance_group kind {}",
                    group.kind
                )));
            }
        }
    }
    Ok(())
}

/// Creates the instances of a model version with the backend its configuration names.
pub async fn load_instances(
    kind: BackendKind,
    ctx: &LoadContext,
) -> Result<Vec<Box<dyn ModelInstance>>, LoadError> {
    check_instance_groups(&ctx.config)?;
    match kind {
        BackendKind::Onnx => onnx::load(ctx).await,
        BackendKind::Wasm => wasm::load(ctx).await,
        BackendKind::Ensemble => ensemble::load(ctx),
    }
}
