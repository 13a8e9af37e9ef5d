//! The model repository: Triton's on-disk layout, version policies, model control, and each
//! version's state.
//!
//! ```text
//! <repository>/<model>/config.pbtxt
//! <repository>/<model>/<label files>
//! <repository>/<model>/<version>/model.onnx | model.wasm   (version: a positive integer)
//! ```
//!
//! Models come from the `--model-repository` folders and from the deployment [`Store`] (which
//! shadows a repository model of the same name). Every model version has a state; a model that
//! fails to load is UNAVAILABLE with its reason and never keeps the others from serving.
//!
//! Changing what is loaded (start-up, `load`, `unload`, polling, deployments) goes through
//! [`Control`], one change at a time. A change builds the new [`ModelEntry`] beside the live one
//! and swaps a new table in atomically: requests that already hold the old version finish on it,
//! and it is dropped (its Wasm instances finalized) when the last one lets go. Versions whose
//! configuration and files did not change (by content hash) are carried over, not reloaded.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};

use crate::backend::{self, Backends, LoadContext};
use crate::config::{self, BackendKind, ModelConfig, pb};
use crate::device::placement::InstanceSlot;
use crate::infer::{BoxFuture, InferError, Inference};
use crate::metrics::ModelStats;
use crate::model::ModelVersion;
use crate::scheduler::rate_limit::{RateLimiter, Requirement, Resource, Share};
use crate::scheduler::{BatchPolicy, Executor, Scheduler};
use crate::store::{Store, check_key};

/// A config parameter that names the models a handler calls (comma-separated), so they load
/// before it and its `initialize` can use them. Ensembles' steps are dependencies already.
pub const DEPENDS_ON_PARAMETER: &str = "tessera.depends_on";

/// Lifecycle state of a model version, named as Triton names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelState {
    Unavailable,
    Loading,
    Ready,
    Unloading,
}

impl ModelState {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Unavailable => "UNAVAILABLE",
            ModelState::Loading => "LOADING",
            ModelState::Ready => "READY",
            ModelState::Unloading => "UNLOADING",
        }
    }
}

/// State of one version.
#[derive(Clone)]
pub struct VersionStatus {
    pub state: ModelState,
    pub reason: String,
    pub model: Option<Arc<ModelVersion>>,
}

/// Where a model's files come from.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Origin {
    /// A `--model-repository` folder.
    #[default]
    Repository,
    /// A revision of the deployment store.
    Store { revision: u64 },
}

/// A model directory to load, and the configuration that replaces its `config.pbtxt`, if any
/// (Triton's `load` with a `config` parameter).
#[derive(Clone, Debug, Default)]
pub struct ModelSource {
    pub dir: PathBuf,
    pub origin: Origin,
    pub config_override: Option<Arc<ModelConfig>>,
}

/// Content hashes of a model directory: its configuration and shared files, and each version
/// folder. Equal hashes mean an equal model, whatever the file times say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint {
    model: [u8; 32],
    versions: BTreeMap<i64, [u8; 32]>,
}

impl Fingerprint {
    /// One hash of everything, hex-encoded.
    pub fn sha256_hex(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.model);
        for (v, hash) in &self.versions {
            h.update(v.to_le_bytes());
            h.update(hash);
        }
        hex::encode(h.finalize())
    }
}

/// A model directory and what became of it.
#[derive(Clone, Default)]
pub struct ModelEntry {
    pub path: PathBuf,
    pub origin: Origin,
    /// Set when the configuration itself could not be used: no version loads then.
    pub error: Option<String>,
    pub config: Option<Arc<ModelConfig>>,
    pub versions: BTreeMap<i64, VersionStatus>,
    source: ModelSource,
    kind: Option<BackendKind>,
    fingerprint: Fingerprint,
    /// Loaded by a request (or at start) rather than only as another model's dependency.
    explicit: bool,
    /// Models this one calls: ensemble steps and `tessera.depends_on`.
    dependencies: Vec<String>,
    /// An ensemble one of whose steps was unloaded: UNAVAILABLE until that step loads again,
    /// when it is planned again.
    missing_step: Option<String>,
}

impl ModelEntry {
    fn has_ready(&self) -> bool {
        self.versions.values().any(|s| s.state == ModelState::Ready)
    }

    fn failures(&self) -> Vec<String> {
        if let Some(e) = &self.error {
            return vec![e.clone()];
        }
        self.versions
            .iter()
            .filter(|(_, s)| s.state != ModelState::Ready)
            .map(|(v, s)| format!("version {v}: {}", s.reason))
            .collect()
    }
}

/// One row of the repository index.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexRow {
    pub name: String,
    /// Empty when the model failed before any version was known, or was never loaded.
    pub version: String,
    /// None for a model of the repository that was never loaded (explicit mode).
    pub state: Option<ModelState>,
    pub reason: String,
}

/// How models are read.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// `--strict-model-config`: require `config.pbtxt` to be complete; no auto-completion.
    pub strict_model_config: bool,
    /// `--metrics-config summary_latencies=true`: models keep the latency windows the summaries
    /// need (otherwise recording statistics costs a few atomic additions).
    pub latency_summaries: bool,
    /// `--default-max-queue-size`: the queue bound of models whose policy sets none (0: none).
    pub default_max_queue_size: usize,
}

/// Why a model-control request failed; the protocol maps each to a status.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No such model in any repository or in the store.
    #[error("{0}")]
    NotFound(String),
    /// The model, its configuration or its files are wrong, or it failed to load.
    #[error("{0}")]
    Invalid(String),
    /// An upload beyond the deployment size limit.
    #[error("{0}")]
    TooLarge(String),
    /// The model-control mode does not allow the request.
    #[error("{0}")]
    NotAllowed(String),
    /// A tenant's quota does not allow it (the number of deployments).
    #[error("{0}")]
    Forbidden(String),
    /// Another replica changed the deployment at the same time (the shared store).
    #[error("{0}")]
    Conflict(String),
    /// The shared deployment store cannot be reached.
    #[error("{0}")]
    Unavailable(String),
    /// The store or the filesystem failed.
    #[error("{0}")]
    Internal(String),
}

impl From<crate::store::shared::SharedStoreError> for ControlError {
    fn from(e: crate::store::shared::SharedStoreError) -> Self {
        use crate::store::shared::SharedStoreError;
        match e {
            e @ SharedStoreError::Conflict { .. } => ControlError::Conflict(e.to_string()),
            SharedStoreError::Invalid(m) => ControlError::Invalid(m),
            e @ SharedStoreError::Unavailable(_) => {
                // The store's URL and the client library's words stay in the log.
                tracing::error!("{e}");
                ControlError::Unavailable(
                    "the shared deployment store is unreachable; nothing was published (details in the server log)".into(),
                )
            }
            e @ SharedStoreError::Corrupt(_) => {
                tracing::error!("{e}");
                ControlError::Internal(
                    "the shared deployment store holds something unreadable (details in the server log)".into(),
                )
            }
        }
    }
}

