//! The deployment store: models deployed through the API, kept on disk so that an acknowledged
//! deployment survives a crash and a restart.
//!
//! ```text
//! <store>/models/<model>/manifest.json   which revision serves, whether it is loaded, history
//! <store>/models/<model>/<revision>/     a Triton model directory (config.pbtxt, 1/model.wasm…)
//! <store>/functions/<function>/...       the same for functions (function.wasm, function.toml)
//! <store>/tmp/                           deployments being written; emptied at start
//! <store>/tenants.json                    tenants, key hashes, quotas, grants (`tenants.rs`)
//! <store>/tenants/<tenant>/models/...     a tenant's deployments, laid out as above
//! ```
//!
//! Deployments are named by key (`crate::namespace`): `m` for the operator's, `tenant/m` for a
//! tenant's, which lives under `tenants/<tenant>/`.
//!
//! One [`Store`] value handles one area (`models` or `functions`).
//!
//! Its methods block on the disk (fsync); callers run them off the async workers.
//!
//! Crash safety comes from the order of the steps, each made durable before the next:
//! a deployment is written under `tmp/` and fsynced, renamed to `models/<model>/<revision>/`
//! (the rename and the directory fsynced), and only then named in the manifest, which is replaced
//! atomically (temporary file, fsync, rename, fsync of the directory). A revision directory is
//! immutable once renamed in. A model's first deployment writes an empty manifest before its
//! first revision is renamed in, so every model folder the store made has a manifest. On start,
//! `tmp/` is emptied and revision directories the manifest does not name (a crash between the
//! rename and the manifest) are removed, so after a SIGKILL at any moment each model is at its
//! previous revision or at the new one, never torn.
//!
//! Only what provably never was acknowledged is removed. A manifest that cannot be read (empty,
//! truncated, wrong-typed, a directory in its place) or a model folder whose manifest is missing
//! is *damaged*: nothing of it is touched, start-up goes on, and the deployment is reported
//! UNAVAILABLE with the reason ([`Store::damaged`]) until an operator repairs it. Deploying it
//! again or rolling it back rebuilds the manifest from the revisions on disk (the damaged file is
//! kept beside it as `manifest.json.damaged-<time>`).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

pub mod shared;

/// How many revisions of a model are kept (the serving one included), so `rollback` has
/// somewhere to go without the store growing forever.
pub const KEPT_REVISIONS: usize = 5;

const MANIFEST: &str = "manifest.json";

/// The longest file name and path a deployment may hold (Linux's NAME_MAX, and a path well
/// within PATH_MAX once under the store).
const MAX_NAME_BYTES: usize = 255;
const MAX_PATH_BYTES: usize = 1024;

/// Where tenants' deployments live, one folder per tenant.
pub const TENANTS_DIR: &str = "tenants";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the deployment store at {path} failed: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    /// (what: "model" or "function", its key)
    #[error("{} '{}' has no deployed revision", .0, crate::namespace::shown(.1))]
    NotDeployed(&'static str, String),
    #[error("{} '{}' has no earlier revision to roll back to", .0, crate::namespace::shown(.1))]
    NoEarlierRevision(&'static str, String),
}

impl StoreError {
    /// The error as a client may read it: a disk failure names neither the store's path nor the
    /// operating system's words (both go to the log, where [`StoreError`]'s own text has them).
    pub fn for_client(&self) -> String {
        match self {
            StoreError::Io { source, .. } => format!(
                "the deployment store failed: {} (details in the server log)",
                source.kind()
            ),
            other => other.to_string(),
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What the store remembers of one model.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    /// The revision that serves.
    pub current: u64,
    /// False after an unload: the model stays deployed but does not load at start.
    pub loaded: bool,
    /// Kept revisions, oldest first.
    pub revisions: Vec<Revision>,
    /// With a shared store (`crate::store::shared`): the generation of the shared manifest this
    /// replica has applied; 0 otherwise.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Revision {
    pub revision: u64,
    /// Content hash of the revision's files, as the repository computes it.
    pub sha256: String,
    /// Seconds since the Unix epoch.
    pub deployed_at: u64,
}

/// A deployment written under `tmp/`, not yet part of the store; removed when dropped uncommitted.
pub struct Staged {
    pub name: String,
    pub dir: PathBuf,
    committed: bool,
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

pub struct Store {
    root: PathBuf,
    /// `models` or `functions`: the folder under `root` this store keeps.
    area: &'static str,
    /// Manifests, as on disk. Writers hold the lock across the disk write, so memory and disk
    /// never disagree.
    manifests: Mutex<BTreeMap<String, Manifest>>,
    /// Deployments whose manifest could not be read at start, with the reason; left untouched
    /// on disk until a deploy or a rollback rebuilds their manifest.
    damaged: Mutex<BTreeMap<String, String>>,
    /// The store every replica shares, when this one is a replica's cache of it.
    shared: Option<crate::store::shared::SharedArea>,
    /// Held while open: one server per store directory (see [`lock_area`]).
    _lock: File,
}

/// A model name usable as a directory name and in a URL: 1-128 characters of letters, digits,
/// `_`, `-` and `.`, not starting with `.`.
pub fn check_model_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "invalid model name '{}': use 1-128 letters, digits, '_', '-' or '.', not starting with '.'",
            name.escape_debug()
        )))
    }
}

