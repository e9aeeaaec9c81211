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
//! * Pool extents of truncated bytes (SETATTR size, OPEN with `O_TRUNC`)
//!   go back to the pool ([`SharedDevice::reclaim`]).
//! * A cap on what one VM holds open ([`TimedFs::with_open_files_cap`]):
//!   LOOKUP, OPEN, OPENDIR, CREATE, MKDIR and SYMLINK get `EMFILE` once the
//!   VM's inodes and handles (each a host fd) reach it, so one guest
//!   walking a huge tree cannot take the fds every VM needs.
//!
//! Everything else passes through to the wrapped filesystem unchanged.

use crate::abi::{fattr, EntryOut, FileLock, Kstatfs, SetattrIn};
use crate::device::{SharedDevice, EXTENT_SIZE, PAGE};
use crate::ids::FileKey;
use crate::metrics::VmMetrics;
use crate::server::{
    AttrReply, Context, CopyRange, Created, Creation, DirSink, Fallocate, FileIo, FileSystem,
    FsResult, HostFile, LockRequest, LockWaiter, Named, Opened, Timed, Xattr,
};
use cxlfs_device_model::Op;
use rustix::io::Errno;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

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
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
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
        let mut held: MutexGuard<'_, HashSet<FileKey>> =
            self.locks.held.lock().unwrap_or_else(|e| e.into_inner());
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
/// change destroys those bytes: the pages the range covers in part keep
/// bytes outside it and are written back and dropped; the whole pages are
/// discarded unwritten. Call it under the file's change guard.
fn discard_range<'c>(c: &'c dyn Coherence, key: FileKey, start: u64, end: u64) -> Discard<'c> {
    let first_whole = start.div_ceil(PAGE).saturating_mul(PAGE);
    let end_whole = end / PAGE * PAGE;
    if start % PAGE != 0 {
        c.evict_file_range(key, start, 1);
    }
    if end % PAGE != 0 && end_whole >= first_whole {
        // Not the head page again (a range inside one page).
        c.evict_file_range(key, end_whole, 1);
    }
    Discard::start(c, key, first_whole, end_whole.saturating_sub(first_whole))
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
                self.device
                    .discard_file_range(f.key, attr.size, f.size - attr.size);
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
            coherence.evict_file_range(f.key, f.size, to - f.size);
            None
        };
        // Refused: the discard, dropped, stores what it held.
        let r = self.inner.setattr(ctx, nodeid, attr)?;
        if let Some(d) = discard {
            d.commit();
        }
        if attr.size < f.size {
            self.device
                .discard_file_range(f.key, attr.size, f.size - attr.size);
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
        let guard = self.coherence.as_ref().map(|c| {
            let g = c.change_guard(key);
            c.evict_file_range(key, offset, u64::from(size));
            g
        });
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
                let guard = match &self.coherence {
                    Some(c) if !keep_size => {
                        let f = self.inner.host_file(range.nodeid, Some(range.fh), false)?;
                        (end > f.size && f.size % PAGE != 0).then(|| {
                            let g = c.change_guard(f.key);
                            c.evict_file_range(f.key, f.size, 1);
                            g
                        })
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
                return Err(Errno::IO);
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
                if let Err(e) = c.sync_file_range(key_in, copy.off_in, copy.len) {
                    tracing::warn!(error = %e, "copy_file_range: cannot write back the source's pool pages");
                    return Err(Errno::IO);
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
                return Err(Errno::IO);
            }
        }
        self.inner.fsync(ctx, nodeid, fh, datasync)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(ino: u64) -> FileKey {
        FileKey { dev: 1, ino }
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
