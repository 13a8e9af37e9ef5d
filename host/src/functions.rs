//! Functions by name: `wasi:http` components served at `/v1/functions/<name>/...`, loaded from
//! `--functions` folders, each `<dir>/<name>/function.wasm` with an optional `function.toml`, and
//! deployed over HTTP into the deployment store (`<store>/functions/<name>/<revision>/`), which
//! shadows a folder's function of the same name. A deployment is validated (compiled and linked)
//! before anything is written, written durably, then swapped in: invocations already running
//! finish on the old one.
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
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Deserialize;

use crate::backend::wasm::{FunctionLimits, Limits, WasmFunction, WasmRuntime};
use crate::infer::Inference;
use crate::repository::{ControlError, LoadOutcome};
use crate::store::{Store, check_key};
use crate::tenants::{Tenants, WasmCeiling};

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
    let most = crate::backend::wasm::MAX_EXECUTE_DEADLINE_MS;
    if l.timeout_ms > most {
        return Err(format!(
            "limits.timeout_ms {} is more than an hour ({most})",
            l.timeout_ms
        ));
    }
    // Hosts are matched exactly: a pattern would silently match nothing.
    if let Some(host) = manifest
        .outgoing
        .allowed_hosts
        .iter()
        .find(|h| h.is_empty() || h.contains(['*', '/', ' ']))
    {
        return Err(format!(
            "outgoing.allowed_hosts entry {host:?} is not a host name or host:port (hosts are matched exactly; wildcards, paths and empty names are not accepted)"
        ));
    }
    // A port must be a port: "host:99999" would silently match nothing.
    if let Some(host) = manifest.outgoing.allowed_hosts.iter().find(|h| {
        // `[::1]` is an IPv6 address without a port.
        (!h.ends_with(']'))
            .then(|| h.rsplit_once(':'))
            .flatten()
            .is_some_and(|(name, port)| {
                name.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0)
            })
    }) {
        return Err(format!(
            "outgoing.allowed_hosts entry {host:?} has no valid port (host or host:port, the port 1-65535)"
        ));
    }
    // What an environment can hold: a name with `=` reads as another variable, an empty name
    // is dropped, and a NUL ends the name or value where the guest reads it.
    if let Some((name, _)) = manifest
        .env
        .iter()
        .find(|(name, value)| name.is_empty() || name.contains(['=', '\0']) || value.contains('\0'))
    {
        return Err(format!(
            "env entry {name:?} cannot be an environment variable (names are not empty and hold no '=' or NUL; values hold no NUL)"
        ));
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
pub struct Functions {
    table: ArcSwap<BTreeMap<String, FunctionEntry>>,
    /// Where deployed functions are kept; None: deployments are refused.
    store: Option<Arc<Store>>,
    /// The folders of `--functions`, to reload a function from.
    dirs: std::sync::Mutex<Vec<PathBuf>>,
    /// One load, deployment, unload or rollback at a time.
    control: tokio::sync::Mutex<()>,
    /// Tenants' Wasm ceilings clamp their functions' limits.
    tenants: Arc<Tenants>,
}

/// A function deployment: its component and its manifest (`function.toml` text; none: defaults).
pub struct FunctionUpload {
    pub component: bytes::Bytes,
    pub manifest: Option<String>,
}

/// The content hash of a function revision.
fn fingerprint(component: &[u8], manifest: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(component);
    h.update([0]);
    h.update(manifest.as_bytes());
    hex::encode(h.finalize())
}

impl Functions {
    pub fn new(store: Option<Arc<Store>>, tenants: Arc<Tenants>) -> Functions {
        Functions {
            table: ArcSwap::default(),
            store,
            dirs: std::sync::Mutex::new(Vec::new()),
            control: tokio::sync::Mutex::new(()),
            tenants,
        }
    }

    /// How many functions `tenant` has deployed and their bytes, leaving out `except`.
    pub fn usage(&self, tenant: &str, except: &str) -> (usize, u64) {
        self.store
            .as_ref()
            .map_or((0, 0), |s| s.usage(tenant, except))
    }

    /// Stops serving every function of `tenant` and forgets its deployments.
    pub async fn remove_tenant(&self, tenant: &str) {
        let _control = self.control.lock().await;
        let prefix = crate::namespace::ModelKey::tenant_prefix(tenant);
        let mut next = BTreeMap::clone(&self.table.load());
        next.retain(|key, _| !key.starts_with(&prefix));
        self.table.store(Arc::new(next));
        if let Some(store) = &self.store
            && let Err(e) = crate::deploy::disk(|| store.remove_tenant(tenant))
        {
            tracing::warn!(tenant, "removing the functions of a deleted tenant: {e}");
        }
    }

    /// Replaces (or removes) one function. Writers hold `control`, so the copy-and-swap cannot
    /// lose a change.
    fn set(&self, name: &str, entry: Option<FunctionEntry>) {
        let mut next = BTreeMap::clone(&self.table.load());
        match entry {
            Some(e) => next.insert(name.to_owned(), e),
            None => next.remove(name),
        };
        self.table.store(Arc::new(next));
    }

    /// Where `name` loads from: the store's current revision, else a `--functions` folder.
    fn source_of(&self, name: &str) -> Option<PathBuf> {
        if let Some((dir, _)) = self.store.as_ref().and_then(|s| s.current_dir(name)) {
            return Some(dir);
        }
        // The `--functions` folders hold the operator's functions only.
        if crate::namespace::ModelKey::parse(name).tenant.is_some() {
            return None;
        }
        let dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        dirs.iter()
            .map(|d| d.join(name))
            .find(|d| d.join(COMPONENT_FILE).is_file())
    }

    /// Loads every function of `dirs` and every deployment of the store (a deployment shadows a
    /// folder's function of the same name). One that fails is recorded with its reason; the
    /// others serve.
    pub async fn load(
        &self,
        runtime: &Arc<WasmRuntime>,
        dirs: &[PathBuf],
        inference: Weak<dyn Inference>,
    ) {
        let _control = self.control.lock().await;
        *self.dirs.lock().unwrap_or_else(|p| p.into_inner()) = dirs.to_vec();
        let mut folders: BTreeMap<String, PathBuf> = BTreeMap::new();
        for dir in dirs {
            let entries = match std::fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!("cannot read functions folder {}: {e}", dir.display());
                    continue;
                }
            };
            for folder in entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join(COMPONENT_FILE).is_file())
            {
                if let Some(name) = folder.file_name().and_then(|n| n.to_str()) {
                    folders.insert(name.to_owned(), folder.clone());
                }
            }
        }
        if let Some(store) = &self.store {
            for (name, manifest) in store.deployed() {
                if manifest.loaded {
                    let dir = store.revision_dir(&name, manifest.current);
                    folders.insert(name, dir);
                } else {
                    // Unloaded on request: stays unloaded across restarts.
                    folders.remove(&name);
                }
            }
        }
        let mut table = BTreeMap::new();
        for (name, folder) in folders {
            let entry = match load_one(
                runtime,
                &name,
                &folder,
                inference.clone(),
                self.tenants.ceiling(&name),
            )
            .await
            {
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
        if let Some(store) = &self.store {
            for (name, reason) in store.damaged() {
                tracing::error!(function = %name, "UNAVAILABLE: {reason}");
                table.insert(name, FunctionEntry::Failed(reason));
            }
        }
        self.table.store(Arc::new(table));
    }

    /// Deploys a function: validates it (manifest, component, linking) before anything changes,
    /// writes it durably to the store, and swaps it in. Deploying the same files again is a
    /// no-op.
    pub async fn deploy(
        &self,
        runtime: &Arc<WasmRuntime>,
        name: &str,
        upload: FunctionUpload,
        inference: Weak<dyn Inference>,
    ) -> Result<(LoadOutcome, u64), ControlError> {
        check_key(name)?;
        let store = self.store.clone().ok_or_else(|| {
            ControlError::NotAllowed(format!(
                "failed to deploy function '{}': this server runs without a deployment store (--store)",
                crate::namespace::shown(name)
            ))
        })?;
        let _control = self.control.lock().await;
        let manifest = upload.manifest.unwrap_or_default();
        let hash = fingerprint(&upload.component, &manifest);
        // With a shared store, "unchanged" is judged against the shared state, in `deploy`.
        if store.shared().is_none()
            && let Some(m) = store.manifest(name)
            && m.loaded
            && m.revisions
                .iter()
                .any(|r| r.revision == m.current && r.sha256 == hash)
            && matches!(self.get(name), Some(FunctionEntry::Ready(_)))
        {
            return Ok((LoadOutcome::Unchanged, m.current));
        }
        let files = vec![
            (PathBuf::from(COMPONENT_FILE), upload.component),
            (PathBuf::from(MANIFEST_FILE), bytes::Bytes::from(manifest)),
        ];
        let target = FunctionTarget {
            functions: self,
            runtime,
            inference,
        };
        let deployed = crate::deploy::deploy(&store, &target, name, files).await?;
        Ok((deployed.outcome, deployed.revision.unwrap_or(0)))
    }

    /// Loads `name` again from where it lives (its store revision or its folder).
    pub async fn reload(
        &self,
        runtime: &Arc<WasmRuntime>,
        name: &str,
        inference: Weak<dyn Inference>,
    ) -> Result<(), ControlError> {
        check_key(name)?;
        let _control = self.control.lock().await;
        let dir = self.source_of(name).ok_or_else(|| {
            ControlError::NotFound(format!(
                "function '{}' is in no --functions folder and not in the store",
                crate::namespace::shown(name)
            ))
        })?;
        let function = load_one(runtime, name, &dir, inference, self.tenants.ceiling(name))
            .await
            .map_err(|e| {
                ControlError::Invalid(format!(
                    "failed to load function '{}': {e}",
                    crate::namespace::shown(name)
                ))
            })?;
        if let Some(store) = &self.store {
            crate::deploy::set_loaded(store, name, true).await?;
        }
        self.set(name, Some(FunctionEntry::Ready(function)));
        Ok(())
    }

    /// Stops serving `name` (404 from now on; invocations running finish). A deployed function
    /// stays in the store, unloaded, also after a restart.
    pub async fn unload(&self, name: &str) -> Result<(), ControlError> {
        let _control = self.control.lock().await;
        if self.get(name).is_none() {
            return Err(ControlError::NotFound(format!(
                "failed to unload function '{}': it is not loaded",
                crate::namespace::shown(name)
            )));
        }
        if let Some(store) = &self.store {
            crate::deploy::set_loaded(store, name, false).await?;
        }
        self.set(name, None);
        Ok(())
    }

    /// Serves the revision before the current one again.
    pub async fn rollback(
        &self,
        runtime: &Arc<WasmRuntime>,
        name: &str,
        inference: Weak<dyn Inference>,
    ) -> Result<u64, ControlError> {
        check_key(name)?;
        let store = self.store.clone().ok_or_else(|| {
            ControlError::NotAllowed("this server runs without a deployment store (--store)".into())
        })?;
        let _control = self.control.lock().await;
        let target = FunctionTarget {
            functions: self,
            runtime,
            inference,
        };
        let deployed = crate::deploy::rollback(&store, &target, name).await?;
        Ok(deployed.revision.unwrap_or(0))
    }

    /// Applies what another replica published to the shared store ([`crate::deploy::follow`]).
    pub async fn follow(
        &self,
        runtime: &Arc<WasmRuntime>,
        name: &str,
        manifest: &crate::store::shared::SharedManifest,
        inference: Weak<dyn Inference>,
    ) -> Result<(), ControlError> {
        let Some(store) = self.store.clone() else {
            return Ok(());
        };
        let _control = self.control.lock().await;
        let target = FunctionTarget {
            functions: self,
            runtime,
            inference,
        };
        crate::deploy::follow(&store, &target, name, manifest).await
    }

    /// Where deployed functions are kept.
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    pub fn get(&self, name: &str) -> Option<FunctionEntry> {
        self.table.load().get(name).cloned()
    }

    /// Every function with its state: `Ok` when it serves, else why not. A deployment unloaded on
    /// request is listed too (as an unloaded model is in the repository index): it stays in the
    /// store, and it keeps a folder's function of the same name from serving.
    pub fn list(&self) -> Vec<(String, Result<(), String>)> {
        let table = self.table.load();
        let mut rows: BTreeMap<String, Result<(), String>> = table
            .iter()
            .map(|(name, entry)| {
                let state = match entry {
                    FunctionEntry::Ready(_) => Ok(()),
                    FunctionEntry::Failed(e) => Err(e.clone()),
                };
                (name.clone(), state)
            })
            .collect();
        if let Some(store) = &self.store {
            for (name, manifest) in store.deployed() {
                if !manifest.loaded && !rows.contains_key(&name) {
                    let reason = format!(
                        "unloaded (revision {} stays in the store; load it to serve it again)",
                        manifest.current
                    );
                    rows.insert(name, Err(reason));
                }
            }
        }
        rows.into_iter().collect()
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
        use crate::metrics::Family;
        let mut family = Family::start(
            out,
            "tessera_function_invocations_total",
            "counter",
            "Function invocations by response status class",
        );
        for f in &ready {
            for (i, class) in ["2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
                let n = f.stats.by_class[i].load(Ordering::Relaxed);
                family.sample(&[("function", &f.name), ("status", class)], n);
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
            let mut family = Family::start(out, name, "summary", help);
            for f in &ready {
                let (sum, count) = pick(f);
                family.sample_of("_sum", &[("function", &f.name)], sum);
                family.sample_of("_count", &[("function", &f.name)], count);
            }
        }
        let mut family = Family::start(
            out,
            "tessera_function_instances_live",
            "gauge",
            "Function instances running now",
        );
        for f in &ready {
            family.sample(
                &[("function", &f.name)],
                f.stats.live.load(Ordering::Relaxed),
            );
        }
    }
}

/// Reads a function's folder and prepares it.
async fn load_one(
    runtime: &Arc<WasmRuntime>,
    name: &str,
    folder: &Path,
    inference: Weak<dyn Inference>,
    ceiling: Option<WasmCeiling>,
) -> Result<Arc<WasmFunction>, String> {
    check_key(name).map_err(|e| e.to_string())?;
    let (component, manifest) = read_folder(folder).await?;
    prepare(runtime, name, component, manifest, inference, ceiling).await
}

/// A function folder's component and manifest (an empty manifest when it has none).
async fn read_folder(folder: &Path) -> Result<(bytes::Bytes, String), String> {
    let folder = folder.to_owned();
    tokio::task::spawn_blocking(move || {
        let manifest_path = folder.join(MANIFEST_FILE);
        let text = match std::fs::read_to_string(&manifest_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", manifest_path.display())),
        };
        let component = folder.join(COMPONENT_FILE);
        let bytes = std::fs::read(&component)
            .map_err(|e| format!("cannot read {}: {e}", component.display()))?;
        Ok((bytes::Bytes::from(bytes), text))
    })
    .await
    .map_err(|e| format!("loading failed: {e}"))?
}

/// A function deployment: built from its store revision, swapped into the function table.
struct FunctionTarget<'f> {
    functions: &'f Functions,
    runtime: &'f Arc<WasmRuntime>,
    inference: Weak<dyn Inference>,
}

