//! How long the device lock was waited for and held: every VM's data path
//! goes through that one lock, so these say whether it limits them.
//!
//! Recorded by the lock's holder, inside the lock (the wait once it is
//! acquired, the hold just before it is released): no other
//! synchronisation, and two clock reads per acquisition besides the one
//! taken before waiting.

use hdrhistogram::Histogram;
use std::time::Duration;

/// Longest wait or hold a histogram tells apart (longer ones count here).
const MAX_NS: u64 = 10_000_000_000;

/// Waits and holds of the device lock since the start or the last reset.
pub(super) struct LockTimes {
    wait: Histogram<u64>,
    hold: Histogram<u64>,
    wait_ns: u64,
    hold_ns: u64,
}

/// [`LockTimes`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockTimesSnapshot {
    /// Times the lock was taken.
    pub acquisitions: u64,
    /// Time spent waiting for it, summed over every taker (ns).
    pub wait_ns_total: u64,
    /// Time it was held, summed (ns).
    pub hold_ns_total: u64,
    /// Median and 99th percentile of one wait (ns).
    pub wait_p50_ns: u64,
    /// 99th percentile of one wait (ns).
    pub wait_p99_ns: u64,
    /// Median of one hold (ns).
    pub hold_p50_ns: u64,
    /// 99th percentile of one hold (ns).
    pub hold_p99_ns: u64,
    /// Longest hold (ns).
    pub hold_max_ns: u64,
}

fn histogram() -> Histogram<u64> {
    // 2 significant digits from 1 ns to MAX_NS: a few KiB; the bounds are
    // constants, so this cannot fail.
    Histogram::new_with_bounds(1, MAX_NS, 2).unwrap_or_else(|_| unreachable!("constant bounds"))
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl LockTimes {
    pub(super) fn new() -> Self {
        LockTimes {
            wait: histogram(),
            hold: histogram(),
            wait_ns: 0,
            hold_ns: 0,
        }
    }

    /// One taker waited `d` for the lock.
    pub(super) fn waited(&mut self, d: Duration) {
        let v = ns(d);
        self.wait.saturating_record(v.clamp(1, MAX_NS));
        self.wait_ns = self.wait_ns.saturating_add(v);
    }

    /// One taker held the lock for `d`.
    pub(super) fn held(&mut self, d: Duration) {
        let v = ns(d);
        self.hold.saturating_record(v.clamp(1, MAX_NS));
        self.hold_ns = self.hold_ns.saturating_add(v);
    }

    pub(super) fn snapshot(&self) -> LockTimesSnapshot {
        LockTimesSnapshot {
            acquisitions: self.wait.len(),
            wait_ns_total: self.wait_ns,
            hold_ns_total: self.hold_ns,
            wait_p50_ns: self.wait.value_at_quantile(0.5),
            wait_p99_ns: self.wait.value_at_quantile(0.99),
            hold_p50_ns: self.hold.value_at_quantile(0.5),
            hold_p99_ns: self.hold.value_at_quantile(0.99),
            hold_max_ns: self.hold.max(),
        }
    }

    pub(super) fn reset(&mut self) {
        self.wait.reset();
        self.hold.reset();
        self.wait_ns = 0;
        self.hold_ns = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_and_holds_are_summed_and_their_quantiles_kept() {
        let mut t = LockTimes::new();
        for us in 1..=100u64 {
            t.waited(Duration::from_micros(us));
            t.held(Duration::from_micros(2 * us));
        }
        let s = t.snapshot();
        assert_eq!(s.acquisitions, 100);
        assert_eq!(s.wait_ns_total, 5050 * 1000);
        assert_eq!(s.hold_ns_total, 2 * 5050 * 1000);
        let near = |v: u64, want: u64| v.abs_diff(want) * 100 <= want;
        assert!(near(s.wait_p50_ns, 50_000), "{s:?}");
        assert!(near(s.hold_p99_ns, 198_000), "{s:?}");
        assert!(near(s.hold_max_ns, 200_000), "{s:?}");
        t.reset();
        assert_eq!(t.snapshot(), LockTimesSnapshot::default());
    }
}
