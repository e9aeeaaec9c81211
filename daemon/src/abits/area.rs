//! One accessed-bit area: a file the daemon creates beside a VM's socket
//! and maps shared, which the VM's QEMU maps too (`x-cxlfs-abits=PATH` on a
//! memory backend, `abits=PATH` on `vhost-user-fs`). A 64-byte header
//! ([`AreaHeader`], DESIGN.md "QEMU accessed bits"), then one bit per
//! 4 KiB page of the region. QEMU sets a page's bit on a vCPU's TLB fill;
//! the daemon takes the set bits with one atomic exchange a word.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use zerocopy::IntoBytes;

pub use cxlfs_api::abits::{AreaHeader, HEADER_BYTES, MAGIC, PAGE_BYTES, VERSION};

/// Byte offsets of the header's fields.
const VERSION_AT: usize = std::mem::offset_of!(AreaHeader, version);
const HEADER_BYTES_AT: usize = std::mem::offset_of!(AreaHeader, header_bytes);
const PAGES_AT: usize = std::mem::offset_of!(AreaHeader, pages);
const ACTIVE_AT: usize = std::mem::offset_of!(AreaHeader, active);
const REARMS_AT: usize = std::mem::offset_of!(AreaHeader, rearms);
const BITS_SET_AT: usize = std::mem::offset_of!(AreaHeader, bits_set);

/// Why an area could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CreateAreaError {
    /// The region is empty or not whole pages.
    #[error("a region of {0} bytes has no whole 4 KiB pages to track")]
    Size(u64),
    /// The file could not be created, written or mapped.
    #[error("accessed-bit area {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
}

/// What QEMU has written in the header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AreaState {
    /// QEMU attached and sets bits.
    pub active: bool,
    /// Its re-arms so far.
    pub rearms: u64,
    /// Bits it set so far.
    pub bits_set: u64,
}

/// A mapped area (unmapped on drop; the daemon removes its file at exit).
#[derive(Debug)]
pub struct BitArea {
    path: PathBuf,
    base: NonNull<u8>,
    len: usize,
    pages: u64,
}

// SAFETY: the mapping is only reached through atomics (see `word`, `state`);
// `BitArea` owns it, and it stays mapped until drop.
unsafe impl Send for BitArea {}
// SAFETY: as above: shared access goes through atomic operations only.
unsafe impl Sync for BitArea {}

impl BitArea {
    /// Creates the area at `path` (a file left there before is replaced:
    /// a VMM still holding it keeps the old one) for a region of
    /// `region_bytes`, QEMU to re-arm every `period_us`, and maps it.
    pub fn create(path: &Path, region_bytes: u64, period_us: u32) -> Result<Self, CreateAreaError> {
        let pages = region_bytes / PAGE_BYTES;
        if pages == 0 || region_bytes % PAGE_BYTES != 0 {
            return Err(CreateAreaError::Size(region_bytes));
        }
        let io = |source| CreateAreaError::Io {
            path: path.to_path_buf(),
            source,
        };
        let len = usize::try_from(AreaHeader::area_bytes(pages))
            .map_err(|_| CreateAreaError::Size(region_bytes))?;
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(io)?;
        let header = AreaHeader::new(pages, period_us);
        file.set_len(len as u64).map_err(io)?;
        file.write_all_at(header.as_bytes(), 0).map_err(io)?;
        let base = map_shared(&file, len).map_err(io)?;
        Ok(BitArea {
            path: path.to_path_buf(),
            base,
            len,
            pages,
        })
    }

    /// The file QEMU is to be given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Pages tracked.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// What QEMU wrote in the header.
    pub fn state(&self) -> AreaState {
        AreaState {
            active: self.u32_at(ACTIVE_AT).load(Ordering::Acquire) == 1,
            rearms: self.u64_at(REARMS_AT).load(Ordering::Relaxed),
            bits_set: self.u64_at(BITS_SET_AT).load(Ordering::Relaxed),
        }
    }

    /// Whether the daemon's header fields are still as it wrote them (a
    /// VMM that wrote over them is not to be trusted with the bits).
    pub fn intact(&self) -> bool {
        self.u64_at(0).load(Ordering::Relaxed) == MAGIC
            && self.u32_at(VERSION_AT).load(Ordering::Relaxed) == VERSION
            && self.u32_at(HEADER_BYTES_AT).load(Ordering::Relaxed) == HEADER_BYTES
            && self.u64_at(PAGES_AT).load(Ordering::Relaxed) == self.pages
    }

