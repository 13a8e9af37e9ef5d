//! Triton's rate limiter: with `--rate-limit=execution_count`, an instance runs a batch only
//! when the resources its `instance_group.rate_limiter` names are free. Resources are per device
//! (each GPU has its own units; CPU instances count on device 0, as in Triton) unless marked
//! `global: true`. Totals come from `--rate-limit-resource NAME:COUNT[:DEVICE]` (without DEVICE,
//! the count applies to every device; a global resource takes the largest count given); a
//! resource not given there gets the largest count any single instance needs, so every instance
//! can run alone.
//!
//! Waiting instances are served in the order Triton uses: lowest `executions × priority` first
//! (arrival breaks ties), so an instance with `priority: 2` gets half the turns of one with
//! `priority: 1` when both keep waiting, and `priority: 0` (the default) always goes first. Only
//! the first waiter may take resources: a large need is never starved by smaller ones that keep
//! fitting around it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// A resource of the rate limiter: a name, on one device or global.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resource {
    pub name: String,
    /// `None`: global (`global: true`), shared by every device.
    pub device: Option<u32>,
}

impl Resource {
    pub fn on_device(name: impl Into<String>, device: u32) -> Resource {
        Resource {
            name: name.into(),
            device: Some(device),
        }
    }

    pub fn global(name: impl Into<String>) -> Resource {
        Resource {
            name: name.into(),
            device: None,
        }
    }
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.device {
            Some(d) => write!(f, "\"{}\" on device {d}", self.name),
            None => write!(f, "\"{}\" (global)", self.name),
        }
    }
}

/// A total from the command line (`--rate-limit-resource NAME:COUNT[:DEVICE]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceLimit {
    pub name: String,
    pub count: u64,
    /// `None`: the count applies to every device.
    pub device: Option<u32>,
}

/// Resource units one instance needs to execute.
pub type Requirement = Vec<(Resource, u32)>;

/// One instance's standing with the rate limiter: what it needs, its `priority` weight and how
/// often it has run.
#[derive(Debug, Clone, Default)]
pub struct Share {
    pub need: Requirement,
    pub priority: u32,
    executions: u64,
}

impl Share {
    pub fn new(need: Requirement, priority: u32) -> Share {
        Share {
            need,
            priority,
            executions: 0,
        }
    }

    /// Triton's "scaled priority": the lower, the sooner this instance runs.
    fn scaled_priority(&self) -> u128 {
        u128::from(self.executions) * u128::from(self.priority)
    }
}

/// Waiting order: scaled priority, then arrival.
type WaitKey = (u128, u64);

#[derive(Debug, Default)]
struct Pool {
    /// Units of each resource not in use.
    free: HashMap<Resource, u64>,
    /// Totals given on the command line; these are never raised by instance needs.
    limits: Vec<ResourceLimit>,
    /// Total of each resource (fixed or derived).
    total: HashMap<Resource, u64>,
    /// Instances waiting for resources.
    waiting: BTreeSet<WaitKey>,
    arrivals: u64,
}

impl Pool {
    /// The command line's total for a resource: the count for its device, else the count for
    /// every device; for a global resource, the largest count given for its name.
    fn fixed(&self, resource: &Resource) -> Option<u64> {
        let named = self.limits.iter().filter(|l| l.name == resource.name);
        match resource.device {
            None => named.map(|l| l.count).max(),
            Some(d) => {
                let named: Vec<&ResourceLimit> = named.collect();
                named
                    .iter()
                    .find(|l| l.device == Some(d))
                    .or_else(|| named.iter().find(|l| l.device.is_none()))
                    .map(|l| l.count)
            }
        }
    }

    fn fits(&self, need: &Requirement) -> bool {
        need.iter()
            .all(|(name, n)| self.free.get(name).copied().unwrap_or(0) >= u64::from(*n))
    }
}

/// The server's rate limiter; disabled means every acquisition succeeds at once.
#[derive(Debug, Default)]
pub struct RateLimiter {
    enabled: bool,
    pool: Mutex<Pool>,
    changed: Notify,
}

/// Held while a batch executes; returns its resources when dropped.
pub struct Permit {
    limiter: Arc<RateLimiter>,
    taken: Requirement,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.taken.is_empty() {
            return;
        }
        let mut pool = self.limiter.lock();
        for (name, n) in &self.taken {
            *pool.free.entry(name.clone()).or_default() += u64::from(*n);
        }
        drop(pool);
        self.limiter.changed.notify_waiters();
    }
}

/// Removes a waiter that gave up (its task was dropped) so that it does not block the line.
struct InLine<'a> {
    limiter: &'a RateLimiter,
    key: WaitKey,
    served: bool,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        if !self.served {
            self.limiter.lock().waiting.remove(&self.key);
            self.limiter.changed.notify_waiters();
        }
    }
}

