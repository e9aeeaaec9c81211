//! The timing layer: wraps any [`FileSystem`] and adds what the emulated
//! device does to it — all device policy of the FUSE path in one place.
//!
//! * READ and WRITE are charged to the device model at the request's
//!   arrival: the file range maps to pool addresses, CXL-tier pages go
//!   through the device (hits, misses, NAND queueing, GC), DRAM-tier pages
//!   cost nothing; the reply is released at the charge's completion.
//! * DAX coherence (when a [`Coherence`] is given, i.e. DAX is on): before
//!   a WRITE or a truncation changes a file's bytes behind the pool, the
//!   pool's copies are written back and dropped under the plane-fill guard;
//!   FSYNC first writes back the stores guests made through their windows.
//! * Bytes a change destroys (a punched hole, a zeroed range, a truncated
//!   tail) leave the pool unwritten: their pool pages are discarded from
//!   the windows ([`Coherence::discard_file_range`], held write-backs
//!   restored if the host refuses) and from the device cache
//!   ([`SharedDevice::discard_file_range`]). Pool extents of truncated
//!   bytes (SETATTR size, OPEN with `O_TRUNC`, COLLAPSE_RANGE) go back to
//!   the pool ([`SharedDevice::reclaim`]).
//! * Bytes a host call reads or moves reach the host file first:
//!   COPY_FILE_RANGE (charged as reads of the source and writes of the
//!   destination), SEEK_DATA / SEEK_HOLE, COLLAPSE / INSERT_RANGE, SYNCFS.
//!   Allocation is not charged.
//! * A cap on what one VM holds open ([`TimedFs::with_open_files_cap`]):
//!   LOOKUP, OPEN, OPENDIR, CREATE, MKDIR, SYMLINK, LINK, MKNOD and TMPFILE
//!   get `EMFILE` once the VM's inodes and handles (each a host fd) reach
//!   it, so one guest walking a huge tree cannot take the fds every VM
//!   needs.
//!
//! Everything else passes through to the wrapped filesystem unchanged
//! (xattrs, locks, ACCESS: no device traffic). See DESIGN.md, "Pool
//! semantics of the metadata and space operations".

use crate::abi::{fattr, EntryOut, FileLock, Kstatfs, SetattrIn};
use crate::device::{SharedDevice, EXTENT_SIZE, PAGE};
use crate::ids::FileKey;
use crate::metrics::VmMetrics;
use crate::server::{
    AttrReply, Context, CopyRange, Created, Creation, DirSink, Fallocate, FileIo, FileSystem,
    FsResult, HostFile, LockRequest, LockWaiter, Named, Opened, Timed, Xattr,
};
use crate::sync::lock;
use cxlfs_device_model::Op;
use rustix::io::Errno;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The errno a guest gets when its file's pool pages could not be written
/// back ([`residency::writeback_errno`]: ENOSPC, EDQUOT, EFBIG stay
/// themselves, anything else is EIO).
fn sync_errno(e: &SyncPoolError) -> Errno {
    match &e.source {
        residency::SendNotifyError::Kernel(io) => {
            Errno::from_raw_os_error(residency::writeback_errno(io))
        }
        _ => Errno::IO,
    }
}

/// A file's dirty pool pages could not be written back.
#[derive(Debug, thiserror::Error)]
#[error("cannot write back pool pages {offset:#x}+{len:#x}")]
pub struct SyncPoolError {
    /// Pool offset of the range.
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// The plane's error.
    #[source]
    pub source: residency::SendNotifyError,
}

/// One lock per file, taken by key: files never share one, so a slow
/// change of one file holds up nothing of another's. A file's entry exists
/// only while someone holds it.
#[derive(Debug, Default)]
pub struct FileLocks {
    held: Mutex<HashSet<FileKey>>,
    freed: Condvar,
}

impl FileLocks {
    /// Waits until nobody holds `key`'s lock, then holds it.
    pub fn lock(&self, key: FileKey) -> FileGuard<'_> {
        let mut held = lock(&self.held);
        while held.contains(&key) {
            held = self.freed.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        held.insert(key);
        FileGuard { locks: self, key }
    }
}

/// A held [`FileLocks`] lock; released when dropped.
#[derive(Debug)]
pub struct FileGuard<'a> {
    locks: &'a FileLocks,
    key: FileKey,
}

impl Drop for FileGuard<'_> {
    fn drop(&mut self) {
        let mut held: MutexGuard<'_, HashSet<FileKey>> = lock(&self.locks.held);
        held.remove(&self.key);
        drop(held);
        // Waiters for other files wake and wait again: rare (a file's
        // change against its own fill), and cheap.
        self.locks.freed.notify_all();
    }
}

/// Keeps the pool's copies of file pages coherent with the host files (the
/// DAX plane implements it).
pub trait Coherence: Send + Sync {
    /// Held across every change of file `key`'s bytes behind the pool, so
    /// that no plane fill reads them meanwhile (per file: other files'
    /// changes and fills go on).
    fn change_guard(&self, key: FileKey) -> FileGuard<'_>;

    /// Writes back and drops the pool's pages of file bytes
    /// `[offset, offset + len)` of `key`, and waits.
    fn evict_file_range(&self, key: FileKey, offset: u64, len: u64);

    /// Writes back the dirty pool pages of those bytes (they stay resident).
    fn sync_file_range(&self, key: FileKey, offset: u64, len: u64) -> Result<(), SyncPoolError>;

    /// Drops the pool's pages of file bytes `[offset, offset + len)` of
    /// `key` from every window WITHOUT writing them back, and waits: the
    /// caller is about to destroy those bytes in the host file (punch a
    /// hole, zero a range, truncate), and a write-back after that would
    /// bring the old bytes back. Whole pages only (the caller writes back a
    /// page the range covers in part with
    /// [`Coherence::evict_file_range`]). Call it under the file's
    /// [`Coherence::change_guard`], and end it with
    /// [`Coherence::end_discard`] (see [`Discard`], which does): until
    /// then, what the kernel writes back of these pages is held, neither
    /// stored nor charged.
    fn discard_file_range(&self, key: FileKey, offset: u64, len: u64) -> DiscardId;

    /// Ends a discard. `restore` false: the change went through, the held
    /// write-backs are dropped; true: it failed, and they are stored and
    /// charged as the write-backs they were (the guests' stores survive a
    /// refused punch).
    fn end_discard(&self, id: DiscardId, restore: bool);

