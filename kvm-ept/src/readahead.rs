//! Refusing the kernel's readahead on a pool that a VMM maps as guest RAM.
//!
//! QEMU madvises all guest RAM `MADV_HUGEPAGE`. On a file mapping with
//! `VM_HUGEPAGE` the kernel answers a page fault by reading a 2–4 MiB
//! window "even if readahead is disabled" (`max_readahead` does not apply),
//! so one trap would charge (and fill the device cache with) up to 1024
//! pages, and two vCPUs faulting at once evict each other's windows before
//! the faulting page is mapped: a livelock with a small device cache. A
//! multi-page `READ` is therefore refused (`EIO`) the first time: the
//! kernel drops the readahead and reads just the faulting folio
//! (`read_folio`). Should that folio itself span several pages (a kernel
//! that gives FUSE large folios), its retry is recognised — a multi-page
//! `READ` at an offset refused a moment ago, from the same faulting thread
//! (the retry is synchronous, in that thread) — and served.

use std::collections::VecDeque;
use std::sync::Mutex;

/// How long a refusal is remembered: the retry comes within microseconds
/// (100 ms leaves room for a descheduled thread on a busy host).
const REMEMBER_NS: u64 = 100_000_000;
/// Most refusals remembered at once.
const MAX_REMEMBERED: usize = 4096;

/// Recent refusals, oldest first: `(pool offset, thread, when)`.
#[derive(Debug, Default)]
pub(crate) struct ReadaheadRefusals {
    recent: Mutex<VecDeque<(u64, u32, u64)>>,
}

impl ReadaheadRefusals {
    /// Whether to refuse a multi-page `READ` at `offset` from thread `pid`
    /// arriving at `now_ns` (false: it retries one refused a moment ago;
    /// serve it).
    pub(crate) fn refuse(&self, offset: u64, pid: u32, now_ns: u64) -> bool {
        let mut q = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        while q
            .front()
            .is_some_and(|&(_, _, at)| now_ns.saturating_sub(at) > REMEMBER_NS)
        {
            q.pop_front();
        }
        if let Some(i) = q.iter().position(|&(o, p, _)| o == offset && p == pid) {
            q.remove(i);
            return false;
        }
        if q.len() == MAX_REMEMBERED {
            q.pop_front();
        }
        q.push_back((offset, pid, now_ns));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_read_is_refused_and_its_retry_served() {
        let r = ReadaheadRefusals::default();
        assert!(r.refuse(0, 7, 10));
        assert!(r.refuse(128 << 10, 7, 20), "another window");
        assert!(r.refuse(0, 8, 25), "another thread's readahead is refused");
        assert!(
            !r.refuse(0, 7, 30),
            "the retry of a refused folio is served"
        );
        assert!(
            r.refuse(0, 7, 40),
            "then a new window at the same place is refused again"
        );
        assert!(
            r.refuse(128 << 10, 7, 20 + REMEMBER_NS + 1),
            "forgotten after a while"
        );
    }

    #[test]
    fn memory_is_bounded() {
        let r = ReadaheadRefusals::default();
        for i in 0..(MAX_REMEMBERED as u64 + 10) {
            assert!(r.refuse(i << 12, 1, 1));
        }
        assert_eq!(r.recent.lock().unwrap().len(), MAX_REMEMBERED);
    }
}
