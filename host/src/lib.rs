//! Tessera: a KServe v2 inference server for Triton model repositories, with WebAssembly handlers
//! in place of Triton's Python backend.
//!
//! The request path, top to bottom (docs/architecture.md has the layers and the decisions):
//! [`protocol`] authenticates the caller ([`tenants`]), decodes a request and makes its
//! [`infer::CallContext`] → [`server::Server::infer`] resolves the name in the caller's
//! [`namespace`], checks BLS cycles, depth, admission and the tenant's quotas, and finds the
//! model version in the [`repository`]'s table → [`model::ModelVersion::infer`] checks it against the
//! [`config`] → the [`scheduler`] queues and batches it → a [`backend`] instance executes the
//! batch → outputs are checked and shaped, and the response travels back the same way.
//! Ensemble steps and Wasm handlers' `infer` calls enter at `Server::infer` too, through the
//! [`infer::Inference`] trait, so every request of a model shares one queue and one batcher.

pub mod api;
pub mod backend;
pub mod cli;
pub mod deploy;
pub mod device;
pub mod functions;
pub mod guest_build;
pub mod limits;
pub mod metrics;
pub mod model;
pub mod protocol;
pub mod repository;
pub mod scheduler;
pub mod sequence;
pub mod server;
pub mod shm;
pub mod store;
pub mod telemetry;
pub mod tenants;
pub mod warmup;

// The bottom layer lives in `tessera-core`; these keep its modules at their familiar paths.
pub use tessera_core::{config, infer, namespace, signature, stream, tensor};
