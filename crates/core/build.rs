//! Triton's `ModelConfig` schema (`proto/model_config.proto`) becomes Rust types (prost) and an
//! embedded descriptor set, so `config.pbtxt` is parsed by a real protobuf text-format parser.

use std::env;
use std::path::PathBuf;

use prost::Message;

fn main() {
    println!("cargo:rerun-if-changed=proto/model_config.proto");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let fds =
        protox::compile(["model_config.proto"], ["proto"]).expect("model_config.proto compiles");
    std::fs::write(out.join("model_config.bin"), fds.encode_to_vec())
        .expect("write descriptor set");
    prost_build::Config::new()
        .compile_fds(fds)
        .expect("prost generates the ModelConfig types");
}
