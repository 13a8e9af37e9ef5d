//! One deployment lifecycle, for models and functions alike:
//!
//! ```text
//! deploy:   stage (tmp/) → commit (next revision) → build beside what serves → publish (manifest,
//!           durable) → swap in → answer
//! rollback: previous revision → build beside what serves → publish → swap in → answer
//! ```
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
use crate::store::{Store, StoreError};

/// What a load or rollback did, for the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployed {
    pub outcome: LoadOutcome,
    /// The store revision that serves, for a deployment.
    pub revision: Option<u64>,
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
    let (revision, dir) = disk(|| {
        let staged = store.stage(key, &files)?;
        store.commit(staged)
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
        });
    };
    let hash = target.hash(&built);
    // Durable before it serves: a crash from here on restarts with this revision.
    disk(|| store.publish(key, revision, &hash))?;
    committed.published = true;
    target.swap(key, built).await?;
    tracing::info!(key, revision, "deployed");
    Ok(Deployed {
        outcome: LoadOutcome::Loaded,
        revision: Some(revision),
    })
}

/// Serves the revision before the one that serves `key` again (for a damaged deployment, the
/// newest revision on disk).
pub async fn rollback<T: Target>(
    store: &Store,
    target: &T,
    key: &str,
) -> Result<Deployed, ControlError> {
    let (revision, dir, recorded) = disk(|| store.previous(key))?;
    let Some(built) = target.build(key, revision, &dir).await? else {
        return Ok(Deployed {
            outcome: LoadOutcome::Unchanged,
            revision: None,
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
    })
}

/// Records whether `key` loads at start (after a load or an unload on request).
pub fn set_loaded(store: &Store, key: &str, loaded: bool) -> Result<(), StoreError> {
    disk(|| store.set_loaded(key, loaded))
}
