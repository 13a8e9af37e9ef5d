//! Tenants: who may call the server, in which namespace, within which quotas.
//!
//! Tenancy is on when the server has an admin key (`TESSERA_ADMIN_KEY` or `--admin-key-file`).
//! Then every request carries `Authorization: Bearer <key>`: the admin key acts as the operator
//! (the models of `--model-repository`, the admin API), a tenant's key as that tenant (its own
//! namespace, the shared models it was granted). Without an admin key the server is single-tenant
//! and open: every request is the operator's.
//!
//! The registry lives in the deployment store as `tenants.json`, replaced atomically like a
//! deployment's manifest, beside `tenants.secret`: the key of the keyed hash (HMAC-SHA256) that
//! API keys are stored as. API keys are 256 random bits, so a keyed hash is as strong as a slow
//! one against a stolen `tenants.json` and costs a microsecond per request instead of tens of
//! milliseconds; without the secret, the hashes are useless.
//!
//! Quotas are checked at one place, the server's request path (`Server::infer` and function
//! invocations), through [`Tenant::admit`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::infer::{ErrorKind, InferError};
use crate::store::{StoreError, TENANTS_DIR, check_model_name, replace_file};

const REGISTRY_FILE: &str = "tenants.json";
const SECRET_FILE: &str = "tenants.secret";
/// Every API key starts with this, so a leaked one is recognisable (secret scanners, logs).
const KEY_PREFIX: &str = "tsk_";

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    #[error(
        "tenancy is off: start the server with an admin key (TESSERA_ADMIN_KEY or --admin-key-file) to manage tenants"
    )]
    Disabled,
    /// The registry's disk write failed; the client reads [`StoreError::for_client`], the log
    /// the whole error.
    #[error("{}", .0.for_client())]
    Store(#[from] StoreError),
    /// The shared store cannot be reached: nothing changed.
    #[error(
        "the shared deployment store is unreachable; the tenant registry was not changed (details in the server log)"
    )]
    Unavailable,
}

impl From<crate::store::shared::SharedStoreError> for TenantError {
    fn from(e: crate::store::shared::SharedStoreError) -> Self {
        use crate::store::shared::SharedStoreError;
        match e {
            SharedStoreError::Conflict { .. } => TenantError::Conflict(
                "the tenant registry was changed by another replica at the same time; nothing of this request was published: retry".into(),
            ),
            SharedStoreError::Invalid(m) => TenantError::Invalid(m),
            e => {
                tracing::error!("tenant registry: {e}");
                TenantError::Unavailable
            }
        }
    }
}

/// Why a request was not authenticated (401).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("missing API key: send 'Authorization: Bearer <key>'")]
    Missing,
    #[error("invalid API key")]
    Invalid,
}

/// A tenant's limits. Each field has a default (documented in docs/tenants.md); a quota update
/// changes only the fields it names.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Quotas {
    /// Client requests (inferences and function invocations) in flight at once.
    pub max_concurrent_requests: u32,
    /// Client requests per second, with a burst of as many; 0: no limit.
    pub requests_per_second: u32,
    /// Models deployed in the tenant's namespace.
    pub max_models: u32,
    /// Functions deployed in the tenant's namespace.
    pub max_functions: u32,
    /// Bytes of the serving revisions of every model and function, the new deployment included.
    pub max_deployed_bytes: u64,
    /// Ceiling on the memory of each Wasm handler or function instance (clamps its own limit).
    pub max_wasm_memory_bytes: u64,
    /// Ceiling on the time of one Wasm execution or invocation, in ms (clamps its own limit).
    pub max_wasm_time_ms: u64,
    /// Priority level of the tenant's requests in models with priority levels (1 is highest;
    /// 0: the model's default), unless a request sets its own.
    pub priority: u32,
    /// LLM tokens (prompt and generated) per minute, refilled continuously; a request is
    /// admitted while the budget is not spent and pays for what it used; 0: no limit.
    pub tokens_per_minute: u64,
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas {
            max_concurrent_requests: 64,
            requests_per_second: 1000,
            max_models: 16,
            max_functions: 16,
            max_deployed_bytes: 1 << 30,
            max_wasm_memory_bytes: 256 << 20,
            max_wasm_time_ms: 30_000,
            priority: 0,
            tokens_per_minute: 0,
        }
    }
}

