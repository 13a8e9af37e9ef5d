//! Triton's `ModelConfig` schema (`proto/model_config.proto`) becomes Rust types (prost) and an
//! embedded descriptor set, so `config.pbtxt` is parsed by a real protobuf text-format parser.
//! The messages of Triton's gRPC service (`proto/grpc_service.proto`, same `inference` package)
//! are generated here too, so their decoder lives in this crate and can be fuzzed; the host
//! generates only the service around them.

use std::env;
use std::path::PathBuf;

use prost::Message;

fn main() {
    println!("cargo:rerun-if-changed=proto/model_config.proto");
    println!("cargo:rerun-if-changed=proto/grpc_service.proto");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let fds = protox::compile(["model_config.proto", "grpc_service.proto"], ["proto"])
        .expect("model_config.proto and grpc_service.proto compile");
    std::fs::write(out.join("model_config.bin"), fds.encode_to_vec())
        .expect("write descriptor set");
    prost_build::Config::new()
        // Tensor payloads stay reference-counted slices of the request.
        .bytes(["."])
        .compile_fds(fds)
        .expect("prost generates the ModelConfig types");
}
