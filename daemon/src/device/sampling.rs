//! Access sampling's marks on device pages, kept under the device lock.
//!
//! A page the sampler *arms* is dropped from its residency plane while the
//! device cache keeps it: the guest's next access to it traps, and that
//! trap is charged as any other (a device hit, so the policy sees the
//! access). The marks make the mechanism leave no trace in the model:
//! * an armed page's trap is counted as a sampled access;
//! * the plane writes a dirty armed page back to the host before it drops
//!   it; that write-back is *deferred*: no NAND program now, the page stays
//!   dirty in the model, and its program is charged when the model would
//!   have charged it without sampling: when the device evicts the page (or
//!   a sync asks for it);
//! * a page the device evicts or discards loses its marks.
//!
//! With sampling on, the marks also keep the order in which the daemon last
//! heard of each resident page (its last trap: the miss that brought it in,
//! or a sampled hit). The sampler arms the pages it has not heard of for
//! the longest first: under a recency policy those are the next to be
//! evicted, the pages whose hits the policy needs to see. Only the oldest
//! quarter is ever armed ([`ARMABLE_SHARE`]): a page just heard of is
//! nowhere near eviction, and arming it would make every access to a hot
//! page trap once the rate outruns the evictions.

use super::PAGE;
use cxlfs_device_model::{AccessError, Device};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Sampling's counters (since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SamplingCounts {
    /// Pages armed (dropped from a plane for sampling).
    pub armed_pages: u64,
    /// Traps on armed pages: accesses the policy saw as hits.
    pub sampled_accesses: u64,
    /// Write-backs of armed pages whose program was deferred (pages).
    pub deferred_pages: u64,
    /// Deferred programs charged since (the page left the device cache,
    /// or a sync asked for it).
    pub deferred_programs: u64,
    /// Time the sampler spent arming pages (ns, wall clock).
    pub busy_ns: u64,
}

/// The marks (see the module doc).
#[derive(Debug, Default)]
pub(super) struct SampleMarks {
    armed: HashSet<u64>,
    deferred: HashSet<u64>,
    counts: SamplingCounts,
    /// Whether the order of last traps is kept (sampling is on).
    tracking: bool,
    /// Trap sequence number of each tracked page, and the pages by it.
    heard: HashMap<u64, u64>,
    by_heard: BTreeMap<u64, u64>,
    next_seq: u64,
}

/// The share of tracked pages, those heard of longest ago, that may be
/// armed (one in this many).
pub(super) const ARMABLE_SHARE: usize = 4;

/// The device pages of bytes `[addr, addr + len)`, partial ones included.
fn pages(addr: u64, len: u64) -> std::ops::Range<u64> {
    addr / PAGE..addr.saturating_add(len).div_ceil(PAGE)
}

impl SampleMarks {
    pub(super) fn counts(&self) -> SamplingCounts {
        self.counts
    }

    /// Starts keeping the order of last traps.
    pub(super) fn track(&mut self) {
        self.tracking = true;
    }

    /// Whether there is nothing to look up for a device page.
    fn idle(&self) -> bool {
        self.armed.is_empty() && self.deferred.is_empty() && self.heard.is_empty()
    }

    /// Up to `n` tracked pages not armed, those heard of longest ago first,
    /// from the oldest [`ARMABLE_SHARE`]th of them.
    pub(super) fn oldest(&self, n: usize) -> Vec<u64> {
        self.by_heard
            .values()
            .take(self.by_heard.len().div_ceil(ARMABLE_SHARE))
            .filter(|p| !self.armed.contains(p))
            .take(n)
            .copied()
            .collect()
    }

    fn unhear(&mut self, page: u64) {
        if let Some(seq) = self.heard.remove(&page) {
            self.by_heard.remove(&seq);
        }
    }

    fn hear(&mut self, page: u64) {
        self.unhear(page);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heard.insert(page, seq);
        self.by_heard.insert(seq, page);
    }

    pub(super) fn record_time(&mut self, ns: u64) {
        self.counts.busy_ns = self.counts.busy_ns.saturating_add(ns);
    }

    /// Arms `pages` (not yet armed); returns those newly armed.
    pub(super) fn arm(&mut self, pages: &[u64]) -> Vec<u64> {
        let fresh: Vec<u64> = pages
            .iter()
            .copied()
            .filter(|p| self.armed.insert(*p))
            .collect();
        self.counts.armed_pages += fresh.len() as u64;
        fresh
    }

    /// The prefetcher filled these `(page, ready)` pages: heard of now.
    pub(super) fn filled(&mut self, pages: &[(u64, u64)]) {
        if self.tracking {
            for &(p, _) in pages {
                self.hear(p);
            }
        }
    }

    /// A trap on `[addr, addr + len)` (the pages are resident now): the
    /// armed pages it covers, disarmed and counted as sampled accesses.
    pub(super) fn take(&mut self, addr: u64, len: u64) -> u64 {
        if self.tracking {
            for p in pages(addr, len) {
                self.hear(p);
            }
        }
        if self.armed.is_empty() {
            return 0;
        }
        let n = pages(addr, len).filter(|p| self.armed.remove(p)).count() as u64;
        self.counts.sampled_accesses += n;
        n
    }

    /// Device `pages` a hit source saw referenced: with tracking on, the
    /// resident ones count as heard of now.
    pub(super) fn referenced(&mut self, device: &Device, pages: &[u64]) {
        if !self.tracking {
            return;
        }
        for &p in pages {
            if device.is_resident(p * PAGE) {
                self.hear(p);
            }
        }
    }

