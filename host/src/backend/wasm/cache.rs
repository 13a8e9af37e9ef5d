//! The compiled-code cache: a component compiled once is stored as
//! `<cache dir>/<sha256 of the component>-<engine compatibility hash>.cwasm` and deserialized on
//! the next load, so a restart does not recompile. The engine hash changes with wasmtime's
//! version and settings, so a stale entry is never used.
//!
//! Deserializing an entry runs native code that the file holds, so an entry is used only when it
//! is ours: the directory is created with mode 0700, and before any entry is read the directory
//! and the entry must belong to the server's user and be writable by nobody else. Otherwise the
//! component is compiled afresh and the cache is not used (with a warning).

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
    format!("{}-{:016x}", hex::encode(digest), hasher.finish())
}

/// Returns the compiled component, from the cache when possible.
pub fn load_or_compile(
    engine: &Engine,
    dir: Option<&Path>,
    bytes: &[u8],
    model: &str,
    counters: &Counters,
) -> Result<Component, LoadError> {
    // Runs on a blocking thread (the Wasm backend loads there): compilation takes seconds.
    let compile = || {
        Component::new(engine, bytes).map_err(|e| {
            LoadError::invalid(super::with_likely_fix(format!(
                "not a valid Wasm component: {e:#}"
            )))
        })
    };
    let Some(dir) = dir else { return compile() };
    if let Err(e) = create_private_dir(dir) {
        tracing::warn!(model, dir = %dir.display(), "cannot create the compiled-code cache: {e}");
    }
    if let Err(why) = owned_and_private(dir) {
        tracing::warn!(model, dir = %dir.display(), "not using the compiled-code cache: {why}");
        return compile();
    }
    let path = dir.join(format!("{}.cwasm", cache_key(engine, bytes)));
    if path.exists() {
        if let Err(why) = owned_and_private(&path) {
            tracing::warn!(model, path = %path.display(), "not using the compiled-code cache: {why}");
            return compile();
        }
        // SAFETY: the file was written by `Component::serialize` of an engine with the same
        // compatibility hash (part of its name), and it and its directory belong to this user
        // and are writable by nobody else (checked just above).
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
    let stored = (|| {
        let bytes = component.serialize().map_err(std::io::Error::other)?;
        // Write then rename, so a crash never leaves a truncated entry behind. The temporary
        // name is unique per process and per call: two loads of the same component at once
        // must not write into one file.
        static NEXT_TMP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let serial = NEXT_TMP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp{}-{serial}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = stored {
        tracing::warn!(model, dir = %dir.display(), "cannot store compiled component: {e}");
    }
    Ok(component)
}

/// Creates the cache directory (and its parents) readable and writable by this user only.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Whether `path` belongs to the server's user and nobody else can write it.
fn owned_and_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!(
            "it belongs to uid {}, not to this server's uid {me}",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "it is writable by other users (mode {:o})",
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_private_entries_are_trusted() {
        let scratch = tempfile::tempdir().expect("a scratch folder");
        let dir = scratch.path().join("cache");
        create_private_dir(&dir).expect("created");
        let mode = std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(owned_and_private(&dir).is_ok());
        let entry = dir.join("x.cwasm");
        std::fs::write(&entry, b"not code").expect("written");
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(owned_and_private(&entry).is_ok());
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert!(
            owned_and_private(&entry)
                .unwrap_err()
                .contains("writable by other users")
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(owned_and_private(&dir).is_err());
        // Owned by someone else: root's directory, seen by a non-root user (skip when root).
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                owned_and_private(Path::new("/"))
                    .unwrap_err()
                    .contains("belongs to uid")
            );
        }
    }
}