impl From<crate::store::StoreError> for ControlError {
    fn from(e: crate::store::StoreError) -> Self {
        use crate::store::StoreError;
        match e {
            StoreError::Invalid(m) => ControlError::Invalid(m),
            e @ (StoreError::NotDeployed(..) | StoreError::NoEarlierRevision(..)) => {
                ControlError::NotFound(e.to_string())
            }
            e @ StoreError::Io { .. } => {
                // The path and the operating system's words stay in the log (D9).
                tracing::error!("{e}");
                ControlError::Internal(e.for_client())
            }
        }
    }
}

/// What a load did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadOutcome {
    /// A new or changed model now serves.
    Loaded,
    /// The model already served these exact files and configuration.
    Unchanged,
}

/// A model loaded beside the live table, not yet serving.
pub struct Candidate {
    name: String,
    entry: ModelEntry,
    /// Whether a failed load is recorded in the table (a repository model shows UNAVAILABLE with
    /// its reason) or leaves no trace (a rejected deployment changes nothing).
    record_failure: bool,
}

impl Candidate {
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.entry.fingerprint
    }

    /// Why versions of it did not load (empty: all READY).
    pub fn failures(&self) -> Vec<String> {
        self.entry.failures()
    }
}

/// Every model and what became of it, by name: an immutable snapshot.
type ModelTable = BTreeMap<String, ModelEntry>;

/// All models of all repository paths and of the deployment store.
pub struct Repository {
    paths: Vec<PathBuf>,
    store: Option<Arc<Store>>,
    /// Read without locking by every request; changed only by building a new table beside the
    /// live one and swapping it in, so a request sees one consistent table.
    table: ArcSwap<ModelTable>,
    /// Serializes the writers, so no change is lost between copying the table and swapping it.
    writer: Mutex<()>,
    /// One model-control change at a time (loads take long; requests never wait on this). It
    /// guards the fingerprints of changes that polling found and could not load, so a broken
    /// file is tried again only once it changes, not at every poll.
    control: tokio::sync::Mutex<HashMap<String, Fingerprint>>,
    /// What loads a model of each kind.
    backends: Backends,
    /// Shared by every instance that names rate-limiter resources.
    limiter: Arc<RateLimiter>,
    /// The request path, for models that call other models.
    inference: Weak<dyn Inference>,
    options: LoadOptions,
    /// Which operator models each tenant may use, for resolving names in its namespace.
    tenants: Arc<crate::tenants::Tenants>,
}

/// Which repository models load at start.
#[derive(Clone, Debug)]
pub enum StartupModels {
    All,
    /// `--load-model` names (explicit mode); `*` is [`StartupModels::All`].
    Named(Vec<String>),
}

impl Repository {
    pub fn new(
        paths: Vec<PathBuf>,
        store: Option<Arc<Store>>,
        backends: Backends,
        limiter: Arc<RateLimiter>,
        inference: Weak<dyn Inference>,
        options: &LoadOptions,
        tenants: Arc<crate::tenants::Tenants>,
    ) -> Repository {
        Repository {
            paths,
            store,
            table: ArcSwap::from_pointee(ModelTable::new()),
            writer: Mutex::new(()),
            control: tokio::sync::Mutex::new(HashMap::new()),
            backends,
            limiter,
            inference,
            options: options.clone(),
            tenants,
        }
    }

    /// The key a model name means in `namespace` (None: the operator's): the namespace's own
    /// model (loaded or deployed), else an operator model granted to it, else the namespace's
    /// own key, which exists nowhere, so a model that is not granted is missing exactly like
    /// one that does not exist. Requests, ensemble steps and dependencies all resolve here.
    pub fn resolve(&self, namespace: Option<&str>, name: &str) -> String {
        let Some(tenant) = namespace else {
            return name.to_owned();
        };
        let own = crate::namespace::ModelKey::new(Some(tenant), name).key();
        let owned = self.read().contains_key(&own)
            || self
                .store
                .as_ref()
                .is_some_and(|s| s.manifest(&own).is_some());
        if !owned && self.tenants.granted(tenant, name) {
            name.to_owned()
        } else {
            own
        }
    }

    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    /// The live table.
    fn read(&self) -> arc_swap::Guard<Arc<ModelTable>> {
        self.table.load()
    }

    /// Builds the next table from the live one with `change`, and swaps it in.
    fn update(&self, change: impl FnOnce(&mut ModelTable)) {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = ModelTable::clone(&self.table.load());
        change(&mut next);
        self.table.store(Arc::new(next));
    }

