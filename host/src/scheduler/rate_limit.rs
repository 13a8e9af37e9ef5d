//! Triton's rate limiter: with `--rate-limit=execution_count`, an instance runs a batch only
//! when the resources its `instance_group.rate_limiter` names are free. Resource totals come
//! from `--rate-limit-resource NAME:COUNT[:DEVICE]`; a resource not given there gets the largest
//! count any single instance needs, so every instance can run alone. (This CPU build has one
//! device; the DEVICE part is accepted and ignored. Instance `priority` is accepted and not yet
//! used to order waiting instances: waiters are served as resources free up.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Resource units one instance needs to execute.
pub type Requirement = Vec<(String, u32)>;

#[derive(Debug, Default)]
struct Pool {
    /// Units of each resource not in use.
    free: HashMap<String, u64>,
    /// Totals given on the command line; these are never raised by instance needs.
    fixed: HashMap<String, u64>,
    /// Total of each resource (fixed or derived).
    total: HashMap<String, u64>,
}

/// The server's rate limiter; disabled means every acquisition succeeds at once.
#[derive(Debug, Default)]
pub struct RateLimiter {
    enabled: bool,
    pool: Mutex<Pool>,
    freed: Notify,
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
        self.limiter.freed.notify_waiters();
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
            freed: Notify::new(),
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

    /// Waits until `need` is free and takes it.
    pub async fn acquire(self: &Arc<Self>, need: &Requirement) -> Permit {
        if !self.enabled || need.is_empty() {
            return Permit {
                limiter: self.clone(),
                taken: Vec::new(),
            };
        }
        loop {
            let freed = self.freed.notified();
            {
                let mut pool = self.lock();
                if need
                    .iter()
                    .all(|(name, n)| pool.free.get(name).copied().unwrap_or(0) >= u64::from(*n))
                {
                    for (name, n) in need {
                        if let Some(free) = pool.free.get_mut(name) {
                            *free -= u64::from(*n);
                        }
                    }
                    return Permit {
                        limiter: self.clone(),
                        taken: need.clone(),
                    };
                }
            }
            freed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let first = limiter.acquire(&need).await;
        let waiting = limiter.acquire(&need);
        tokio::pin!(waiting);
        assert!(
            futures::FutureExt::now_or_never(waiting.as_mut()).is_none(),
            "R is taken"
        );
        drop(first);
        let _second = waiting.await;
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