    /// File `key` is about to grow to `new_size` (a truncation up, a
    /// WRITE, FALLOCATE or copy past its end): the new bytes a window maps
    /// writable, holes included, get host blocks first, as a store there
    /// reaches the host only in a later write-back, which a full share
    /// must not fail. Call it under the file's
    /// [`Coherence::change_guard`], before the host file changes; an error
    /// (`ENOSPC`, `EDQUOT`) refuses the operation, with nothing reserved
    /// past the old end. The default reserves nothing.
    fn reserve_growth(&self, key: FileKey, new_size: u64) -> Result<(), Errno> {
        let _ = (key, new_size);
        Ok(())
    }

    /// A FALLOCATE just made `[offset, end)` of file `key` a hole (punch,
    /// zero, insert): where a window maps it writable, host blocks are
    /// reserved again (best effort: the bytes are gone; a failure is
    /// logged). Under the file's change guard. The default does nothing.
    fn reserve_hole(&self, key: FileKey, offset: u64, end: u64) {
        let _ = (key, offset, end);
    }

    /// Writes back every dirty pool page of every file (SYNCFS); they stay
    /// resident. The default has nothing to write back.
    fn sync_all(&self) -> Result<(), SyncAllError> {
        Ok(())
    }
}

/// One [`Coherence::discard_file_range`] in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DiscardId(pub u64);

/// The pool's dirty pages could not all be written back (SYNCFS).
#[derive(Debug, thiserror::Error)]
#[error("cannot write back the pool's dirty pages")]
pub struct SyncAllError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// A discard in progress ([`Coherence::discard_file_range`]): dropped
/// without [`Discard::commit`] (the change failed, or an early return), it
/// stores the held write-backs after all.
#[must_use = "a discard ends with commit() once the change is made; dropped, it restores"]
pub struct Discard<'a> {
    coherence: &'a dyn Coherence,
    id: Option<DiscardId>,
}

impl<'a> Discard<'a> {
    /// Starts discarding the pool pages of file bytes `[offset, offset +
    /// len)` of `key` (whole pages) through `coherence`.
    pub fn start(coherence: &'a dyn Coherence, key: FileKey, offset: u64, len: u64) -> Self {
        let id = coherence.discard_file_range(key, offset, len);
        Discard {
            coherence,
            id: Some(id),
        }
    }

    /// The change went through: what was held is dropped.
    pub fn commit(mut self) {
        if let Some(id) = self.id.take() {
            self.coherence.end_discard(id, false);
        }
    }
}

impl Drop for Discard<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.coherence.end_discard(id, true);
        }
    }
}

impl std::fmt::Debug for Discard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discard").field("id", &self.id).finish()
    }
}

/// Counts what a filesystem holds open for its VM (inodes + handles).
pub type OpenFiles<F> = Box<dyn Fn(&F) -> u64 + Send + Sync>;

/// A filesystem whose data path is timed by the shared device.
pub struct TimedFs<F> {
    inner: F,
    device: Arc<SharedDevice>,
    metrics: Arc<VmMetrics>,
    coherence: Option<Arc<dyn Coherence>>,
    open_cap: Option<(u64, OpenFiles<F>)>,
    cap_warned: AtomicBool,
}

impl<F> std::fmt::Debug for TimedFs<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedFs")
            .field("vm", &self.metrics.name)
            .field("coherence", &self.coherence.is_some())
            .finish_non_exhaustive()
    }
}

impl<F: FileSystem> TimedFs<F> {
    /// Wraps `inner`; charges go to `device` and are counted for `metrics`'
    /// VM; `coherence`: the DAX plane, when DAX is on.
    pub fn new(
        inner: F,
        device: Arc<SharedDevice>,
        metrics: Arc<VmMetrics>,
        coherence: Option<Arc<dyn Coherence>>,
    ) -> Self {
        TimedFs {
            inner,
            device,
            metrics,
            coherence,
            open_cap: None,
            cap_warned: AtomicBool::new(false),
        }
    }

    /// Caps the inodes + handles the VM holds at `cap`, as `count` counts
    /// them: requests that would add one get `EMFILE` at the cap.
    pub fn with_open_files_cap(mut self, cap: u64, count: OpenFiles<F>) -> Self {
        self.open_cap = Some((cap, count));
        self
    }

    /// `EMFILE` when the VM holds `cap` inodes + handles already.
    fn check_open_cap(&self) -> Result<(), Errno> {
        let Some((cap, count)) = &self.open_cap else {
            return Ok(());
        };
        let held = count(&self.inner);
        if held < *cap {
            return Ok(());
        }
        self.metrics
            .open_files_refused
            .fetch_add(1, Ordering::Relaxed);
        if !self.cap_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(vm = %self.metrics.name, held, cap, "VM holds its cap of open files; LOOKUP/OPEN get EMFILE (cxlfsd --max-open-files)");
        }
        Err(Errno::MFILE)
    }

    /// Gives back the pool extents of `key` past `size` bytes (truncated).
    fn reclaim_past(&self, key: FileKey, size: u64) {
        self.device.reclaim(key, size.div_ceil(EXTENT_SIZE));
    }

    /// Drops the device-cache pages of the bytes a truncation from
    /// `old_size` to `new_size` cut off, unwritten; the old last page is
    /// wholly cut off when the new size ends before it.
    fn discard_tail(&self, key: FileKey, new_size: u64, old_size: u64) {
        let end = old_size.div_ceil(PAGE).saturating_mul(PAGE);
        self.device
            .discard_file_range(key, new_size, end.saturating_sub(new_size));
    }

    /// The wrapped filesystem.
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// Charges file bytes `[offset, offset + len)` of `key`; returns the
    /// release time (`None`: nothing to wait for).
    fn charge(
        &self,
        arrival_ns: u64,
        op: Op,
        key: FileKey,
        offset: u64,
        len: usize,
    ) -> Option<u64> {
        if len == 0 {
            return None;
        }
        match self.device.charge(arrival_ns, op, key, offset, len as u64) {
            Ok(c) => {
                self.metrics.record_charge(&c);
                Some(c.completes_at_ns)
            }
            Err(e) => {
                tracing::warn!(error = %e, "device charge failed; reply not delayed");
                None
            }
        }
    }
}