    /// Takes the model-control lock: loads, unloads and deployments happen one at a time.
    pub async fn control(&self) -> Control<'_> {
        Control {
            repo: self,
            poll_failures: self.control.lock().await,
        }
    }

    /// The version that should answer a request: the given one, or the newest READY one.
    pub fn ready_model(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> Result<Arc<ModelVersion>, InferError> {
        let models = self.read();
        let key = name;
        let name = crate::namespace::shown(key);
        let Some(entry) = models.get(key) else {
            return Err(InferError::not_found(format!(
                "Request for unknown model: '{name}' is not found"
            )));
        };
        match version {
            Some(v) => match entry.versions.get(&v) {
                Some(VersionStatus {
                    model: Some(m),
                    state: ModelState::Ready,
                    ..
                }) => Ok(m.clone()),
                Some(status) => Err(InferError::unavailable(format!(
                    "Request for unknown model: '{name}' version {v} is not at ready state ({}{})",
                    status.state.as_str(),
                    if status.reason.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", status.reason)
                    }
                ))),
                None => Err(InferError::not_found(format!(
                    "Request for unknown model: '{name}' version {v} is not found"
                ))),
            },
            None => entry
                .versions
                .values()
                .rev()
                .find_map(|s| {
                    (s.state == ModelState::Ready)
                        .then(|| s.model.clone())
                        .flatten()
                })
                .ok_or_else(|| {
                    let reason = entry
                        .error
                        .clone()
                        .or_else(|| {
                            entry
                                .versions
                                .values()
                                .next_back()
                                .map(|s| s.reason.clone())
                        })
                        .unwrap_or_default();
                    InferError::unavailable(format!(
                        "Request for unknown model: '{name}' has no available versions{}",
                        if reason.is_empty() {
                            String::new()
                        } else {
                            format!(": {reason}")
                        }
                    ))
                }),
        }
    }

    /// Whether a model (or one version) exists at all, ready or not.
    pub fn contains(&self, name: &str, version: Option<i64>) -> bool {
        self.read()
            .get(name)
            .is_some_and(|e| version.is_none_or(|v| e.versions.contains_key(&v)))
    }

    /// The configuration of a model, even when no version is ready.
    pub fn config(&self, name: &str) -> Option<Arc<ModelConfig>> {
        self.read().get(name).and_then(|e| e.config.clone())
    }

    /// Version numbers known for a model.
    pub fn versions(&self, name: &str) -> Vec<i64> {
        self.read()
            .get(name)
            .map(|e| e.versions.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Every model and version with its state; with `ready_only`, the READY versions only.
    /// Models of the repository folders that were never loaded are listed by name alone.
    pub fn index(&self, ready_only: bool) -> Vec<IndexRow> {
        let table = self.read();
        let mut rows = Vec::new();
        for (name, entry) in table.iter() {
            if entry.versions.is_empty() {
                rows.push(IndexRow {
                    name: name.clone(),
                    version: String::new(),
                    state: Some(ModelState::Unavailable),
                    reason: entry
                        .error
                        .clone()
                        .unwrap_or_else(|| "no versions found".into()),
                });
            }
            for (v, status) in &entry.versions {
                rows.push(IndexRow {
                    name: name.clone(),
                    version: v.to_string(),
                    state: Some(status.state),
                    reason: status.reason.clone(),
                });
            }
        }
        if !ready_only {
            let known: BTreeSet<String> = self.available().into_keys().collect();
            for name in known {
                if !table.contains_key(&name) {
                    rows.push(IndexRow {
                        name,
                        version: String::new(),
                        state: None,
                        reason: String::new(),
                    });
                }
            }
            rows.sort_by(|a, b| a.name.cmp(&b.name));
        }
        rows.retain(|r| !ready_only || r.state == Some(ModelState::Ready));
        rows
    }

    /// Every model that could be loaded, by name: the repository folders' model directories and
    /// the store's deployments (a deployment shadows a repository model of the same name).
    fn available(&self) -> BTreeMap<String, ModelSource> {
        let mut found: BTreeMap<String, ModelSource> = match discover(&self.paths) {
            Ok(found) => found
                .into_iter()
                .map(|(name, dir)| {
                    (
                        name,
                        ModelSource {
                            dir,
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            Err(e) => {
                tracing::error!("{e}");
                BTreeMap::new()
            }
        };
        if let Some(store) = &self.store {
            for (name, manifest) in store.deployed() {
                found.insert(
                    name.clone(),
                    ModelSource {
                        dir: store.revision_dir(&name, manifest.current),
                        origin: Origin::Store {
                            revision: manifest.current,
                        },
                        config_override: None,
                    },
                );
            }
        }
        found
    }

    /// Where the model `name` would load from.
    fn source_of(&self, name: &str) -> Option<ModelSource> {
        check_key(name).ok()?;
        if let Some((dir, revision)) = self.store.as_ref().and_then(|s| s.current_dir(name)) {
            return Some(ModelSource {
                dir,
                origin: Origin::Store { revision },
                config_override: None,
            });
        }
        self.repository_folder(name).map(|dir| ModelSource {
            dir,
            ..Default::default()
        })
    }

    /// The repository folder that holds the model `name`, deployed or not (the repository folders
    /// hold the operator's models only).
    pub fn repository_folder(&self, name: &str) -> Option<PathBuf> {
        if crate::namespace::ModelKey::parse(name).tenant.is_some() {
            return None;
        }
        self.paths
            .iter()
            .map(|root| root.join(name))
            .find(|dir| dir.is_dir())
    }

    /// Where a loaded model came from.
    pub fn origin(&self, name: &str) -> Option<Origin> {
        self.read().get(name).map(|e| e.origin.clone())
    }

    /// Every READY model version.
    pub fn ready_versions(&self) -> Vec<Arc<ModelVersion>> {
        self.read()
            .values()
            .flat_map(|e| e.versions.values().filter_map(|s| s.model.clone()))
            .collect()
    }

    /// True when every version of every model that should serve is READY (Triton's strict
    /// readiness; models unloaded on request, and ensembles waiting for a step unloaded on
    /// request, do not count).
    pub fn all_ready(&self) -> bool {
        self.read().values().all(|e| {
            e.error.is_none()
                && e.versions.values().all(|s| {
                    s.state == ModelState::Ready
                        || s.state == ModelState::Unavailable
                            && (s.reason == UNLOADED || e.missing_step.is_some())
                })
        })
    }

    /// Drops every model: their schedulers finish what is queued, then stop.
    pub fn unload_all(&self) {
        self.update(|models| {
            for entry in models.values_mut() {
                mark_unloaded(entry);
            }
        });
    }
}

/// The reason an unloaded version shows, as Triton shows it.
const UNLOADED: &str = "unloaded";

fn mark_unloaded(entry: &mut ModelEntry) {
    for status in entry.versions.values_mut() {
        status.state = ModelState::Unavailable;
        status.reason = UNLOADED.into();
        status.model = None;
    }
    entry.explicit = false;
    entry.missing_step = None;
}

/// Makes an ensemble UNAVAILABLE while its step `step` is not loaded, in Triton's words; it
/// keeps what it needs to be planned again when the step comes back.
fn mark_missing_step(entry: &mut ModelEntry, step: &str) {
    let reason = format!(
        "ensemble contains models that are not available: {}",
        crate::namespace::shown(step)
    );
    for status in entry.versions.values_mut() {
        status.state = ModelState::Unavailable;
        status.reason = reason.clone();
        status.model = None;
    }
    entry.missing_step = Some(step.to_owned());
}

/// Models a configuration calls: its ensemble steps and its `tessera.depends_on` parameter.
fn dependencies(config: &ModelConfig) -> Vec<String> {
    let mut deps: Vec<String> = config::ensemble_scheduling(config)
        .map(|e| e.step.iter().map(|s| s.model_name.clone()).collect())
        .unwrap_or_default();
    if let Some(list) = config::string_parameter(config, DEPENDS_ON_PARAMETER) {
        deps.extend(
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        );
    }
    deps.sort();
    deps.dedup();
    deps
}

/// Holds the model-control lock; every change to what is loaded goes through here.
pub struct Control<'r> {
    repo: &'r Repository,
    poll_failures: tokio::sync::MutexGuard<'r, HashMap<String, Fingerprint>>,
}

/// How a load treats what it finds.
#[derive(Clone, Copy)]
struct LoadMode {
    /// Loaded on request, not only as a dependency.
    explicit: bool,
    /// A failure shows in the table (UNAVAILABLE with its reason) when nothing serves yet.
    record_failure: bool,
    /// Rebuild every version, even unchanged ones (an ensemble whose step changed).
    force: bool,
}

impl Control<'_> {
    /// Loads the models that serve from the start: the chosen repository models and every
    /// deployment of the store that was not unloaded. A model that fails is recorded and the
    /// others go on.
    pub async fn load_startup(&self, which: &StartupModels) -> Result<(), String> {
        let paths = self.repo.paths.clone();
        // An unreadable repository folder fails the start, as in Triton.
        tokio::task::spawn_blocking(move || discover(&paths))
            .await
            .map_err(|e| format!("reading the repository failed: {e}"))??;
        let store_loaded: BTreeSet<String> = self
            .repo
            .store
            .as_ref()
            .map(|s| {
                s.deployed()
                    .into_iter()
                    .filter(|(_, m)| m.loaded)
                    .map(|(n, _)| n)
                    .collect()
            })
            .unwrap_or_default();
        let available = self.repo.available();
        let mut names: Vec<String> = match which {
            StartupModels::All => available.keys().cloned().collect(),
            StartupModels::Named(names) => names.clone(),
        };
        names.extend(store_loaded.iter().cloned());
        // A damaged deployment shows UNAVAILABLE with its reason (`load` records it).
        if let Some(store) = &self.repo.store {
            names.extend(store.damaged().into_keys());
        }
        names.sort();
        names.dedup();
        for name in names {
            let loaded_by_store = store_loaded.contains(&name);
            // A deployment that was unloaded stays unloaded across restarts (unless named).
            if matches!(which, StartupModels::All)
                && !loaded_by_store
                && matches!(
                    available.get(&name),
                    Some(ModelSource {
                        origin: Origin::Store { .. },
                        ..
                    })
                )
            {
                continue;
            }
            if let Err(e) = self.load(&name, None).await {
                tracing::error!(model = %name, "{e}");
            }
        }
        Ok(())
    }

    /// Loads (or reloads) `name` from where it lives, with `config_override` replacing its
    /// `config.pbtxt` when given. Loading an unchanged model that serves does nothing.
    pub async fn load(
        &self,
        name: &str,
        config_override: Option<ModelConfig>,
    ) -> Result<LoadOutcome, ControlError> {
        let shown = crate::namespace::shown(name);
        if let Some(reason) = self.repo.store.as_ref().and_then(|s| s.damage(name)) {
            let message = format!("failed to load '{shown}': {reason}");
            if !self
                .repo
                .read()
                .get(name)
                .is_some_and(ModelEntry::has_ready)
            {
                let entry = ModelEntry {
                    origin: Origin::Store { revision: 0 },
                    ..Default::default()
                };
                self.repo.update(|t| {
                    t.insert(name.to_owned(), with_error(entry, &message));
                });
            }
            return Err(ControlError::Invalid(message));
        }
        let mut source = self.repo.source_of(name).ok_or_else(|| {
            ControlError::NotFound(format!(
                "failed to load '{shown}': no model directory '{shown}' in the model repositories or the store"
            ))
        })?;
        source.config_override = config_override.map(Arc::new);
        let mode = LoadMode {
            explicit: true,
            record_failure: true,
            force: false,
        };
        self.load_source(name.to_owned(), source, mode, Vec::new())
            .await
    }

    /// Builds `name` from `source` beside the live table, loading what it depends on first;
    /// nothing serves it until [`Control::publish`]. `None`: it already serves unchanged.
    pub async fn build(
        &self,
        name: &str,
        source: ModelSource,
    ) -> Result<Option<Candidate>, ControlError> {
        let mode = LoadMode {
            explicit: true,
            record_failure: false,
            force: false,
        };
        self.build_inner(name.to_owned(), source, mode, Vec::new())
            .await
    }

    fn load_source(
        &self,
        name: String,
        source: ModelSource,
        mode: LoadMode,
        visiting: Vec<String>,
    ) -> BoxFuture<'_, Result<LoadOutcome, ControlError>> {
        Box::pin(async move {
            match self.build_inner(name, source, mode, visiting).await? {
                Some(candidate) => {
                    self.publish(candidate).await?;
                    Ok(LoadOutcome::Loaded)
                }
                None => Ok(LoadOutcome::Unchanged),
            }
        })
    }

    async fn build_inner(
        &self,
        name: String,
        source: ModelSource,
        mode: LoadMode,
        mut visiting: Vec<String>,
    ) -> Result<Option<Candidate>, ControlError> {
        let repo = self.repo;
        let options = repo.options.clone();
        let (prepared_name, prepared_source) = (name.clone(), source.clone());
        let (mut entry, kind) = tokio::task::spawn_blocking(move || {
            prepare(&prepared_name, &prepared_source, &options)
        })
        .await
        .map_err(|e| {
            ControlError::Internal(format!(
                "reading '{}' failed: {e}",
                crate::namespace::shown(&name)
            ))
        })?;
        entry.explicit = mode.explicit;
        // A tenant's model calls names of its namespace.
        let namespace = crate::namespace::ModelKey::parse(&name).tenant;
        entry.dependencies = entry
            .dependencies
            .iter()
            .map(|dep| repo.resolve(namespace, dep))
            .collect();
        let live = repo.read().get(&name).cloned();
        let shown = crate::namespace::shown(&name).to_owned();
        let fail = |entry: ModelEntry, message: String| {
            if mode.record_failure && !live.as_ref().is_some_and(ModelEntry::has_ready) {
                repo.update(|t| {
                    t.insert(name.clone(), entry);
                });
            }
            Err(ControlError::Invalid(message))
        };
        let Some(kind) = kind else {
            let reason = entry.error.clone().unwrap_or_default();
            return fail(entry, format!("failed to load '{shown}': {reason}"));
        };
        // What it calls loads first, so an ensemble plans against it and a handler's
        // `initialize` can call it.
        visiting.push(name.clone());
        for dep in entry.dependencies.clone() {
            if repo.read().get(&dep).is_some_and(ModelEntry::has_ready) {
                continue;
            }
            if visiting.contains(&dep) {
                let message = format!(
                    "failed to load '{shown}': dependency cycle {} -> {}",
                    crate::namespace::shown_chain(visiting.iter().map(String::as_str)),
                    crate::namespace::shown(&dep)
                );
                return fail(with_error(entry, &message), message);
            }
            let Some(dep_source) = repo.source_of(&dep) else {
                let message = format!(
                    "failed to load '{shown}': it depends on '{}', which is in no model repository",
                    crate::namespace::shown(&dep)
                );
                return fail(with_error(entry, &message), message);
            };
            let dep_mode = LoadMode {
                explicit: false,
                record_failure: true,
                force: false,
            };
            if let Err(e) = self
                .load_source(dep.clone(), dep_source, dep_mode, visiting.clone())
                .await
            {
                let message = format!(
                    "failed to load '{shown}': it depends on '{}', which failed: {e}",
                    crate::namespace::shown(&dep)
                );
                return fail(with_error(entry, &message), message);
            }
        }
        if let Some(live) = &live
            && !mode.force
            && live.fingerprint == entry.fingerprint
            && live.source.config_override == entry.source.config_override
            && live.has_ready()
            && live.failures().is_empty()
        {
            if mode.explicit && !live.explicit {
                repo.update(|t| {
                    if let Some(e) = t.get_mut(&name) {
                        e.explicit = true;
                    }
                });
            }
            return Ok(None);
        }
        let entry = match self.complete_config(&name, entry, kind).await {
            Ok(entry) => entry,
            Err((entry, reason)) => {
                tracing::error!(model = name, "{reason}");
                let reason = without_paths(&reason, &entry.path);
                let message = format!("failed to load '{shown}': {reason}");
                return fail(with_error(entry, &reason), message);
            }
        };
        let reuse = if mode.force { None } else { live.as_ref() };
        let entry = repo.load_versions(&name, entry, kind, reuse).await;
        Ok(Some(Candidate {
            name,
            entry,
            record_failure: mode.record_failure,
        }))
    }

    /// The configuration as the model completes it (Triton's auto-complete: an ONNX file's
    /// signature, a handler's `auto_complete_config`), then checked: what this server does not
    /// do is refused, what it ignores is logged. The model speaks through its latest version.
    async fn complete_config(
        &self,
        name: &str,
        mut entry: ModelEntry,
        kind: BackendKind,
    ) -> Result<ModelEntry, (ModelEntry, String)> {
        let repo = self.repo;
        let Some(read) = entry.config.clone() else {
            return Ok(entry);
        };
        let mut config = ModelConfig::clone(&read);
        let latest = entry.versions.keys().next_back().copied();
        if !repo.options.strict_model_config
            && let Some(latest) = latest
        {
            let ctx = backend::CompletionContext {
                name: name.to_owned(),
                config: config.clone(),
                version_dir: entry.path.join(latest.to_string()),
            };
            match repo.backends.complete_config(kind, &ctx).await {
                Ok(Some(completed)) => config = completed,
                Ok(None) => {}
                Err(e) => return Err((entry, e.to_string())),
            }
        }
        if let Some(reason) = config::unsupported_settings(
            &config,
            matches!(
                kind,
                BackendKind::Wasm | BackendKind::Llm | BackendKind::Ensemble
            ),
        ) {
            return Err((entry, reason));
        }
        for ignored in config::ignored_settings(&config) {
            tracing::warn!(
                model = name,
                "'{ignored}' is accepted but not acted on by tessera"
            );
        }
        if let Err(e) = config::validate(&config) {
            return Err((entry, format!("invalid configuration: {e}")));
        }
        entry.config = Some(Arc::new(config));
        Ok(entry)
    }

    /// Swaps a built model in: new requests go to it, requests holding the old version finish
    /// there. A model that failed to load leaves what serves untouched and says why. Ensembles
    /// built on the model are planned again against it.
    pub fn publish(&self, candidate: Candidate) -> BoxFuture<'_, Result<(), ControlError>> {
        Box::pin(async move {
            let Candidate {
                name,
                entry,
                record_failure,
            } = candidate;
            let failures = entry.failures();
            let live_serves = self
                .repo
                .read()
                .get(&name)
                .is_some_and(ModelEntry::has_ready);
            if !failures.is_empty() {
                let message = format!(
                    "failed to load '{}': {}",
                    crate::namespace::shown(&name),
                    failures.join("; ")
                );
                if live_serves {
                    tracing::warn!(model = %name, "{message}; the serving version is unchanged");
                    return Err(ControlError::Invalid(format!(
                        "{message}; the serving version is unchanged"
                    )));
                }
                if record_failure {
                    self.repo.update(|t| {
                        t.insert(name.clone(), entry);
                    });
                }
                return Err(ControlError::Invalid(message));
            }
            self.repo.update(|t| {
                t.insert(name.clone(), entry);
            });
            tracing::info!(model = %name, "serving");
            let table = self.repo.read();
            // An ensemble waiting for its steps is planned again once none is missing: planning
            // loads missing steps, and one unloaded on request must stay unloaded.
            let missing = |e: &ModelEntry| {
                e.dependencies
                    .iter()
                    .find(|d| !table.get(d.as_str()).is_some_and(ModelEntry::has_ready))
                    .cloned()
            };
            let mut still_waiting = Vec::new();
            let dependents: Vec<(String, ModelEntry)> = table
                .iter()
                .filter(|(_, e)| {
                    e.kind == Some(BackendKind::Ensemble) && e.dependencies.contains(&name)
                })
                .filter(|(n, e)| match (&e.missing_step, e.has_ready()) {
                    (Some(_), _) => match missing(e) {
                        Some(step) => {
                            still_waiting.push(((*n).clone(), step));
                            false
                        }
                        None => true,
                    },
                    (None, ready) => ready,
                })
                .map(|(n, e)| (n.clone(), e.clone()))
                .collect();
            drop(table);
            if !still_waiting.is_empty() {
                self.repo.update(|t| {
                    for (ensemble, step) in &still_waiting {
                        if let Some(e) = t.get_mut(ensemble) {
                            mark_missing_step(e, step);
                        }
                    }
                });
            }
            for (dependent, e) in dependents {
                let mode = LoadMode {
                    explicit: e.explicit,
                    record_failure: false,
                    force: true,
                };
                if let Err(err) = self
                    .load_source(
                        dependent.clone(),
                        e.source.clone(),
                        mode,
                        vec![name.clone()],
                    )
                    .await
                {
                    tracing::warn!(model = %dependent, "re-planning after '{name}' changed: {err}");
                }
            }
            Ok(())
        })
    }

    /// The store revision of `name` that serves now, if a deployment of the store serves.
    pub fn serving_revision(&self, name: &str) -> Option<u64> {
        let table = self.repo.read();
        let entry = table.get(name).filter(|e| e.has_ready())?;
        match entry.origin {
            Origin::Store { revision } => Some(revision),
            _ => None,
        }
    }

    /// Unloads `name`: new requests find it UNAVAILABLE, queued ones finish. With
    /// `unload_dependents`, models that call it are unloaded too; without, ensembles that call it
    /// are UNAVAILABLE until it loads again (then they are planned again and serve), as in
    /// Triton. Models it called that were loaded only for it (not on request) are unloaded with
    /// it, as in Triton. Returns the models unloaded.
    pub fn unload<'a>(
        &'a self,
        name: &'a str,
        unload_dependents: bool,
    ) -> BoxFuture<'a, Result<Vec<String>, ControlError>> {
        Box::pin(async move {
            let Some(entry) = self.repo.read().get(name).cloned() else {
                return if self.repo.source_of(name).is_some() {
                    Ok(Vec::new())
                } else {
                    Err(ControlError::NotFound(format!(
                        "failed to unload '{shown}': no model '{shown}' in the model repositories or the store",
                        shown = crate::namespace::shown(name)
                    )))
                };
            };
            self.repo.update(|t| {
                if let Some(e) = t.get_mut(name) {
                    mark_unloaded(e);
                }
            });
            tracing::info!(model = name, "unloaded");
            let mut unloaded = vec![name.to_owned()];
            if unload_dependents {
                let dependents: Vec<String> = self
                    .repo
                    .read()
                    .iter()
                    .filter(|(_, e)| e.has_ready() && e.dependencies.iter().any(|d| d == name))
                    .map(|(n, _)| n.clone())
                    .collect();
                for d in dependents {
                    unloaded.extend(self.unload(&d, true).await?);
                }
            } else {
                self.hold_ensembles_missing(name);
            }
            for dep in &entry.dependencies {
                let table = self.repo.read();
                let still_needed = table
                    .iter()
                    .any(|(_, e)| e.has_ready() && e.dependencies.contains(dep));
                let implicit = table.get(dep).is_some_and(|e| e.has_ready() && !e.explicit);
                drop(table);
                if implicit && !still_needed {
                    unloaded.extend(self.unload(dep, false).await?);
                }
            }
            Ok(unloaded)
        })
    }

    /// Makes every ready ensemble that calls `step`, directly or through other ensembles,
    /// UNAVAILABLE until it loads again.
    fn hold_ensembles_missing(&self, step: &str) {
        let mut missing = vec![step.to_owned()];
        while let Some(step) = missing.pop() {
            self.repo.update(|t| {
                for (name, entry) in t.iter_mut() {
                    if entry.kind == Some(BackendKind::Ensemble)
                        && entry.has_ready()
                        && entry.dependencies.contains(&step)
                    {
                        tracing::warn!(
                            model = %name,
                            "unavailable until '{}' loads again",
                            crate::namespace::shown(&step)
                        );
                        mark_missing_step(entry, &step);
                        missing.push(name.clone());
                    }
                }
            });
        }
    }

    /// Forgets `name` entirely (a deleted tenant's model): unlike an unload, it no longer shows
    /// in the index. Requests holding its versions finish on them.
    pub fn forget(&self, name: &str) {
        self.repo.update(|t| {
            t.remove(name);
        });
    }

    /// Poll mode: picks up added, removed and changed models (and versions) in the repository
    /// folders and the store.
    pub async fn poll(&mut self) {
        let mut available = self.repo.available();
        if let Some(store) = &self.repo.store {
            available.retain(|name, source| {
                source.origin == Origin::Repository
                    || store.manifest(name).is_some_and(|m| m.loaded)
            });
        }
        let loaded: Vec<(String, ModelEntry)> = self
            .repo
            .read()
            .iter()
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect();
        for (name, entry) in &loaded {
            if !available.contains_key(name) && !entry.versions.is_empty() {
                tracing::info!(model = %name, "removed from the repository");
                self.repo.update(|t| {
                    t.remove(name);
                });
            }
        }
        for (name, source) in available {
            let (dir, config_override) = (source.dir.clone(), source.config_override.clone());
            let now =
                tokio::task::spawn_blocking(move || fingerprint(&dir, config_override.as_deref()))
                    .await
                    .ok()
                    .and_then(Result::ok);
            let same = self.repo.read().get(&name).is_some_and(|e| {
                now.as_ref() == Some(&e.fingerprint) && e.source.dir == source.dir
            });
            let failed_before = now.is_some() && self.poll_failures.get(&name) == now.as_ref();
            if same || failed_before {
                continue;
            }
            let mode = LoadMode {
                explicit: true,
                record_failure: true,
                force: false,
            };
            match self
                .load_source(name.clone(), source, mode, Vec::new())
                .await
            {
                Ok(_) => {
                    self.poll_failures.remove(&name);
                }
                Err(e) => {
                    tracing::error!(model = %name, "{e}");
                    if let Some(now) = now {
                        self.poll_failures.insert(name, now);
                    }
                }
            }
        }
    }
}