/// A key: a name, or `tenant/name` (both parts checked as names).
pub fn check_key(key: &str) -> Result<(), StoreError> {
    let key = crate::namespace::ModelKey::parse(key);
    match key.tenant {
        Some(tenant) => check_model_name(tenant).and_then(|()| check_model_name(key.name)),
        None => check_model_name(key.name),
    }
}

/// A file path inside a model directory: relative, only normal components, no hidden ones.
pub fn check_relative_path(path: &str) -> Result<PathBuf, StoreError> {
    let parsed = Path::new(path);
    // A trailing '/' names a directory, and NUL ends a path for the OS: neither is a file name.
    let fine = !path.is_empty()
        && !path.contains(['\\', '\0'])
        && !path.ends_with('/')
        && path.len() <= MAX_PATH_BYTES
        && parsed.components().all(|c| match c {
            Component::Normal(part) => part
                .to_str()
                .is_some_and(|p| !p.starts_with('.') && p.len() <= MAX_NAME_BYTES),
            _ => false,
        });
    if fine {
        Ok(parsed.to_owned())
    } else {
        Err(StoreError::Invalid(format!(
            "invalid file path '{}': a relative path inside the model directory, without '..' or hidden names, of at most {MAX_PATH_BYTES} bytes with names of at most {MAX_NAME_BYTES}",
            tessera_core::infer::bounded(&path.escape_debug().to_string(), 300)
        )))
    }
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` and makes them durable (the directory entry is synced by the caller).
fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let mut file = File::create(path).map_err(io(path))?;
    file.write_all(bytes).map_err(io(path))?;
    file.sync_all().map_err(io(path))
}

/// The bytes of the files under `dir` (0 where it cannot be read).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// Replaces `path` with `bytes` atomically and durably: a temporary file beside it, fsync,
/// rename, fsync of the directory. A crash leaves the old file or the new one.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let dir = path
        .parent()
        .ok_or_else(|| StoreError::Invalid(format!("{} has no folder", path.display())))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{}.tmp", name.unwrap_or_default()));
    write_durably(&tmp, bytes)?;
    fs::rename(&tmp, path).map_err(io(path))?;
    sync_dir(dir)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Store {
    /// Opens (creating it if needed) the store at `root`, and removes what a crash left behind.
    /// `with_tenants`: tenants' deployments too (a server without tenancy leaves them on disk,
    /// unloaded: nobody could call them).
    pub fn open(root: &Path, area: &'static str, with_tenants: bool) -> Result<Store, StoreError> {
        create_private_dir(root)?;
        refuse_shared_layout(root)?;
        let lock = lock_area(root, area)?;
        let models = root.join(area);
        let tmp = root.join("tmp");
        create_private_dir(&tmp)?;
        // Staged deployments of this area a crash left behind (the other area's are its own).
        let prefix = format!("{area}.");
        for entry in fs::read_dir(&tmp).map_err(io(&tmp))? {
            let entry = entry.map_err(io(&tmp))?;
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let path = entry.path();
                fs::remove_dir_all(&path).map_err(io(&path))?;
            }
        }
        create_private_dir(&models)?;
        let mut manifests = BTreeMap::new();
        let mut damaged = BTreeMap::new();
        scan_area(&models, None, &mut manifests, &mut damaged)?;
        let tenants = root.join(TENANTS_DIR);
        if with_tenants && tenants.is_dir() {
            for entry in fs::read_dir(&tenants).map_err(io(&tenants))? {
                let entry = entry.map_err(io(&tenants))?;
                let area_dir = entry.path().join(area);
                if let Some(tenant) = entry.file_name().to_str()
                    && check_model_name(tenant).is_ok()
                    && area_dir.is_dir()
                {
                    scan_area(&area_dir, Some(tenant), &mut manifests, &mut damaged)?;
                }
            }
        }
        sync_dir(&models)?;
        Ok(Store {
            root: root.to_owned(),
            area,
            manifests: Mutex::new(manifests),
            damaged: Mutex::new(damaged),
            shared: None,
            _lock: lock,
        })
    }

    /// What this store holds, in the singular, for messages: "model" or "function".
    pub fn what(&self) -> &'static str {
        if self.area == "functions" {
            "function"
        } else {
            "model"
        }
    }

    /// Makes this store a replica's cache of `shared`.
    pub fn with_shared(mut self, shared: crate::store::shared::SharedArea) -> Store {
        self.shared = Some(shared);
        self
    }

    /// The shared store this one caches, if any.
    pub fn shared(&self) -> Option<&crate::store::shared::SharedArea> {
        self.shared.as_ref()
    }

    /// Deployments whose manifest is damaged or missing, with the reason (see the module doc).
    pub fn damaged(&self) -> BTreeMap<String, String> {
        self.damaged_lock().clone()
    }

    /// Why `name` cannot serve from the store, if its manifest is damaged.
    pub fn damage(&self, name: &str) -> Option<String> {
        self.damaged_lock().get(name).cloned()
    }

    fn damaged_lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.damaged.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The revisions of `name` on disk, oldest first (what a damaged manifest is rebuilt from).
    fn revisions_on_disk(&self, name: &str) -> Vec<u64> {
        revisions_in(&self.model_dir(name))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn manifests(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Manifest>> {
        self.manifests.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn model_dir(&self, key: &str) -> PathBuf {
        let key = crate::namespace::ModelKey::parse(key);
        match key.tenant {
            Some(tenant) => self
                .root
                .join(TENANTS_DIR)
                .join(tenant)
                .join(self.area)
                .join(key.name),
            None => self.root.join(self.area).join(key.name),
        }
    }

    /// How many deployments `tenant` has in this area, and the bytes of their serving
    /// revisions, leaving out `except` (the one being replaced).
    pub fn usage(&self, tenant: &str, except: &str) -> (usize, u64) {
        let prefix = crate::namespace::ModelKey::tenant_prefix(tenant);
        let keys: Vec<(String, u64)> = self
            .manifests()
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix) && k.as_str() != except)
            .map(|(k, m)| (k.clone(), m.current))
            .collect();
        let bytes = keys
            .iter()
            .map(|(k, r)| dir_bytes(&self.revision_dir(k, *r)))
            .sum();
        (keys.len(), bytes)
    }

    /// Forgets every deployment of `tenant` in this area and removes their folder.
    pub fn remove_tenant(&self, tenant: &str) -> Result<(), StoreError> {
        let prefix = crate::namespace::ModelKey::tenant_prefix(tenant);
        let mut manifests = self.manifests();
        manifests.retain(|k, _| !k.starts_with(&prefix));
        let dir = self.root.join(TENANTS_DIR).join(tenant).join(self.area);
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&dir)(e)),
            _ => Ok(()),
        }
    }

    /// Every deployed model with its manifest.
    pub fn deployed(&self) -> BTreeMap<String, Manifest> {
        self.manifests().clone()
    }

    pub fn manifest(&self, name: &str) -> Option<Manifest> {
        self.manifests().get(name).cloned()
    }

    /// The directory of the revision that serves `name`.
    pub fn current_dir(&self, name: &str) -> Option<(PathBuf, u64)> {
        let manifests = self.manifests();
        let m = manifests.get(name)?;
        Some((self.revision_dir(name, m.current), m.current))
    }

    pub fn revision_dir(&self, name: &str, revision: u64) -> PathBuf {
        self.model_dir(name).join(revision.to_string())
    }

    /// Writes a deployment's folder (`files`, paths already checked) under `tmp/`, durably.
    /// Nothing of it is visible until [`Store::commit`].
    pub fn stage(
        &self,
        name: &str,
        files: &[(PathBuf, bytes::Bytes)],
    ) -> Result<Staged, StoreError> {
        check_key(name)?;
        let nonce: u64 = rand_nonce();
        let dir = self.root.join("tmp").join(format!(
            "{}.{}.{nonce:016x}",
            self.area,
            // A file name, so the tenant and the name are joined by a character no name holds.
            match crate::namespace::ModelKey::parse(name) {
                crate::namespace::ModelKey {
                    tenant: Some(tenant),
                    name,
                } => format!("{tenant}~{name}"),
                key => key.name.to_owned(),
            }
        ));
        let staged = Staged {
            name: name.to_owned(),
            dir: dir.clone(),
            committed: false,
        };
        fs::create_dir(&dir).map_err(io(&dir))?;
        let mut dirs = vec![dir.clone()];
        for (relative, bytes) in files {
            let path = dir.join(relative);
            if let Some(parent) = path.parent()
                && !parent.exists()
            {
                fs::create_dir_all(parent).map_err(io(parent))?;
                let mut at = parent.to_owned();
                while at != dir {
                    dirs.push(at.clone());
                    at.pop();
                }
            }
            write_durably(&path, bytes)?;
        }
        dirs.sort();
        dirs.dedup();
        for d in dirs.iter().rev() {
            sync_dir(d)?;
        }
        Ok(staged)
    }

    /// Moves a staged deployment into the store as the model's next revision, durably; the
    /// manifest does not name it yet ([`Store::publish`] does), so a crash now forgets it.
    pub fn commit(&self, staged: Staged) -> Result<(u64, PathBuf), StoreError> {
        self.commit_as(staged, None)
    }

    /// [`Store::commit`], as revision `number` when given (a replica takes the shared store's
    /// numbering); a folder of that number that the manifest does not name is a leftover of a
    /// deployment that did not complete, and is replaced.
    pub fn commit_as(
        &self,
        mut staged: Staged,
        number: Option<u64>,
    ) -> Result<(u64, PathBuf), StoreError> {
        let model_dir = self.model_dir(&staged.name);
        if !model_dir.exists() {
            // Every folder created on the way (a tenant's first deployment creates three) is
            // made durable in its parent.
            let mut created = vec![model_dir.clone()];
            while let Some(parent) = created.last().and_then(|d| d.parent())
                && !parent.exists()
            {
                created.push(parent.to_owned());
            }
            fs::create_dir_all(&model_dir).map_err(io(&model_dir))?;
            for dir in created.iter().rev() {
                if let Some(parent) = dir.parent() {
                    sync_dir(parent)?;
                }
            }
        }
        let manifest_path = model_dir.join(MANIFEST);
        if !self.manifests().contains_key(&staged.name)
            && self.damage(&staged.name).is_none()
            && !manifest_path.exists()
        {
            // A first deployment: an empty manifest before any revision, so that a model folder
            // without one is never a normal state and start-up can tell a first deployment that
            // did not complete (empty manifest: removed) from a lost manifest (kept).
            self.write_manifest(&staged.name, &Manifest::default())?;
        }
        let next = if let Some(number) = number {
            let target = model_dir.join(number.to_string());
            let named = self
                .manifests()
                .get(&staged.name)
                .is_some_and(|m| m.revisions.iter().any(|r| r.revision == number));
            if named {
                return Err(StoreError::Invalid(format!(
                    "revision {number} of '{}' is already in this replica's cache",
                    crate::namespace::shown(&staged.name)
                )));
            }
            if fs::symlink_metadata(&target).is_ok() {
                fs::remove_dir_all(&target).map_err(io(&target))?;
            }
            number
        } else {
            let manifests = self.manifests();
            let in_manifest = manifests
                .get(&staged.name)
                .and_then(|m| m.revisions.iter().map(|r| r.revision).max())
                .unwrap_or(0);
            // Past every revision on disk too: one committed but not yet published is still
            // loading.
            let on_disk = fs::read_dir(&model_dir)
                .map_err(io(&model_dir))?
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
                .max()
                .unwrap_or(0);
            in_manifest.max(on_disk) + 1
        };
        let target = model_dir.join(next.to_string());
        fs::rename(&staged.dir, &target).map_err(io(&target))?;
        staged.committed = true;
        sync_dir(&model_dir)?;
        sync_dir(&self.root.join("tmp"))?;
        Ok((next, target))
    }

    /// Makes `revision` the one that serves `name` (durably), and forgets revisions beyond
    /// [`KEPT_REVISIONS`].
    pub fn publish(&self, name: &str, revision: u64, sha256: &str) -> Result<(), StoreError> {
        self.publish_generation(name, revision, sha256, 0, true)
    }

    /// [`Store::publish`], recording the shared manifest's `generation` it applies and whether
    /// the deployment is loaded there.
    pub fn publish_generation(
        &self,
        name: &str,
        revision: u64,
        sha256: &str,
        generation: u64,
        loaded: bool,
    ) -> Result<(), StoreError> {
        let mut manifests = self.manifests();
        let repairing = self.damage(name).is_some();
        let mut manifest = if repairing {
            self.rebuilt_manifest(name)?
        } else {
            manifests.get(name).cloned().unwrap_or_default()
        };
        if !manifest.revisions.iter().any(|r| r.revision == revision) {
            manifest.revisions.push(Revision {
                revision,
                sha256: sha256.to_owned(),
                deployed_at: now_unix(),
            });
        }
        manifest.current = revision;
        manifest.loaded = loaded;
        manifest.generation = generation;
        let mut dropped = Vec::new();
        while manifest.revisions.len() > KEPT_REVISIONS {
            let Some(oldest) = manifest
                .revisions
                .iter()
                .position(|r| r.revision != manifest.current)
            else {
                break;
            };
            dropped.push(manifest.revisions.remove(oldest).revision);
        }
        self.write_manifest(name, &manifest)?;
        manifests.insert(name.to_owned(), manifest);
        drop(manifests);
        if repairing {
            self.damaged_lock().remove(name);
            tracing::warn!(
                model = name,
                revision,
                "the damaged manifest was rebuilt from the revisions on disk"
            );
        }
        // Removed after the manifest no longer names them; a crash in between leaves directories
        // that the next start removes.
        for revision in dropped {
            let dir = self.revision_dir(name, revision);
            if let Err(e) = fs::remove_dir_all(&dir) {
                tracing::warn!(
                    model = name,
                    "cannot remove old revision {}: {e}",
                    dir.display()
                );
            }
        }
        Ok(())
    }

    /// Records whether `name` loads at start.
    pub fn set_loaded(&self, name: &str, loaded: bool) -> Result<(), StoreError> {
        self.set_loaded_generation(name, loaded, None)
    }

    /// [`Store::set_loaded`], recording the shared manifest's `generation` it applies.
    pub fn set_loaded_generation(
        &self,
        name: &str,
        loaded: bool,
        generation: Option<u64>,
    ) -> Result<(), StoreError> {
        let mut manifests = self.manifests();
        let Some(manifest) = manifests.get(name) else {
            return Ok(());
        };
        let generation = generation.unwrap_or(manifest.generation);
        if manifest.loaded == loaded && manifest.generation == generation {
            return Ok(());
        }
        let mut manifest = manifest.clone();
        manifest.loaded = loaded;
        manifest.generation = generation;
        self.write_manifest(name, &manifest)?;
        manifests.insert(name.to_owned(), manifest);
        Ok(())
    }

    /// The revision before the serving one.
    /// For a damaged deployment, the newest revision on disk: rolling it back rebuilds its
    /// manifest and serves that revision.
    pub fn previous(&self, name: &str) -> Result<(u64, PathBuf, String), StoreError> {
        if self.damage(name).is_some() {
            let newest = self
                .revisions_on_disk(name)
                .last()
                .copied()
                .ok_or_else(|| StoreError::NoEarlierRevision(self.what(), name.to_owned()))?;
            return Ok((newest, self.revision_dir(name, newest), String::new()));
        }
        let manifests = self.manifests();
        let manifest = manifests
            .get(name)
            .ok_or_else(|| StoreError::NotDeployed(self.what(), name.to_owned()))?;
        let previous = manifest
            .revisions
            .iter()
            .filter(|r| r.revision < manifest.current)
            .max_by_key(|r| r.revision)
            .ok_or_else(|| StoreError::NoEarlierRevision(self.what(), name.to_owned()))?;
        Ok((
            previous.revision,
            self.revision_dir(name, previous.revision),
            previous.sha256.clone(),
        ))
    }

    /// Removes a committed revision that never served (its load failed).
    pub fn discard(&self, name: &str, revision: u64) {
        let named = self
            .manifests()
            .get(name)
            .is_some_and(|m| m.revisions.iter().any(|r| r.revision == revision));
        if named {
            return;
        }
        let dir = self.revision_dir(name, revision);
        if let Err(e) = fs::remove_dir_all(&dir) {
            tracing::warn!(model = name, "cannot remove {}: {e}", dir.display());
        }
        let model_dir = self.model_dir(name);
        if !self.manifests().contains_key(name)
            && self.damage(name).is_none()
            && revisions_in(&model_dir).is_empty()
        {
            // A first deployment that failed: its empty manifest goes with it.
            let _ = fs::remove_file(model_dir.join(MANIFEST));
            let _ = fs::remove_dir(&model_dir);
        }
    }

    /// A manifest for a damaged deployment, from the revisions on disk (their hashes unknown),
    /// with the damaged file kept beside it for inspection.
    fn rebuilt_manifest(&self, name: &str) -> Result<Manifest, StoreError> {
        let path = self.model_dir(name).join(MANIFEST);
        if fs::symlink_metadata(&path).is_ok() {
            let aside = path.with_extension(format!("json.damaged-{}", now_unix()));
            fs::rename(&path, &aside).map_err(io(&path))?;
            tracing::warn!(
                model = name,
                "kept the damaged manifest as {}",
                aside.display()
            );
        }
        let revisions = self
            .revisions_on_disk(name)
            .into_iter()
            .map(|revision| Revision {
                revision,
                sha256: String::new(),
                deployed_at: 0,
            })
            .collect();
        Ok(Manifest {
            current: 0,
            loaded: true,
            revisions,
            generation: 0,
        })
    }

    fn write_manifest(&self, name: &str, manifest: &Manifest) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(manifest).map_err(|e| {
            StoreError::Invalid(format!(
                "manifest of '{}': {e}",
                crate::namespace::shown(name)
            ))
        })?;
        replace_file(&self.model_dir(name).join(MANIFEST), &bytes)
    }
}

/// The numbered revision directories in a model folder, oldest first.
fn revisions_in(dir: &Path) -> Vec<u64> {
    let mut revisions: Vec<u64> = fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
                .collect()
        })
        .unwrap_or_default();
    revisions.sort_unstable();
    revisions
}

/// What start-up finds of one model folder's manifest.
enum Found {
    Manifest(Manifest),
    /// No manifest file.
    Missing,
    /// The empty manifest a first deployment writes before its revision: that deployment never
    /// completed.
    Empty,
    /// It cannot be read or parsed: why.
    Damaged(String),
}

fn read_manifest(path: &Path) -> Found {
    match fs::read(path) {
        Ok(bytes) => match serde_json::from_slice::<Manifest>(&bytes) {
            Ok(m) if m.revisions.is_empty() && m.current == 0 => Found::Empty,
            Ok(m) if !m.revisions.iter().any(|r| r.revision == m.current) => {
                Found::Damaged(format!(
                    "its manifest names revision {} but does not keep it",
                    m.current
                ))
            }
            Ok(m) => Found::Manifest(m),
            Err(e) => Found::Damaged(format!("its manifest cannot be parsed ({e})")),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Found::Missing,
        Err(e) => Found::Damaged(format!("its manifest cannot be read ({})", e.kind())),
    }
}

/// Reads the manifests of one area folder (`models/` or a tenant's), removing what a crash left
/// that provably never was acknowledged, and recording damaged deployments untouched.
/// A shared store on a directory (`--store file://DIR`) keeps `<area>/manifests/` and
/// `<area>/revisions/` of objects; a server's own store would take them for the folders of
/// first deployments that never completed, and remove them.
fn refuse_shared_layout(root: &Path) -> Result<(), StoreError> {
    for area in ["models", "functions"] {
        for kind in ["manifests", "revisions"] {
            let dir = root.join(area).join(kind);
            if dir.is_dir() && !dir.join(MANIFEST).exists() && revisions_in(&dir).is_empty() {
                return Err(StoreError::Invalid(format!(
                    "{} holds a shared store (its {area}/{kind}/ is no deployment): start with --store file://{} to serve it as a replica",
                    root.display(),
                    root.display()
                )));
            }
        }
    }
    Ok(())
}

/// Whether `dir` holds only what a first deployment that never completed leaves: nothing, its
/// empty manifest, the manifest's temporary file, revision folders. Anything else is not ours
/// to remove.
fn only_debris(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().all(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(kind) = entry.file_type() else {
            return false;
        };
        if kind.is_dir() {
            name.parse::<u64>().is_ok()
        } else {
            kind.is_file() && (name == MANIFEST || name == format!(".{MANIFEST}.tmp"))
        }
    })
}