    /// Takes every set bit (clears it) and appends its page to `out`.
    pub fn take(&self, out: &mut Vec<u64>) {
        let words = self.pages.div_ceil(64);
        for w in 0..words {
            let word = self.u64_at(HEADER_BYTES as usize + w as usize * 8);
            // A plain load first: most words are clear, and a clear word
            // costs no locked instruction.
            if word.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits = word.swap(0, Ordering::AcqRel);
            while bits != 0 {
                let page = w * 64 + u64::from(bits.trailing_zeros());
                if page < self.pages {
                    out.push(page);
                }
                bits &= bits - 1;
            }
        }
    }

    /// The u64 at byte `at` of the mapping (8-aligned, inside it).
    fn u64_at(&self, at: usize) -> &AtomicU64 {
        assert!(at % 8 == 0 && at + 8 <= self.len, "area offset {at}");
        // SAFETY: `at` is 8-aligned and inside the live mapping (asserted;
        // the mapping is page-aligned); the memory is shared with QEMU,
        // which touches it only with atomic operations, so it is only ever
        // read or written here as an atomic.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(at).cast()) }
    }

    /// The u32 at byte `at` of the mapping (4-aligned, inside it).
    fn u32_at(&self, at: usize) -> &AtomicU32 {
        assert!(at % 4 == 0 && at + 4 <= self.len, "area offset {at}");
        // SAFETY: as in `u64_at`, for a 4-aligned u32.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(at).cast()) }
    }
}

/// Maps `len` bytes of `file` shared, read and write.
fn map_shared(file: &File, len: usize) -> std::io::Result<NonNull<u8>> {
    use rustix::mm::{mmap, MapFlags, ProtFlags};
    // SAFETY: a fresh mapping chosen by the kernel (no address given), of a
    // file at least `len` bytes long; it overlaps nothing of ours and is
    // unmapped only in `drop`.
    let p = unsafe {
        mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            file,
            0,
        )
    }?;
    NonNull::new(p.cast()).ok_or_else(|| std::io::Error::other("mmap returned null"))
}

impl Drop for BitArea {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`, of `len` bytes; no reference
        // into it outlives `self`.
        if let Err(e) = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) } {
            tracing::warn!(error = %e, path = %self.path.display(), "cannot unmap an accessed-bit area");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_new_area_has_the_header_qemu_checks_and_no_bit_set() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vm0.sock.cxl-abits");
        let a = BitArea::create(&path, 100 * PAGE_BYTES, 50_000).unwrap();
        let b = std::fs::read(&path).unwrap();
        assert_eq!(b.len(), 64 + 2 * 8);
        assert_eq!(&b[0..8], b"XLSABITS");
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 64);
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 100);
        assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 50_000);
        assert_eq!(a.state(), AreaState::default());
        let mut out = Vec::new();
        a.take(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn bits_set_through_the_file_are_taken_once_and_the_header_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let a = BitArea::create(&path, 130 * PAGE_BYTES, 1000).unwrap();
        // Another writer of the file, as QEMU: bits 0, 63, 64, 65 and 129,
        // and the header fields QEMU writes.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&(1u64 | 1 << 63).to_le_bytes(), 64).unwrap();
        f.write_all_at(&(1u64 | 1 << 1).to_le_bytes(), 72).unwrap();
        f.write_all_at(&(1u64 << 1).to_le_bytes(), 80).unwrap();
        f.write_all_at(&1u32.to_le_bytes(), 28).unwrap();
        f.write_all_at(&7u64.to_le_bytes(), 32).unwrap();
        f.write_all_at(&4u64.to_le_bytes(), 40).unwrap();
        let mut out = Vec::new();
        a.take(&mut out);
        assert_eq!(out, vec![0, 63, 64, 65, 129]);
        let s = a.state();
        assert_eq!((s.active, s.rearms, s.bits_set), (true, 7, 4));
        out.clear();
        a.take(&mut out);
        assert!(out.is_empty(), "taken bits are cleared");
    }

    #[test]
    fn an_area_left_behind_is_replaced_and_a_bad_size_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        std::fs::write(&path, b"stale").unwrap();
        let a = BitArea::create(&path, 64 * PAGE_BYTES, 1000).unwrap();
        assert_eq!(a.pages(), 64);
        assert!(a.intact());
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&65u64.to_le_bytes(), 16).unwrap();
        assert!(!a.intact(), "a page count written over is noticed");
        assert_eq!(&std::fs::read(&path).unwrap()[0..8], b"XLSABITS");
        assert!(matches!(
            BitArea::create(&dir.path().join("b"), 1000, 1000),
            Err(CreateAreaError::Size(1000))
        ));
    }
}