/// A reason as clients read it: paths inside the model directory shown relative to it, the
/// directory itself as "the model directory". Where the repository or the store lives is the
/// server's business (D9); the log line written beside each reason has the full text.
fn without_paths(message: &str, model_dir: &Path) -> String {
    let dir = model_dir.display().to_string();
    if dir.is_empty() {
        return message.to_owned();
    }
    message
        .replace(&format!("{dir}/"), "")
        .replace(&dir, "the model directory")
}

fn with_error(mut entry: ModelEntry, message: &str) -> ModelEntry {
    entry.error = Some(message.to_owned());
    entry.versions.clear();
    entry
}

/// Content hashes of a model directory (see [`Fingerprint`]); `config_override` stands in for
/// `config.pbtxt`.
fn fingerprint(dir: &Path, config_override: Option<&ModelConfig>) -> std::io::Result<Fingerprint> {
    let mut model = Sha256::new();
    let mut versions = BTreeMap::new();
    if let Some(config) = config_override {
        model.update(b"override\0");
        model.update(config::to_text(config).as_bytes());
    }
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if config_override.is_some() && name == "config.pbtxt" {
            continue;
        }
        match version_number(&name) {
            Some(v) if path.is_dir() => {
                let mut h = Sha256::new();
                hash_tree(&mut h, &path, Path::new(""))?;
                versions.insert(v, h.finalize().into());
            }
            _ => hash_entry(&mut model, &path, Path::new(&*name))?,
        }
    }
    Ok(Fingerprint {
        model: model.finalize().into(),
        versions,
    })
}