impl Quotas {
    /// These quotas with the fields of `patch` (a JSON object) replaced.
    pub fn patched(&self, patch: serde_json::Value) -> Result<Quotas, TenantError> {
        let serde_json::Value::Object(patch) = patch else {
            return Err(TenantError::Invalid(
                "quotas must be a JSON object, e.g. {\"requests_per_second\": 50}".into(),
            ));
        };
        let mut merged = match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(o)) => o,
            _ => serde_json::Map::new(),
        };
        merged.extend(patch);
        let quotas: Quotas = serde_json::from_value(serde_json::Value::Object(merged))
            .map_err(|e| TenantError::Invalid(format!("invalid quotas: {e}")))?;
        if quotas.max_concurrent_requests == 0 {
            return Err(TenantError::Invalid(
                "max_concurrent_requests must be at least 1".into(),
            ));
        }
        Ok(quotas)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct KeyRecord {
    id: String,
    /// HMAC-SHA256 of the whole key under the store's secret, hex.
    hash: String,
    created_at: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct TenantRecord {
    name: String,
    created_at: u64,
    #[serde(default)]
    keys: Vec<KeyRecord>,
    #[serde(default)]
    quotas: Quotas,
    /// Operator models this tenant may call (read-only).
    #[serde(default)]
    grants: BTreeSet<String>,
    /// Random, set at creation: tells a tenant from an earlier one of the same name (replicas
    /// remove what they hold of the earlier one).
    #[serde(default)]
    incarnation: String,
}

#[derive(Default, Serialize, Deserialize)]
struct RegistryFile {
    tenants: Vec<TenantRecord>,
    /// With a shared store: the registry generation this file holds (0 otherwise).
    #[serde(default, skip_serializing_if = "is_zero")]
    generation: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What the admin API shows of a tenant (never a key or its hash).
#[derive(Clone, Debug, Serialize)]
pub struct TenantInfo {
    pub name: String,
    pub created_at: u64,
    pub keys: Vec<String>,
    pub quotas: Quotas,
    pub grants: Vec<String>,
}

type RateLimiter = governor::DefaultDirectRateLimiter;

/// A tenant's token budget (`tokens_per_minute`): a bucket of at most a minute's tokens that
/// refills continuously. It may go below zero (a request pays for what it generated); requests
/// are refused until it is above zero again.
struct TokenBudget {
    per_minute: u64,
    /// (tokens left, when last refilled)
    state: Mutex<(f64, Instant)>,
}

impl TokenBudget {
    fn new(per_minute: u64) -> TokenBudget {
        TokenBudget {
            per_minute,
            state: Mutex::new((per_minute as f64, Instant::now())),
        }
    }

    fn per_second(&self) -> f64 {
        self.per_minute as f64 / 60.0
    }

    /// The tokens left now, refilled.
    fn refill(&self) -> std::sync::MutexGuard<'_, (f64, Instant)> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let refilled = state.0 + (now - state.1).as_secs_f64() * self.per_second();
        *state = (refilled.min(self.per_minute as f64), now);
        state
    }

    fn charge(&self, tokens: u64) {
        self.refill().0 -= tokens as f64;
    }

    /// Ok while tokens are left; else how long until some are.
    fn check(&self) -> Result<(), Duration> {
        let left = self.refill().0;
        if left > 0.0 {
            return Ok(());
        }
        let rate = self.per_second().max(f64::MIN_POSITIVE);
        Err(Duration::from_secs_f64(((1.0 - left) / rate).min(3600.0)))
    }
}

/// Per-tenant request counters, for `/metrics`. Kept across quota changes.
#[derive(Default)]
pub struct TenantCounters {
    success: AtomicU64,
    failure: AtomicU64,
    duration_us: AtomicU64,
    rejected_rate: AtomicU64,
    rejected_concurrency: AtomicU64,
    rejected_tokens: AtomicU64,
    /// LLM tokens charged to the tenant.
    tokens: AtomicU64,
}

/// One tenant as requests see it: its record and the live state its quotas need.
pub struct Tenant {
    pub name: Arc<str>,
    record: TenantRecord,
    concurrency: Arc<Semaphore>,
    rate: Option<Arc<RateLimiter>>,
    tokens: Option<Arc<TokenBudget>>,
    counters: Arc<TenantCounters>,
}

/// A client request admitted within its tenant's quotas; holds one concurrency slot.
pub struct Admitted {
    _slot: OwnedSemaphorePermit,
    counters: Arc<TenantCounters>,
    started: Instant,
    /// Set by [`Admitted::finish`]; a request dropped before it (its client went away) is
    /// counted as a failure when the admission drops, so no request escapes the accounting.
    ok: bool,
}

impl Admitted {
    /// Counts the request's outcome and time.
    pub fn finish(mut self, ok: bool) {
        self.ok = ok;
    }

    /// Counts the request as a success when the admission drops (a stream that started: its
    /// end is whenever its reader stops).
    pub fn started(mut self) -> Admitted {
        self.ok = true;
        self
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let counter = if self.ok {
            &self.counters.success
        } else {
            &self.counters.failure
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.counters
            .duration_us
            .fetch_add(self.started.elapsed().as_micros() as u64, Ordering::Relaxed);
    }
}

impl Tenant {
    fn new(record: TenantRecord, previous: Option<&Tenant>) -> Tenant {
        let quotas = &record.quotas;
        // Each limit keeps its state (requests in flight, the rate's and the budget's spending)
        // unless its own quota changed: changing one quota must not reset the others.
        let kept = |same: fn(&Quotas, &Quotas) -> bool| {
            previous.filter(|p| same(&p.record.quotas, quotas))
        };
        let concurrency = match kept(|a, b| a.max_concurrent_requests == b.max_concurrent_requests)
        {
            Some(p) => p.concurrency.clone(),
            None => Arc::new(Semaphore::new(quotas.max_concurrent_requests as usize)),
        };
        let rate = match kept(|a, b| a.requests_per_second == b.requests_per_second) {
            Some(p) => p.rate.clone(),
            None => NonZeroU32::new(quotas.requests_per_second)
                .map(|rps| Arc::new(RateLimiter::direct(governor::Quota::per_second(rps)))),
        };
        let tokens = match kept(|a, b| a.tokens_per_minute == b.tokens_per_minute) {
            Some(p) => p.tokens.clone(),
            None => (quotas.tokens_per_minute > 0)
                .then(|| Arc::new(TokenBudget::new(quotas.tokens_per_minute))),
        };
        Tenant {
            name: Arc::from(record.name.as_str()),
            concurrency,
            rate,
            tokens,
            counters: previous.map_or_else(Default::default, |p| p.counters.clone()),
            record,
        }
    }

    pub fn quotas(&self) -> &Quotas {
        &self.record.quotas
    }

    /// Admits one client request, or says which quota refused it and when to retry. The
    /// concurrency slot is taken first, so a request refused for it spends no rate.
    pub fn admit(&self) -> Result<Admitted, InferError> {
        let slot = self.concurrency.clone().try_acquire_owned().map_err(|_| {
            self.counters
                .rejected_concurrency
                .fetch_add(1, Ordering::Relaxed);
            quota_error(
                format!(
                    "tenant '{}' has {} requests in flight, its quota max_concurrent_requests; retry later",
                    self.name, self.record.quotas.max_concurrent_requests
                ),
                Duration::from_secs(1),
            )
        })?;
        if let Some(rate) = &self.rate
            && let Err(not_until) = rate.check()
        {
            use governor::clock::Clock as _;
            self.counters.rejected_rate.fetch_add(1, Ordering::Relaxed);
            let wait = not_until.wait_time_from(governor::clock::DefaultClock::default().now());
            return Err(quota_error(
                format!(
                    "tenant '{}' is over its quota requests_per_second ({}); retry later",
                    self.name, self.record.quotas.requests_per_second
                ),
                wait,
            ));
        }
        if let Some(tokens) = &self.tokens
            && let Err(wait) = tokens.check()
        {
            self.counters
                .rejected_tokens
                .fetch_add(1, Ordering::Relaxed);
            return Err(quota_error(
                format!(
                    "tenant '{}' has spent its quota tokens_per_minute ({}); retry later",
                    self.name, self.record.quotas.tokens_per_minute
                ),
                wait,
            ));
        }
        Ok(Admitted {
            _slot: slot,
            counters: self.counters.clone(),
            started: Instant::now(),
            ok: false,
        })
    }
}

fn quota_error(message: String, retry_after: Duration) -> InferError {
    InferError {
        retry_after: Some(retry_after),
        ..InferError::new(ErrorKind::ResourceExhausted, message)
    }
}

impl crate::backend::llm::TokenMeter for Tenants {
    fn charge(&self, tenant: &str, tokens: u64) {
        self.charge_tokens(tenant, tokens);
    }
}

/// The admin key, kept out of `Debug` output and logs.
#[derive(Clone)]
pub struct AdminKey(pub String);

impl std::fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminKey(..)")
    }
}