impl crate::deploy::Target for FunctionTarget<'_> {
    /// The function, and the hash of its component and manifest.
    type Built = (Arc<WasmFunction>, String);

    async fn build(
        &self,
        key: &str,
        _revision: u64,
        dir: &Path,
    ) -> Result<Option<Self::Built>, ControlError> {
        let failed = |e: String| {
            ControlError::Invalid(format!(
                "failed to deploy function '{}': {e}",
                crate::namespace::shown(key)
            ))
        };
        let (component, manifest) = read_folder(dir).await.map_err(failed)?;
        let hash = fingerprint(&component, &manifest);
        let ceiling = self.functions.tenants.ceiling(key);
        let function = prepare(
            self.runtime,
            key,
            component,
            manifest,
            self.inference.clone(),
            ceiling,
        )
        .await
        .map_err(failed)?;
        Ok(Some((function, hash)))
    }

    fn hash(&self, built: &Self::Built) -> String {
        built.1.clone()
    }

    async fn swap(&self, key: &str, built: Self::Built) -> Result<(), ControlError> {
        self.functions.set(key, Some(FunctionEntry::Ready(built.0)));
        Ok(())
    }

    fn serving(&self, key: &str) -> Option<u64> {
        // The table does not keep revisions: what serves is the store's current one, which a
        // deployment records before it swaps.
        match self.functions.get(key) {
            Some(FunctionEntry::Ready(_)) => self
                .functions
                .store
                .as_ref()?
                .manifest(key)
                .map(|m| m.current),
            _ => None,
        }
    }

    async fn unload(&self, key: &str) -> Result<(), ControlError> {
        self.functions.set(key, None);
        Ok(())
    }
}

