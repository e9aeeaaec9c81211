//! The plane's counters: traps (per VM), stores, invalidations, write-backs,
//! an estimate of the resident pool bytes, and the latency compensation's
//! current floor.

use crate::pace::{Compensation, Floor};
use crate::vm::VmId;
use crate::PAGE_SIZE;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Live counters, updated by the plane's threads.
#[derive(Debug)]
pub struct PlaneMetrics {
    traps: AtomicU64,
    trap_bytes: AtomicU64,
    traps_by_vm: Mutex<BTreeMap<Option<VmId>, u64>>,
    trap_errors: AtomicU64,
    stores: AtomicU64,
    store_bytes: AtomicU64,
    invalidations: AtomicU64,
    invalidated_bytes: AtomicU64,
    writebacks: AtomicU64,
    writeback_bytes: AtomicU64,
    notify_errors: AtomicU64,
    ring_requests: AtomicU64,
    invalidation_lag_ns: AtomicU64,
    invalidation_lag_max_ns: AtomicU64,
    /// One bit per pool page: set when the plane made it resident (miss
    /// reply, store), cleared on invalidation. The kernel may also drop
    /// clean pages under memory pressure, so this is an upper bound.
    resident: Vec<AtomicU64>,
    resident_pages: AtomicU64,
    /// The trap path's floor that miss replies are released ahead of
    /// their modeled completion by (see `pace::Compensation`).
    pub(crate) floor: Floor,
}

/// A copy of the counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlaneMetricsSnapshot {
    /// Traps (FUSE_READs of the pool) answered.
    pub traps: u64,
    /// Bytes returned by traps.
    pub trap_bytes: u64,
    /// Traps per VM (`None`: a thread of no registered VMM).
    pub traps_by_vm: BTreeMap<Option<VmId>, u64>,
    /// Traps answered with an error.
    pub trap_errors: u64,
    /// Multi-page READs refused as readahead (see `readahead.rs`).
    pub readahead_refused: u64,
    /// NOTIFY_STORE messages the kernel took.
    pub stores: u64,
    /// Bytes stored.
    pub store_bytes: u64,
    /// NOTIFY_INVAL_INODE messages the kernel took.
    pub invalidations: u64,
    /// Bytes invalidated (requested ranges).
    pub invalidated_bytes: u64,
    /// FUSE_WRITEs (write-backs) taken.
    pub writebacks: u64,
    /// Bytes written back.
    pub writeback_bytes: u64,
    /// Notifications the kernel refused.
    pub notify_errors: u64,
    /// Requests answered through FUSE over io_uring (0 on `/dev/fuse`).
    pub ring_requests: u64,
    /// Time invalidations waited between being queued and the kernel
    /// taking them, summed (ns): while an evicted page waits, a guest still
    /// reaches it without a trap.
    pub invalidation_lag_ns: u64,
    /// The longest such wait (ns).
    pub invalidation_lag_max_ns: u64,
    /// Misses held back because more evicted pages than the plane's bound
    /// waited for their invalidation (`PlaneOptions::eviction_backlog_pages`).
    pub backlog_waits: u64,
    /// Their time held back, summed (ns).
    pub backlog_wait_ns: u64,
    /// Of those, the waits that ended at their limit with the backlog
    /// still over the bound.
    pub backlog_overruns: u64,
    /// Estimated resident pool bytes (an upper bound).
    pub resident_bytes: u64,
    /// The floor miss replies are released ahead of their modeled
    /// completion by now (ns; 0: compensation off or not yet measured).
    pub compensation_ns: u64,
    /// Calibration probes measured so far (compensation `auto`).
    pub calibration_probes: u64,
}

impl PlaneMetrics {
    /// Counters for a pool of `pool_size` bytes.
    pub fn new(pool_size: u64) -> Self {
        let pages = pool_size.div_ceil(PAGE_SIZE);
        PlaneMetrics {
            traps: AtomicU64::new(0),
            trap_bytes: AtomicU64::new(0),
            traps_by_vm: Mutex::new(BTreeMap::new()),
            trap_errors: AtomicU64::new(0),
            stores: AtomicU64::new(0),
            store_bytes: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            invalidated_bytes: AtomicU64::new(0),
            writebacks: AtomicU64::new(0),
            writeback_bytes: AtomicU64::new(0),
            notify_errors: AtomicU64::new(0),
            ring_requests: AtomicU64::new(0),
            invalidation_lag_ns: AtomicU64::new(0),
            invalidation_lag_max_ns: AtomicU64::new(0),
            resident: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            resident_pages: AtomicU64::new(0),
            floor: Floor::new(Compensation::Off),
        }
    }

