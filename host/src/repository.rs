//! The model repository: Triton's on-disk layout, version policies, and each version's state.
//!
//! ```text
//! <repository>/<model>/config.pbtxt
//! <repository>/<model>/<label files>
//! <repository>/<model>/<version>/model.onnx | model.wasm   (version: a positive integer)
//! ```
//!
//! Every model version has a state; a model that fails to load is UNAVAILABLE with its reason
//! and never keeps the others from serving.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use arc_swap::ArcSwap;

use crate::backend::{self, Backends, LoadContext};
use crate::config::{self, BackendKind, ModelConfig, model_file, pb};
use crate::infer::{InferError, Inference};
use crate::metrics::ModelStats;
use crate::model::ModelVersion;
use crate::scheduler::rate_limit::{RateLimiter, Requirement, Share};
use crate::scheduler::{BatchPolicy, Executor, Scheduler};

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

/// A model directory and what became of it.
#[derive(Clone, Default)]
pub struct ModelEntry {
    pub path: PathBuf,
    /// Set when the configuration itself could not be used: no version loads then.
    pub error: Option<String>,
    pub config: Option<Arc<ModelConfig>>,
    pub versions: BTreeMap<i64, VersionStatus>,
}

/// One row of the repository index.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexRow {
    pub name: String,
    /// Empty when the model failed before any version was known.
    pub version: String,
    pub state: ModelState,
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

/// Every model and what became of it, by name: an immutable snapshot.
type ModelTable = BTreeMap<String, ModelEntry>;

/// All models of all repository paths.
pub struct Repository {
    paths: Vec<PathBuf>,
    /// Read without locking by every request; changed only by building a new table beside the
    /// live one and swapping it in, so a request sees one consistent table (and a reload can
    /// replace a model while requests run).
    table: ArcSwap<ModelTable>,
    /// Serializes the writers, so no change is lost between copying the table and swapping it.
    writer: Mutex<()>,
    /// What loads a model of each kind.
    backends: Backends,
    /// Shared by every instance that names rate-limiter resources.
    limiter: Arc<RateLimiter>,
    /// The request path, for models that call other models.
    inference: Weak<dyn Inference>,
    latency_summaries: bool,
    default_max_queue_size: usize,
}