/// A tenant's Wasm ceilings: every deployment's own limits are clamped to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WasmCeiling {
    pub max_memory_bytes: u64,
    pub max_time: Duration,
}

/// Who made a request: the principal its key authenticates (not the model that calls; see
/// `namespace::Caller`).
#[derive(Clone)]
pub enum Principal {
    /// The operator: the admin key, or anyone on a server without tenancy.
    Operator,
    Tenant(Arc<Tenant>),
}

impl Principal {
    /// The namespace the principal's names resolve in (None: the operator's).
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Principal::Operator => None,
            Principal::Tenant(t) => Some(&t.name),
        }
    }

    pub fn tenant(&self) -> Option<Arc<str>> {
        match self {
            Principal::Operator => None,
            Principal::Tenant(t) => Some(t.name.clone()),
        }
    }
}

#[derive(Default)]
struct Registry {
    by_name: BTreeMap<String, Arc<Tenant>>,
    /// Key id → tenant, so a key is checked against one hash.
    by_key: HashMap<String, Arc<Tenant>>,
}

impl Registry {
    fn insert(&mut self, tenant: Arc<Tenant>) {
        for key in &tenant.record.keys {
            self.by_key.insert(key.id.clone(), tenant.clone());
        }
        self.by_name.insert(tenant.record.name.clone(), tenant);
    }

    fn records(&self) -> Vec<TenantRecord> {
        self.by_name.values().map(|t| t.record.clone()).collect()
    }
}

fn parse_registry(bytes: &[u8], generation: u64) -> Result<RegistryFile, TenantError> {
    let mut file: RegistryFile = serde_json::from_slice(bytes).map_err(|e| {
        TenantError::Invalid(format!(
            "the shared tenant registry, generation {generation}: {e}"
        ))
    })?;
    file.generation = generation;
    Ok(file)
}

/// The tenants of a server.
pub struct Tenants {
    /// Set when tenancy is on: the keyed hash of the admin key.
    admin: Option<[u8; 32]>,
    root: PathBuf,
    secret: [u8; 32],
    registry: ArcSwap<Registry>,
    /// One change at a time: read, write the file, swap.
    writer: Mutex<()>,
    /// The store replicas share, which holds the registry every replica serves.
    shared: Option<Arc<crate::store::shared::SharedStore>>,
    /// The shared registry generation this replica serves.
    generation: AtomicU64,
    /// Tenants whose deployments this replica has yet to remove ([`Tenants::take_removed`]).
    removed: Mutex<Vec<String>>,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TenantError + '_ {
    move |source| {
        TenantError::Store(StoreError::Io {
            path: path.to_owned(),
            source,
        })
    }
}