fn hash_tree(h: &mut Sha256, dir: &Path, relative: &Path) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        hash_entry(h, &entry.path(), &relative.join(entry.file_name()))?;
    }
    Ok(())
}

fn hash_entry(h: &mut Sha256, path: &Path, relative: &Path) -> std::io::Result<()> {
    if path.is_dir() {
        return hash_tree(h, path, relative);
    }
    h.update(relative.to_string_lossy().as_bytes());
    h.update([0]);
    let mut file = std::fs::File::open(path)?;
    h.update(file.metadata()?.len().to_le_bytes());
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        h.update(&buffer[..n]);
    }
    Ok(())
}

/// Model directories found in the repository paths (a name present twice is an error).
fn discover(paths: &[PathBuf]) -> Result<BTreeMap<String, PathBuf>, String> {
    let mut found = BTreeMap::new();
    for root in paths {
        let entries = std::fs::read_dir(root)
            .map_err(|e| format!("cannot read model repository {}: {e}", root.display()))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
                continue;
            };
            if !path.is_dir() || name.starts_with('.') {
                continue;
            }
            if let Some(previous) = found.insert(name.clone(), path.clone()) {
                return Err(format!(
                    "model '{name}' appears in two repositories: {} and {}",
                    previous.display(),
                    path.display()
                ));
            }
        }
    }
    Ok(found)
}

