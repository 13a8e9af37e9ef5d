//! One deployment lifecycle, for models and functions alike:
//!
//! ```text
//! deploy:   stage (tmp/) → commit (next revision) → build beside what serves → publish (manifest,
//!           durable) → swap in → answer
//! rollback: previous revision → build beside what serves → publish → swap in → answer
//! follow:   (a replica) a change another replica published → fetch the revision → build
//!           beside what serves → record → swap in (or unload)
//! ```
//!
//! With a shared store (`crate::store::shared`, replicas), *publish* is first the shared
//! manifest's next generation, create-only, read fresh at the start of the request: a change
//! made meanwhile by another replica makes this one a conflict (409) before anything serves,
//! and the answer comes only once the change is in the shared store. Then the replica's own
//! store (its cache) records it.
//!
//! What differs between a model and a function is only how a revision is built and swapped in
//! ([`Target`]); validation of the upload happens before, in the caller. A revision committed
//! but not published is discarded on every path, by a guard ([`Committed`]), also when the
//! request is dropped half-way. The answer comes only after the manifest naming the revision is
//! durable and the revision serves.
//!
//! **Blocking disk work** has one policy. Writes to the store and the tenant registry (staging,
//! renames, fsyncs, manifests) run through [`disk`]: `block_in_place`, so a step is never cut in
//! half by a dropped request (a publish runs to its end once started), while tokio moves this
//! worker's other tasks to other threads. Reading files to load a model or a function runs on
//! `spawn_blocking`: abandoning a read harms nothing.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::repository::{ControlError, LoadOutcome};
use crate::store::shared::{SharedManifest, SharedRevision};
use crate::store::{Store, StoreError};

/// What a load or rollback did, for the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployed {
    pub outcome: LoadOutcome,
    /// The store revision that serves, for a deployment.
    pub revision: Option<u64>,
    /// The repository folder of the operator's model that this deployment serves instead of.
    pub replaces: Option<PathBuf>,
}

/// How one kind of deployment (a model, a function) is built beside what serves and swapped in.
pub trait Target {
    /// What was built, ready to serve.
    type Built: Send;

    /// Builds the store revision at `dir` beside what serves. `None`: exactly this already
    /// serves. A failure leaves what serves as it is.
    fn build(
        &self,
        key: &str,
        revision: u64,
        dir: &Path,
    ) -> impl Future<Output = Result<Option<Self::Built>, ControlError>> + Send;

    /// The content hash the manifest records for what was built.
    fn hash(&self, built: &Self::Built) -> String;

    /// Makes `built` serve.
    fn swap(
        &self,
        key: &str,
        built: Self::Built,
    ) -> impl Future<Output = Result<(), ControlError>> + Send;

    /// The store revision of `key` that serves now, if one does.
    fn serving(&self, key: &str) -> Option<u64>;

    /// Stops serving `key` (another replica unloaded it).
    fn unload(&self, key: &str) -> impl Future<Output = Result<(), ControlError>> + Send;
}

/// Runs blocking store work: see the module documentation.
pub fn disk<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        // A single-threaded runtime (unit tests) or none: there is no other worker to hand off to.
        _ => work(),
    }
}

/// A revision committed to the store whose deployment has not been published: discarded when
/// dropped so, on whatever path (an error, a panic, a dropped request).
struct Committed<'s> {
    store: &'s Store,
    key: String,
    revision: u64,
    dir: PathBuf,
    published: bool,
}

impl Drop for Committed<'_> {
    fn drop(&mut self) {
        if !self.published {
            disk(|| self.store.discard(&self.key, self.revision));
        }
    }
}

