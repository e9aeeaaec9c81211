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

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes per pool page.
const PAGE: u64 = 4096;

/// Words before the bitmap in the shared map: the refused-READ count.
const HEADER_WORDS: usize = 1;

/// Pages refused and not served since: those the kernel holds as tombstones.
///
/// The words live in a shared memory file (a memfd), so a split plane's
/// helper process, which reads the requests and refuses, and the daemon,
/// whose notifier forgets invalidated pages, share one map
/// ([`ReadaheadRefusals::share`], [`ReadaheadRefusals::attach`]). Word 0
/// counts the refused READs; the bitmap follows.
#[derive(Debug)]
pub(crate) struct ReadaheadRefusals {
    map: SharedWords,
}

/// A `MAP_SHARED` mapping of a memfd, seen as atomic words.
#[derive(Debug)]
struct SharedWords {
    ptr: *mut AtomicU64,
    words: usize,
    file: File,
}

// SAFETY: the mapping is only reached through `&AtomicU64`s, which are
// Sync; the pointer stays valid until Drop unmaps it.
unsafe impl Send for SharedWords {}
// SAFETY: as for Send: shared access is through atomics only.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Maps `words` words of `file` (which holds at least that many bytes).
    fn map(file: File, words: usize) -> io::Result<Self> {
        let len = words
            .checked_mul(8)
            .ok_or_else(|| io::Error::other("map too large"))?;
        // SAFETY: a fresh shared mapping of a file we hold; the kernel
        // picks the address; failure is MAP_FAILED, checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedWords {
            ptr: ptr.cast(),
            words,
            file,
        })
    }

    fn get(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.words, "word {i} past the map");
        // SAFETY: `i` is in bounds, the mapping is live for `&self`, page
        // aligned (so every word is aligned) and only ever accessed as
        // atomics, in this process and in the other.
        unsafe { &*self.ptr.add(i) }
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; no reference to
        // it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.words * 8) };
    }
}

impl ReadaheadRefusals {
    /// Words of the map for a pool of `size` bytes.
    fn words_for(size: u64) -> usize {
        HEADER_WORDS + size.div_ceil(PAGE).div_ceil(64) as usize
    }

    /// For a pool of `size` bytes: a new, empty map.
    pub(crate) fn new(size: u64) -> io::Result<Self> {
        let words = Self::words_for(size);
        // SAFETY: a NUL-terminated name and plain flags.
        let fd = unsafe { libc::memfd_create(c"cxlfs-readahead".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(words as u64 * 8)?;
        Ok(ReadaheadRefusals {
            map: SharedWords::map(file, words)?,
        })
    }

    /// The map's file, to hand to a helper process ([`Self::attach`]).
    pub(crate) fn file(&self) -> &File {
        &self.map.file
    }

    /// The map another process made ([`Self::file`]), for the same pool.
    pub(crate) fn attach(file: File, size: u64) -> io::Result<Self> {
        let words = Self::words_for(size);
        if file.metadata()?.len() < words as u64 * 8 {
            return Err(io::Error::other("readahead map smaller than the pool"));
        }
        Ok(ReadaheadRefusals {
            map: SharedWords::map(file, words)?,
        })
    }

    /// Bitmap word `w`.
    fn word(&self, w: usize) -> &AtomicU64 {
        self.map.get(HEADER_WORDS + w)
    }

    /// Bitmap words.
    fn bitmap_words(&self) -> usize {
        self.map.words - HEADER_WORDS
    }

    /// READs refused so far, by either process.
    pub(crate) fn refused_count(&self) -> u64 {
        self.map.get(0).load(Ordering::Relaxed)
    }

    /// The `(word, mask)` pairs covering pages `[offset, offset + len)`
    /// (clipped to the pool).
    fn words(&self, offset: u64, len: u64) -> impl Iterator<Item = (usize, u64)> + '_ {
        let first = offset / PAGE;
        let end = offset.saturating_add(len.max(1)).div_ceil(PAGE);
        let end = end.min(self.bitmap_words() as u64 * 64);
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
            .all(|(w, m)| self.word(w).load(Ordering::Acquire) & m == m);
        for (w, m) in self.words(offset, len) {
            if all_refused {
                self.word(w).fetch_and(!m, Ordering::AcqRel);
            } else {
                self.word(w).fetch_or(m, Ordering::AcqRel);
            }
        }
        if !all_refused {
            self.map.get(0).fetch_add(1, Ordering::Relaxed);
        }
        !all_refused
    }

    /// The kernel dropped `[offset, offset + len)` from its page cache (an
    /// invalidation): no tombstones there any more.
    pub(crate) fn forget(&self, offset: u64, len: u64) {
        for (w, m) in self.words(offset, len) {
            self.word(w).fetch_and(!m, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_refused_once_then_served_until_invalidated() {
        let r = ReadaheadRefusals::new(1 << 20).expect("map");
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
        let r = ReadaheadRefusals::new(1 << 20).expect("map");
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
        let r = ReadaheadRefusals::new(64 * PAGE).expect("map");
        assert_eq!(r.bitmap_words(), 1);
        assert!(r.refuse(63 * PAGE, 4 * PAGE));
        assert!(!r.refuse(63 * PAGE, PAGE));
        r.forget(u64::MAX - 1, 10);
    }

    #[test]
    fn two_maps_of_one_file_share_the_bits_and_the_count() {
        let daemon = ReadaheadRefusals::new(1 << 20).expect("map");
        let dup = daemon.file().try_clone().expect("dup");
        let helper = ReadaheadRefusals::attach(dup, 1 << 20).expect("attach");
        assert!(helper.refuse(5 * PAGE, PAGE), "the helper refuses");
        assert_eq!(daemon.refused_count(), 1, "the daemon sees the count");
        daemon.forget(5 * PAGE, PAGE);
        assert!(
            helper.refuse(5 * PAGE, PAGE),
            "forgotten by the daemon: a hole again for the helper"
        );
        assert!(!helper.refuse(5 * PAGE, PAGE));
        assert_eq!(helper.refused_count(), 2);
        let small = daemon.file().try_clone().expect("dup");
        assert!(
            ReadaheadRefusals::attach(small, 1 << 30).is_err(),
            "a map too small for the pool is refused"
        );
    }
}
