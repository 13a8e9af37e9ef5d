//! Triton's rate limiter: with `--rate-limit=execution_count`, an instance runs a batch only
//! when the resources its `instance_group.rate_limiter` names are free. Resource totals come
//! from `--rate-limit-resource NAME:COUNT[:DEVICE]`; a resource not given there gets the largest
//! count any single instance needs, so every instance can run alone. (This CPU build has one
//! device; the DEVICE part is accepted and ignored.)
//!
//! Waiting instances are served in the order Triton uses: lowest `executions × priority` first
//! (arrival breaks ties), so an instance with `priority: 2` gets half the turns of one with
//! `priority: 1` when both keep waiting, and `priority: 0` (the default) always goes first. Only
//! the first waiter may take resources: a large need is never starved by smaller ones that keep
//! fitting around it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Resource units one instance needs to execute.
pub type Requirement = Vec<(String, u32)>;

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
    free: HashMap<String, u64>,
    /// Totals given on the command line; these are never raised by instance needs.
    fixed: HashMap<String, u64>,
    /// Total of each resource (fixed or derived).
    total: HashMap<String, u64>,
    /// Instances waiting for resources.
    waiting: BTreeSet<WaitKey>,
    arrivals: u64,
}

impl Pool {
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
pub fn parse_resource(spec: &str) -> Result<(String, u64), String> {
    let mut parts = spec.split(':');
    let name = parts
        .next()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("'{spec}': missing resource name"))?;
    let count = parts
        .next()
        .and_then(|c| c.parse::<u64>().ok())
        .ok_or_else(|| format!("'{spec}': expected NAME:COUNT[:DEVICE]"))?;
    if parts.nth(1).is_some() {
        return Err(format!("'{spec}': expected NAME:COUNT[:DEVICE]"));
    }
    Ok((name.to_owned(), count))
}

impl RateLimiter {
    pub fn new(enabled: bool, resources: &[(String, u64)]) -> RateLimiter {
        let mut pool = Pool::default();
        for (name, count) in resources {
            pool.fixed.insert(name.clone(), *count);
            pool.total.insert(name.clone(), *count);
            pool.free.insert(name.clone(), *count);
        }
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
        for (name, n) in need {
            let n = u64::from(*n);
            if let Some(&fixed) = pool.fixed.get(name) {
                if n > fixed {
                    return Err(format!(
                        "an instance needs {n} of rate-limiter resource '{name}', but only {fixed} exist"
                    ));
                }
                continue;
            }
            let total = pool.total.entry(name.clone()).or_default();
            if n > *total {
                let extra = n - *total;
                *total = n;
                *pool.free.entry(name.clone()).or_default() += extra;
            }
        }
        Ok(())
    }

    /// Waits for this instance's turn and for its resources, and takes them.
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

    #[test]
    fn parses_resource_specs() {
        assert_eq!(parse_resource("R1:10"), Ok(("R1".into(), 10)));
        assert_eq!(parse_resource("R2:5:0"), Ok(("R2".into(), 5)));
        assert!(parse_resource("R3").is_err());
        assert!(parse_resource(":4").is_err());
    }

    #[tokio::test]
    async fn second_holder_waits_for_the_first() {
        let limiter = Arc::new(RateLimiter::new(true, &[("R".into(), 1)]));
        let need: Requirement = vec![("R".into(), 1)];
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
        let limiter = Arc::new(RateLimiter::new(true, &[("R".into(), 1)]));
        let need: Requirement = vec![("R".into(), 1)];
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
        let limiter = Arc::new(RateLimiter::new(true, &[("R".into(), 1)]));
        let need: Requirement = vec![("R".into(), 1)];
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
        let limiter = RateLimiter::new(true, &[("R".into(), 2)]);
        assert!(limiter.register(&vec![("R".into(), 3)]).is_err());
        assert!(
            limiter.register(&vec![("S".into(), 3)]).is_ok(),
            "derived resources grow"
        );
    }
}
