//! End-to-end tests: the real `tessera` binary, real ONNX Runtime, real Wasm components built
//! from `examples/` and `tests/guests/`, over real HTTP on loopback.

mod deployment;
mod functions;
mod gpu;
mod hardening;
mod harness;
mod hostile_requests;
mod http_protocol;
mod repository;
mod sandbox;
mod scheduling;
mod tenants;
mod tracing;
mod wasm_handlers;