/// What a FALLOCATE does to a file's bytes, by mode (`FALLOC_FL_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FallocKind {
    /// Mode 0, `KEEP_SIZE`, `UNSHARE_RANGE`: blocks are allocated, no
    /// byte changes (`keep_size`: the size does not grow).
    Allocate { keep_size: bool },
    /// `PUNCH_HOLE`, `ZERO_RANGE`: the range's bytes become zeros.
    Destroy,
    /// `COLLAPSE_RANGE` (`collapse`), `INSERT_RANGE`: every byte from the
    /// offset on moves.
    Shift { collapse: bool },
}

impl FallocKind {
    /// The mode's kind, refused as `vfs_fallocate` refuses it (the same
    /// errnos, in its order): modes this layer does not know get
    /// `EOPNOTSUPP` rather than bytes changed behind the pool.
    fn of(mode: u32) -> Result<Self, Errno> {
        const KEEP: u32 = libc::FALLOC_FL_KEEP_SIZE as u32;
        const PUNCH: u32 = libc::FALLOC_FL_PUNCH_HOLE as u32;
        const COLLAPSE: u32 = libc::FALLOC_FL_COLLAPSE_RANGE as u32;
        const ZERO: u32 = libc::FALLOC_FL_ZERO_RANGE as u32;
        const INSERT: u32 = libc::FALLOC_FL_INSERT_RANGE as u32;
        const UNSHARE: u32 = libc::FALLOC_FL_UNSHARE_RANGE as u32;
        if mode & !(KEEP | PUNCH | COLLAPSE | ZERO | INSERT | UNSHARE) != 0 {
            return Err(Errno::OPNOTSUPP);
        }
        if mode & (PUNCH | ZERO) == PUNCH | ZERO || (mode & PUNCH != 0 && mode & KEEP == 0) {
            return Err(Errno::OPNOTSUPP);
        }
        if (mode & COLLAPSE != 0 && mode != COLLAPSE)
            || (mode & INSERT != 0 && mode != INSERT)
            || (mode & UNSHARE != 0 && mode & !(UNSHARE | KEEP) != 0)
        {
            return Err(Errno::INVAL);
        }
        Ok(if mode & (PUNCH | ZERO) != 0 {
            FallocKind::Destroy
        } else if mode & (COLLAPSE | INSERT) != 0 {
            FallocKind::Shift {
                collapse: mode == COLLAPSE,
            }
        } else {
            FallocKind::Allocate {
                keep_size: mode & KEEP != 0,
            }
        })
    }
}

/// Drops the pool's pages of file bytes `[start, end)` of `key` before a
/// change destroys those bytes: the whole pages are discarded unwritten;
/// the pages the range covers in part keep bytes outside it and are
/// written back and dropped — after the discard has marked the whole ones,
/// so that a large folio laundered with an edge page holds their bytes
/// too. Call it under the file's change guard.
fn discard_range<'c>(c: &'c dyn Coherence, key: FileKey, start: u64, end: u64) -> Discard<'c> {
    let first_whole = start.div_ceil(PAGE).saturating_mul(PAGE);
    let end_whole = end / PAGE * PAGE;
    let discard = Discard::start(c, key, first_whole, end_whole.saturating_sub(first_whole));
    if start % PAGE != 0 {
        c.evict_file_range(key, start, 1);
    }
    if end % PAGE != 0 && end_whole >= first_whole {
        // Not the head page again (a range inside one page).
        c.evict_file_range(key, end_whole, 1);
    }
    discard
}

/// Methods the timing layer passes to the wrapped filesystem unchanged.
macro_rules! pass_through {
    ($(fn $name:ident(&self $(, $arg:ident: $ty:ty)*) $(-> $ret:ty)?;)*) => {$(
        fn $name(&self $(, $arg: $ty)*) $(-> $ret)? {
            self.inner.$name($($arg),*)
        }
    )*};
}