fn random_bytes<const N: usize>() -> Result<[u8; N], TenantError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes)
        .map_err(|e| TenantError::Invalid(format!("no random numbers from the OS: {e}")))?;
    Ok(bytes)
}

impl Tenants {
    /// A server without tenancy: everyone is the operator.
    pub fn disabled() -> Tenants {
        Tenants {
            admin: None,
            root: PathBuf::new(),
            secret: [0; 32],
            registry: ArcSwap::default(),
            writer: Mutex::new(()),
            shared: None,
            generation: AtomicU64::new(0),
            removed: Mutex::default(),
        }
    }

    /// [`Tenants::open`] for a replica of a shared store: the secret and the registry come from
    /// the shared store, cached under `root`; a replica that cannot reach the store starts from
    /// its cache (and refuses to start without one: a secret of its own would not match).
    pub async fn open_shared(
        root: &Path,
        admin_key: &str,
        shared: Arc<crate::store::shared::SharedStore>,
    ) -> Result<Tenants, TenantError> {
        let secret = match shared.tenant_secret().await {
            Ok(secret) => Some(secret),
            Err(e) => {
                tracing::error!("{e}; tenants start from this replica's cache");
                None
            }
        };
        let registry = match shared.registry_generation().await {
            Ok(0) => Some(RegistryFile::default()),
            Ok(generation) => match shared.registry(generation).await {
                Ok(bytes) => Some(parse_registry(&bytes, generation)?),
                Err(e) => {
                    tracing::error!("{e}; tenants start from this replica's cache");
                    None
                }
            },
            Err(_) => None,
        };
        let (root, key) = (root.to_owned(), admin_key.to_owned());
        let mut tenants = tokio::task::spawn_blocking(move || {
            Tenants::open_with(&root, &key, Some((secret, registry)))
        })
        .await
        .map_err(|e| TenantError::Invalid(e.to_string()))??;
        tenants.shared = Some(shared);
        Ok(tenants)
    }

    /// The store replicas share, when this server is one of them.
    pub fn shared(&self) -> Option<&Arc<crate::store::shared::SharedStore>> {
        self.shared.as_ref()
    }

    /// The shared registry generation this replica serves.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Serves `generation` of the shared registry (another replica changed it). Tenants it
    /// no longer names are left for [`Tenants::take_removed`].
    pub fn follow(&self, generation: u64, bytes: &[u8]) -> Result<(), TenantError> {
        let file = parse_registry(bytes, generation)?;
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if generation <= self.generation() {
            return Ok(());
        }
        let previous = self.registry.load_full();
        self.serve(&previous, file.tenants, generation)
    }

    /// Writes `records` to the cache file and serves them.
    fn serve(
        &self,
        previous: &Registry,
        records: Vec<TenantRecord>,
        generation: u64,
    ) -> Result<(), TenantError> {
        let bytes = serde_json::to_vec_pretty(&RegistryFile {
            tenants: records.clone(),
            generation,
        })
        .map_err(|e| TenantError::Invalid(e.to_string()))?;
        replace_file(&self.root.join(REGISTRY_FILE), &bytes)?;
        if self.shared.is_some() {
            // Tenants gone, or replaced by a new one of the same name: a replica removes what it
            // holds of them (`take_removed`).
            let gone = previous.by_name.values().filter(|old| {
                !records
                    .iter()
                    .any(|r| r.name == old.record.name && r.incarnation == old.record.incarnation)
            });
            let mut removed = self.removed.lock().unwrap_or_else(|p| p.into_inner());
            removed.extend(gone.map(|t| t.record.name.clone()));
        }
        let mut next = Registry::default();
        for record in records {
            let old = previous
                .by_name
                .get(&record.name)
                .filter(|t| t.record.incarnation == record.incarnation)
                .map(|t| &**t);
            next.insert(Arc::new(Tenant::new(record, old)));
        }
        self.registry.store(Arc::new(next));
        self.generation.store(generation, Ordering::Relaxed);
        Ok(())
    }

    /// Tenants whose deployments this replica must remove (deleted, or replaced by a new
    /// tenant of the same name, in a registry it now serves); taken once.
    pub fn take_removed(&self) -> Vec<String> {
        let mut removed = self.removed.lock().unwrap_or_else(|p| p.into_inner());
        let mut taken: Vec<String> = std::mem::take(&mut *removed);
        taken.sort();
        taken.dedup();
        taken
    }

    /// `name`'s deployments were removed here already (its deletion ran on this replica).
    pub fn removed_here(&self, name: &str) {
        let mut removed = self.removed.lock().unwrap_or_else(|p| p.into_inner());
        removed.retain(|n| n != name);
    }

    /// Opens the registry of the store at `root` (creating its secret on first use) with tenancy
    /// on, and removes the folders of tenants it does not name (a crash during a deletion).
    /// Blocks on the disk.
    pub fn open(root: &Path, admin_key: &str) -> Result<Tenants, TenantError> {
        Tenants::open_with(root, admin_key, None)
    }

