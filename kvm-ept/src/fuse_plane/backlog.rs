//! The eviction backlog: pool pages the backend evicted whose invalidation
//! the notifier has not written yet, and the bound a plane may hold misses
//! to ([`PlaneOptions::eviction_backlog_pages`](super::PlaneOptions::eviction_backlog_pages)).
//!
//! Until its invalidation is written, an evicted page stays in the host's
//! page cache and mapped: a guest reaches it without a trap, a hit the
//! device model never sees, on a page the model no longer holds. The
//! notifier usually keeps up, but each invalidation of a dirty page waits
//! for its write-back, and a lap of misses over freshly written pages can
//! queue evictions faster than the kernel takes them (on a loaded 2-CPU
//! host the queue grew to 70–300 ms, and whole laps ran on pages the model
//! had dropped). With a bound, a miss is not answered while more than that
//! many evicted pages wait: the device cannot take a page in before it has
//! made room, and the trap that would outrun the room waits for it. The
//! wait has a limit ([`MAX_WAIT`]), so a notifier that is itself held up
//! (its write-backs need request threads) costs a late reply, never a
//! deadlock, and only [`MAX_WAITERS`] request threads wait at once.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest a miss waits for the backlog to fall under its bound.
pub(crate) const MAX_WAIT: Duration = Duration::from_millis(20);

/// Request threads that may wait at once; a miss that finds them all
/// waiting is answered without waiting (the others hold the traps back
/// already, and free entries answer the write-backs the invalidations
/// wait for).
pub(crate) const MAX_WAITERS: u32 = 4;

/// Evicted pages queued and not yet invalidated; who waits for fewer.
#[derive(Debug, Default)]
pub(crate) struct EvictionBacklog {
    /// Most pages a miss may leave queued (`None`: no bound, misses never
    /// wait; `Some(0)`: a miss waits until every eviction is written).
    bound: Option<u64>,
    pages: AtomicU64,
    waiters: AtomicU32,
    lock: Mutex<()>,
    fell: Condvar,
    /// Misses that waited, and for how long in all.
    waits: AtomicU64,
    wait_ns: AtomicU64,
    /// Waits that ended at [`MAX_WAIT`] with the backlog still over.
    overruns: AtomicU64,
}

/// What the backlog has done since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BacklogFigures {
    /// Misses held back.
    pub(crate) waits: u64,
    /// Their time held back, in all.
    pub(crate) wait_ns: u64,
    /// Waits that hit [`MAX_WAIT`].
    pub(crate) overruns: u64,
}

impl EvictionBacklog {
    /// A backlog whose misses wait while more than `bound` pages are
    /// queued (`None`: never).
    pub(crate) fn bounded(bound: Option<u64>) -> Self {
        EvictionBacklog {
            bound,
            ..EvictionBacklog::default()
        }
    }

    /// `pages` evicted pages were queued for the notifier (not counted
    /// without a bound: nothing would read the count).
    pub(crate) fn queued(&self, pages: u64) {
        if pages == 0 || self.bound.is_none() {
            return; // a store (nothing evicted), or no bound to hold to
        }
        self.pages.fetch_add(pages, Ordering::AcqRel);
    }

