//! A binary trace read in place from a shared, read-only mapping of its
//! file: for the parts of a split trace (`TraceReader::split`),
//! whose pass reads each record once and keeps few. Reading through
//! `read(2)` copies every byte out of the page cache into a buffer first;
//! from the mapping the pass reads the page cache itself: each part maps
//! its own range's pages in one call (`MADV_POPULATE_READ`) and the pass
//! prefetches ahead of its loop (`Sampler::access_records`), since the
//! hardware's prefetcher stops at each 4 KiB page of the cache.
//!
//! A mapped file that shrinks while it is read would fault (`SIGBUS`) on
//! the bytes it lost: [`MappedTrace::map`] installs a handler that turns
//! that fault into an error message and exit status 1. A file that cannot
//! be mapped (empty, not a regular file, a file system without `mmap`)
//! is read through a buffer instead.

use memmap2::{Advice, Mmap};
use std::fs::File;
use std::io::{self, BufRead, Read};
use std::sync::{Arc, Once};

/// Bytes handed out per [`BufRead::fill_buf`].
const WINDOW: usize = 1 << 20;

/// A read-only mapping of a whole trace file, shared by its parts.
#[derive(Debug, Clone)]
pub struct MappedTrace {
    map: Arc<Mmap>,
}

impl MappedTrace {
    /// Maps `file` (shared, read-only); `None` where it cannot be mapped.
    pub fn map(file: &File) -> Option<MappedTrace> {
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.len() == 0 {
            return None;
        }
        guard_sigbus();
        // SAFETY: the mapping is read-only and only ever read as bytes,
        // each record checked like a read one. Another process that
        // truncates the file while it is mapped makes the lost bytes fault,
        // which `guard_sigbus` turns into an error exit; one that rewrites
        // bytes in place changes records the pass then checks as it checks
        // any (a trace being rewritten while it is read is not a trace this
        // tool can measure, mapped or read).
        let map = unsafe { Mmap::map(file) }.ok()?;
        Some(MappedTrace { map: Arc::new(map) })
    }

    /// A reader of bytes `start..` to the end of the file, whose part of
    /// the trace ends at byte `end`.
    pub fn part(&self, start: usize, end: usize) -> MappedPart {
        let len = self.map.len();
        MappedPart {
            map: Arc::clone(&self.map),
            pos: start.min(len),
            populate: Some((start.min(len), end.min(len))),
        }
    }
}

/// The bytes of a mapped trace from `pos` on, read in place.
#[derive(Debug)]
pub struct MappedPart {
    map: Arc<Mmap>,
    pos: usize,
    /// The part's own bytes, before they are populated (at the first
    /// [`BufRead::fill_buf`], on the part's thread).
    populate: Option<(usize, usize)>,
}

impl Read for MappedPart {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for MappedPart {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if let Some((from, to)) = self.populate.take() {
            // The part's page-table entries in one call, on its own thread
            // (3 ms less CPU over a 200 MB trace than the faults one by
            // one). Only an advance: a kernel without it faults them in.
            let _ = self
                .map
                .advise_range(Advice::PopulateRead, from, to.saturating_sub(from));
        }
        let stop = self.pos.saturating_add(WINDOW).min(self.map.len());
        Ok(&self.map[self.pos..stop])
    }

    fn consume(&mut self, amt: usize) {
        self.pos = self.pos.saturating_add(amt).min(self.map.len());
    }
}

/// Installs, once per process, a `SIGBUS` handler that says a mapped trace
/// lost bytes while it was read and exits with status 1 (instead of the
/// signal's core dump).
fn guard_sigbus() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed `sigaction` is a valid value (no flags, an empty
        // mask filled in below); the handler calls only async-signal-safe
        // functions.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
        }
    });
}

extern "C" fn on_sigbus(_: libc::c_int) {
    const MESSAGE: &[u8] =
        b"cxlfs: error: the trace file shrank while it was read (a fault on its mapping)\n";
    // SAFETY: write(2) and _exit(2) are async-signal-safe; MESSAGE is static.
    unsafe {
        libc::write(2, MESSAGE.as_ptr().cast(), MESSAGE.len());
        libc::_exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_part_reads_the_file_from_its_start_in_windows() {
        let bytes: Vec<u8> = (0..3 * WINDOW + 7).map(|i| (i % 251) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(&bytes).expect("write");
        let map = MappedTrace::map(f.as_file()).expect("maps");
        let mut part = map.part(5, usize::MAX);
        assert_eq!(part.fill_buf().expect("fill").len(), WINDOW);
        let mut all = Vec::new();
        part.read_to_end(&mut all).expect("read");
        assert_eq!(all, bytes[5..]);
        assert!(part.fill_buf().expect("end").is_empty());
        let mut past = map.part(bytes.len() + 10, usize::MAX);
        assert!(past.fill_buf().expect("past").is_empty());
    }

    #[test]
    fn an_empty_file_is_not_mapped() {
        let f = tempfile::NamedTempFile::new().expect("temp file");
        assert!(MappedTrace::map(f.as_file()).is_none());
    }
}