    /// `shared`: a replica's secret and registry as the shared store gave them (`None` each
    /// where it could not), to cache and serve.
    fn open_with(
        root: &Path,
        admin_key: &str,
        shared: Option<(Option<[u8; 32]>, Option<RegistryFile>)>,
    ) -> Result<Tenants, TenantError> {
        if admin_key.len() < 16 {
            return Err(TenantError::Invalid(
                "the admin key must be at least 16 characters".into(),
            ));
        }
        std::fs::create_dir_all(root).map_err(io(root))?;
        let secret_path = root.join(SECRET_FILE);
        if let Some((Some(secret), _)) = &shared {
            replace_file(&secret_path, secret)?;
        }
        let secret: [u8; 32] = match std::fs::read(&secret_path) {
            Ok(bytes) => bytes.try_into().map_err(|_| {
                TenantError::Invalid(format!("{} is not 32 bytes", secret_path.display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && shared.is_some() => {
                return Err(TenantError::Invalid(
                    "the shared deployment store is unreachable and this replica has no cached tenant secret: it cannot check tenants' keys; start it once the store answers".into(),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let secret = random_bytes::<32>()?;
                replace_file(&secret_path, &secret)?;
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&secret_path, std::fs::Permissions::from_mode(0o600))
                        .map_err(io(&secret_path))?;
                }
                secret
            }
            Err(e) => return Err(io(&secret_path)(e)),
        };
        let registry_path = root.join(REGISTRY_FILE);
        if let Some((_, Some(file))) = &shared {
            let bytes =
                serde_json::to_vec_pretty(file).map_err(|e| TenantError::Invalid(e.to_string()))?;
            replace_file(&registry_path, &bytes)?;
        }
        let file: RegistryFile = match std::fs::read(&registry_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| TenantError::Invalid(format!("{}: {e}", registry_path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => RegistryFile::default(),
            Err(e) => return Err(io(&registry_path)(e)),
        };
        let generation = file.generation;
        let mut registry = Registry::default();
        for record in file.tenants {
            registry.insert(Arc::new(Tenant::new(record, None)));
        }
        let tenants_dir = root.join(TENANTS_DIR);
        if let Ok(entries) = std::fs::read_dir(&tenants_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !registry.by_name.contains_key(&name) {
                    tracing::info!(tenant = %name, "removing the deployments of a deleted tenant");
                    let path = entry.path();
                    std::fs::remove_dir_all(&path).map_err(io(&path))?;
                }
            }
        }
        let tenants = Tenants {
            admin: None,
            root: root.to_owned(),
            secret,
            registry: ArcSwap::from_pointee(registry),
            writer: Mutex::new(()),
            shared: None,
            generation: AtomicU64::new(generation),
            removed: Mutex::default(),
        };
        Ok(Tenants {
            admin: Some(tenants.mac(admin_key)),
            ..tenants
        })
    }

    /// Whether tenancy is on.
    pub fn enabled(&self) -> bool {
        self.admin.is_some()
    }

    /// The keyed hash of `key`, not yet finalized.
    fn hasher(&self, key: &str) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret)
            .expect("HMAC takes a key of any length");
        mac.update(key.as_bytes());
        mac
    }

    fn mac(&self, key: &str) -> [u8; 32] {
        self.hasher(key).finalize().into_bytes().into()
    }

    /// Compares in constant time: `expected` is a keyed hash, `key` what the client sent.
    fn matches(&self, key: &str, expected: &[u8]) -> bool {
        self.hasher(key).verify_slice(expected).is_ok()
    }

    /// Who sent `authorization` (the header's value). Without tenancy, everyone is the operator.
    pub fn authenticate(&self, authorization: Option<&[u8]>) -> Result<Principal, AuthError> {
        let Some(admin) = &self.admin else {
            return Ok(Principal::Operator);
        };
        let header = authorization.ok_or(AuthError::Missing)?;
        let key = std::str::from_utf8(header)
            .ok()
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or(AuthError::Missing)?;
        if let Some(id) = key
            .strip_prefix(KEY_PREFIX)
            .and_then(|rest| rest.split_once('_'))
            .map(|(id, _)| id)
        {
            let registry = self.registry.load();
            let tenant = registry.by_key.get(id).ok_or(AuthError::Invalid)?;
            let record = tenant
                .record
                .keys
                .iter()
                .find(|k| k.id == id)
                .ok_or(AuthError::Invalid)?;
            let expected = hex::decode(&record.hash).map_err(|_| AuthError::Invalid)?;
            return if self.matches(key, &expected) {
                Ok(Principal::Tenant(tenant.clone()))
            } else {
                Err(AuthError::Invalid)
            };
        }
        if self.matches(key, admin) {
            Ok(Principal::Operator)
        } else {
            Err(AuthError::Invalid)
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<Tenant>> {
        self.registry.load().by_name.get(name).cloned()
    }

    /// Charges `tokens` LLM tokens to `tenant`'s budget (the engine calls it as they are used).
    pub fn charge_tokens(&self, tenant: &str, tokens: u64) {
        if let Some(t) = self.get(tenant) {
            t.counters.tokens.fetch_add(tokens, Ordering::Relaxed);
            if let Some(budget) = &t.tokens {
                budget.charge(tokens);
            }
        }
    }

    /// Whether `tenant` may call the operator's model `model`.
    pub fn granted(&self, tenant: &str, model: &str) -> bool {
        self.registry
            .load()
            .by_name
            .get(tenant)
            .is_some_and(|t| t.record.grants.contains(model))
    }

    /// The Wasm ceilings of the namespace `key` is in (None: the operator's, no ceiling).
    pub fn ceiling(&self, key: &str) -> Option<WasmCeiling> {
        let tenant = self.get(crate::namespace::ModelKey::parse(key).tenant?)?;
        Some(WasmCeiling {
            max_memory_bytes: tenant.record.quotas.max_wasm_memory_bytes,
            max_time: Duration::from_millis(tenant.record.quotas.max_wasm_time_ms),
        })
    }

    /// The operator's models granted to `tenant`.
    pub fn grants(&self, tenant: &str) -> BTreeSet<String> {
        self.get(tenant)
            .map(|t| t.record.grants.clone())
            .unwrap_or_default()
    }

    pub fn list(&self) -> Vec<TenantInfo> {
        self.registry
            .load()
            .by_name
            .values()
            .map(|t| info(&t.record))
            .collect()
    }

    pub fn info(&self, name: &str) -> Result<TenantInfo, TenantError> {
        self.get(name)
            .map(|t| info(&t.record))
            .ok_or_else(|| unknown(name))
    }

    /// Applies `change` to the records, writes them durably, then serves them. Blocks.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut Vec<TenantRecord>) -> Result<T, TenantError>,
    ) -> Result<T, TenantError> {
        if !self.enabled() {
            return Err(TenantError::Disabled);
        }
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let previous = self.registry.load_full();
        let Some(shared) = &self.shared else {
            let mut records = previous.records();
            let out = change(&mut records)?;
            self.serve(&previous, records, 0)?;
            return Ok(out);
        };
        // A replica: the change applies to the newest shared registry, read fresh, and is
        // published as its next generation (create-only) before it serves here. Callers run
        // this through `deploy::disk` (block_in_place), where blocking on the runtime is allowed.
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| TenantError::Invalid("no runtime for the shared store".into()))?;
        let (generation, mut records) = runtime.block_on(async {
            let generation = shared.registry_generation().await?;
            let records = match generation {
                0 => Vec::new(),
                g => parse_registry(&shared.registry(g).await?, g)?.tenants,
            };
            Ok::<_, TenantError>((generation, records))
        })?;
        let out = change(&mut records)?;
        let bytes = serde_json::to_vec_pretty(&RegistryFile {
            tenants: records.clone(),
            generation: generation + 1,
        })
        .map_err(|e| TenantError::Invalid(e.to_string()))?;
        runtime.block_on(shared.publish_registry(generation + 1, bytes::Bytes::from(bytes)))?;
        self.serve(&previous, records, generation + 1)?;
        Ok(out)
    }

    pub fn create(&self, name: &str) -> Result<TenantInfo, TenantError> {
        check_model_name(name).map_err(|e| {
            TenantError::Invalid(e.to_string().replace("model name", "tenant name"))
        })?;
        let incarnation = hex::encode(random_bytes::<8>()?);
        if let Some(shared) = &self.shared {
            // Whatever an earlier tenant of this name left in the shared store (a deletion
            // whose clean-up failed) goes before the new one exists.
            let runtime = tokio::runtime::Handle::try_current()
                .map_err(|_| TenantError::Invalid("no runtime for the shared store".into()))?;
            runtime.block_on(async {
                let generation = shared.registry_generation().await?;
                if generation > 0
                    && parse_registry(&shared.registry(generation).await?, generation)?
                        .tenants
                        .iter()
                        .any(|r| r.name == name)
                {
                    return Err(TenantError::Conflict(format!(
                        "tenant '{name}' already exists"
                    )));
                }
                shared.remove_tenant(name).await?;
                Ok(())
            })?;
        }
        self.change(|records| {
            if records.iter().any(|r| r.name == name) {
                return Err(TenantError::Conflict(format!(
                    "tenant '{name}' already exists"
                )));
            }
            let record = TenantRecord {
                name: name.to_owned(),
                created_at: now_unix(),
                keys: Vec::new(),
                quotas: Quotas::default(),
                grants: BTreeSet::new(),
                incarnation: incarnation.clone(),
            };
            let shown = info(&record);
            records.push(record);
            Ok(shown)
        })
    }

    /// Removes the tenant from the registry: its keys stop working at once. Its deployments are
    /// the server's to remove (`Server::delete_tenant`).
    pub fn delete(&self, name: &str) -> Result<(), TenantError> {
        self.change(|records| {
            let before = records.len();
            records.retain(|r| r.name != name);
            if records.len() == before {
                return Err(unknown(name));
            }
            Ok(())
        })
    }

    /// Removes what is left on disk of a deleted tenant.
    pub fn remove_files(&self, name: &str) -> Result<(), TenantError> {
        let dir = self.root.join(TENANTS_DIR).join(name);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&dir)(e)),
            _ => Ok(()),
        }
    }