/// Reads a model's configuration, hashes its files and decides its versions; no backend work
/// yet, so the configuration is checked only once the backend has completed it
/// ([`Control::complete_config`]). Blocks (reads files).
fn prepare(
    name: &str,
    source: &ModelSource,
    options: &LoadOptions,
) -> (ModelEntry, Option<BackendKind>) {
    let path = source.dir.as_path();
    let mut entry = ModelEntry {
        path: path.to_owned(),
        origin: source.origin.clone(),
        source: source.clone(),
        ..Default::default()
    };
    let fail = |mut entry: ModelEntry, message: String| {
        tracing::error!(model = name, "{message}");
        entry.error = Some(without_paths(&message, path));
        (entry, None)
    };
    entry.fingerprint = match fingerprint(path, source.config_override.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %path.display(), "cannot read a model directory: {e}");
            return fail(
                entry,
                format!("cannot read {} ({})", path.display(), e.kind()),
            );
        }
    };
    let config_path = path.join("config.pbtxt");
    let mut config = if let Some(config) = &source.config_override {
        ModelConfig::clone(config)
    } else if config_path.exists() {
        match config::read(&config_path) {
            Ok(c) => c,
            Err(e) => return fail(entry, e.to_string()),
        }
    } else if let Origin::Store { revision } = source.origin {
        // Every deployment writes one: without it the revision was damaged on disk, and
        // serving it with an empty configuration would answer every request wrongly.
        return fail(
            entry,
            format!(
                "deployed revision {revision} has no config.pbtxt (the deployment store was damaged): deploy it again or roll it back"
            ),
        );
    } else if options.strict_model_config {
        return fail(
            entry,
            format!(
                "{} is missing (start with --strict-model-config=false to derive it from the model file)",
                config_path.display()
            ),
        );
    } else {
        ModelConfig::default()
    };
    // Before anything the configuration names is opened.
    if let Err(e) = config::check_file_names(&config) {
        return fail(entry, format!("invalid configuration: {e}"));
    }
    if config.name.is_empty() {
        config.name = name.to_owned();
    } else if config.name != name {
        return fail(
            entry,
            format!(
                "config name '{}' does not match the directory name '{}'",
                crate::namespace::shown(&config.name),
                crate::namespace::shown(name)
            ),
        );
    }
    let versions = match version_folders(path) {
        Ok(v) => v,
        Err(e) => return fail(entry, e),
    };
    if config.platform.is_empty() && config.backend.is_empty() && !options.strict_model_config {
        // Like Triton's auto-complete: the model file names the backend.
        let file = |f: &str| {
            versions
                .iter()
                .rev()
                .any(|v| path.join(v.to_string()).join(f).exists())
        };
        // Triton's default model file names; the ones tessera cannot serve still name their
        // backend, so the model is refused as "backend 'dali' is not supported", not as a config
        // without a backend.
        // A model.py speaks before the model.wasm `tessera build` made of it: its backend is
        // "python", as in Triton.
        let by_file: [(&str, &str, &str); 8] = [
            ("model.onnx", "onnxruntime_onnx", ""),
            ("model.py", "", "python"),
            ("model.wasm", "", "wasm"),
            ("model.plan", "tensorrt_plan", ""),
            ("model.pt", "pytorch_libtorch", ""),
            ("model.savedmodel", "tensorflow_savedmodel", ""),
            ("model.graphdef", "tensorflow_graphdef", ""),
            ("model.dali", "", "dali"),
        ];
        if let Some((_, platform, backend)) = by_file.iter().find(|(f, _, _)| file(f)) {
            config.platform = (*platform).into();
            config.backend = (*backend).into();
        }
    }
    let kind = match BackendKind::of(&config) {
        Ok(k) => k,
        Err(e) => return fail(entry, e),
    };
    let selected = match select_versions(&config, &versions) {
        Ok(v) => v,
        Err(e) => return fail(entry, e),
    };
    if kind == BackendKind::Onnx
        && options.strict_model_config
        && (config.input.is_empty() || config.output.is_empty())
    {
        return fail(
            entry,
            "--strict-model-config requires input and output in config.pbtxt (or start with --strict-model-config=false to derive them)".into(),
        );
    }
    entry.dependencies = dependencies(&config);
    entry.kind = Some(kind);
    entry.config = Some(Arc::new(config));
    for v in selected {
        entry.versions.insert(
            v,
            VersionStatus {
                state: ModelState::Loading,
                reason: String::new(),
                model: None,
            },
        );
    }
    if entry.versions.is_empty() {
        return fail(entry, "no version folder found (expected e.g. 1/)".into());
    }
    (entry, Some(kind))
}

