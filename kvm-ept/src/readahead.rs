//! Refusing the kernel's readahead on a pool that a VMM maps as guest RAM.
//!
//! QEMU madvises all guest RAM `MADV_HUGEPAGE`. On a file mapping with
//! `VM_HUGEPAGE` a page fault reads the whole two-PMD window around it
//! (1024 pages) "even if readahead is disabled" (`max_readahead` does not
//! apply): one `READ` per run of pages missing from the page cache. Served,
//! each would be charged and enter the device cache, although the guest
//! touched one page: with a working set larger than the cache, where the
//! windows are full of single-page holes, a load of the guest cost seven
//! traps, and a small cache livelocked.
//!
//! So the first `READ` of any page is refused (`EIO`). A refused folio
//! stays in the page cache, not up to date (a *tombstone*): readahead skips
//! it from then on, and the fault that needs it reads just that folio
//! (`read_folio`), synchronously, which is served — every page of that
//! `READ` was refused before. The plane remembers one bit per pool page: set
//! when refused, cleared when served, and cleared when an invalidation
//! (the device evicted the page) drops the folio, so the page is a hole
//! again. Memory: one bit per 4 KiB page of the pool, fixed at start.
//!
//! A page the kernel reclaims from its page cache while a tombstone leaves a
//! stale bit: its next readahead `READ` is served (a hole read ahead once),
//! the pre-refusal behaviour, not an error. The refusal relies on the kernel
//! trying readahead before `read_folio` on a fault; a mapping with
//! `MADV_RANDOM` and without `VM_HUGEPAGE` goes straight to `read_folio`,
//! which would be refused (a `SIGBUS`): region planes serve QEMU guest RAM,
//! which is never such a mapping.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes per pool page.
const PAGE: u64 = 4096;

/// Pages refused and not served since: those the kernel holds as tombstones.
#[derive(Debug)]
pub(crate) struct ReadaheadRefusals {
    refused: Vec<AtomicU64>,
}

impl ReadaheadRefusals {
    /// For a pool of `size` bytes.
    pub(crate) fn new(size: u64) -> Self {
        let words = size.div_ceil(PAGE).div_ceil(64);
        ReadaheadRefusals {
            refused: (0..words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The `(word, mask)` pairs covering pages `[offset, offset + len)`
    /// (clipped to the pool).
    fn words(&self, offset: u64, len: u64) -> impl Iterator<Item = (usize, u64)> + '_ {
        let first = offset / PAGE;
        let end = offset.saturating_add(len.max(1)).div_ceil(PAGE);
        let end = end.min(self.refused.len() as u64 * 64);
        let mut page = first;
        std::iter::from_fn(move || {
            if page >= end {
                return None;
            }
            let word = page / 64;
            let upto = end.min((word + 1) * 64);
            let bits = upto - page;
            let mask = if bits == 64 {
                u64::MAX
            } else {
                ((1u64 << bits) - 1) << (page % 64)
            };
            page = upto;
            Some((word as usize, mask))
        })
    }

    /// Whether to refuse a `READ` of `[offset, offset + len)`: yes unless
    /// every page of it was refused before (then the kernel is reading a
    /// tombstone for a fault: serve it, and forget the pages).
    pub(crate) fn refuse(&self, offset: u64, len: u64) -> bool {
        let all_refused = self
            .words(offset, len)
            .all(|(w, m)| self.refused[w].load(Ordering::Acquire) & m == m);
        for (w, m) in self.words(offset, len) {
            if all_refused {
                self.refused[w].fetch_and(!m, Ordering::AcqRel);
            } else {
                self.refused[w].fetch_or(m, Ordering::AcqRel);
            }
        }
        !all_refused
    }

    /// The kernel dropped `[offset, offset + len)` from its page cache (an
    /// invalidation): no tombstones there any more.
    pub(crate) fn forget(&self, offset: u64, len: u64) {
        for (w, m) in self.words(offset, len) {
            self.refused[w].fetch_and(!m, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_refused_once_then_served_until_invalidated() {
        let r = ReadaheadRefusals::new(1 << 20);
        assert!(r.refuse(0, PAGE), "the first READ of a page is readahead");
        assert!(!r.refuse(0, PAGE), "its tombstone's read_folio is served");
        assert!(r.refuse(0, PAGE), "served: a new hole is refused again");
        assert!(!r.refuse(0, PAGE));
        // Refused, then evicted: the tombstone is gone.
        assert!(r.refuse(PAGE, PAGE));
        r.forget(0, 2 * PAGE);
        assert!(r.refuse(PAGE, PAGE));
    }

    #[test]
    fn multi_page_reads_are_served_when_every_page_was_refused() {
        let r = ReadaheadRefusals::new(1 << 20);
        // A readahead batch of 3 pages: refused, all three become tombstones.
        assert!(r.refuse(10 * PAGE, 3 * PAGE));
        // The fault reads its own page (the middle one): served.
        assert!(!r.refuse(11 * PAGE, PAGE));
        // A batch with one never-refused page is refused (and marks it).
        assert!(r.refuse(10 * PAGE, 4 * PAGE));
        // A large folio's retry of the same range: served.
        assert!(!r.refuse(10 * PAGE, 4 * PAGE));
        // Spanning a word boundary.
        assert!(r.refuse(60 * PAGE, 10 * PAGE));
        assert!(!r.refuse(60 * PAGE, 10 * PAGE));
    }

    #[test]
    fn ranges_past_the_pool_are_clipped() {
        let r = ReadaheadRefusals::new(64 * PAGE);
        assert_eq!(r.refused.len(), 1);
        assert!(r.refuse(63 * PAGE, 4 * PAGE));
        assert!(!r.refuse(63 * PAGE, PAGE));
        r.forget(u64::MAX - 1, 10);
    }
}
