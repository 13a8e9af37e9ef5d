//! The shared deployment store: one store for many replicas, on object storage (`s3://…`,
//! `az://…`) or on a shared directory (`file:///mnt/nfs/…`), all through the `object_store`
//! crate.
//!
//! ```text
//! <prefix>/<area>/manifests/<key>/<generation>.json   immutable; the highest generation is the state
//! <prefix>/<area>/revisions/<key>/<content>/<file>    a revision's files, by their content hash
//!
//! <prefix>/tenants/registry/<generation>.json         the tenant registry, generations as above
//! <prefix>/tenants/secret                            the key-hashing secret, created once
//! ```
//!
//! `<area>` is `models` or `functions`; `<key>` is `o/<name>` for the operator's deployments and
//! `t/<tenant>/<name>` for a tenant's, so that no name can pass for another.
//!
//! **Why generations, not one manifest replaced in place.** Every change (deploy, rollback, load,
//! unload) writes the next generation with a create-only put (`If-None-Match: *` on S3, a hard
//! link on a directory). Two replicas changing one deployment at once both try to create the same
//! generation: exactly one succeeds, the other is told so (a 409 for its client) and nothing it
//! wrote is named anywhere. Create-only needs nothing beyond what every S3-compatible server and
//! a POSIX directory provide (`object_store`'s local store has no compare-and-swap update), a
//! manifest is never torn (objects appear whole), and a replica finds every change in one LIST.
//!
//! Revisions are stored by content hash, so the files of a deploy that loses the race are
//! harmless and two replicas uploading the same content write the same objects. A replica
//! verifies the hash of what it downloads before it serves it.
//!
//! The replica's own copy (the cache) is a [`crate::store::Store`]: it serves from there, so a
//! replica that starts while the shared store is unreachable serves what it has cached.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Manifest generations kept per deployment (older ones are deleted by the writer).
const KEPT_GENERATIONS: u64 = 16;

/// How long a revision's files stay after they were last written, whether or not a manifest
/// names them: an upload is published (or re-uploaded, which writes the files again) well within
/// it, and a lagging replica has fetched what it read.
pub const CONTENT_GRACE: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum SharedStoreError {
    /// Another replica changed the deployment between our read and our write.
    #[error(
        "'{}' was changed by another replica at the same time (generation {generation} is taken); nothing of this request was published: read its state and retry",
        crate::namespace::shown(.key)
    )]
    Conflict { key: String, generation: u64 },
    #[error("the shared deployment store is unreachable or failed: {0}")]
    Unavailable(#[from] object_store::Error),
    #[error("the shared deployment store holds something unreadable: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Invalid(String),
}

/// One deployment's state, as every replica reads it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SharedManifest {
    pub generation: u64,
    /// The revision that serves (0: none yet).
    pub current: u64,
    /// False after an unload.
    pub loaded: bool,
    /// Kept revisions, oldest first.
    pub revisions: Vec<SharedRevision>,
    /// Which replica wrote this generation (for the log).
    #[serde(default)]
    pub written_by: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SharedRevision {
    pub revision: u64,
    /// [`content_hash`] of the files.
    pub content: String,
    /// The files' paths, relative to the revision.
    pub files: Vec<String>,
    /// Seconds since the Unix epoch.
    pub deployed_at: u64,
}

impl SharedManifest {
    pub fn revision(&self, revision: u64) -> Option<&SharedRevision> {
        self.revisions.iter().find(|r| r.revision == revision)
    }

    /// The revision a new deployment gets.
    pub fn next_revision(&self) -> u64 {
        self.revisions
            .iter()
            .map(|r| r.revision)
            .max()
            .unwrap_or(0)
            .max(self.current)
            + 1
    }

    /// The revision before the serving one.
    pub fn previous(&self) -> Option<&SharedRevision> {
        self.revisions
            .iter()
            .filter(|r| r.revision < self.current)
            .max_by_key(|r| r.revision)
    }
}