fn scan_area(
    models: &Path,
    tenant: Option<&str>,
    manifests: &mut BTreeMap<String, Manifest>,
    damaged: &mut BTreeMap<String, String>,
) -> Result<(), StoreError> {
    for entry in fs::read_dir(models).map_err(io(models))? {
        let entry = entry.map_err(io(models))?;
        let dir = entry.path();
        let Some(file_name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if check_model_name(&file_name).is_err() || !dir.is_dir() {
            continue;
        }
        let name = crate::namespace::ModelKey::new(tenant, &file_name).key();
        let revisions = revisions_in(&dir);
        let found = read_manifest(&dir.join(MANIFEST));
        // An empty manifest, or none and no revision: a first deployment that never completed.
        let first_not_completed = match found {
            Found::Empty => true,
            Found::Missing => revisions.is_empty(),
            _ => false,
        };
        let manifest = match found {
            Found::Manifest(m) => m,
            _ if first_not_completed && only_debris(&dir) => {
                tracing::info!(model = %name, "removing {} (a first deployment that was not completed)", dir.display());
                fs::remove_dir_all(&dir).map_err(io(&dir))?;
                continue;
            }
            Found::Empty => {
                tracing::error!(model = %name, folder = %dir.display(), "the deployment store holds a folder that is no deployment (an empty manifest beside other files); left alone");
                continue;
            }
            Found::Missing if first_not_completed => {
                tracing::error!(model = %name, folder = %dir.display(), "the deployment store holds a folder that is no deployment (no manifest, no revision, other files); left alone");
                continue;
            }
            Found::Missing => {
                let reason = format!(
                    "the deployment store has revisions {revisions:?} of it but no manifest naming the one that serves; nothing was removed: deploy it again or roll it back to serve the newest"
                );
                tracing::error!(model = %name, folder = %dir.display(), "{reason}");
                damaged.insert(name, reason);
                continue;
            }
            Found::Damaged(why) => {
                let reason = format!(
                    "the deployment store cannot serve it: {why}; its revisions {revisions:?} are kept: deploy it again or roll it back to serve the newest"
                );
                tracing::error!(model = %name, folder = %dir.display(), "{reason}");
                damaged.insert(name, reason);
                continue;
            }
        };
        // Revisions the manifest does not name were committed but never published, so never
        // acknowledged; so is the manifest's own temporary file. Anything else is left alone.
        for revision in revisions {
            if !manifest.revisions.iter().any(|r| r.revision == revision) {
                let path = dir.join(revision.to_string());
                tracing::info!(model = %name, "removing {} (a deployment that was not completed)", path.display());
                fs::remove_dir_all(&path).map_err(io(&path))?;
            }
        }
        let _ = fs::remove_file(dir.join(format!(".{MANIFEST}.tmp")));
        manifests.insert(name, manifest);
    }
    sync_dir(models)
}

/// Takes `<root>/.<area>.lock` for as long as the store is open: two servers on one store
/// directory would remove each other's deployments in flight at start and overwrite each other's
/// manifests. Replicas share a store through `--store s3://…` or `file://…` instead
/// (`crate::store::shared`). An advisory lock: it ends with the process, also on SIGKILL.
pub fn lock_area(root: &Path, area: &str) -> Result<File, StoreError> {
    use std::os::fd::AsRawFd;
    let path = root.join(format!(".{area}.lock"));
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io(&path))?;
    // SAFETY: flock on a descriptor this function owns; no memory is involved.
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if !taken {
        return Err(StoreError::Invalid(format!(
            "the deployment store {} is in use by another server: one server per store directory; replicas share one store with --store s3://bucket/prefix or --store file:///shared/dir",
            root.display()
        )));
    }
    Ok(file)
}