/// Deploys `files` (paths checked, the configuration among them) as the next revision of `key`.
pub async fn deploy<T: Target>(
    store: &Store,
    target: &T,
    key: &str,
    files: Vec<(PathBuf, Bytes)>,
) -> Result<Deployed, ControlError> {
    // The shared state, read fresh: the new revision follows it, and a change another replica
    // publishes from now on makes this deploy a conflict.
    let base = match store.shared() {
        Some(shared) => Some(shared.latest(key).await?),
        None => None,
    };
    if let Some(Some(newest)) = &base
        && store.manifest(key).map_or(0, |m| m.generation) < newest.generation
    {
        // This replica has not applied the newest state yet: it does first, so that what it
        // compares the upload with ("unchanged?") is what the store serves.
        follow(store, target, key, newest).await?;
    }
    let number = base
        .as_ref()
        .map(|b| b.as_ref().map_or(1, SharedManifest::next_revision));
    let (revision, dir) = disk(|| {
        let staged = store.stage(key, &files)?;
        store.commit_as(staged, number)
    })?;
    let mut committed = Committed {
        store,
        key: key.to_owned(),
        revision,
        dir,
        published: false,
    };
    let Some(built) = target.build(key, revision, &committed.dir).await? else {
        return Ok(Deployed {
            outcome: LoadOutcome::Unchanged,
            revision: None,
            replaces: None,
        });
    };
    let hash = target.hash(&built);
    let mut generation = 0;
    if let (Some(shared), Some(base)) = (store.shared(), base) {
        let uploaded = shared.upload(key, &files).await?;
        let mut next = base.clone().unwrap_or_default();
        next.revisions.push(SharedRevision {
            revision,
            content: uploaded.content,
            files: uploaded.files,
            deployed_at: now_unix(),
        });
        next.current = revision;
        next.loaded = true;
        generation = shared.publish(key, base.as_ref(), next).await?.generation;
    }
    // Durable before it serves: a crash from here on restarts with this revision.
    disk(|| store.publish_generation(key, revision, &hash, generation, true))?;
    committed.published = true;
    target.swap(key, built).await?;
    tracing::info!(key, revision, "deployed");
    Ok(Deployed {
        outcome: LoadOutcome::Loaded,
        revision: Some(revision),
        replaces: None,
    })
}

/// Serves the revision before the one that serves `key` again (for a damaged deployment, the
/// newest revision on disk).
pub async fn rollback<T: Target>(
    store: &Store,
    target: &T,
    key: &str,
) -> Result<Deployed, ControlError> {
    if store.shared().is_some() {
        return rollback_shared(store, target, key).await;
    }
    let (revision, dir, recorded) = disk(|| store.previous(key))?;
    let Some(built) = target.build(key, revision, &dir).await? else {
        return Ok(Deployed {
            outcome: LoadOutcome::Unchanged,
            revision: None,
            replaces: None,
        });
    };
    // A revision rebuilt from a damaged manifest has no recorded hash.
    let hash = if recorded.is_empty() {
        target.hash(&built)
    } else {
        recorded
    };
    disk(|| store.publish(key, revision, &hash))?;
    target.swap(key, built).await?;
    tracing::info!(key, revision, "rolled back");
    Ok(Deployed {
        outcome: LoadOutcome::Loaded,
        revision: Some(revision),
        replaces: None,
    })
}

/// [`rollback`] on a replica: the previous revision of the shared state, fetched if this
/// replica does not have it.
async fn rollback_shared<T: Target>(
    store: &Store,
    target: &T,
    key: &str,
) -> Result<Deployed, ControlError> {
    let Some(shared) = store.shared() else {
        return Err(ControlError::Internal("no shared store".into()));
    };
    let base = shared
        .latest(key)
        .await?
        .ok_or_else(|| StoreError::NotDeployed(store.what(), key.to_owned()))?;
    if store.manifest(key).map_or(0, |m| m.generation) < base.generation {
        // As in `deploy`: "already serving" is judged against the newest state.
        follow(store, target, key, &base).await?;
    }
    let previous = base
        .previous()
        .cloned()
        .ok_or_else(|| StoreError::NoEarlierRevision(store.what(), key.to_owned()))?;
    let (dir, fetched) = cached_revision(store, key, &previous).await?;
    let Some(built) = target.build(key, previous.revision, &dir).await? else {
        return Ok(Deployed {
            outcome: LoadOutcome::Unchanged,
            revision: None,
            replaces: None,
        });
    };
    let hash = target.hash(&built);
    let mut next = base.clone();
    next.current = previous.revision;
    next.loaded = true;
    let generation = shared.publish(key, Some(&base), next).await?.generation;
    disk(|| store.publish_generation(key, previous.revision, &hash, generation, true))?;
    if let Some(mut fetched) = fetched {
        fetched.published = true;
    }
    target.swap(key, built).await?;
    tracing::info!(key, revision = previous.revision, "rolled back");
    Ok(Deployed {
        outcome: LoadOutcome::Loaded,
        revision: Some(previous.revision),
        replaces: None,
    })
}

