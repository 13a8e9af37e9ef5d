//! Wasm handlers (placeholder while the sandbox lands).
use std::path::PathBuf;

use super::{LoadContext, LoadError, ModelInstance};

pub struct WasmRuntime;

impl WasmRuntime {
    pub fn new(_cache: Option<PathBuf>) -> anyhow::Result<WasmRuntime> {
        Ok(WasmRuntime)
    }
}

pub async fn load(_ctx: &LoadContext) -> Result<Vec<Box<dyn ModelInstance>>, LoadError> {
    Err(LoadError::new("wasm backend not built yet"))
}