    /// A new API key for `name`: `(id, key)`. The key is shown only now; the registry keeps its
    /// keyed hash.
    pub fn issue_key(&self, name: &str) -> Result<(String, String), TenantError> {
        let id = hex::encode(random_bytes::<6>()?);
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes::<32>()?);
        let key = format!("{KEY_PREFIX}{id}_{secret}");
        let hash = hex::encode(self.mac(&key));
        self.change(|records| {
            let record = find(records, name)?;
            record.keys.push(KeyRecord {
                id: id.clone(),
                hash,
                created_at: now_unix(),
            });
            Ok(())
        })?;
        Ok((id, key))
    }

    pub fn revoke_key(&self, name: &str, id: &str) -> Result<(), TenantError> {
        self.change(|records| {
            let record = find(records, name)?;
            let before = record.keys.len();
            record.keys.retain(|k| k.id != id);
            if record.keys.len() == before {
                return Err(TenantError::NotFound(format!(
                    "tenant '{name}' has no key '{id}'"
                )));
            }
            Ok(())
        })
    }

    pub fn set_quotas(&self, name: &str, patch: serde_json::Value) -> Result<Quotas, TenantError> {
        self.change(|records| {
            let record = find(records, name)?;
            record.quotas = record.quotas.patched(patch)?;
            Ok(record.quotas.clone())
        })
    }

    /// Grants (or with `allow` false, revokes) `name` the use of the operator's `model`.
    pub fn set_grant(&self, name: &str, model: &str, allow: bool) -> Result<(), TenantError> {
        check_model_name(model).map_err(|e| TenantError::Invalid(e.to_string()))?;
        self.change(|records| {
            let record = find(records, name)?;
            if allow {
                record.grants.insert(model.to_owned());
            } else if !record.grants.remove(model) {
                return Err(TenantError::NotFound(format!(
                    "tenant '{name}' has no grant for '{model}'"
                )));
            }
            Ok(())
        })
    }

    /// Per-tenant request metrics, Prometheus text.
    pub fn render_metrics(&self, out: &mut String) {
        use crate::metrics::Family;
        let registry = self.registry.load();
        if registry.by_name.is_empty() {
            return;
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut family = Family::start(
            out,
            "tessera_tenant_requests_total",
            "counter",
            "Client requests (inferences and function invocations) admitted per tenant, by outcome",
        );
        for (name, t) in &registry.by_name {
            let c = &t.counters;
            family.sample(
                &[("tenant", name), ("outcome", "success")],
                load(&c.success),
            );
            family.sample(
                &[("tenant", name), ("outcome", "failure")],
                load(&c.failure),
            );
        }
        let mut family = Family::start(
            out,
            "tessera_tenant_rejected_total",
            "counter",
            "Client requests refused by a tenant quota",
        );
        for (name, t) in &registry.by_name {
            let c = &t.counters;
            let quota = |q: &'static str| [("tenant", name.as_ref()), ("quota", q)];
            family.sample(&quota("requests_per_second"), load(&c.rejected_rate));
            family.sample(
                &quota("max_concurrent_requests"),
                load(&c.rejected_concurrency),
            );
            family.sample(&quota("tokens_per_minute"), load(&c.rejected_tokens));
        }
        let mut family = Family::start(
            out,
            "tessera_tenant_tokens_total",
            "counter",
            "LLM tokens (prompt and generated) charged to a tenant",
        );
        for (name, t) in &registry.by_name {
            family.sample(&[("tenant", name)], load(&t.counters.tokens));
        }
        let mut family = Family::start(
            out,
            "tessera_tenant_request_duration_us",
            "counter",
            "Total time of a tenant's admitted requests, in microseconds",
        );
        for (name, t) in &registry.by_name {
            family.sample(&[("tenant", name)], load(&t.counters.duration_us));
        }
        let mut family = Family::start(
            out,
            "tessera_tenant_inflight_requests",
            "gauge",
            "Client requests a tenant has in flight",
        );
        for (name, t) in &registry.by_name {
            let inflight = (t.record.quotas.max_concurrent_requests as usize)
                .saturating_sub(t.concurrency.available_permits());
            family.sample(&[("tenant", name)], inflight);
        }
    }
}

