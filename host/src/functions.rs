//! Functions by name: `wasi:http` components served at `/v1/functions/<name>/...`, loaded from
//! `--functions` folders, each `<dir>/<name>/function.wasm` with an optional `function.toml`.
//!
//! The manifest (every key optional; a function without one gets these defaults):
//!
//! ```toml
//! [limits]
//! timeout_ms = 10000                 # wall time of one invocation, body included -> 504
//! max_memory_bytes = 134217728       # linear memory (128 MiB) -> 500, the guest is stopped
//! max_request_body_bytes = 16777216  # 16 MiB -> 413
//! max_response_body_bytes = 16777216 # 16 MiB: the response is cut off there
//! max_concurrency = 32               # invocations at once -> 429 with Retry-After
//! max_log_bytes = 65536              # per invocation, stdout, stderr and `log` each
//! max_log_bytes_per_second = 1048576
//!
//! [env]                              # the guest's environment (nothing else is visible)
//! GREETING = "hello"
//!
//! [outgoing]
//! allowed_hosts = ["api.example.com", "localhost:8000"]   # outgoing HTTP; none by default
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Deserialize;

use crate::backend::wasm::{FunctionLimits, Limits, WasmFunction, WasmRuntime};
use crate::infer::Inference;
use crate::store::check_model_name;

/// The component of a function, in its folder.
pub const COMPONENT_FILE: &str = "function.wasm";
/// Its manifest.
pub const MANIFEST_FILE: &str = "function.toml";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    #[serde(default)]
    limits: ManifestLimits,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    outgoing: Outgoing,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ManifestLimits {
    timeout_ms: u64,
    max_memory_bytes: u64,
    max_request_body_bytes: u64,
    max_response_body_bytes: u64,
    max_concurrency: u32,
    max_log_bytes: u64,
    max_log_bytes_per_second: u64,
}

impl Default for ManifestLimits {
    fn default() -> Self {
        ManifestLimits {
            timeout_ms: 10_000,
            max_memory_bytes: 128 << 20,
            max_request_body_bytes: 16 << 20,
            max_response_body_bytes: 16 << 20,
            max_concurrency: 32,
            max_log_bytes: 64 << 10,
            max_log_bytes_per_second: 1 << 20,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Outgoing {
    #[serde(default)]
    allowed_hosts: Vec<String>,
}

/// A function's settings, from its manifest.
pub struct FunctionSpec {
    pub limits: FunctionLimits,
    pub env: Vec<(String, String)>,
    pub allowed_hosts: Vec<String>,
}

/// Parses a `function.toml` (empty text: the defaults).
pub fn parse_manifest(text: &str) -> Result<FunctionSpec, String> {
    let manifest: Manifest = toml::from_str(text).map_err(|e| e.to_string())?;
    let l = manifest.limits;
    let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    for (key, value) in [
        ("timeout_ms", l.timeout_ms),
        ("max_memory_bytes", l.max_memory_bytes),
        ("max_request_body_bytes", l.max_request_body_bytes),
        ("max_response_body_bytes", l.max_response_body_bytes),
        ("max_concurrency", u64::from(l.max_concurrency)),
    ] {
        if value == 0 {
            return Err(format!("limits.{key} must be positive"));
        }
    }
    let sandbox = Limits {
        max_memory_bytes: size(l.max_memory_bytes),
        execute_deadline: Duration::from_millis(l.timeout_ms),
        max_log_bytes: size(l.max_log_bytes),
        max_log_bytes_per_second: size(l.max_log_bytes_per_second),
        ..Limits::default()
    };
    Ok(FunctionSpec {
        limits: FunctionLimits {
            sandbox,
            max_request_body_bytes: size(l.max_request_body_bytes),
            max_response_body_bytes: size(l.max_response_body_bytes),
            max_concurrency: l.max_concurrency as usize,
        },
        env: manifest.env.into_iter().collect(),
        allowed_hosts: manifest.outgoing.allowed_hosts,
    })
}

/// A function, or why it could not load.
#[derive(Clone)]
pub enum FunctionEntry {
    Ready(Arc<WasmFunction>),
    Failed(String),
}

/// Every function, by name: an immutable table swapped as a whole.
#[derive(Default)]
pub struct Functions {
    table: ArcSwap<BTreeMap<String, FunctionEntry>>,
}

impl Functions {
    /// Loads every function of `dirs`. One that fails is recorded with its reason; the others
    /// serve.
    pub async fn load(
        &self,
        runtime: &Arc<WasmRuntime>,
        dirs: &[PathBuf],
        inference: Weak<dyn Inference>,
    ) {
        let mut table = BTreeMap::new();
        for dir in dirs {
            let entries = match std::fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!("cannot read functions folder {}: {e}", dir.display());
                    continue;
                }
            };
            let mut folders: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join(COMPONENT_FILE).is_file())
                .collect();
            folders.sort();
            for folder in folders {
                let Some(name) = folder
                    .file_name()
                    .and_then(|n| n.to_str())
                    .map(str::to_owned)
                else {
                    continue;
                };
                let entry = match load_one(runtime, &name, &folder, inference.clone()).await {
                    Ok(f) => {
                        tracing::info!(function = %name, "serving at /v1/functions/{name}/");
                        FunctionEntry::Ready(f)
                    }
                    Err(e) => {
                        tracing::error!(function = %name, "UNAVAILABLE: {e}");
                        FunctionEntry::Failed(e)
                    }
                };
                table.insert(name, entry);
            }
        }
        self.table.store(Arc::new(table));
    }