/// The version a model subfolder's name stands for: a positive integer written plainly. `01` or
/// `+1` are not versions (a version's folder is found again by its number, `1/`).
pub fn version_number(name: &str) -> Option<i64> {
    name.parse::<i64>()
        .ok()
        .filter(|&v| v > 0 && v.to_string() == name)
}

/// Numeric subfolders of a model directory.
fn version_folders(path: &Path) -> Result<Vec<i64>, String> {
    let entries = std::fs::read_dir(path)
        .map_err(|e| format!("cannot read {} ({})", path.display(), e.kind()))?;
    let mut versions: Vec<i64> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| version_number(e.file_name().to_str()?))
        .collect();
    versions.sort_unstable();
    Ok(versions)
}

/// Applies `version_policy` (default: the latest one).
fn select_versions(config: &ModelConfig, available: &[i64]) -> Result<Vec<i64>, String> {
    use pb::model_version_policy::PolicyChoice;
    let latest = |n: usize| available[available.len().saturating_sub(n.max(1))..].to_vec();
    match config
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
    {
        None => Ok(latest(1)),
        Some(PolicyChoice::Latest(l)) => Ok(latest(l.num_versions as usize)),
        Some(PolicyChoice::All(_)) => Ok(available.to_vec()),
        Some(PolicyChoice::Specific(s)) => {
            let missing: Vec<i64> = s
                .versions
                .iter()
                .copied()
                .filter(|v| !available.contains(v))
                .collect();
            if missing.is_empty() {
                let mut v = s.versions.clone();
                v.sort_unstable();
                v.dedup();
                Ok(v)
            } else {
                Err(format!(
                    "version_policy names versions {missing:?} that have no folder"
                ))
            }
        }
    }
}

/// Reads the label files named by outputs (`label_filename`, one label per line).
fn read_labels(
    config: &ModelConfig,
    model_dir: &Path,
) -> Result<HashMap<String, Vec<String>>, String> {
    let mut labels = HashMap::new();
    for output in config
        .output
        .iter()
        .filter(|o| !o.label_filename.is_empty())
    {
        // `label_filename` stays inside the model's folder (config::check_file_names).
        let path = model_dir.join(&output.label_filename);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            tracing::warn!(path = %path.display(), "cannot read a label file: {e}");
            format!(
                "cannot read label file '{}' of output '{}' ({})",
                output.label_filename,
                output.name,
                e.kind()
            )
        })?;
        labels.insert(
            output.name.clone(),
            text.lines().map(str::to_owned).collect(),
        );
    }
    Ok(labels)
}

/// Pairs instances with the rate-limiter resources and priority of their instance group, on the
/// device of their slot (global resources on none).
fn executors(
    config: &ModelConfig,
    instances: Vec<(InstanceSlot, Box<dyn crate::backend::ModelInstance>)>,
    limiter: &RateLimiter,
) -> Result<Vec<Executor>, backend::LoadError> {
    let mut executors = Vec::with_capacity(instances.len());
    for (slot, instance) in instances {
        let limits = config
            .instance_group
            .get(slot.group)
            .and_then(|g| g.rate_limiter.as_ref());
        let need: Requirement = limits
            .map(|r| {
                r.resources
                    .iter()
                    .map(|res| {
                        let resource = if res.global {
                            Resource::global(&res.name)
                        } else {
                            Resource::on_device(&res.name, slot.resource_device())
                        };
                        (resource, res.count)
                    })
                    .collect()
            })
            .unwrap_or_default();
        limiter
            .register(&need)
            .map_err(backend::LoadError::invalid)?;
        let priority = limits.map_or(0, |r| r.priority);
        executors.push(Executor {
            instance,
            share: Share::new(need, priority),
        });
    }
    Ok(executors)
}

impl Repository {
    /// An ensemble with a decoupled step is decoupled itself (as in Triton, whose TensorRT-LLM
    /// `ensemble` streams without saying so): it answers a stream with one response per
    /// response of that step, and its configuration says so.
    fn with_inherited_decoupling(
        &self,
        name: &str,
        kind: BackendKind,
        mut config: ModelConfig,
    ) -> ModelConfig {
        let decoupled = config
            .model_transaction_policy
            .as_ref()
            .is_some_and(|p| p.decoupled);
        if kind == BackendKind::Ensemble
            && !decoupled
            && let Some(inference) = self.inference.upgrade()
            && crate::backend::ensemble::has_decoupled_step(name, &config, inference.as_ref())
        {
            config.model_transaction_policy = Some(pb::ModelTransactionPolicy { decoupled: true });
        }
        config
    }