/// Parses the manifest, then compiles and links the component (blocking work, off the workers).
async fn prepare(
    runtime: &Arc<WasmRuntime>,
    name: &str,
    component: bytes::Bytes,
    manifest: String,
    inference: Weak<dyn Inference>,
    ceiling: Option<WasmCeiling>,
) -> Result<Arc<WasmFunction>, String> {
    let mut spec = parse_manifest(&manifest).map_err(|e| format!("{MANIFEST_FILE}: {e}"))?;
    if let Some(ceiling) = ceiling {
        let sandbox = &mut spec.limits.sandbox;
        let max_memory = usize::try_from(ceiling.max_memory_bytes).unwrap_or(usize::MAX);
        sandbox.max_memory_bytes = sandbox.max_memory_bytes.min(max_memory);
        sandbox.execute_deadline = sandbox.execute_deadline.min(ceiling.max_time);
    }
    let (runtime, name) = (runtime.clone(), name.to_owned());
    tokio::task::spawn_blocking(move || {
        runtime
            .prepare_function(
                &name,
                &component,
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
        for bad in ["\"*\"", "\"\"", "\"*.example.com\"", "\"http://x/\""] {
            let text = format!("[outgoing]\nallowed_hosts = [{bad}]\n");
            let e = parse_manifest(&text).err().unwrap_or_default();
            assert!(e.contains("matched exactly"), "{bad}: {e}");
        }
        for bad in ["\"x:99999\"", "\"x:notaport\"", "\"x:0\"", "\":80\""] {
            let text = format!("[outgoing]\nallowed_hosts = [{bad}]\n");
            let e = parse_manifest(&text).err().unwrap_or_default();
            assert!(e.contains("no valid port"), "{bad}: {e}");
        }
        let hosts = "[outgoing]\nallowed_hosts = [\"[::1]\", \"[::1]:8080\", \"x\"]\n";
        assert!(
            parse_manifest(hosts).is_ok(),
            "IPv6 literals, with and without a port"
        );
        for bad in ["\"A=B\" = \"c\"", "\"\" = \"x\"", "A = \"x\\u0000y\""] {
            let e = parse_manifest(&format!("[env]\n{bad}\n"))
                .err()
                .unwrap_or_default();
            assert!(
                e.contains("cannot be an environment variable"),
                "{bad}: {e}"
            );
        }
        let e = parse_manifest("[limits]\ntimeout_ms = 18446744073709551615\n")
            .err()
            .unwrap_or_default();
        assert!(e.contains("more than an hour"), "{e}");
        assert!(parse_manifest("[limits]\ntimeout = 5\n").is_err(), "a typo");
        assert!(parse_manifest("[limits]\nmax_concurrency = 0\n").is_err());
    }
}