    pub fn get(&self, name: &str) -> Option<FunctionEntry> {
        self.table.load().get(name).cloned()
    }

    /// Every function with its state: `Ok` when it serves, else why not.
    pub fn list(&self) -> Vec<(String, Result<(), String>)> {
        self.table
            .load()
            .iter()
            .map(|(name, entry)| {
                let state = match entry {
                    FunctionEntry::Ready(_) => Ok(()),
                    FunctionEntry::Failed(e) => Err(e.clone()),
                };
                (name.clone(), state)
            })
            .collect()
    }

    /// The `tessera_function_*` families in Prometheus text.
    pub fn render_metrics(&self, out: &mut String) {
        let table = self.table.load();
        let ready: Vec<&Arc<WasmFunction>> = table
            .values()
            .filter_map(|e| match e {
                FunctionEntry::Ready(f) => Some(f),
                FunctionEntry::Failed(_) => None,
            })
            .collect();
        if ready.is_empty() {
            return;
        }
        let label = |f: &WasmFunction| crate::metrics::escape_label(&f.name).into_owned();
        let name = "tessera_function_invocations_total";
        let _ = writeln!(
            out,
            "# HELP {name} Function invocations by response status class\n# TYPE {name} counter"
        );
        for f in &ready {
            for (i, class) in ["2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
                let n = f.stats.by_class[i].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "{name}{{function=\"{}\",status=\"{class}\"}} {n}",
                    label(f)
                );
            }
        }
        /// A summary family: name, help, and its (sum, count) for a function.
        type Summary = (&'static str, &'static str, fn(&WasmFunction) -> (u64, u64));
        let summaries: [Summary; 2] = [
            (
                "tessera_function_duration_us",
                "Time to the response head of function invocations, in microseconds",
                |f| {
                    (
                        f.stats.duration_us.load(Ordering::Relaxed),
                        f.stats.invocations(),
                    )
                },
            ),
            (
                "tessera_function_instantiation_us",
                "Time to instantiate a function's fresh instance, in microseconds",
                |f| {
                    (
                        f.stats.instantiation_us.load(Ordering::Relaxed),
                        f.stats.instantiations.load(Ordering::Relaxed),
                    )
                },
            ),
        ];
        for (name, help, pick) in summaries {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} summary");
            for f in &ready {
                let (sum, count) = pick(f);
                let l = label(f);
                let _ = writeln!(
                    out,
                    "{name}_sum{{function=\"{l}\"}} {sum}\n{name}_count{{function=\"{l}\"}} {count}"
                );
            }
        }
        let name = "tessera_function_instances_live";
        let _ = writeln!(
            out,
            "# HELP {name} Function instances running now\n# TYPE {name} gauge"
        );
        for f in &ready {
            let _ = writeln!(
                out,
                "{name}{{function=\"{}\"}} {}",
                label(f),
                f.stats.live.load(Ordering::Relaxed)
            );
        }
    }
}

async fn load_one(
    runtime: &Arc<WasmRuntime>,
    name: &str,
    folder: &Path,
    inference: Weak<dyn Inference>,
) -> Result<Arc<WasmFunction>, String> {
    check_model_name(name).map_err(|e| e.to_string())?;
    let (runtime, name, folder) = (runtime.clone(), name.to_owned(), folder.to_owned());
    // Reading and compiling are blocking work.
    tokio::task::spawn_blocking(move || {
        let manifest_path = folder.join(MANIFEST_FILE);
        let text = match std::fs::read_to_string(&manifest_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", manifest_path.display())),
        };
        let spec =
            parse_manifest(&text).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
        let component = folder.join(COMPONENT_FILE);
        let bytes = std::fs::read(&component)
            .map_err(|e| format!("cannot read {}: {e}", component.display()))?;
        runtime
            .prepare_function(
                &name,
                &bytes,
                spec.limits,
                spec.env,
                spec.allowed_hosts,
                inference,
            )
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("loading failed: {e}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_have_defaults_and_refuse_unknown_keys() {
        let spec = parse_manifest("").expect("empty is fine");
        assert_eq!(spec.limits.max_concurrency, 32);
        assert_eq!(
            spec.limits.sandbox.execute_deadline,
            Duration::from_secs(10)
        );
        assert!(spec.env.is_empty() && spec.allowed_hosts.is_empty());
        let spec = parse_manifest(
            "[limits]\ntimeout_ms = 50\n[env]\nA = \"b\"\n[outgoing]\nallowed_hosts = [\"x:80\"]\n",
        )
        .expect("parses");
        assert_eq!(
            spec.limits.sandbox.execute_deadline,
            Duration::from_millis(50)
        );
        assert_eq!(spec.env, vec![("A".to_owned(), "b".to_owned())]);
        assert_eq!(spec.allowed_hosts, vec!["x:80".to_owned()]);
        assert!(parse_manifest("[limits]\ntimeout = 5\n").is_err(), "a typo");
        assert!(parse_manifest("[limits]\nmax_concurrency = 0\n").is_err());
    }
}
