//! The compiled-code cache: a component compiled once is stored as
//! `<cache dir>/<sha256 of the component>-<engine compatibility hash>.cwasm` and deserialized on
//! the next load, so a restart does not recompile. The engine hash changes with wasmtime's
//! version and settings, so a stale entry is never used.

use std::hash::{Hash, Hasher};
use std::path::Path;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::limits::Counters;
use crate::backend::LoadError;

fn cache_key(engine: &Engine, bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}-{:016x}", hasher.finish())
}

/// Returns the compiled component, from the cache when possible.
pub fn load_or_compile(
    engine: &Engine,
    dir: Option<&Path>,
    bytes: &[u8],
    model: &str,
    counters: &Counters,
) -> Result<Component, LoadError> {
    let compile = || {
        // Compilation takes seconds for large handlers; keep other tasks of this worker moving.
        tokio::task::block_in_place(|| Component::new(engine, bytes))
            .map_err(|e| LoadError::new(format!("not a valid Wasm component: {e:#}")))
    };
    let Some(dir) = dir else { return compile() };
    let path = dir.join(format!("{}.cwasm", cache_key(engine, bytes)));
    if path.exists() {
        // SAFETY: the file was written by `Component::serialize` of an engine with the same
        // compatibility hash (part of its name), into the server's own cache directory.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => {
                Counters::bump(&counters.compile_cache_hits);
                tracing::info!(model, path = %path.display(), "compiled-code cache hit");
                return Ok(component);
            }
            Err(e) => {
                tracing::warn!(model, path = %path.display(), "ignoring unusable cache entry: {e:#}")
            }
        }
    }
    Counters::bump(&counters.compile_cache_misses);
    let component = compile()?;
    tracing::info!(model, path = %path.display(), "compiled-code cache miss: compiled and stored");
    let stored = std::fs::create_dir_all(dir).and_then(|()| {
        let bytes = component.serialize().map_err(std::io::Error::other)?;
        // Write then rename, so a crash never leaves a truncated entry behind.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)
    });
    if let Err(e) = stored {
        tracing::warn!(model, dir = %dir.display(), "cannot store compiled component: {e}");
    }
    Ok(component)
}
