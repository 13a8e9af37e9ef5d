//! Tessera's bottom layer, below the scheduler, the backends and the server: what a request *is*,
//! independent of who runs it.
//!
//! - [`tensor`]: tensors as they travel through the server (datatypes come from `tessera-abi`,
//!   shared with guests).
//! - [`infer`]: the request path's vocabulary: `InferRequest`, `InferResponse`, `InferError`.
//! - [`config`]: Triton's `ModelConfig`, read from `config.pbtxt`.
//! - [`signature`]: a model's inputs and outputs, and the metadata front-ends report.
//! - [`kserve`]: the KServe v2 request/response bodies (JSON and the binary extension).
//! - [`grpc`]: Triton's gRPC messages and their codec.
//! - [`namespace`]: how a tenant's names become the keys the server keeps models under.
//! - [`stream`]: the bounded channel a decoupled model answers through, 0..N responses.
//!
//! Everything here is pure (no I/O beyond reading a config file; the one async piece is the
//! stream's channel), so the decoders can be fuzzed and property-tested without building the
//! server.

pub mod config;
pub mod grpc;
pub mod infer;
pub mod kserve;
pub mod namespace;
pub mod signature;
pub mod stream;
pub mod tensor;