    /// The notifier is done with `pages` of them (written or refused).
    pub(crate) fn done(&self, pages: u64) {
        if pages == 0 || self.bound.is_none() {
            return;
        }
        let before = self
            .pages
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                Some(p.saturating_sub(pages))
            })
            .unwrap_or(0);
        let now = before.saturating_sub(pages);
        let Some(bound) = self.bound else { return };
        if now <= bound && before > bound && self.waiters.load(Ordering::Acquire) > 0 {
            // Under the lock: a waiter checks and sleeps under it too, so
            // it cannot miss this.
            let _g = super::lock(&self.lock);
            self.fell.notify_all();
        }
    }

    /// Pages queued now (0 without a bound: not counted).
    pub(crate) fn pages(&self) -> u64 {
        self.pages.load(Ordering::Acquire)
    }

    /// Waits (at most `limit`) until no more than the bound is queued;
    /// returns how long it waited. Returns at once with no bound, under
    /// it, or when [`MAX_WAITERS`] threads wait already.
    pub(crate) fn wait_under_bound(&self, limit: Duration) -> Duration {
        let Some(bound) = self.bound else {
            return Duration::ZERO;
        };
        if self.pages() <= bound {
            return Duration::ZERO;
        }
        let joined = self
            .waiters
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w < MAX_WAITERS).then_some(w + 1)
            });
        if joined.is_err() {
            return Duration::ZERO;
        }
        let start = Instant::now();
        let mut g = super::lock(&self.lock);
        let over = loop {
            if self.pages() <= bound {
                break false;
            }
            let Some(left) = limit.checked_sub(start.elapsed()).filter(|d| !d.is_zero()) else {
                break true;
            };
            g = self
                .fell
                .wait_timeout(g, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        };
        drop(g);
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        let waited = start.elapsed();
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.wait_ns.fetch_add(
            u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if over {
            self.overruns.fetch_add(1, Ordering::Relaxed);
        }
        waited
    }

    /// What it has done.
    pub(crate) fn figures(&self) -> BacklogFigures {
        BacklogFigures {
            waits: self.waits.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
            overruns: self.overruns.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn no_bound_never_waits() {
        let b = EvictionBacklog::bounded(None);
        b.queued(1_000);
        assert_eq!(b.wait_under_bound(Duration::from_secs(5)), Duration::ZERO);
        assert_eq!(b.figures(), BacklogFigures::default());
        assert_eq!(b.pages(), 0, "not counted without a bound");
    }

    #[test]
    fn a_bound_of_zero_waits_for_every_eviction() {
        let b = Arc::new(EvictionBacklog::bounded(Some(0)));
        assert_eq!(b.wait_under_bound(Duration::from_secs(5)), Duration::ZERO);
        b.queued(1);
        let notifier = {
            let b = b.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                b.done(1);
            })
        };
        let waited = b.wait_under_bound(Duration::from_secs(10));
        notifier.join().unwrap();
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        assert_eq!(b.pages(), 0);
    }

    #[test]
    fn under_the_bound_a_miss_goes_on() {
        let b = EvictionBacklog::bounded(Some(8));
        b.queued(8);
        assert_eq!(b.wait_under_bound(Duration::from_secs(5)), Duration::ZERO);
        b.done(3);
        assert_eq!(b.pages(), 5);
        // More done than queued (a notifier drained by shutdown) stays at 0.
        b.done(100);
        assert_eq!(b.pages(), 0);
    }

    #[test]
    fn over_the_bound_a_miss_waits_until_the_notifier_catches_up() {
        let b = Arc::new(EvictionBacklog::bounded(Some(4)));
        b.queued(10);
        let n = b.clone();
        let notifier = std::thread::spawn(move || {
            for _ in 0..6 {
                std::thread::sleep(Duration::from_millis(2));
                n.done(1);
            }
        });
        let waited = b.wait_under_bound(Duration::from_secs(10));
        notifier.join().unwrap();
        assert!(waited >= Duration::from_millis(10), "{waited:?}");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
        assert_eq!(b.pages(), 4);
        let f = b.figures();
        assert_eq!((f.waits, f.overruns), (1, 0));
        assert!(f.wait_ns >= 10_000_000, "{f:?}");
    }

    #[test]
    fn a_stuck_notifier_costs_at_most_the_limit() {
        let b = EvictionBacklog::bounded(Some(1));
        b.queued(2);
        let waited = b.wait_under_bound(Duration::from_millis(5));
        assert!(waited >= Duration::from_millis(5), "{waited:?}");
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        assert_eq!(b.figures().overruns, 1);
    }

    #[test]
    fn only_a_few_threads_wait_at_once() {
        let b = Arc::new(EvictionBacklog::bounded(Some(1)));
        b.queued(2);
        let waiting: Vec<_> = (0..MAX_WAITERS)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || b.wait_under_bound(Duration::from_secs(10)))
            })
            .collect();
        while b.waiters.load(Ordering::Acquire) < MAX_WAITERS {
            std::thread::yield_now();
        }
        // One more finds every place taken and goes on.
        assert_eq!(b.wait_under_bound(Duration::from_secs(10)), Duration::ZERO);
        b.done(1);
        for w in waiting {
            assert!(w.join().unwrap() < Duration::from_secs(10));
        }
        assert_eq!(b.figures().waits, u64::from(MAX_WAITERS));
    }
}