    /// Loads each selected version of a prepared model; a version whose configuration and files
    /// equal those of a READY version in `reuse` (the live entry) is carried over as it is.
    async fn load_versions(
        &self,
        name: &str,
        mut entry: ModelEntry,
        kind: BackendKind,
        reuse: Option<&ModelEntry>,
    ) -> ModelEntry {
        let Some(config) = entry.config.clone() else {
            return entry;
        };
        // Where the instances go depends on this server's GPUs; the placed configuration is the
        // one the model serves with and reports.
        let config = match self.backends.place(kind, &config) {
            Ok(placed) => Arc::new(self.with_inherited_decoupling(name, kind, placed)),
            Err(e) => {
                tracing::error!(model = name, "UNAVAILABLE: {e}");
                for status in entry.versions.values_mut() {
                    status.state = ModelState::Unavailable;
                    status.reason = e.to_string();
                }
                return entry;
            }
        };
        entry.config = Some(config.clone());
        let limiter = &self.limiter;
        let (labels_config, labels_dir) = (config.clone(), entry.path.clone());
        let labels =
            match tokio::task::spawn_blocking(move || read_labels(&labels_config, &labels_dir))
                .await
                .unwrap_or_else(|e| Err(format!("reading labels failed: {e}")))
            {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(model = name, "UNAVAILABLE: {e}");
                    let reason = without_paths(&e, &entry.path);
                    for status in entry.versions.values_mut() {
                        status.state = ModelState::Unavailable;
                        status.reason.clone_from(&reason);
                    }
                    return entry;
                }
            };
        let fingerprint = entry.fingerprint.clone();
        for (&version, status) in entry.versions.iter_mut() {
            let unchanged = reuse.and_then(|live| {
                let same = live.fingerprint.model == fingerprint.model
                    && live.source.config_override == entry.source.config_override
                    && live.fingerprint.versions.get(&version)
                        == fingerprint.versions.get(&version);
                let serving = live.versions.get(&version)?;
                (same && serving.state == ModelState::Ready).then(|| serving.clone())
            });
            if let Some(serving) = unchanged {
                tracing::debug!(model = name, version, "unchanged; kept as it serves");
                *status = serving;
                continue;
            }
            let ctx = LoadContext {
                name: name.to_owned(),
                version,
                config: config.clone(),
                model_dir: entry.path.clone(),
                version_dir: entry.path.join(version.to_string()),
                instances: crate::device::placement::slots(&config),
                devices: self.backends.devices().clone(),
                inference: self.inference.clone(),
            };
            let loaded = self
                .backends
                .load_instances(kind, &ctx)
                .await
                .and_then(|instances| executors(&config, instances, limiter));
            let loaded = loaded.and_then(|executors| {
                let sequencer =
                    crate::sequence::Sequencer::of(name, &config, ctx.instances.len(), &entry.path)
                        .map_err(crate::backend::LoadError::invalid)?;
                Ok((executors, sequencer))
            });
            match loaded {
                Ok((executors, sequencer)) => {
                    let max_rows = usize::try_from(config.max_batch_size).unwrap_or(0);
                    let stats = Arc::new(ModelStats::new(max_rows, self.options.latency_summaries));
                    let scheduler = Scheduler::start(
                        BatchPolicy::from_config(&config)
                            .with_default_max_queue_size(self.options.default_max_queue_size),
                        executors,
                        stats.clone(),
                        limiter.clone(),
                    );
                    let model = ModelVersion::new(
                        name.to_owned(),
                        version,
                        kind,
                        config.clone(),
                        labels.clone(),
                        scheduler,
                        stats,
                    )
                    .with_sequencer(sequencer);
                    if let Err(e) = crate::warmup::run(&model, &entry.path).await {
                        tracing::error!(model = name, version, "UNAVAILABLE: {e}");
                        *status = VersionStatus {
                            state: ModelState::Unavailable,
                            reason: without_paths(&e, &entry.path),
                            model: None,
                        };
                        continue;
                    }
                    tracing::info!(model = name, version, "READY");
                    *status = VersionStatus {
                        state: ModelState::Ready,
                        reason: String::new(),
                        model: Some(Arc::new(model)),
                    };
                }
                Err(e) => {
                    tracing::error!(model = name, version, "UNAVAILABLE: {e}");
                    *status = VersionStatus {
                        state: ModelState::Unavailable,
                        reason: without_paths(&e.to_string(), &entry.path),
                        model: None,
                    };
                }
            }
        }
        entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plainly_written_positive_numbers_name_versions() {
        assert_eq!(version_number("1"), Some(1));
        assert_eq!(version_number("12"), Some(12));
        for name in ["01", "+1", "0", "-1", "1.0", " 1", "x"] {
            assert_eq!(version_number(name), None, "{name}");
        }
    }

    #[test]
    fn reasons_show_paths_relative_to_the_model_directory() {
        let dir = Path::new("/srv/store/models/m/3");
        assert_eq!(
            without_paths(
                "cannot read label file /srv/store/models/m/3/labels.txt: gone",
                dir
            ),
            "cannot read label file labels.txt: gone"
        );
        assert_eq!(
            without_paths("cannot read /srv/store/models/m/3: gone", dir),
            "cannot read the model directory: gone"
        );
    }

    /// An instance that is never asked to execute here.
    struct Idle;

    impl crate::backend::ModelInstance for Idle {
        fn execute(
            &mut self,
            _batch: Vec<crate::infer::Call>,
        ) -> BoxFuture<'_, crate::backend::Executed> {
            Box::pin(async {
                crate::backend::Executed {
                    results: Vec::new(),
                    timing: Default::default(),
                }
            })
        }
    }

    /// Each instance needs its group's resources on its own GPU (CPU instances on device 0),
    /// and global resources on none.
    #[test]
    fn instances_need_resources_on_their_own_device() {
        let config = config::parse(
            r#"instance_group [
                 { kind: KIND_GPU gpus: [0, 1] rate_limiter { resources [
                     { name: "R" count: 1 }, { name: "G" global: true count: 2 } ] } },
                 { kind: KIND_CPU rate_limiter { resources [{ name: "R" count: 3 }] } } ]"#,
            "c",
        )
        .expect("parses");
        let slots = crate::device::placement::slots(&config);
        let instances: Vec<(InstanceSlot, Box<dyn crate::backend::ModelInstance>)> = slots
            .into_iter()
            .map(|slot| {
                (
                    slot,
                    Box::new(Idle) as Box<dyn crate::backend::ModelInstance>,
                )
            })
            .collect();
        let limiter = RateLimiter::new(true, &[]);
        let needs: Vec<Requirement> = executors(&config, instances, &limiter)
            .expect("registers")
            .into_iter()
            .map(|e| e.share.need)
            .collect();
        assert_eq!(
            needs,
            vec![
                vec![(Resource::on_device("R", 0), 1), (Resource::global("G"), 2)],
                vec![(Resource::on_device("R", 1), 1), (Resource::global("G"), 2)],
                vec![(Resource::on_device("R", 0), 3)],
            ]
        );
    }

    fn policy(text: &str) -> ModelConfig {
        config::parse(text, "c").expect("parses")
    }

    #[test]
    fn version_policies() {
        let available = [1, 2, 5];
        assert_eq!(select_versions(&policy(""), &available), Ok(vec![5]));
        assert_eq!(
            select_versions(
                &policy("version_policy { latest { num_versions: 2 } }"),
                &available
            ),
            Ok(vec![2, 5])
        );
        assert_eq!(
            select_versions(&policy("version_policy { all { } }"), &available),
            Ok(vec![1, 2, 5])
        );
        assert_eq!(
            select_versions(
                &policy("version_policy { specific { versions: [1, 5] } }"),
                &available
            ),
            Ok(vec![1, 5])
        );
        assert!(
            select_versions(
                &policy("version_policy { specific { versions: 3 } }"),
                &available
            )
            .is_err()
        );
    }
}