/// Parses `NAME:COUNT[:DEVICE]`.
pub fn parse_resource(spec: &str) -> Result<ResourceLimit, String> {
    let mut parts = spec.split(':');
    let name = parts
        .next()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("'{spec}': missing resource name"))?;
    let count = parts
        .next()
        .and_then(|c| c.parse::<u64>().ok())
        .ok_or_else(|| format!("'{spec}': expected NAME:COUNT[:DEVICE]"))?;
    let device = match parts.next() {
        None => None,
        Some(d) => Some(
            d.parse::<u32>()
                .map_err(|_| format!("'{spec}': DEVICE must be a device id like 0"))?,
        ),
    };
    if parts.next().is_some() {
        return Err(format!("'{spec}': expected NAME:COUNT[:DEVICE]"));
    }
    Ok(ResourceLimit {
        name: name.to_owned(),
        count,
        device,
    })
}

impl RateLimiter {
    pub fn new(enabled: bool, limits: &[ResourceLimit]) -> RateLimiter {
        let pool = Pool {
            limits: limits.to_vec(),
            ..Pool::default()
        };
        RateLimiter {
            enabled,
            pool: Mutex::new(pool),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes sure the pool can satisfy `need` alone (resources not fixed on the command line
    /// grow to the largest single need). Fails when a fixed total is too small.
    pub fn register(&self, need: &Requirement) -> Result<(), String> {
        let mut pool = self.lock();
        for (resource, n) in need {
            let n = u64::from(*n);
            if let Some(fixed) = pool.fixed(resource) {
                if n > fixed {
                    return Err(format!(
                        "resource count for {resource} is limited to {fixed} which will prevent scheduling of one or more model instances, the minimum required count is {n}"
                    ));
                }
                if !pool.total.contains_key(resource) {
                    pool.total.insert(resource.clone(), fixed);
                    pool.free.insert(resource.clone(), fixed);
                }
                continue;
            }
            let total = pool.total.entry(resource.clone()).or_default();
            if n > *total {
                let extra = n - *total;
                *total = n;
                *pool.free.entry(resource.clone()).or_default() += extra;
            }
        }
        Ok(())
    }

    /// Waits for this instance's turn and for its resources, and takes them. The instance's
    /// need must have been [registered](RateLimiter::register) first.
    pub async fn acquire(self: &Arc<Self>, share: &mut Share) -> Permit {
        if !self.enabled || share.need.is_empty() {
            return Permit {
                limiter: self.clone(),
                taken: Vec::new(),
            };
        }
        let key = {
            let mut pool = self.lock();
            pool.arrivals += 1;
            let key = (share.scaled_priority(), pool.arrivals);
            pool.waiting.insert(key);
            key
        };
        let mut in_line = InLine {
            limiter: self,
            key,
            served: false,
        };
        loop {
            let changed = self.changed.notified();
            {
                let mut pool = self.lock();
                let first = pool.waiting.first() == Some(&key);
                if first && pool.fits(&share.need) {
                    pool.waiting.remove(&key);
                    for (name, n) in &share.need {
                        if let Some(free) = pool.free.get_mut(name) {
                            *free -= u64::from(*n);
                        }
                    }
                    in_line.served = true;
                    share.executions += 1;
                    drop(pool);
                    // The next in line may fit in what is left.
                    self.changed.notify_waiters();
                    return Permit {
                        limiter: self.clone(),
                        taken: share.need.clone(),
                    };
                }
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    /// Polls once; the tests poll again themselves after changing the pool.
    fn poll<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
        future.poll(&mut Context::from_waker(Waker::noop()))
    }

    fn limit(name: &str, count: u64, device: Option<u32>) -> ResourceLimit {
        ResourceLimit {
            name: name.into(),
            count,
            device,
        }
    }

    fn r(name: &str, device: u32) -> Resource {
        Resource::on_device(name, device)
    }

    #[test]
    fn parses_resource_specs() {
        assert_eq!(parse_resource("R1:10"), Ok(limit("R1", 10, None)));
        assert_eq!(parse_resource("R2:5:1"), Ok(limit("R2", 5, Some(1))));
        assert!(parse_resource("R3").is_err());
        assert!(parse_resource(":4").is_err());
        assert!(parse_resource("R:1:gpu").is_err());
        assert!(parse_resource("R:1:0:0").is_err());
    }

    /// One unit of R per device: instances on two GPUs run together, two on one GPU take turns;
    /// a global R is one unit for everybody.
    #[tokio::test]
    async fn per_device_resources_are_separate_and_global_ones_shared() {
        let limiter = Arc::new(RateLimiter::new(true, &[limit("R", 1, None)]));
        let (on0, on1) = (vec![(r("R", 0), 1)], vec![(r("R", 1), 1)]);
        limiter.register(&on0).expect("fits");
        limiter.register(&on1).expect("fits");
        let (mut a, mut b, mut c) = (
            Share::new(on0.clone(), 0),
            Share::new(on1, 0),
            Share::new(on0, 0),
        );
        let _a = limiter.acquire(&mut a).await;
        let _b = limiter.acquire(&mut b).await; // device 1 has its own unit
        let third = limiter.acquire(&mut c);
        tokio::pin!(third);
        assert!(
            poll(third.as_mut()).is_pending(),
            "device 0's unit is taken"
        );

        let global = Arc::new(RateLimiter::new(
            true,
            &[limit("G", 1, Some(0)), limit("G", 1, Some(1))],
        ));
        let need = vec![(Resource::global("G"), 1)];
        global.register(&need).expect("fits");
        let (mut x, mut y) = (Share::new(need.clone(), 0), Share::new(need, 0));
        let _x = global.acquire(&mut x).await;
        let second = global.acquire(&mut y);
        tokio::pin!(second);
        assert!(poll(second.as_mut()).is_pending(), "one global unit");
    }

    #[test]
    fn a_device_count_overrides_the_every_device_count() {
        let limiter = RateLimiter::new(true, &[limit("R", 1, None), limit("R", 4, Some(1))]);
        assert!(limiter.register(&vec![(r("R", 1), 4)]).is_ok());
        let e = limiter
            .register(&vec![(r("R", 0), 2)])
            .expect_err("device 0 has 1");
        assert!(
            e.contains("limited to 1") && e.contains("minimum required count is 2"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn second_holder_waits_for_the_first() {
        let limiter = Arc::new(RateLimiter::new(true, &[limit("R", 1, None)]));
        let need: Requirement = vec![(r("R", 0), 1)];
        limiter.register(&need).expect("fits");
        let (mut a, mut b) = (Share::new(need.clone(), 0), Share::new(need, 0));
        let first = limiter.acquire(&mut a).await;
        let waiting = limiter.acquire(&mut b);
        tokio::pin!(waiting);
        assert!(poll(waiting.as_mut()).is_pending(), "R is taken");
        drop(first);
        let _second = waiting.await;
    }

    /// Two instances keep asking for the one unit of R, the `priority: 3` one always first:
    /// the `priority: 1` one gets three turns for each of its.
    #[tokio::test]
    async fn turns_follow_executions_times_priority() {
        let limiter = Arc::new(RateLimiter::new(true, &[limit("R", 1, None)]));
        let need: Requirement = vec![(r("R", 0), 1)];
        limiter.register(&need).expect("fits");
        let mut holder = Share::new(need.clone(), 0);
        let mut weighted = Share::new(need.clone(), 3);
        let mut favoured = Share::new(need, 1);
        let mut turns = String::new();
        for _ in 0..9 {
            let held = limiter.acquire(&mut holder).await;
            let w = limiter.acquire(&mut weighted);
            let f = limiter.acquire(&mut favoured);
            tokio::pin!(w, f);
            assert!(poll(w.as_mut()).is_pending());
            assert!(poll(f.as_mut()).is_pending());
            drop(held);
            match (poll(w.as_mut()), poll(f.as_mut())) {
                (Poll::Ready(_), Poll::Pending) => turns.push('w'),
                (Poll::Pending, Poll::Ready(_)) => turns.push('f'),
                _ => panic!("exactly one waiter must get R"),
            }
        }
        assert_eq!(turns, "wfffwfffw");
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_the_line() {
        let limiter = Arc::new(RateLimiter::new(true, &[limit("R", 1, None)]));
        let need: Requirement = vec![(r("R", 0), 1)];
        limiter.register(&need).expect("fits");
        let (mut a, mut b, mut c) = (
            Share::new(need.clone(), 0),
            Share::new(need.clone(), 0),
            Share::new(need, 0),
        );
        let held = limiter.acquire(&mut a).await;
        {
            let quitter = limiter.acquire(&mut b);
            tokio::pin!(quitter);
            assert!(poll(quitter.as_mut()).is_pending());
        }
        let next = limiter.acquire(&mut c);
        tokio::pin!(next);
        assert!(poll(next.as_mut()).is_pending());
        drop(held);
        assert!(poll(next.as_mut()).is_ready(), "nobody ahead any more");
    }

    #[test]
    fn fixed_totals_refuse_larger_needs() {
        let limiter = RateLimiter::new(true, &[limit("R", 2, None)]);
        assert!(limiter.register(&vec![(r("R", 0), 3)]).is_err());
        assert!(
            limiter.register(&vec![(r("S", 0), 3)]).is_ok(),
            "derived resources grow"
        );
    }
}