impl Repository {
    pub fn new(
        paths: Vec<PathBuf>,
        backends: Backends,
        limiter: Arc<RateLimiter>,
        inference: Weak<dyn Inference>,
        options: &LoadOptions,
    ) -> Repository {
        Repository {
            paths,
            table: ArcSwap::from_pointee(ModelTable::new()),
            writer: Mutex::new(()),
            backends,
            limiter,
            inference,
            latency_summaries: options.latency_summaries,
            default_max_queue_size: options.default_max_queue_size,
        }
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

    /// Loads every model. Ensembles load last, as they refer to the others.
    pub async fn load_all(&self, options: &LoadOptions) -> Result<(), String> {
        // Reading directories and configs (and ONNX files, for auto-complete) blocks.
        let (paths, options) = (self.paths.clone(), options.clone());
        let mut prepared: Vec<(String, ModelEntry, Option<BackendKind>)> =
            tokio::task::spawn_blocking(move || {
                discover(&paths).map(|found| {
                    found
                        .into_iter()
                        .map(|(name, path)| {
                            let (entry, kind) = prepare(&name, &path, &options);
                            (name, entry, kind)
                        })
                        .collect()
                })
            })
            .await
            .map_err(|e| format!("reading the repository failed: {e}"))??;
        let depths = ensemble_depths(&prepared);
        // Plain models first, then ensembles, each after the ensembles it uses as steps.
        prepared.sort_by_key(|(name, _, _)| depths.get(name).copied().unwrap_or(0));
        for (name, entry, kind) in prepared {
            self.update(|t| {
                t.insert(name.clone(), entry.clone());
            });
            let Some(kind) = kind else { continue };
            let loaded = self.load_versions(&name, entry, kind).await;
            self.update(|t| {
                t.insert(name, loaded);
            });
        }
        Ok(())
    }

    /// The version that should answer a request: the given one, or the newest READY one.
    pub fn ready_model(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> Result<Arc<ModelVersion>, InferError> {
        let models = self.read();
        let Some(entry) = models.get(name) else {
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

    /// Every model and version with its state.
    pub fn index(&self) -> Vec<IndexRow> {
        let mut rows = Vec::new();
        for (name, entry) in self.read().iter() {
            if entry.versions.is_empty() {
                rows.push(IndexRow {
                    name: name.clone(),
                    version: String::new(),
                    state: ModelState::Unavailable,
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
                    state: status.state,
                    reason: status.reason.clone(),
                });
            }
        }
        rows
    }

    /// Every READY model version.
    pub fn ready_versions(&self) -> Vec<Arc<ModelVersion>> {
        self.read()
            .values()
            .flat_map(|e| e.versions.values().filter_map(|s| s.model.clone()))
            .collect()
    }

    /// True when every version of every model is READY (Triton's strict readiness).
    pub fn all_ready(&self) -> bool {
        self.index().iter().all(|r| r.state == ModelState::Ready)
    }

    /// Drops every model: their schedulers finish what is queued, then stop.
    pub fn unload_all(&self) {
        self.update(|models| {
            for entry in models.values_mut() {
                for status in entry.versions.values_mut() {
                    status.state = ModelState::Unavailable;
                    status.reason = "unloaded".into();
                    status.model = None;
                }
            }
        });
    }
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

/// How deep each ensemble nests: 1 for an ensemble of plain models, 1 + the deepest step for an
/// ensemble of ensembles. Plain models are absent (depth 0). A cycle stops the count; the plan
/// check at load time reports it.
fn ensemble_depths(
    prepared: &[(String, ModelEntry, Option<BackendKind>)],
) -> HashMap<String, usize> {
    let steps: HashMap<&str, Vec<&str>> = prepared
        .iter()
        .filter(|(_, _, kind)| *kind == Some(BackendKind::Ensemble))
        .filter_map(|(name, entry, _)| {
            let config = entry.config.as_deref()?;
            let steps = config::ensemble_scheduling(config)?
                .step
                .iter()
                .map(|s| s.model_name.as_str())
                .collect();
            Some((name.as_str(), steps))
        })
        .collect();
    fn depth<'a>(
        name: &'a str,
        steps: &HashMap<&'a str, Vec<&'a str>>,
        seen: &mut Vec<&'a str>,
    ) -> usize {
        let Some(children) = steps.get(name) else {
            return 0;
        };
        if seen.contains(&name) {
            return 0;
        }
        seen.push(name);
        let d = 1 + children
            .iter()
            .map(|c| depth(c, steps, seen))
            .max()
            .unwrap_or(0);
        seen.pop();
        d
    }
    steps
        .keys()
        .map(|&name| (name.to_owned(), depth(name, &steps, &mut Vec::new())))
        .collect()
}

/// Reads a model's configuration and decides its versions; no backend work yet.
fn prepare(name: &str, path: &Path, options: &LoadOptions) -> (ModelEntry, Option<BackendKind>) {
    let mut entry = ModelEntry {
        path: path.to_owned(),
        ..Default::default()
    };
    let fail = |mut entry: ModelEntry, message: String| {
        tracing::error!(model = name, "{message}");
        entry.error = Some(message);
        (entry, None)
    };
    let config_path = path.join("config.pbtxt");
    let mut config = if config_path.exists() {
        match config::read(&config_path) {
            Ok(c) => c,
            Err(e) => return fail(entry, e.to_string()),
        }
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
    if config.name.is_empty() {
        config.name = name.to_owned();
    } else if config.name != name {
        return fail(
            entry,
            format!(
                "config name '{}' does not match the directory name '{name}'",
                config.name
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
        let by_file: [(&str, &str, &str); 8] = [
            ("model.onnx", "onnxruntime_onnx", ""),
            ("model.wasm", "", "wasm"),
            ("model.plan", "tensorrt_plan", ""),
            ("model.pt", "pytorch_libtorch", ""),
            ("model.savedmodel", "tensorflow_savedmodel", ""),
            ("model.graphdef", "tensorflow_graphdef", ""),
            ("model.dali", "", "dali"),
            ("model.py", "", "python"),
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
    if kind == BackendKind::Onnx
        && !options.strict_model_config
        && let Some(&latest) = selected.last()
    {
        let file = model_file(&config, &path.join(latest.to_string()), "model.onnx");
        match backend::onnx::signature(&file) {
            Ok(signature) => {
                let filled = config::autocomplete(&mut config, &signature);
                if !filled.is_empty() {
                    tracing::info!(model = name, fields = ?filled, "auto-completed configuration from the model file");
                }
            }
            Err(e) => return fail(entry, e.to_string()),
        }
    }
    for ignored in config::ignored_settings(&config) {
        tracing::warn!(
            model = name,
            "'{ignored}' is accepted but not acted on by tessera"
        );
    }
    if let Err(e) = config::validate(&config) {
        return fail(entry, format!("invalid configuration: {e}"));
    }
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

/// Numeric subfolders of a model directory.
fn version_folders(path: &Path) -> Result<Vec<i64>, String> {
    let entries =
        std::fs::read_dir(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut versions: Vec<i64> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str()?.parse::<i64>().ok())
        .filter(|&v| v > 0)
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
        let path = model_dir.join(&output.label_filename);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read label file {}: {e}", path.display()))?;
        labels.insert(
            output.name.clone(),
            text.lines().map(str::to_owned).collect(),
        );
    }
    Ok(labels)
}

/// Pairs instances with the rate-limiter resources and priority of their instance group
/// (instances are created group by group, `count` each).
fn executors(
    config: &ModelConfig,
    instances: Vec<Box<dyn crate::backend::ModelInstance>>,
    limiter: &RateLimiter,
) -> Result<Vec<Executor>, backend::LoadError> {
    let mut shares: Vec<Share> = Vec::new();
    for group in &config.instance_group {
        let need: Requirement = group
            .rate_limiter
            .as_ref()
            .map(|r| {
                r.resources
                    .iter()
                    .map(|res| (res.name.clone(), res.count))
                    .collect()
            })
            .unwrap_or_default();
        limiter
            .register(&need)
            .map_err(backend::LoadError::invalid)?;
        let priority = group.rate_limiter.as_ref().map_or(0, |r| r.priority);
        shares.extend(std::iter::repeat_n(
            Share::new(need, priority),
            usize::try_from(group.count.max(1)).unwrap_or(1),
        ));
    }
    Ok(instances
        .into_iter()
        .enumerate()
        .map(|(i, instance)| Executor {
            instance,
            share: shares.get(i).cloned().unwrap_or_default(),
        })
        .collect())
}

impl Repository {
    /// Loads each selected version of a prepared model.
    async fn load_versions(
        &self,
        name: &str,
        mut entry: ModelEntry,
        kind: BackendKind,
    ) -> ModelEntry {
        let Some(config) = entry.config.clone() else {
            return entry;
        };
        let limiter = &self.limiter;
        let labels = match read_labels(&config, &entry.path) {
            Ok(l) => l,
            Err(e) => {
                for status in entry.versions.values_mut() {
                    status.state = ModelState::Unavailable;
                    status.reason.clone_from(&e);
                }
                return entry;
            }
        };
        for (&version, status) in entry.versions.iter_mut() {
            let ctx = LoadContext {
                name: name.to_owned(),
                version,
                config: config.clone(),
                model_dir: entry.path.clone(),
                version_dir: entry.path.join(version.to_string()),
                inference: self.inference.clone(),
            };
            let loaded = self
                .backends
                .load_instances(kind, &ctx)
                .await
                .and_then(|instances| executors(&config, instances, limiter));
            match loaded {
                Ok(executors) => {
                    let max_rows = usize::try_from(config.max_batch_size).unwrap_or(0);
                    let stats = Arc::new(ModelStats::new(max_rows, self.latency_summaries));
                    let scheduler = Scheduler::start(
                        BatchPolicy::from_config(&config)
                            .with_default_max_queue_size(self.default_max_queue_size),
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
                    );
                    if let Err(e) = crate::warmup::run(&model, &entry.path).await {
                        tracing::error!(model = name, version, "UNAVAILABLE: {e}");
                        *status = VersionStatus {
                            state: ModelState::Unavailable,
                            reason: e,
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
                        reason: e.to_string(),
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