/// The content hash of a revision's files: SHA-256 over each path and its bytes, in path order.
pub fn content_hash(files: &[(PathBuf, Bytes)]) -> String {
    let mut sorted: Vec<&(PathBuf, Bytes)> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut hasher = Sha256::new();
    for (path, bytes) in sorted {
        let path = path.to_string_lossy();
        hasher.update((path.len() as u64).to_le_bytes());
        hasher.update(path.as_bytes());
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    }
    hex::encode(hasher.finalize())
}

/// The shared store, for one area (`models` or `functions`).
#[derive(Clone)]
pub struct SharedArea {
    store: Arc<SharedStore>,
    area: &'static str,
    /// [`CONTENT_GRACE`], shorter in tests.
    content_grace: Duration,
}

pub struct SharedStore {
    objects: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    /// Shown in logs and in the manifests this replica writes.
    replica: String,
    url: String,
}

impl SharedStore {
    /// Opens the store a `--store` URL names: `s3://bucket/prefix` (credentials, region and
    /// endpoint from the usual `AWS_*` environment), `az://container/prefix` (`AZURE_STORAGE_*`)
    /// or `file:///path` (a shared directory).
    pub fn open(url: &str, replica: &str) -> Result<SharedStore, SharedStoreError> {
        let parsed = url::Url::parse(url)
            .map_err(|e| SharedStoreError::Invalid(format!("--store '{url}': {e}")))?;
        // Failures are reported quickly, not retried for minutes: a replica serves its cache
        // meanwhile, and the watcher tries again on its next round.
        let retry = object_store::RetryConfig {
            max_retries: 2,
            retry_timeout: Duration::from_secs(5),
            backoff: object_store::BackoffConfig::default(),
        };
        let (objects, prefix): (Arc<dyn ObjectStore>, String) = match parsed.scheme() {
            "s3" | "s3a" => {
                let bucket = parsed.host_str().unwrap_or_default();
                // Set key by key: `with_client_options` would drop what the environment set
                // (AWS_ALLOW_HTTP among it).
                use object_store::ClientConfigKey as Client;
                use object_store::aws::AmazonS3ConfigKey as Key;
                let s3 = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_retry(retry)
                    .with_config(Key::Client(Client::ConnectTimeout), "2s")
                    .with_config(Key::Client(Client::Timeout), "30s")
                    .build()
                    .map_err(|e| SharedStoreError::Invalid(format!("--store '{url}': {e}")))?;
                (Arc::new(s3), parsed.path().trim_matches('/').to_owned())
            }
            "az" | "azure" => {
                // `az://container/prefix`: account, key or token from the AZURE_STORAGE_*
                // environment (AZURE_STORAGE_USE_EMULATOR=true for Azurite).
                let container = parsed.host_str().unwrap_or_default();
                let azure = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(container)
                    .with_retry(retry)
                    .with_config(
                        object_store::azure::AzureConfigKey::Client(
                            object_store::ClientConfigKey::ConnectTimeout,
                        ),
                        "2s",
                    )
                    .with_config(
                        object_store::azure::AzureConfigKey::Client(
                            object_store::ClientConfigKey::Timeout,
                        ),
                        "30s",
                    )
                    .build()
                    .map_err(|e| SharedStoreError::Invalid(format!("--store '{url}': {e}")))?;
                (Arc::new(azure), parsed.path().trim_matches('/').to_owned())
            }
            "file" => {
                let dir = parsed.to_file_path().map_err(|()| {
                    SharedStoreError::Invalid(format!("--store '{url}': not a local path"))
                })?;
                std::fs::create_dir_all(&dir).map_err(|e| {
                    SharedStoreError::Invalid(format!("--store '{url}': cannot create it: {e}"))
                })?;
                // A server's own store (`--store DIR`) keeps its lock files at its root: its
                // layout is not this one, and each would take the other's files for debris.
                if [".models.lock", ".functions.lock"]
                    .iter()
                    .any(|lock| dir.join(lock).exists())
                {
                    return Err(SharedStoreError::Invalid(format!(
                        "--store '{url}': {} is one server's own store (started with --store {}), not a shared one; give the replicas a directory of their own",
                        dir.display(),
                        dir.display()
                    )));
                }
                let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| SharedStoreError::Invalid(format!("--store '{url}': {e}")))?;
                (Arc::new(local), String::new())
            }
            other => {
                return Err(SharedStoreError::Invalid(format!(
                    "--store '{url}': '{other}://' is not supported (s3:// for S3 and S3-compatible servers, az:// for Azure Blob Storage, file:// for a shared directory, or a plain path for one server's own store)"
                )));
            }
        };
        Ok(SharedStore {
            objects,
            prefix: ObjectPath::from(prefix),
            replica: replica.to_owned(),
            url: url.to_owned(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn area(self: &Arc<Self>, area: &'static str) -> SharedArea {
        SharedArea {
            store: self.clone(),
            area,
            content_grace: CONTENT_GRACE,
        }
    }

    fn path(&self, parts: &[&str]) -> ObjectPath {
        let mut path = self.prefix.clone();
        for part in parts {
            for piece in part.split('/') {
                path = path.child(piece);
            }
        }
        path
    }
}

impl SharedStore {
    /// The secret tenants' key hashes are keyed with, the same on every replica: created by the
    /// first replica that needs it (create-only), read by the others.
    pub async fn tenant_secret(&self) -> Result<[u8; 32], SharedStoreError> {
        let at = self.path(&["tenants", "secret"]);
        for _ in 0..2 {
            match self.objects.get(&at).await {
                Ok(found) => {
                    let bytes = found.bytes().await?;
                    return <[u8; 32]>::try_from(bytes.as_ref())
                        .map_err(|_| SharedStoreError::Corrupt(format!("{at} is not 32 bytes")));
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            let mut secret = [0u8; 32];
            getrandom::fill(&mut secret)
                .map_err(|e| SharedStoreError::Invalid(format!("no random numbers: {e}")))?;
            match self.create(&at, Bytes::copy_from_slice(&secret)).await {
                Ok(true) => return Ok(secret),
                // Another replica created it first: read theirs.
                Ok(false) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(SharedStoreError::Corrupt(format!(
            "{at} cannot be created nor read"
        )))
    }

    /// The newest generation of the tenant registry (0: none yet).
    pub async fn registry_generation(&self) -> Result<u64, SharedStoreError> {
        let prefix = self.path(&["tenants", "registry"]);
        Ok(self.newest_generation(&prefix).await?.unwrap_or(0))
    }

    /// The highest `<generation>.json` directly under `prefix` (one LIST); `None`: none.
    async fn newest_generation(
        &self,
        prefix: &ObjectPath,
    ) -> Result<Option<u64>, SharedStoreError> {
        let listed: Vec<_> = self.objects.list(Some(prefix)).try_collect().await?;
        Ok(listed
            .iter()
            .filter_map(|m| {
                m.location
                    .filename()?
                    .strip_suffix(".json")?
                    .parse::<u64>()
                    .ok()
            })
            .max())
    }

    pub async fn registry(&self, generation: u64) -> Result<Bytes, SharedStoreError> {
        let at = self.path(&["tenants", "registry", &format!("{generation:020}.json")]);
        Ok(self.objects.get(&at).await?.bytes().await?)
    }

    /// Publishes the registry as `generation`, create-only.
    pub async fn publish_registry(
        &self,
        generation: u64,
        bytes: Bytes,
    ) -> Result<(), SharedStoreError> {
        let at = self.path(&["tenants", "registry", &format!("{generation:020}.json")]);
        if !self.create(&at, bytes).await? {
            return Err(SharedStoreError::Conflict {
                key: "the tenant registry".into(),
                generation,
            });
        }
        if generation > KEPT_GENERATIONS {
            let old = format!("{:020}.json", generation - KEPT_GENERATIONS);
            let _ = self
                .objects
                .delete(&self.path(&["tenants", "registry", &old]))
                .await;
        }
        Ok(())
    }

    /// Removes every deployment of `tenant` (models and functions) from the shared store.
    pub async fn remove_tenant(&self, tenant: &str) -> Result<(), SharedStoreError> {
        for area in ["models", "functions"] {
            for kind in ["manifests", "revisions"] {
                let prefix = self.path(&[area, kind, "t", tenant]);
                let listed: Vec<_> = self.objects.list(Some(&prefix)).try_collect().await?;
                for meta in listed {
                    match self.objects.delete(&meta.location).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(())
    }

    /// Creates `at` only if nothing is there: false if something else is.
    ///
    /// The client library retries a request that failed with a 5xx; if the first attempt had
    /// landed, the retry finds the object there. So "already exists" and a failure are checked
    /// against what is there: our own bytes mean our write landed. (What we write is unique to
    /// the writer: a manifest names its replica, a secret is random.)
    async fn create(&self, at: &ObjectPath, bytes: Bytes) -> Result<bool, SharedStoreError> {
        let put = self
            .objects
            .put_opts(
                at,
                PutPayload::from_bytes(bytes.clone()),
                PutOptions {
                    mode: PutMode::Create,
                    ..Default::default()
                },
            )
            .await;
        let failure = match put {
            Ok(_) => return Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => None,
            Err(e) => Some(e),
        };
        let there = match self.objects.get(at).await {
            Ok(found) => Some(found.bytes().await?),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(failure.unwrap_or(e).into()),
        };
        match (there, failure) {
            (Some(there), _) if there == bytes => Ok(true),
            (Some(_), _) => Ok(false),
            (None, Some(e)) => Err(e.into()),
            (None, None) => Err(SharedStoreError::Corrupt(format!(
                "{at} was reported present, then absent"
            ))),
        }
    }
}

/// `o/<name>` or `t/<tenant>/<name>`.
fn key_path(key: &str) -> String {
    let key = crate::namespace::ModelKey::parse(key);
    match key.tenant {
        Some(tenant) => format!("t/{tenant}/{}", key.name),
        None => format!("o/{}", key.name),
    }
}

/// The key and generation of a manifest object, from its path below `<area>/manifests/`.
fn parse_manifest_path(rest: &[&str]) -> Option<(String, u64)> {
    let (key, file) = match rest {
        ["o", name, file] => ((*name).to_owned(), *file),
        ["t", tenant, name, file] => (format!("{tenant}/{name}"), *file),
        _ => return None,
    };
    crate::store::check_key(&key).ok()?;
    let generation = file.strip_suffix(".json")?.parse::<u64>().ok()?;
    Some((key, generation))
}

impl SharedArea {
    pub fn url(&self) -> &str {
        &self.store.url
    }

    fn manifests_prefix(&self) -> ObjectPath {
        self.store.path(&[self.area, "manifests"])
    }

    fn manifest_path(&self, key: &str, generation: u64) -> ObjectPath {
        self.store.path(&[
            self.area,
            "manifests",
            &key_path(key),
            &format!("{generation:020}.json"),
        ])
    }

    fn file_path(&self, key: &str, content: &str, file: &str) -> ObjectPath {
        self.store
            .path(&[self.area, "revisions", &key_path(key), content, file])
    }

    /// The newest generation of every deployment (one LIST).
    pub async fn generations(&self) -> Result<BTreeMap<String, u64>, SharedStoreError> {
        let prefix = self.manifests_prefix();
        let depth = prefix.parts().count();
        let listed: Vec<_> = self.store.objects.list(Some(&prefix)).try_collect().await?;
        let mut newest = BTreeMap::new();
        for meta in listed {
            let parts: Vec<String> = meta
                .location
                .parts()
                .skip(depth)
                .map(|p| p.as_ref().to_owned())
                .collect();
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            if let Some((key, generation)) = parse_manifest_path(&parts) {
                let at = newest.entry(key).or_insert(0);
                *at = (*at).max(generation);
            }
        }
        Ok(newest)
    }

    /// The newest manifest of `key`, read fresh from the store (`None`: never deployed).
    pub async fn latest(&self, key: &str) -> Result<Option<SharedManifest>, SharedStoreError> {
        let prefix = self.store.path(&[self.area, "manifests", &key_path(key)]);
        match self.store.newest_generation(&prefix).await? {
            Some(generation) => self.manifest(key, generation).await.map(Some),
            None => Ok(None),
        }
    }

    pub async fn manifest(
        &self,
        key: &str,
        generation: u64,
    ) -> Result<SharedManifest, SharedStoreError> {
        let path = self.manifest_path(key, generation);
        let bytes = self.store.objects.get(&path).await?.bytes().await?;
        let manifest: SharedManifest = serde_json::from_slice(&bytes)
            .map_err(|e| SharedStoreError::Corrupt(format!("{path}: {e}")))?;
        if manifest.generation != generation {
            return Err(SharedStoreError::Corrupt(format!(
                "{path} says it is generation {}",
                manifest.generation
            )));
        }
        Ok(manifest)
    }

    /// Uploads a revision's files under their content hash (idempotent).
    pub async fn upload(
        &self,
        key: &str,
        files: &[(PathBuf, Bytes)],
    ) -> Result<SharedRevisionFiles, SharedStoreError> {
        let content = content_hash(files);
        let mut names = Vec::with_capacity(files.len());
        for (path, bytes) in files {
            let name = path.to_string_lossy().into_owned();
            let at = self.file_path(key, &content, &name);
            self.store
                .objects
                .put(&at, PutPayload::from_bytes(bytes.clone()))
                .await?;
            names.push(name);
        }
        names.sort();
        Ok(SharedRevisionFiles {
            content,
            files: names,
        })
    }

    /// Downloads a revision's files and checks their content hash.
    pub async fn download(
        &self,
        key: &str,
        revision: &SharedRevision,
    ) -> Result<Vec<(PathBuf, Bytes)>, SharedStoreError> {
        let mut files = Vec::with_capacity(revision.files.len());
        for name in &revision.files {
            let relative = crate::store::check_relative_path(name)
                .map_err(|e| SharedStoreError::Corrupt(e.to_string()))?;
            let at = self.file_path(key, &revision.content, name);
            let bytes = match self.store.objects.get(&at).await {
                Ok(found) => found.bytes().await?,
                // Not a store that is away: a file the manifest names is missing.
                Err(object_store::Error::NotFound { .. }) => {
                    return Err(SharedStoreError::Corrupt(format!(
                        "{at}, a file of revision {} of '{}', is missing",
                        revision.revision,
                        crate::namespace::shown(key)
                    )));
                }
                Err(e) => return Err(e.into()),
            };
            files.push((relative, bytes));
        }
        let found = content_hash(&files);
        if found != revision.content {
            return Err(SharedStoreError::Corrupt(format!(
                "revision {} of '{}' hashes to {found}, not {}",
                revision.revision,
                crate::namespace::shown(key),
                revision.content
            )));
        }
        Ok(files)
    }

    /// Publishes `next` as the generation after `base`'s (`None`: the first), create-only:
    /// [`SharedStoreError::Conflict`] if another replica took that generation first.
    pub async fn publish(
        &self,
        key: &str,
        base: Option<&SharedManifest>,
        mut next: SharedManifest,
    ) -> Result<SharedManifest, SharedStoreError> {
        next.generation = base.map_or(0, |b| b.generation) + 1;
        next.written_by = self.store.replica.clone();
        while next.revisions.len() > crate::store::KEPT_REVISIONS {
            let Some(oldest) = next
                .revisions
                .iter()
                .position(|r| r.revision != next.current)
            else {
                break;
            };
            next.revisions.remove(oldest);
        }
        let bytes = serde_json::to_vec_pretty(&next)
            .map_err(|e| SharedStoreError::Invalid(e.to_string()))?;
        let at = self.manifest_path(key, next.generation);
        if !self.store.create(&at, Bytes::from(bytes)).await? {
            return Err(SharedStoreError::Conflict {
                key: key.to_owned(),
                generation: next.generation,
            });
        }
        self.collect_garbage(key, &next).await;
        Ok(next)
    }

    /// Deletes old generations, then revision contents no generation names (failures only cost
    /// space: they are logged).
    async fn collect_garbage(&self, key: &str, next: &SharedManifest) {
        if next.generation > KEPT_GENERATIONS {
            let old = self.manifest_path(key, next.generation - KEPT_GENERATIONS);
            if let Err(e) = self.store.objects.delete(&old).await
                && !matches!(e, object_store::Error::NotFound { .. })
            {
                tracing::warn!(key, "cannot delete {old}: {e}");
            }
        }
        if let Err(e) = self.sweep_contents(key).await {
            tracing::warn!(key, "cannot sweep old revisions' files: {e}");
        }
    }

    /// Deletes the files of `key`'s revisions that no stored generation names and that were
    /// last written more than the grace period ago. Both are needed: a revision leaves the
    /// manifests when it is older than the last five, but another replica may be uploading the
    /// same content again (same hash, same objects) to publish it, or a lagging one may still be
    /// fetching what an older generation named. An upload writes every file again, so content
    /// being published is always recent; any generation a replica can still read is listed
    /// here. Returns the contents deleted.
    async fn sweep_contents(&self, key: &str) -> Result<Vec<String>, SharedStoreError> {
        let manifests = self.store.path(&[self.area, "manifests", &key_path(key)]);
        let listed: Vec<_> = self
            .store
            .objects
            .list(Some(&manifests))
            .try_collect()
            .await?;
        let mut named = std::collections::BTreeSet::new();
        for meta in listed {
            let Some(generation) = meta
                .location
                .filename()
                .and_then(|f| f.strip_suffix(".json"))
                .and_then(|g| g.parse::<u64>().ok())
            else {
                continue;
            };
            match self.manifest(key, generation).await {
                Ok(manifest) => named.extend(manifest.revisions.into_iter().map(|r| r.content)),
                // Deleted by a newer writer since the listing: it names nothing newer ones don't.
                Err(SharedStoreError::Unavailable(object_store::Error::NotFound { .. })) => {}
                // Anything else unreadable: do not guess what it names.
                Err(e) => return Err(e),
            }
        }
        let revisions = self.store.path(&[self.area, "revisions", &key_path(key)]);
        let depth = revisions.parts().count();
        let files: Vec<_> = self
            .store
            .objects
            .list(Some(&revisions))
            .try_collect()
            .await?;
        // Each content's files, and when the newest of them was written (Unix seconds).
        let mut contents: BTreeMap<String, (i64, Vec<ObjectPath>)> = BTreeMap::new();
        for meta in files {
            let Some(content) = meta.location.parts().nth(depth) else {
                continue;
            };
            let written = meta.last_modified.timestamp();
            let entry = contents
                .entry(content.as_ref().to_owned())
                .or_insert((written, Vec::new()));
            entry.0 = entry.0.max(written);
            entry.1.push(meta.location);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let grace = i64::try_from(self.content_grace.as_secs()).unwrap_or(i64::MAX);
        let mut deleted = Vec::new();
        for (content, (written, paths)) in contents {
            if named.contains(&content) || now.saturating_sub(written) < grace {
                continue;
            }
            for path in paths {
                match self.store.objects.delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            tracing::info!(
                key,
                content,
                "deleted the files of a revision no manifest names any more"
            );
            deleted.push(content);
        }
        Ok(deleted)
    }
}

/// What [`SharedArea::upload`] stored.
pub struct SharedRevisionFiles {
    pub content: String,
    pub files: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area(dir: &std::path::Path, replica: &str) -> SharedArea {
        let url = url::Url::from_directory_path(dir)
            .expect("a path")
            .to_string();
        Arc::new(SharedStore::open(&url, replica).expect("opens")).area("models")
    }

    #[test]
    fn a_servers_own_store_is_not_opened_as_a_shared_one() {
        let dir = tempfile::tempdir().expect("a scratch folder");
        let own = crate::store::Store::open(dir.path(), "models", false).expect("opens");
        let url = url::Url::from_directory_path(dir.path())
            .expect("a path")
            .to_string();
        let Err(refused) = SharedStore::open(&url, "r1") else {
            panic!("a server's own store is refused");
        };
        assert!(refused.to_string().contains("own store"), "{refused}");
        drop(own);
    }

    fn files(text: &'static str) -> Vec<(PathBuf, Bytes)> {
        vec![
            (
                PathBuf::from("config.pbtxt"),
                Bytes::from_static(b"name: \"m\""),
            ),
            (
                PathBuf::from("1/model.wasm"),
                Bytes::from_static(text.as_bytes()),
            ),
        ]
    }

    /// Uploads `text` as revision 1 of `key`: the revision, and a manifest serving it.
    async fn first_revision(
        area: &SharedArea,
        key: &str,
        text: &'static str,
    ) -> (SharedRevision, SharedManifest) {
        let uploaded = area.upload(key, &files(text)).await.expect("upload");
        let revision = SharedRevision {
            revision: 1,
            content: uploaded.content,
            files: uploaded.files,
            deployed_at: 0,
        };
        let manifest = SharedManifest {
            current: 1,
            loaded: true,
            revisions: vec![revision.clone()],
            ..Default::default()
        };
        (revision, manifest)
    }

    #[tokio::test]
    async fn generations_are_create_only_and_one_writer_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (area(dir.path(), "a"), area(dir.path(), "b"));
        let (revision, first) = first_revision(&a, "m", "one").await;
        let published = a.publish("m", None, first.clone()).await.expect("first");
        assert_eq!(published.generation, 1);
        // b read nothing yet: its first generation is taken.
        let lost = b.publish("m", None, first).await;
        assert!(matches!(
            lost,
            Err(SharedStoreError::Conflict { generation: 1, .. })
        ));
        let seen = b.latest("m").await.expect("read").expect("deployed");
        assert_eq!(seen, published);
        assert_eq!(b.generations().await.expect("list").get("m"), Some(&1));
        let back = b.download("m", &revision).await.expect("download");
        assert_eq!(content_hash(&back), revision.content);
    }

    #[tokio::test]
    async fn files_no_generation_names_go_once_past_the_grace_period() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut a = area(dir.path(), "a");
        let texts = ["r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8"];
        let mut base: Option<SharedManifest> = None;
        let mut contents = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let uploaded = a.upload("m", &files(text)).await.expect("upload");
            contents.push(uploaded.content.clone());
            let mut next = base.clone().unwrap_or_default();
            next.current = i as u64 + 1;
            next.loaded = true;
            next.revisions.push(SharedRevision {
                revision: i as u64 + 1,
                content: uploaded.content,
                files: uploaded.files,
                deployed_at: 0,
            });
            base = Some(a.publish("m", base.as_ref(), next).await.expect("publish"));
        }
        // Within the grace period nothing goes, though the last manifest names five revisions.
        assert!(a.sweep_contents("m").await.expect("sweep").is_empty());
        a.content_grace = Duration::ZERO;
        // Every generation is still stored (8 < 16): the first generation names revision 1...
        assert!(a.sweep_contents("m").await.expect("sweep").is_empty());
        // ...until the generations that name them are gone (generation 7 names revisions 3-7).
        for generation in 1..=6 {
            let path = a.manifest_path("m", generation);
            a.store.objects.delete(&path).await.expect("delete");
        }
        let deleted = a.sweep_contents("m").await.expect("sweep");
        assert_eq!(deleted, {
            let mut gone = contents[..2].to_vec();
            gone.sort();
            gone
        });
        let latest = a.latest("m").await.expect("read").expect("deployed");
        for revision in &latest.revisions {
            a.download("m", revision).await.expect("still there");
        }
    }

    #[tokio::test]
    async fn tenants_keys_are_apart_and_a_changed_file_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = area(dir.path(), "a");
        let (revision, manifest) = first_revision(&a, "acme/m", "two").await;
        a.publish("acme/m", None, manifest).await.expect("publish");
        let generations = a.generations().await.expect("list");
        assert_eq!(generations.keys().collect::<Vec<_>>(), vec!["acme/m"]);
        assert!(a.latest("m").await.expect("read").is_none());
        let on_disk = dir
            .path()
            .join("models/revisions/t/acme/m")
            .join(&revision.content)
            .join("1/model.wasm");
        std::fs::write(&on_disk, b"tampered").expect("write");
        assert!(matches!(
            a.download("acme/m", &revision).await,
            Err(SharedStoreError::Corrupt(_))
        ));
    }
}
