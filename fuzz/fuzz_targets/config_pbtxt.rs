//! The `config.pbtxt` reader (protobuf text format against Triton's ModelConfig schema), with the
//! validation and JSON rendering that every loaded config goes through.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_core::config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(parsed) = config::parse(text, "fuzz/config.pbtxt") {
        let _ = config::validate(&parsed);
        let _ = config::to_json(&parsed);
    }
});
