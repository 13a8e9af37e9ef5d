//! The epoch ticker: advances the engine's epoch every `--epoch-tick-ms` while a guest runs, so
//! a running guest yields to the executor (and its deadline can fire) at least once a tick.
//!
//! It sleeps while no guest runs. A ticker that always ran woke the process 200 times a second
//! on an idle server, and between the short guest calls of a streaming workload it was a fifth
//! of the serving path's own CPU. Every entry into guest code holds a [`Running`] guard; the
//! first one wakes the ticker, which then ticks until none is held. A guard is a value, not a
//! pair of calls, so a call cancelled at its deadline (its future dropped) still lets go.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::Thread;
use std::time::Duration;

use wasmtime::Engine;

struct Shared {
    /// Guest calls under way (a guest awaiting a host call counts: it resumes without notice).
    running: AtomicUsize,
    stopped: AtomicBool,
}

/// Makes every epoch tick of `store`'s guest yield to the executor and put the guest behind the
/// work that waits: with `tokio::task::yield_now`, a yielded task is polled again only after
/// the worker has run its other ready tasks and polled for I/O and timers. wasmtime's own yield
/// wakes the task at once, so a worker busy with looping guests polled for I/O only every 61st
/// task poll (tokio's `event_interval`), each a whole tick here: another tenant's requests then
/// waited up to 300 ms for their sockets to be read (measured with two looping guests on two
/// workers: 134 ms median).
pub fn yield_each_tick<T: 'static>(store: &mut wasmtime::Store<T>) {
    store.epoch_deadline_callback(|_| {
        Ok(wasmtime::UpdateDeadline::YieldCustom(
            1,
            Box::pin(tokio::task::yield_now()),
        ))
    });
    store.set_epoch_deadline(1);
}

pub struct EpochTicker {
    shared: Arc<Shared>,
    thread: Thread,
}

impl EpochTicker {
    /// Starts the ticker thread; it ends when the ticker or the engine is dropped.
    pub fn start(engine: &Engine, tick: Duration) -> std::io::Result<Arc<EpochTicker>> {
        let weak = engine.weak();
        EpochTicker::start_with(tick, move || {
            let Some(engine) = weak.upgrade() else {
                return false;
            };
            engine.increment_epoch();
            true
        })
    }

    /// The ticker calling `tick_once` every `tick` while a guest runs, until it returns false.
    fn start_with(
        tick: Duration,
        tick_once: impl Fn() -> bool + Send + 'static,
    ) -> std::io::Result<Arc<EpochTicker>> {
        let shared = Arc::new(Shared {
            running: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
        });
        let theirs = shared.clone();
        let handle = std::thread::Builder::new()
            .name("tessera-epoch".into())
            .spawn(move || {
                while !theirs.stopped.load(Ordering::Acquire) {
                    if theirs.running.load(Ordering::Acquire) == 0 {
                        // Woken by the next guard (or spuriously: the loop checks again).
                        std::thread::park();
                        continue;
                    }
                    // Sleep first: a guest that just started gets a whole tick before it yields.
                    std::thread::sleep(tick);
                    if !tick_once() {
                        return;
                    }
                }
            })?;
        Ok(Arc::new(EpochTicker {
            shared,
            thread: handle.thread().clone(),
        }))
    }

    /// Held while guest code may run: instantiation, `initialize`, `execute`, `resume`,
    /// `finalize`, a function's `handle`.
    pub fn running(self: &Arc<Self>) -> Running {
        if self.shared.running.fetch_add(1, Ordering::AcqRel) == 0 {
            // Costs a system call only when the ticker is parked.
            self.thread.unpark();
        }
        Running(self.clone())
    }

    #[cfg(test)]
    fn guests_running(&self) -> usize {
        self.shared.running.load(Ordering::Acquire)
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// A guest call under way; the ticker ticks while any exists.
#[must_use = "the ticker stops once the guard is dropped"]
pub struct Running(Arc<EpochTicker>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.shared.running.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::time::Instant;

    #[test]
    fn ticks_only_while_a_guest_runs() {
        let ticks = Arc::new(AtomicU64::new(0));
        let counted = ticks.clone();
        let ticker = EpochTicker::start_with(Duration::from_millis(1), move || {
            counted.fetch_add(1, Ordering::SeqCst);
            true
        })
        .expect("ticker");
        let now = || ticks.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(now(), 0, "no guest ran, yet the ticker ticked");

        let guard = ticker.running();
        let started = Instant::now();
        while now() < 5 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the ticker did not tick while a guest ran"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(guard);
        assert_eq!(ticker.guests_running(), 0);
        // At most the tick already in its sleep lands after the guard is gone (200 ms: the
        // ticker's thread may wait that long for a core on a loaded machine).
        std::thread::sleep(Duration::from_millis(200));
        let settled = now();
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(now(), settled, "the ticker kept ticking with no guest");

        // A second guard wakes it again.
        let _again = ticker.running();
        while now() == settled {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "not woken again"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_thread_ends_with_the_ticker() {
        // The closure lives as long as the thread: its capture's count says when it ended.
        let sentinel = Arc::new(());
        let held = sentinel.clone();
        let ticker = EpochTicker::start_with(Duration::from_millis(1), move || {
            let _ = &held;
            true
        })
        .expect("ticker");
        drop(ticker);
        let started = Instant::now();
        while Arc::strong_count(&sentinel) > 1 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the ticker thread outlived its ticker"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