/// A name for a staging directory that no other deployment in flight uses.
fn rand_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store root that does not exist yet, in a folder removed when the guard drops.
    fn scratch() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("a scratch folder");
        let root = dir.path().join("store");
        (dir, root)
    }

    #[test]
    fn names_and_paths_are_checked() {
        for bad in ["", ".hidden", "a/b", "..", "a b", "x\n", &"n".repeat(129)] {
            assert!(check_model_name(bad).is_err(), "{bad:?}");
        }
        for good in ["add_sub", "m-1.v2", "A"] {
            assert!(check_model_name(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "1/../../x",
            "1/.git",
            "a\\b",
            "./1/x",
            "1/model.wasm/",
            "1/mo\0del.wasm",
        ] {
            assert!(check_relative_path(bad).is_err(), "{bad:?}");
        }
        assert!(check_relative_path("1/model.wasm").is_ok());
    }

    #[test]
    fn deploy_publish_rollback_and_recover() {
        let (_scratch, root) = scratch();
        let store = Store::open(&root, "models", false).expect("opens");
        let files = [(
            PathBuf::from("1/model.wasm"),
            bytes::Bytes::from_static(b"v1"),
        )];
        let staged = store.stage("m", &files).expect("stages");
        let (r1, dir1) = store.commit(staged).expect("commits");
        assert_eq!(fs::read(dir1.join("1/model.wasm")).expect("written"), b"v1");
        store.publish("m", r1, "h1").expect("publishes");
        for n in 2..=7u8 {
            let files = [(PathBuf::from("1/model.wasm"), bytes::Bytes::from(vec![n]))];
            let (r, _) = store
                .commit(store.stage("m", &files).expect("stages"))
                .expect("commits");
            store.publish("m", r, &format!("h{n}")).expect("publishes");
        }
        let m = store.manifest("m").expect("deployed");
        assert_eq!(m.current, 7);
        assert_eq!(m.revisions.len(), KEPT_REVISIONS);
        assert!(!store.revision_dir("m", 1).exists(), "old revisions go");
        assert_eq!(store.previous("m").expect("has one").0, 6);

        // A crash after a commit, before publish: the next start forgets it, and empties tmp.
        let (_, orphan_dir) = store
            .commit(store.stage("m", &[]).expect("stages"))
            .expect("commits");
        let half = store.stage("m", &[]).expect("stages");
        std::mem::forget(half);
        drop(store);
        let store = Store::open(&root, "models", false).expect("reopens");
        assert!(!orphan_dir.exists());
        assert_eq!(
            fs::read_dir(root.join("tmp")).expect("tmp").count(),
            0,
            "tmp is emptied"
        );
        assert_eq!(store.manifest("m").expect("kept").current, 7);
        let (next, _) = store
            .commit(store.stage("m", &[]).expect("stages"))
            .expect("commits");
        assert_eq!(next, 8, "after the newest published revision");
    }

    #[test]
    fn a_shared_stores_directory_is_refused_and_left_as_it_is() {
        // `--store DIR` on the directory replicas share as `--store file://DIR`: its
        // manifests/ and revisions/ look like first deployments that never completed.
        let (_scratch, root) = scratch();
        let manifest = root.join("models/manifests/m/00000000000000000001.json");
        let revision = root.join("models/revisions/m/abc/1/model.wasm");
        for file in [&manifest, &revision] {
            fs::create_dir_all(file.parent().expect("a folder")).expect("makes folders");
            fs::write(file, b"acknowledged").expect("writes");
        }
        let Err(refused) = Store::open(&root, "models", false) else {
            panic!("a shared store's directory is refused");
        };
        assert!(refused.to_string().contains("--store file://"), "{refused}");
        assert!(manifest.exists() && revision.exists(), "nothing removed");
    }

    #[test]
    fn a_folder_that_is_no_deployment_is_left_alone_and_debris_is_removed() {
        let (_scratch, root) = scratch();
        let notes = root.join("models/notes/README.txt");
        fs::create_dir_all(notes.parent().expect("a folder")).expect("makes folders");
        fs::write(&notes, b"mine").expect("writes");
        let debris = root.join("models/half");
        fs::create_dir_all(&debris).expect("makes a folder");
        fs::write(debris.join(format!(".{MANIFEST}.tmp")), b"{").expect("writes");
        let store = Store::open(&root, "models", false).expect("opens");
        assert!(notes.exists(), "another's files are kept");
        assert!(store.manifest("notes").is_none());
        assert!(
            !debris.exists(),
            "an incomplete first deployment is removed"
        );
    }

    /// Two published revisions of `m` in a fresh store at `root`.
    fn deployed_twice(root: &Path) -> Store {
        let store = Store::open(root, "models", false).expect("opens");
        for n in 1..=2u8 {
            let files = [(PathBuf::from("1/model.wasm"), bytes::Bytes::from(vec![n]))];
            let (r, _) = store
                .commit(store.stage("m", &files).expect("stages"))
                .expect("commits");
            store.publish("m", r, &format!("h{n}")).expect("publishes");
        }
        store
    }

    #[test]
    fn a_damaged_manifest_is_reported_and_kept_not_fatal() {
        type Damage = (&'static str, fn(&Path));
        let damage: [Damage; 4] = [
            ("empty", |p| fs::write(p, b"").expect("writes")),
            ("truncated", |p| {
                let text = fs::read(p).expect("reads");
                fs::write(p, &text[..text.len() / 2]).expect("writes")
            }),
            ("wrong-typed", |p| {
                fs::write(p, br#"{"current": "two", "loaded": 1, "revisions": {}}"#)
                    .expect("writes")
            }),
            ("a directory", |p| {
                fs::remove_file(p).expect("removes");
                fs::create_dir(p).expect("makes a directory")
            }),
        ];
        for (what, break_it) in damage {
            let (_scratch, root) = scratch();
            drop(deployed_twice(&root));
            let manifest = root.join("models/m").join(MANIFEST);
            break_it(&manifest);
            let store =
                Store::open(&root, "models", false).expect("a damaged manifest is not fatal");
            assert!(store.manifest("m").is_none(), "{what}");
            let reason = store
                .damage("m")
                .unwrap_or_else(|| panic!("{what}: not reported"));
            assert!(reason.contains("[1, 2]"), "{what}: {reason}");
            for r in [1, 2] {
                assert!(
                    store.revision_dir("m", r).exists(),
                    "{what}: revision {r} kept"
                );
            }
            // A rollback serves the newest revision on disk and rebuilds the manifest.
            let (newest, _, _) = store.previous("m").expect("newest on disk");
            assert_eq!(newest, 2, "{what}");
            store.publish("m", newest, "").expect("repairs");
            assert!(store.damage("m").is_none(), "{what}");
            drop(store);
            let store = Store::open(&root, "models", false).expect("reopens");
            let m = store.manifest("m").expect("repaired");
            assert_eq!((m.current, m.revisions.len()), (2, 2), "{what}");
            assert_eq!(store.previous("m").expect("an earlier one").0, 1, "{what}");
            let aside = fs::read_dir(root.join("models/m"))
                .expect("lists")
                .flatten()
                .any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("manifest.json.damaged-")
                });
            assert!(aside, "{what}: the damaged manifest is kept beside");
        }
    }

    #[test]
    fn a_missing_manifest_keeps_acknowledged_revisions() {
        let (_scratch, root) = scratch();
        drop(deployed_twice(&root));
        fs::remove_file(root.join("models/m").join(MANIFEST)).expect("removes");
        let store = Store::open(&root, "models", false).expect("opens");
        assert!(store.damage("m").is_some_and(|r| r.contains("no manifest")));
        assert!(store.revision_dir("m", 1).exists() && store.revision_dir("m", 2).exists());
        // Deploying again repairs it, after the revisions on disk.
        let (next, _) = store
            .commit(store.stage("m", &[]).expect("stages"))
            .expect("commits");
        assert_eq!(next, 3);
        store.publish("m", next, "h3").expect("publishes");
        let m = store.manifest("m").expect("repaired");
        assert_eq!(
            m.revisions.iter().map(|r| r.revision).collect::<Vec<_>>(),
            [1, 2, 3]
        );
    }

    #[test]
    fn a_first_deployment_that_never_completed_is_removed() {
        let (_scratch, root) = scratch();
        let store = Store::open(&root, "models", false).expect("opens");
        // A crash after the commit of a first deployment, before its publish.
        let (_, dir) = store
            .commit(store.stage("m", &[]).expect("stages"))
            .expect("commits");
        assert!(dir.exists());
        drop(store);
        let store = Store::open(&root, "models", false).expect("reopens");
        assert!(store.damage("m").is_none() && store.manifest("m").is_none());
        assert!(
            !root.join("models/m").exists(),
            "never acknowledged: removed"
        );
        // A failed first deployment leaves nothing either.
        let (r, _) = store
            .commit(store.stage("n", &[]).expect("stages"))
            .expect("commits");
        store.discard("n", r);
        assert!(!root.join("models/n").exists());
    }

    #[test]
    fn one_server_per_store_directory() {
        let (_tmp, root) = scratch();
        let first = Store::open(&root, "models", false).expect("opens");
        let second = Store::open(&root, "models", false);
        assert!(
            matches!(&second, Err(StoreError::Invalid(m)) if m.contains("in use by another server")),
            "{:?}",
            second.err()
        );
        // The other area is a lock of its own; closing the first frees its lock.
        Store::open(&root, "functions", false).expect("the functions area opens");
        drop(first);
        Store::open(&root, "models", false).expect("opens once the first is closed");
    }

    #[test]
    fn long_file_names_are_refused_before_the_disk() {
        let long = "a".repeat(256);
        assert!(check_relative_path(&format!("1/{long}")).is_err());
        assert!(check_relative_path(&"a/".repeat(600)).is_err());
        assert!(check_relative_path(&"a".repeat(255)).is_ok());
        let e = StoreError::Io {
            path: PathBuf::from("/srv/secret/store"),
            source: std::io::Error::from_raw_os_error(libc::ENAMETOOLONG),
        };
        let shown = e.for_client();
        assert!(
            !shown.contains("/srv") && !shown.contains("File name too long"),
            "{shown}"
        );
    }
}