/// Records whether `key` loads at start (after a load or an unload on request); with a shared
/// store, every replica follows.
pub async fn set_loaded(store: &Store, key: &str, loaded: bool) -> Result<(), ControlError> {
    let mut generation = None;
    if let Some(shared) = store.shared()
        && let Some(base) = shared.latest(key).await?
        && base.loaded != loaded
    {
        let mut next = base.clone();
        next.loaded = loaded;
        generation = Some(shared.publish(key, Some(&base), next).await?.generation);
    }
    disk(|| store.set_loaded_generation(key, loaded, generation))?;
    Ok(())
}

/// The folder of `revision` in this replica's store, fetched from the shared store when it is
/// not there; a fetched one comes with its guard (discarded unless marked published).
async fn cached_revision<'s>(
    store: &'s Store,
    key: &str,
    revision: &SharedRevision,
) -> Result<(PathBuf, Option<Committed<'s>>), ControlError> {
    let kept = store
        .manifest(key)
        .is_some_and(|m| m.revisions.iter().any(|r| r.revision == revision.revision));
    if kept {
        return Ok((store.revision_dir(key, revision.revision), None));
    }
    let Some(shared) = store.shared() else {
        return Err(ControlError::Internal("no shared store".into()));
    };
    let files = shared.download(key, revision).await?;
    let (number, dir) = disk(|| {
        let staged = store.stage(key, &files)?;
        store.commit_as(staged, Some(revision.revision))
    })?;
    let guard = Committed {
        store,
        key: key.to_owned(),
        revision: number,
        dir: dir.clone(),
        published: false,
    };
    Ok((dir, Some(guard)))
}

/// Applies what another replica published (`manifest`, the newest generation of `key`) to this
/// replica: the same build-beside-and-swap as a deploy here. Nothing is written to the shared
/// store. The caller holds the lock that serializes deployments of this kind.
pub async fn follow<T: Target>(
    store: &Store,
    target: &T,
    key: &str,
    manifest: &SharedManifest,
) -> Result<(), ControlError> {
    let applied = store.manifest(key).map(|m| m.generation);
    if applied.is_some_and(|g| g >= manifest.generation) {
        return Ok(());
    }
    let Some(revision) = manifest.revision(manifest.current) else {
        return Err(ControlError::Internal(format!(
            "generation {} of '{}' names revision {} but does not keep it",
            manifest.generation,
            crate::namespace::shown(key),
            manifest.current
        )));
    };
    let (dir, mut fetched) = cached_revision(store, key, revision).await?;
    let serving = target.serving(key);
    let recorded = store
        .manifest(key)
        .and_then(|m| {
            m.revisions
                .into_iter()
                .find(|r| r.revision == revision.revision)
        })
        .map(|r| r.sha256)
        .unwrap_or_default();
    if manifest.loaded && serving != Some(revision.revision) {
        let built = target.build(key, revision.revision, &dir).await?;
        let hash = built.as_ref().map_or(recorded, |b| target.hash(b));
        disk(|| {
            store.publish_generation(key, revision.revision, &hash, manifest.generation, true)
        })?;
        if let Some(guard) = fetched.as_mut() {
            guard.published = true;
        }
        if let Some(built) = built {
            target.swap(key, built).await?;
        }
        tracing::info!(
            key,
            revision = revision.revision,
            generation = manifest.generation,
            by = manifest.written_by,
            "serving what another replica deployed"
        );
        return Ok(());
    }
    // One manifest write: a crash cannot leave it loaded at this generation when it is not.
    disk(|| {
        store.publish_generation(
            key,
            revision.revision,
            &recorded,
            manifest.generation,
            manifest.loaded,
        )
    })?;
    if let Some(guard) = fetched.as_mut() {
        guard.published = true;
    }
    if !manifest.loaded && serving.is_some() {
        target.unload(key).await?;
        tracing::info!(
            key,
            by = manifest.written_by,
            "unloaded, as another replica did"
        );
    }
    Ok(())
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