    /// The same counters with latency compensation `mode`.
    pub(crate) fn with_compensation(mut self, mode: Compensation) -> Self {
        self.floor = Floor::new(mode);
        self
    }

    /// The live floor (see `pace::Floor`).
    pub fn floor(&self) -> &Floor {
        &self.floor
    }

    fn mark(&self, offset: u64, len: u64, resident: bool) {
        let first = offset / PAGE_SIZE;
        let pages = self.resident.len() as u64 * 64;
        let end = offset.saturating_add(len).div_ceil(PAGE_SIZE).min(pages);
        for page in first..end {
            let Some(word) = self.resident.get((page / 64) as usize) else {
                return;
            };
            let bit = 1u64 << (page % 64);
            if resident {
                if word.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
                    self.resident_pages.fetch_add(1, Ordering::Relaxed);
                }
            } else if word.fetch_and(!bit, Ordering::Relaxed) & bit != 0 {
                self.resident_pages.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn trap(&self, vm: Option<VmId>, offset: u64, len: u64) {
        self.traps.fetch_add(1, Ordering::Relaxed);
        self.trap_bytes.fetch_add(len, Ordering::Relaxed);
        *self
            .traps_by_vm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(vm)
            .or_default() += 1;
        self.mark(offset, len, true);
    }

    pub(crate) fn trap_error(&self) {
        self.trap_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn store(&self, offset: u64, len: u64) {
        self.stores.fetch_add(1, Ordering::Relaxed);
        self.store_bytes.fetch_add(len, Ordering::Relaxed);
        self.mark(offset, len, true);
    }

    /// An invalidation the kernel took `lag_ns` after it was queued.
    pub(crate) fn invalidation(&self, offset: u64, len: u64, lag_ns: u64) {
        self.invalidations.fetch_add(1, Ordering::Relaxed);
        self.invalidation_lag_ns
            .fetch_add(lag_ns, Ordering::Relaxed);
        self.invalidation_lag_max_ns
            .fetch_max(lag_ns, Ordering::Relaxed);
        self.invalidated_bytes.fetch_add(len, Ordering::Relaxed);
        self.mark(offset, len, false);
    }

    pub(crate) fn writeback(&self, len: u64) {
        self.writebacks.fetch_add(1, Ordering::Relaxed);
        self.writeback_bytes.fetch_add(len, Ordering::Relaxed);
    }

    pub(crate) fn notify_error(&self) {
        self.notify_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn ring_request(&self) {
        self.ring_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> PlaneMetricsSnapshot {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PlaneMetricsSnapshot {
            traps: r(&self.traps),
            trap_bytes: r(&self.trap_bytes),
            traps_by_vm: self
                .traps_by_vm
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            trap_errors: r(&self.trap_errors),
            // Filled in by the plane, from its readahead map.
            readahead_refused: 0,
            stores: r(&self.stores),
            store_bytes: r(&self.store_bytes),
            invalidations: r(&self.invalidations),
            invalidated_bytes: r(&self.invalidated_bytes),
            writebacks: r(&self.writebacks),
            writeback_bytes: r(&self.writeback_bytes),
            notify_errors: r(&self.notify_errors),
            ring_requests: r(&self.ring_requests),
            invalidation_lag_ns: r(&self.invalidation_lag_ns),
            invalidation_lag_max_ns: r(&self.invalidation_lag_max_ns),
            // Filled in by the plane, from its eviction backlog.
            backlog_waits: 0,
            backlog_wait_ns: 0,
            backlog_overruns: 0,
            resident_bytes: r(&self.resident_pages) * PAGE_SIZE,
            compensation_ns: self.floor.current_ns(),
            calibration_probes: self.floor.samples(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_estimate_follows_traps_stores_and_invalidations() {
        let m = PlaneMetrics::new(1 << 20);
        m.trap(Some(1), 0, 4096);
        m.trap(None, 0, 4096);
        m.store(8192, 16384);
        assert_eq!(m.snapshot().resident_bytes, 5 * 4096);
        m.invalidation(0, 12288, 5);
        assert_eq!(m.snapshot().resident_bytes, 3 * 4096);
        m.invalidation(0, u64::MAX, 7);
        m.store(1 << 30, 4096); // out of the pool: ignored
        let s = m.snapshot();
        assert_eq!(s.resident_bytes, 0);
        assert_eq!(s.traps, 2);
        assert_eq!(s.traps_by_vm.get(&Some(1)), Some(&1));
        assert_eq!(s.traps_by_vm.get(&None), Some(&1));
        assert_eq!(s.invalidation_lag_ns, 12);
        assert_eq!(s.invalidation_lag_max_ns, 7);
    }
}