    /// A write-back of `[addr, addr + len)`: the armed pages in it are
    /// deferred (dirty in the model, no program now); `charge` gets each run
    /// `(addr, len)` that is charged as usual, in order.
    pub(super) fn defer<E>(
        &mut self,
        addr: u64,
        len: u64,
        mut charge: impl FnMut(u64, u64) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.armed.is_empty() {
            return charge(addr, len);
        }
        let end = addr.saturating_add(len);
        let mut run: Option<u64> = None;
        for p in pages(addr, len) {
            let (lo, hi) = ((p * PAGE).max(addr), ((p + 1) * PAGE).min(end));
            if self.armed.contains(&p) {
                if self.deferred.insert(p) {
                    self.counts.deferred_pages += 1;
                }
                if let Some(start) = run.take() {
                    charge(start, lo - start)?;
                }
            } else if run.is_none() {
                run = Some(lo);
            }
            if hi == end {
                if let Some(start) = run.take() {
                    charge(start, hi - start)?;
                }
            }
        }
        Ok(())
    }

    /// The device evicted `evicted`: their marks go, and each deferred one
    /// is programmed now (as its eviction would have written it back).
    pub(super) fn settle(
        &mut self,
        dev: &mut Device,
        now_ns: impl FnOnce() -> u64,
        evicted: &[u64],
    ) -> Result<(), AccessError> {
        if evicted.is_empty() || self.idle() {
            return Ok(());
        }
        let now_ns = now_ns();
        for p in evicted {
            self.armed.remove(p);
            self.unhear(*p);
            if self.deferred.remove(p) {
                dev.write_back(now_ns, p * PAGE, PAGE)?;
                self.counts.deferred_programs += 1;
            }
        }
        Ok(())
    }

    /// Programs the deferred pages of `[addr, addr + len)` now (a sync of
    /// them); returns how many.
    pub(super) fn flush(
        &mut self,
        dev: &mut Device,
        now_ns: u64,
        addr: u64,
        len: u64,
    ) -> Result<u64, AccessError> {
        if self.deferred.is_empty() {
            return Ok(0);
        }
        let due: Vec<u64> = pages(addr, len)
            .filter(|p| self.deferred.remove(p))
            .collect();
        for p in &due {
            dev.write_back(now_ns, p * PAGE, PAGE)?;
        }
        self.counts.deferred_programs += due.len() as u64;
        Ok(due.len() as u64)
    }

    /// `[addr, addr + len)` was discarded (its data is gone): no marks, no
    /// program owed.
    pub(super) fn forget(&mut self, addr: u64, len: u64) {
        if self.idle() {
            return;
        }
        for p in pages(addr, len) {
            self.unhear(p);
            self.armed.remove(&p);
            self.deferred.remove(&p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl SampleMarks {
        /// [`SampleMarks::defer`]'s runs, collected.
        fn deferred_runs(&mut self, addr: u64, len: u64) -> Vec<(u64, u64)> {
            let mut runs = Vec::new();
            let ok: Result<(), ()> = self.defer(addr, len, |a, n| {
                runs.push((a, n));
                Ok(())
            });
            assert!(ok.is_ok());
            runs
        }
    }

    #[test]
    fn a_write_back_defers_its_armed_pages_and_charges_the_rest() {
        let mut m = SampleMarks::default();
        assert_eq!(m.deferred_runs(0, 4 * PAGE), [(0, 4 * PAGE)]);
        assert_eq!(m.arm(&[1, 2, 1]), [1, 2]);
        assert_eq!(
            m.deferred_runs(100, 4 * PAGE - 100),
            [(100, PAGE - 100), (3 * PAGE, PAGE)]
        );
        assert_eq!(m.deferred_runs(PAGE, 2 * PAGE), []);
        assert_eq!(m.counts().deferred_pages, 2);
        assert_eq!(m.deferred_runs(2 * PAGE, 2 * PAGE), [(3 * PAGE, PAGE)]);
    }

    #[test]
    fn the_oldest_heard_unarmed_pages_come_first() {
        let mut m = SampleMarks::default();
        m.take(PAGE, PAGE);
        assert!(m.oldest(4).is_empty(), "nothing is kept while off");
        m.track();
        for p in [3, 1, 2, 4, 9, 8, 7, 6] {
            m.take(p * PAGE, PAGE);
        }
        // Eight tracked: the oldest two may be armed.
        assert_eq!(m.oldest(5), [3, 1]);
        m.arm(&[3]);
        assert_eq!(m.oldest(5), [1]);
        m.take(PAGE, 1); // heard again: newest
        assert_eq!(m.oldest(5), [2]);
        m.forget(2 * PAGE, PAGE);
        assert_eq!(m.oldest(5), [4], "seven tracked: 3 (armed) and 4");
    }

    #[test]
    fn a_trap_takes_the_armed_pages_once() {
        let mut m = SampleMarks::default();
        m.arm(&[5, 6]);
        assert_eq!(m.take(5 * PAGE, PAGE), 1);
        assert_eq!(m.take(5 * PAGE, PAGE), 0);
        m.forget(6 * PAGE, PAGE);
        assert_eq!(m.take(6 * PAGE, 1), 0);
        assert_eq!(
            m.counts(),
            SamplingCounts {
                armed_pages: 2,
                sampled_accesses: 1,
                ..Default::default()
            }
        );
    }
}