impl<F: FileSystem> FileSystem for TimedFs<F> {
    pass_through! {
        fn init(&self, kernel_flags: u64) -> Result<u64, Errno>;
        fn destroy(&self);
        fn forget(&self, ctx: &Context, nodeid: u64, nlookup: u64);
        fn getattr(&self, ctx: &Context, nodeid: u64, fh: Option<u64>) -> FsResult<AttrReply>;
        fn readlink(&self, ctx: &Context, nodeid: u64) -> FsResult<Vec<u8>>;
        fn unlink(&self, ctx: &Context, at: Named<'_>, dir: bool) -> FsResult<()>;
        fn rename(&self, ctx: &Context, from: Named<'_>, to: Named<'_>, flags: u32) -> FsResult<()>;
        fn flush(&self, ctx: &Context, nodeid: u64, fh: u64) -> FsResult<()>;
        fn release(&self, ctx: &Context, nodeid: u64, fh: u64);
        fn readdir(&self, ctx: &Context, fh: u64, offset: u64, emit: DirSink<'_>) -> FsResult<()>;
        fn statfs(&self, ctx: &Context, nodeid: u64) -> FsResult<Kstatfs>;
        fn host_file(&self, nodeid: u64, fh: Option<u64>, for_pool: bool) -> Result<HostFile, Errno>;
        fn file_key(&self, nodeid: u64, fh: Option<u64>) -> Result<FileKey, Errno>;
        // Metadata and locks: no device traffic.
        fn getxattr(&self, ctx: &Context, nodeid: u64, name: &[u8], size: u32) -> FsResult<Xattr>;
        fn listxattr(&self, ctx: &Context, nodeid: u64, size: u32) -> FsResult<Xattr>;
        fn setxattr(&self, ctx: &Context, nodeid: u64, name: &[u8], value: &[u8], flags: u32) -> FsResult<()>;
        fn removexattr(&self, ctx: &Context, nodeid: u64, name: &[u8]) -> FsResult<()>;
        fn getlk(&self, ctx: &Context, nodeid: u64, lock: &LockRequest) -> FsResult<FileLock>;
        fn setlk(&self, ctx: &Context, nodeid: u64, lock: &LockRequest) -> FsResult<()>;
        fn lock_waiter(&self, ctx: &Context, nodeid: u64, lock: &LockRequest) -> Result<LockWaiter, Errno>;
        fn unlock_owner(&self, ctx: &Context, nodeid: u64, owner: u64, flock: bool);
        fn access(&self, ctx: &Context, nodeid: u64, mask: u32) -> FsResult<()>;
    }

    fn setattr(&self, ctx: &Context, nodeid: u64, attr: &SetattrIn) -> FsResult<AttrReply> {
        if attr.valid & fattr::SIZE == 0 {
            return self.inner.setattr(ctx, nodeid, attr);
        }
        let Some(coherence) = self.coherence.as_ref() else {
            let before = self.inner.host_file(nodeid, None, false).ok();
            let r = self.inner.setattr(ctx, nodeid, attr)?;
            if let Some(f) = before.filter(|f| attr.size < f.size) {
                self.discard_tail(f.key, attr.size, f.size);
                self.reclaim_past(f.key, attr.size);
            }
            return Ok(r);
        };
        // The pool must not keep bytes of the old size (nor write them back
        // over the new one), and no plane fill may read the file meanwhile.
        let before = self.inner.host_file(nodeid, None, false).ok();
        let Some(f) = &before else {
            return self.inner.setattr(ctx, nodeid, attr);
        };
        let _guard = coherence.change_guard(f.key);
        let to = f
            .size
            .max(attr.size)
            .div_ceil(EXTENT_SIZE)
            .saturating_mul(EXTENT_SIZE);
        // Down: the cut-off tail is discarded, not written back (the
        // truncation destroys it; the page holding the new end keeps
        // bytes and is written back). Up: the old last page is written
        // back while the old size still clamps what a guest stored past
        // it, and dropped.
        let discard = if attr.size < f.size {
            Some(discard_range(coherence.as_ref(), f.key, attr.size, to))
        } else {
            coherence.reserve_growth(f.key, attr.size)?;
            coherence.evict_file_range(f.key, f.size, to - f.size);
            None
        };
        // Refused: the discard, dropped, stores what it held.
        let r = self.inner.setattr(ctx, nodeid, attr)?;
        if let Some(d) = discard {
            d.commit();
        }
        if attr.size < f.size {
            self.discard_tail(f.key, attr.size, f.size);
            self.reclaim_past(f.key, attr.size);
        }
        Ok(r)
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &[u8]) -> FsResult<EntryOut> {
        self.check_open_cap()?;
        self.inner.lookup(ctx, parent, name)
    }

    fn symlink(&self, ctx: &Context, at: Named<'_>, target: &[u8]) -> FsResult<EntryOut> {
        self.check_open_cap()?;
        self.inner.symlink(ctx, at, target)
    }

    fn mkdir(&self, ctx: &Context, at: Named<'_>, how: Creation) -> FsResult<EntryOut> {
        self.check_open_cap()?;
        self.inner.mkdir(ctx, at, how)
    }

    fn create(&self, ctx: &Context, at: Named<'_>, how: Creation) -> FsResult<Created> {
        self.check_open_cap()?;
        self.inner.create(ctx, at, how)
    }

    fn opendir(&self, ctx: &Context, nodeid: u64) -> FsResult<Opened> {
        self.check_open_cap()?;
        self.inner.opendir(ctx, nodeid)
    }

    fn open(&self, ctx: &Context, nodeid: u64, flags: u32, open_flags: u32) -> FsResult<Opened> {
        self.check_open_cap()?;
        let truncates = flags & libc::O_TRUNC as u32 != 0
            && flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32;
        if !truncates {
            return self.inner.open(ctx, nodeid, flags, open_flags);
        }
        // O_TRUNC (FUSE_ATOMIC_O_TRUNC): a truncation to 0, as SETATTR:
        // every pool page of the file is discarded, none written back.
        let key = self.inner.file_key(nodeid, None).ok();
        let guard = match (self.coherence.as_ref(), key) {
            (Some(c), Some(k)) => Some(c.change_guard(k)),
            _ => None,
        };
        let discard = match (self.coherence.as_ref(), key) {
            (Some(c), Some(k)) => Some(Discard::start(c.as_ref(), k, 0, u64::MAX)),
            _ => None,
        };
        // Refused: the discard, dropped, stores what it held.
        let r = self.inner.open(ctx, nodeid, flags, open_flags)?;
        if let Some(d) = discard {
            d.commit();
        }
        if let Some(k) = key {
            self.device.discard_file_range(k, 0, u64::MAX);
            self.reclaim_past(k, 0);
        }
        drop(guard);
        Ok(r)
    }

    fn read(&self, ctx: &Context, io: FileIo<'_>) -> FsResult<usize> {
        let (nodeid, fh, offset) = (io.nodeid, io.fh, io.offset);
        let key = self.inner.file_key(nodeid, Some(fh))?;
        let n = self.inner.read(ctx, io)?.value;
        self.metrics
            .read_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(Timed {
            value: n,
            completes_at_ns: self.charge(ctx.arrival_ns, Op::Read, key, offset, n),
        })
    }

    fn write(&self, ctx: &Context, io: FileIo<'_>) -> FsResult<usize> {
        let (nodeid, fh, offset, size) = (io.nodeid, io.fh, io.offset, io.size);
        let key = self.inner.file_key(nodeid, Some(fh))?;
        // DAX: the pool may hold (dirty) pages of this range; no plane fill
        // may read the file until the new bytes are in it.
        // A write past the end leaves a hole a window may map writable.
        let guard = match self.coherence.as_ref() {
            Some(c) => {
                let g = c.change_guard(key);
                c.reserve_growth(key, offset.saturating_add(u64::from(size)))?;
                c.evict_file_range(key, offset, u64::from(size));
                Some(g)
            }
            None => None,
        };
        let n = self.inner.write(ctx, io)?.value;
        drop(guard);
        self.metrics
            .write_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(Timed {
            value: n,
            completes_at_ns: self.charge(ctx.arrival_ns, Op::Write, key, offset, n),
        })
    }

    fn link(&self, ctx: &Context, nodeid: u64, at: Named<'_>) -> FsResult<EntryOut> {
        // One host inode, one FileKey: the new name reaches the same pool
        // extents, nothing to do but count the inode.
        self.check_open_cap()?;
        self.inner.link(ctx, nodeid, at)
    }

    fn mknod(&self, ctx: &Context, at: Named<'_>, how: Creation, rdev: u32) -> FsResult<EntryOut> {
        self.check_open_cap()?;
        self.inner.mknod(ctx, at, how, rdev)
    }

    fn tmpfile(&self, ctx: &Context, parent: u64, how: Creation) -> FsResult<Created> {
        self.check_open_cap()?;
        self.inner.tmpfile(ctx, parent, how)
    }

    fn fallocate(&self, ctx: &Context, range: Fallocate) -> FsResult<()> {
        let kind = FallocKind::of(range.mode)?;
        if range.length == 0 {
            return Err(Errno::INVAL);
        }
        // The host's bounds (`loff_t`), checked before anything is dropped.
        let end = range
            .offset
            .checked_add(range.length)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or(Errno::FBIG)?;
        match kind {
            FallocKind::Allocate { keep_size } => {
                // Uncharged: the device maps the LBAs, programs nothing.
                // Growing the file: a guest's stores past the old end in the
                // old last page were clamped away by write-backs so far;
                // past the new size they would land in the file, so that
                // page is written back (clamped) and dropped first.
                // A range past the end leaves a hole a window may map
                // writable: its blocks are reserved first.
                let guard = match &self.coherence {
                    Some(c) if !keep_size => {
                        let f = self.inner.host_file(range.nodeid, Some(range.fh), false)?;
                        if end > f.size {
                            let g = c.change_guard(f.key);
                            c.reserve_growth(f.key, end)?;
                            if f.size % PAGE != 0 {
                                c.evict_file_range(f.key, f.size, 1);
                            }
                            Some(g)
                        } else {
                            None
                        }
                    }
                    _ => None,
                };
                let r = self.inner.fallocate(ctx, range);
                drop(guard);
                r
            }
            FallocKind::Destroy => {
                let key = self.inner.file_key(range.nodeid, Some(range.fh))?;
                let guard = self.coherence.as_ref().map(|c| c.change_guard(key));
                let discard = self
                    .coherence
                    .as_ref()
                    .map(|c| discard_range(c.as_ref(), key, range.offset, end));
                // Refused: the discard, dropped, stores what it held.
                let r = self.inner.fallocate(ctx, range)?;
                if let Some(d) = discard {
                    d.commit();
                }
                if let Some(c) = &self.coherence {
                    c.reserve_hole(key, range.offset, end);
                }
                self.device
                    .discard_file_range(key, range.offset, range.length);
                drop(guard);
                Ok(r)
            }
            FallocKind::Shift { collapse } => {
                // Every byte from `offset` on moves: the pool's copies are
                // written back (the host shifts the right bytes) and
                // dropped; the device's copies of the shifted range no
                // longer hold the bytes of their file offsets.
                let key = self.inner.file_key(range.nodeid, Some(range.fh))?;
                let guard = self.coherence.as_ref().map(|c| {
                    let g = c.change_guard(key);
                    c.evict_file_range(key, range.offset, u64::MAX);
                    g
                });
                let r = self.inner.fallocate(ctx, range)?;
                self.device.discard_file_range(key, range.offset, u64::MAX);
                if let (Some(c), false) = (&self.coherence, collapse) {
                    // The inserted range is a hole.
                    c.reserve_hole(key, range.offset, end);
                }
                if collapse {
                    if let Ok(f) = self.inner.host_file(range.nodeid, Some(range.fh), false) {
                        self.reclaim_past(key, f.size);
                    }
                }
                drop(guard);
                Ok(r)
            }
        }
    }

    fn lseek(
        &self,
        ctx: &Context,
        nodeid: u64,
        fh: u64,
        offset: u64,
        whence: u32,
    ) -> FsResult<u64> {
        let layout = whence == libc::SEEK_DATA as u32 || whence == libc::SEEK_HOLE as u32;
        if let (Some(c), true) = (&self.coherence, layout) {
            // Window stores to a hole are data only once written back.
            let key = self.inner.file_key(nodeid, Some(fh))?;
            if let Err(e) = c.sync_file_range(key, 0, u64::MAX) {
                tracing::warn!(error = %e, "lseek: cannot write back the file's pool pages");
                return Err(sync_errno(&e));
            }
        }
        self.inner.lseek(ctx, nodeid, fh, offset, whence)
    }

    fn copy_file_range(&self, ctx: &Context, copy: CopyRange) -> FsResult<usize> {
        // The host's bounds (`loff_t`), checked before anything is evicted.
        for off in [copy.off_in, copy.off_out] {
            if off
                .checked_add(copy.len)
                .map_or(true, |e| e > i64::MAX as u64)
            {
                return Err(Errno::INVAL);
            }
        }
        let key_in = self.inner.file_key(copy.nodeid_in, Some(copy.fh_in))?;
        let key_out = self.inner.file_key(copy.nodeid_out, Some(copy.fh_out))?;
        // DAX: the source's window stores reach the host file first; the
        // destination's pool pages are written back and dropped, and no
        // plane fill reads it until the copy is in. One guard (the
        // destination's) even when source and destination are one file.
        let guard = match &self.coherence {
            Some(c) => {
                let g = c.change_guard(key_out);
                c.reserve_growth(key_out, copy.off_out.saturating_add(copy.len))?;
                if let Err(e) = c.sync_file_range(key_in, copy.off_in, copy.len) {
                    tracing::warn!(error = %e, "copy_file_range: cannot write back the source's pool pages");
                    return Err(sync_errno(&e));
                }
                c.evict_file_range(key_out, copy.off_out, copy.len);
                Some(g)
            }
            None => None,
        };
        let n = self.inner.copy_file_range(ctx, copy)?.value;
        drop(guard);
        // The device reads the source range and writes the destination's
        // (a host-side copy: no READ / WRITE bytes for the VM's counters).
        let read = self.charge(ctx.arrival_ns, Op::Read, key_in, copy.off_in, n);
        let write = self.charge(ctx.arrival_ns, Op::Write, key_out, copy.off_out, n);
        Ok(Timed {
            value: n,
            completes_at_ns: read.max(write),
        })
    }

    fn syncfs(&self, ctx: &Context, nodeid: u64) -> FsResult<()> {
        if let Some(c) = &self.coherence {
            // Window stores of every file reach the host files first.
            if let Err(e) = c.sync_all() {
                tracing::warn!(error = %e, "syncfs: cannot write back the pool's dirty pages");
                return Err(Errno::IO);
            }
        }
        self.inner.syncfs(ctx, nodeid)
    }

    fn fsync(&self, ctx: &Context, nodeid: u64, fh: u64, datasync: bool) -> FsResult<()> {
        if let Some(c) = &self.coherence {
            // Stores made through DAX windows sit in the pool until written back.
            let key = self.inner.file_key(nodeid, Some(fh))?;
            if let Err(e) = c.sync_file_range(key, 0, u64::MAX) {
                tracing::warn!(error = %e, "fsync: cannot write back the file's pool pages");
                return Err(sync_errno(&e));
            }
        }
        self.inner.fsync(ctx, nodeid, fh, datasync)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::Attr;
    use cxlfs_device_model::{Device, DeviceConfig};
    use std::time::Duration;

    fn key(ino: u64) -> FileKey {
        FileKey { dev: 1, ino }
    }

    /// What the fakes were asked, in order.
    type Log = Arc<Mutex<Vec<String>>>;

    fn log(l: &Log, what: String) {
        l.lock().unwrap().push(what);
    }

    fn taken(l: &Log) -> Vec<String> {
        std::mem::take(&mut *l.lock().unwrap())
    }

    /// A filesystem that logs the calls the timing layer forwards: node
    /// `n` is file `key(n)` of `size` bytes; the operations that change
    /// bytes answer `fail` when set.
    struct FakeFs {
        log: Log,
        size: u64,
        fail: Option<Errno>,
    }

    impl FakeFs {
        fn answer<T>(&self, what: String, value: T) -> FsResult<T> {
            log(&self.log, what);
            match self.fail {
                Some(e) => Err(e),
                None => Ok(Timed::now(value)),
            }
        }
    }

    impl FileSystem for FakeFs {
        fn file_key(&self, nodeid: u64, _fh: Option<u64>) -> Result<FileKey, Errno> {
            Ok(key(nodeid))
        }

        fn host_file(&self, nodeid: u64, _: Option<u64>, _: bool) -> Result<HostFile, Errno> {
            Ok(HostFile {
                key: key(nodeid),
                size: self.size,
                is_dir: false,
                pool_file: None,
            })
        }

        fn fallocate(&self, _: &Context, r: Fallocate) -> FsResult<()> {
            let what = format!(
                "fallocate {} {} {} {:#x}",
                r.nodeid, r.offset, r.length, r.mode
            );
            self.answer(what, ())
        }

        fn copy_file_range(&self, _: &Context, c: CopyRange) -> FsResult<usize> {
            let what = format!(
                "copy {}:{} -> {}:{} {}",
                c.nodeid_in, c.off_in, c.nodeid_out, c.off_out, c.len
            );
            self.answer(what, c.len as usize)
        }

        fn setattr(&self, _: &Context, nodeid: u64, a: &SetattrIn) -> FsResult<AttrReply> {
            let reply = AttrReply {
                attr: Attr::default(),
                timeout: Duration::ZERO,
            };
            self.answer(format!("setattr {nodeid} {}", a.size), reply)
        }

        fn lseek(&self, _: &Context, nodeid: u64, _: u64, offset: u64, _: u32) -> FsResult<u64> {
            self.answer(format!("lseek {nodeid}"), offset)
        }

        fn syncfs(&self, _: &Context, _: u64) -> FsResult<()> {
            self.answer("syncfs".into(), ())
        }
    }

    /// A coherence step that logs what it is asked.
    struct FakeCoherence {
        log: Log,
        locks: FileLocks,
        next: std::sync::atomic::AtomicU64,
    }

    impl Coherence for FakeCoherence {
        fn change_guard(&self, key: FileKey) -> FileGuard<'_> {
            log(&self.log, format!("guard {}", key.ino));
            self.locks.lock(key)
        }

        fn evict_file_range(&self, key: FileKey, offset: u64, len: u64) {
            log(&self.log, format!("evict {} {offset} {len}", key.ino));
        }

        fn sync_file_range(
            &self,
            key: FileKey,
            offset: u64,
            len: u64,
        ) -> Result<(), SyncPoolError> {
            log(&self.log, format!("sync {} {offset} {len}", key.ino));
            Ok(())
        }

        fn discard_file_range(&self, key: FileKey, offset: u64, len: u64) -> DiscardId {
            log(&self.log, format!("discard {} {offset} {len}", key.ino));
            DiscardId(self.next.fetch_add(1, Ordering::Relaxed))
        }

        fn end_discard(&self, id: DiscardId, restore: bool) {
            log(&self.log, format!("end {} restore={restore}", id.0));
        }

        fn sync_all(&self) -> Result<(), SyncAllError> {
            log(&self.log, "sync all".into());
            Ok(())
        }
    }

    const C: Context = Context {
        uid: 0,
        gid: 0,
        pid: 0,
        arrival_ns: 0,
    };

    fn device() -> Arc<SharedDevice> {
        let cfg = DeviceConfig::default()
            .with_overrides(&["cache.size_bytes=16MiB", "nand.read_ns=30us"])
            .unwrap();
        Arc::new(SharedDevice::new(Device::new(cfg).unwrap()))
    }

    /// The timing layer over a [`FakeFs`] of files of `size` bytes; with
    /// `dax`, over a logging coherence step. Returns it, its device and
    /// the log both fakes write.
    fn timed(
        size: u64,
        fail: Option<Errno>,
        dax: bool,
    ) -> (TimedFs<FakeFs>, Arc<SharedDevice>, Log) {
        let l: Log = Arc::default();
        let fs = FakeFs {
            log: l.clone(),
            size,
            fail,
        };
        let coherence = dax.then(|| {
            Arc::new(FakeCoherence {
                log: l.clone(),
                locks: FileLocks::default(),
                next: std::sync::atomic::AtomicU64::new(1),
            }) as Arc<dyn Coherence>
        });
        let shared = device();
        let metrics = Arc::new(VmMetrics::new("t"));
        (
            TimedFs::new(fs, shared.clone(), metrics, coherence),
            shared,
            l,
        )
    }

    fn falloc(nodeid: u64, offset: u64, length: u64, mode: i32) -> Fallocate {
        Fallocate {
            nodeid,
            fh: 0,
            offset,
            length,
            mode: mode as u32,
        }
    }

    const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    const P: u64 = PAGE;

    #[test]
    fn a_punch_writes_back_its_edge_pages_and_discards_the_whole_ones() {
        let (fs, shared, l) = timed(16 * P, None, true);
        // The device holds the file's pages 0..8 (a FUSE WRITE charged them).
        shared.charge(0, Op::Write, key(5), 0, 8 * P).unwrap();
        let resident = shared.stats().resident_pages;
        fs.fallocate(&C, falloc(5, 100, 3 * P, PUNCH)).unwrap();
        assert_eq!(
            taken(&l),
            [
                "guard 5".to_string(),
                format!("discard 5 {P} {}", 2 * P),
                "evict 5 100 1".into(),
                format!("evict 5 {} 1", 3 * P),
                format!("fallocate 5 100 {} {PUNCH:#x}", 3 * P),
                "end 1 restore=false".into(),
            ]
        );
        // Pages 1 and 2 left the device cache unwritten; 0 and 3 keep bytes.
        let st = shared.stats();
        assert_eq!(st.discarded, 2);
        assert_eq!(st.resident_pages, resident - 2);
        let base = shared.read(|p, _| p.extent_of(key(5), 0)).unwrap() * EXTENT_SIZE;
        shared.read(|_, dev| {
            assert!(dev.is_resident(base) && dev.is_resident(base + 3 * P));
            assert!(!dev.is_resident(base + P) && !dev.is_resident(base + 2 * P));
        });
        // Only the pages that still hold bytes are programmed on a flush.
        let before = shared.stats().nand.host_programs;
        shared.flush().unwrap();
        assert_eq!(shared.stats().nand.host_programs - before, 6);
    }

    #[test]
    fn a_refused_punch_restores_what_the_discard_held_and_keeps_the_device_pages() {
        let (fs, shared, l) = timed(16 * P, Some(Errno::OPNOTSUPP), true);
        shared.charge(0, Op::Write, key(5), 0, 4 * P).unwrap();
        let zero = libc::FALLOC_FL_ZERO_RANGE;
        assert_eq!(
            fs.fallocate(&C, falloc(5, 0, 4 * P, zero)).unwrap_err(),
            Errno::OPNOTSUPP
        );
        assert_eq!(
            taken(&l),
            [
                "guard 5".to_string(),
                format!("discard 5 0 {}", 4 * P),
                format!("fallocate 5 0 {} {zero:#x}", 4 * P),
                "end 1 restore=true".into(),
            ]
        );
        assert_eq!(shared.stats().discarded, 0);
    }

    #[test]
    fn a_punch_without_dax_drops_the_device_pages_of_extents_the_file_owns_only() {
        let (fs, shared, l) = timed(1 << 40, None, false);
        shared.charge(0, Op::Read, key(5), 0, 4 * P).unwrap();
        // A punch over a terabyte allocates nothing for the untouched part.
        fs.fallocate(&C, falloc(5, 2 * P, 1 << 40, PUNCH)).unwrap();
        assert_eq!(
            taken(&l),
            [format!("fallocate 5 {} {} {PUNCH:#x}", 2 * P, 1u64 << 40)]
        );
        assert_eq!(shared.stats().discarded, 2);
        assert_eq!(shared.read(|p, _| p.allocated_extents()), 1);
    }

    #[test]
    fn allocation_charges_nothing_and_evicts_only_a_partial_last_page_it_grows_past() {
        let (fs, shared, l) = timed(10 * P + 7, None, true);
        let keep = libc::FALLOC_FL_KEEP_SIZE;
        fs.fallocate(&C, falloc(5, 0, 64 * P, keep)).unwrap();
        assert_eq!(taken(&l), [format!("fallocate 5 0 {} {keep:#x}", 64 * P)]);
        fs.fallocate(&C, falloc(5, 0, 64 * P, 0)).unwrap();
        assert_eq!(
            taken(&l),
            [
                "guard 5".to_string(),
                format!("evict 5 {} 1", 10 * P + 7),
                format!("fallocate 5 0 {} 0x0", 64 * P),
            ]
        );
        // Within the size: nothing to evict.
        fs.fallocate(&C, falloc(5, 0, P, 0)).unwrap();
        assert_eq!(taken(&l), ["fallocate 5 0 4096 0x0"]);
        let st = shared.stats();
        assert_eq!(
            (st.accesses, st.nand.programs(), st.nand.reads()),
            (0, 0, 0)
        );
        assert_eq!(shared.read(|p, _| p.allocated_extents()), 0);
    }

    #[test]
    fn shifts_write_back_and_drop_everything_from_the_offset() {
        let (fs, shared, l) = timed(16 * P, None, true);
        shared.charge(0, Op::Write, key(5), 0, 8 * P).unwrap();
        let collapse = libc::FALLOC_FL_COLLAPSE_RANGE;
        fs.fallocate(&C, falloc(5, 4 * P, 2 * P, collapse)).unwrap();
        assert_eq!(
            taken(&l),
            [
                "guard 5".to_string(),
                format!("evict 5 {} {}", 4 * P, u64::MAX),
                format!("fallocate 5 {} {} {collapse:#x}", 4 * P, 2 * P),
            ]
        );
        assert_eq!(shared.stats().discarded, 4);
    }

    #[test]
    fn bad_modes_and_ranges_are_refused_as_the_host_would_before_anything_is_dropped() {
        let (fs, shared, l) = timed(16 * P, None, true);
        use libc::{
            FALLOC_FL_COLLAPSE_RANGE as COLLAPSE, FALLOC_FL_INSERT_RANGE as INSERT,
            FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE as HOLE,
            FALLOC_FL_UNSHARE_RANGE as UNSHARE, FALLOC_FL_ZERO_RANGE as ZERO,
        };
        for (offset, length, mode, want) in [
            (0, P, HOLE, Errno::OPNOTSUPP),
            (0, P, HOLE | ZERO | KEEP, Errno::OPNOTSUPP),
            (0, P, 0x80, Errno::OPNOTSUPP),
            (0, P, COLLAPSE | KEEP, Errno::INVAL),
            (0, P, INSERT | HOLE | KEEP, Errno::INVAL),
            (0, P, UNSHARE | ZERO, Errno::INVAL),
            (0, 0, PUNCH, Errno::INVAL),
            (u64::MAX - 5, P, PUNCH, Errno::FBIG),
            (i64::MAX as u64, 1, PUNCH, Errno::FBIG),
            (1, u64::MAX, 0, Errno::FBIG),
        ] {
            let r = fs.fallocate(&C, falloc(5, offset, length, mode));
            assert_eq!(r.unwrap_err(), want, "{offset} {length} {mode:#x}");
        }
        assert!(taken(&l).is_empty(), "nothing reached the pool or the host");
        assert_eq!(shared.stats().accesses, 0);
        // The copy's bounds likewise.
        for (off_in, off_out, len) in [(u64::MAX, 0, 1), (0, i64::MAX as u64, 1), (0, 0, u64::MAX)]
        {
            let c = CopyRange {
                nodeid_in: 5,
                fh_in: 0,
                off_in,
                nodeid_out: 6,
                fh_out: 0,
                off_out,
                len,
            };
            assert_eq!(fs.copy_file_range(&C, c).unwrap_err(), Errno::INVAL);
        }
        assert!(taken(&l).is_empty());
    }

    #[test]
    fn a_copy_syncs_the_source_evicts_the_destination_and_charges_both() {
        let (fs, shared, l) = timed(16 * P, None, true);
        let copy = |nodeid_out: u64, off_out: u64| CopyRange {
            nodeid_in: 5,
            fh_in: 0,
            off_in: 0,
            nodeid_out,
            fh_out: 0,
            off_out,
            len: 4 * P,
        };
        let t = fs.copy_file_range(&C, copy(6, P)).unwrap();
        assert_eq!(t.value, 4 * P as usize);
        assert_eq!(
            taken(&l),
            [
                "guard 6".to_string(),
                format!("sync 5 0 {}", 4 * P),
                format!("evict 6 {P} {}", 4 * P),
                format!("copy 5:0 -> 6:{P} {}", 4 * P),
            ]
        );
        let st = shared.stats();
        assert_eq!((st.reads, st.writes), (1, 1));
        assert_eq!((st.bytes_read, st.bytes_written), (4 * P, 4 * P));
        assert_eq!(st.misses, 8, "the source's and the destination's pages");
        assert!(
            t.completes_at_ns.unwrap() >= 30_000,
            "held for the NAND reads"
        );
        // Within one file: one guard (a second would wait for the first).
        fs.copy_file_range(&C, copy(5, 8 * P)).unwrap();
        assert_eq!(
            taken(&l),
            [
                "guard 5".to_string(),
                format!("sync 5 0 {}", 4 * P),
                format!("evict 5 {} {}", 8 * P, 4 * P),
                format!("copy 5:0 -> 5:{} {}", 8 * P, 4 * P),
            ]
        );
        // A later copy of the same source hits in the device cache.
        let before = shared.stats();
        let later = Context {
            arrival_ns: 1_000_000_000,
            ..C
        };
        fs.copy_file_range(&later, copy(7, 0)).unwrap();
        let after = shared.stats();
        assert_eq!(after.hits - before.hits, 4);
    }

    #[test]
    fn a_truncation_down_discards_the_tail_and_writes_back_the_new_last_page() {
        let old = 40 * P + 100;
        let (fs, shared, l) = timed(old, None, true);
        shared.charge(0, Op::Write, key(5), 0, old).unwrap();
        let attr = SetattrIn {
            valid: fattr::SIZE,
            size: P + 10,
            ..SetattrIn::default()
        };
        fs.setattr(&C, 5, &attr).unwrap();
        assert_eq!(
            taken(&l),
            [
                "guard 5".to_string(),
                format!("discard 5 {} {}", 2 * P, EXTENT_SIZE - 2 * P),
                format!("evict 5 {} 1", P + 10),
                format!("setattr 5 {}", P + 10),
                "end 1 restore=false".into(),
            ]
        );
        // Pages 2..=40 (the old last one too) left the device unwritten;
        // 0 and 1 stay.
        assert_eq!(shared.stats().discarded, 39);
        assert_eq!(shared.stats().resident_pages, 2);
        // Growing: the old last page is written back and dropped, nothing discarded.
        let (fs, _, l) = timed(P + 10, None, true);
        let attr = SetattrIn {
            valid: fattr::SIZE,
            size: 3 * P,
            ..SetattrIn::default()
        };
        fs.setattr(&C, 5, &attr).unwrap();
        assert_eq!(
            taken(&l),
            [
                "guard 5".to_string(),
                format!("evict 5 {} {}", P + 10, EXTENT_SIZE - P - 10),
                format!("setattr 5 {}", 3 * P),
            ]
        );
    }

    #[test]
    fn a_refused_truncation_restores_the_held_tail() {
        let (fs, _, l) = timed(8 * P, Some(Errno::PERM), true);
        let attr = SetattrIn {
            valid: fattr::SIZE,
            size: 0,
            ..SetattrIn::default()
        };
        assert_eq!(fs.setattr(&C, 5, &attr).unwrap_err(), Errno::PERM);
        assert_eq!(
            taken(&l),
            [
                "guard 5".to_string(),
                format!("discard 5 0 {EXTENT_SIZE}"),
                "setattr 5 0".into(),
                "end 1 restore=true".into(),
            ]
        );
    }

    #[test]
    fn lseek_for_the_layout_and_syncfs_write_window_stores_back_first() {
        let (fs, _, l) = timed(8 * P, None, true);
        fs.lseek(&C, 5, 0, 0, libc::SEEK_DATA as u32).unwrap();
        fs.lseek(&C, 5, 0, 0, libc::SEEK_HOLE as u32).unwrap();
        fs.lseek(&C, 5, 0, 0, libc::SEEK_SET as u32).unwrap();
        fs.syncfs(&C, 1).unwrap();
        let max = u64::MAX;
        assert_eq!(
            taken(&l),
            [
                format!("sync 5 0 {max}"),
                "lseek 5".into(),
                format!("sync 5 0 {max}"),
                "lseek 5".into(),
                "lseek 5".into(),
                "sync all".into(),
                "syncfs".into(),
            ]
        );
    }

    #[test]
    fn file_locks_hold_one_file_and_never_another() {
        let locks = Arc::new(FileLocks::default());
        let a = locks.lock(key(1));
        // Another file: at once, while the first is held.
        drop(locks.lock(key(2)));
        // The same file waits until the first guard goes.
        let (tx, rx) = std::sync::mpsc::channel();
        let l = locks.clone();
        let t = std::thread::spawn(move || {
            let _g = l.lock(key(1));
            tx.send(()).ok();
        });
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        drop(a);
        assert!(rx.recv_timeout(Duration::from_secs(5)).is_ok());
        t.join().ok();
        assert!(locks.held.lock().map(|h| h.is_empty()).unwrap_or(false));
    }
}