fn unknown(name: &str) -> TenantError {
    TenantError::NotFound(format!("tenant '{name}' does not exist"))
}

fn find<'r>(
    records: &'r mut [TenantRecord],
    name: &str,
) -> Result<&'r mut TenantRecord, TenantError> {
    records
        .iter_mut()
        .find(|r| r.name == name)
        .ok_or_else(|| unknown(name))
}

fn info(record: &TenantRecord) -> TenantInfo {
    TenantInfo {
        name: record.name.clone(),
        created_at: record.created_at,
        keys: record.keys.iter().map(|k| k.id.clone()).collect(),
        quotas: record.quotas.clone(),
        grants: record.grants.iter().cloned().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "admin-key-for-tests-0123";

    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir().expect("a scratch folder")
    }

    fn bearer(key: &str) -> Vec<u8> {
        format!("Bearer {key}").into_bytes()
    }

    #[test]
    fn keys_authenticate_until_revoked_and_survive_a_reopen() -> Result<(), TenantError> {
        let dir = scratch();
        let tenants = Tenants::open(dir.path(), ADMIN)?;
        tenants.create("acme")?;
        let (id, key) = tenants.issue_key("acme")?;
        assert!(matches!(
            tenants.authenticate(Some(&bearer(&key))),
            Ok(Principal::Tenant(t)) if &*t.name == "acme"
        ));
        assert!(matches!(
            tenants.authenticate(Some(&bearer(ADMIN))),
            Ok(Principal::Operator)
        ));
        assert_eq!(tenants.authenticate(None).err(), Some(AuthError::Missing));
        let mut wrong = key.clone();
        wrong.pop();
        wrong.push(if key.ends_with('A') { 'B' } else { 'A' });
        assert_eq!(
            tenants.authenticate(Some(&bearer(&wrong))).err(),
            Some(AuthError::Invalid)
        );
        // What is on disk is a keyed hash, never the key.
        let on_disk =
            std::fs::read_to_string(dir.path().join(REGISTRY_FILE)).map_err(io(dir.path()))?;
        assert!(!on_disk.contains(&key[KEY_PREFIX.len() + 13..]));

        let reopened = Tenants::open(dir.path(), ADMIN)?;
        assert!(reopened.authenticate(Some(&bearer(&key))).is_ok());
        reopened.revoke_key("acme", &id)?;
        assert_eq!(
            reopened.authenticate(Some(&bearer(&key))).err(),
            Some(AuthError::Invalid)
        );
        let again = Tenants::open(dir.path(), ADMIN)?;
        assert!(again.authenticate(Some(&bearer(&key))).is_err());
        Ok(())
    }

    #[test]
    fn quotas_patch_named_fields_and_refuse_unknown_ones() -> Result<(), TenantError> {
        let q = Quotas::default().patched(serde_json::json!({ "requests_per_second": 5 }))?;
        assert_eq!(q.requests_per_second, 5);
        assert_eq!(q.max_models, Quotas::default().max_models);
        assert!(
            Quotas::default()
                .patched(serde_json::json!({ "requests_per_minute": 5 }))
                .is_err()
        );
        assert!(
            Quotas::default()
                .patched(serde_json::json!({ "max_concurrent_requests": 0 }))
                .is_err()
        );
        Ok(())
    }

    #[test]
    fn changing_one_quota_keeps_the_others_spent() -> Result<(), TenantError> {
        let dir = scratch();
        let tenants = Tenants::open(dir.path(), ADMIN)?;
        tenants.create("acme")?;
        tenants.set_quotas(
            "acme",
            serde_json::json!({ "max_concurrent_requests": 1, "requests_per_second": 1 }),
        )?;
        let acme = tenants.get("acme").ok_or_else(|| unknown("acme"))?;
        let held = acme.admit().map_err(|e| TenantError::Invalid(e.message))?;
        // An unrelated quota changes: the request in flight still counts, and so does the rate.
        tenants.set_quotas("acme", serde_json::json!({ "max_models": 3 }))?;
        let acme = tenants.get("acme").ok_or_else(|| unknown("acme"))?;
        let busy = acme.admit().err().map(|e| e.message).unwrap_or_default();
        assert!(busy.contains("max_concurrent_requests"), "{busy}");
        held.finish(true);
        let limited = acme.admit().err().map(|e| e.message).unwrap_or_default();
        assert!(limited.contains("requests_per_second"), "{limited}");
        Ok(())
    }

    #[test]
    fn admission_counts_concurrency_and_rate() -> Result<(), TenantError> {
        let dir = scratch();
        let tenants = Tenants::open(dir.path(), ADMIN)?;
        tenants.create("acme")?;
        tenants.set_quotas(
            "acme",
            serde_json::json!({ "max_concurrent_requests": 1, "requests_per_second": 2 }),
        )?;
        let acme = tenants.get("acme").ok_or_else(|| unknown("acme"))?;
        let first = acme.admit().map_err(|e| TenantError::Invalid(e.message))?;
        let busy = acme.admit().err().map(|e| e.message).unwrap_or_default();
        assert!(busy.contains("max_concurrent_requests"), "{busy}");
        first.finish(true);
        let second = acme.admit().map_err(|e| TenantError::Invalid(e.message))?;
        // A request whose client went away is dropped unfinished: still counted, as a failure.
        drop(second);
        let counted = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(
            (
                counted(&acme.counters.success),
                counted(&acme.counters.failure)
            ),
            (1, 1)
        );
        // Two per second with a burst of two: the third in the same instant waits.
        let limited = acme.admit().err().ok_or_else(|| unknown("a refusal"))?;
        assert!(limited.message.contains("requests_per_second"));
        assert!(
            limited
                .retry_after
                .is_some_and(|d| d <= Duration::from_secs(1))
        );
        Ok(())
    }

    #[test]
    fn a_spent_token_budget_refuses_until_it_refills() {
        let budget = TokenBudget::new(60); // one token a second
        assert!(budget.check().is_ok());
        budget.charge(70);
        let wait = budget.check().expect_err("overspent");
        // About 11 s until the balance is above zero again.
        assert!((9.0..=12.0).contains(&wait.as_secs_f64()), "{wait:?}");
        // It never holds more than a minute's tokens.
        let fresh = TokenBudget::new(60);
        fresh.state.lock().unwrap_or_else(|p| p.into_inner()).1 -= Duration::from_secs(600);
        assert!(fresh.refill().0 <= 60.0);
    }

    #[test]
    fn without_an_admin_key_everyone_is_the_operator() {
        let tenants = Tenants::disabled();
        assert!(matches!(
            tenants.authenticate(None),
            Ok(Principal::Operator)
        ));
        assert!(matches!(tenants.create("acme"), Err(TenantError::Disabled)));
    }
}
