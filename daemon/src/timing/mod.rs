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

use crate::abi::{fattr, EntryOut, Kstatfs, SetattrIn};
use crate::device::{SharedDevice, EXTENT_SIZE};
use crate::ids::FileKey;
use crate::metrics::VmMetrics;
use crate::server::{
    AttrReply, Context, Created, Creation, DirSink, FileIo, FileSystem, FsResult, HostFile, Named,
    Opened, Timed,
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
    }

    fn setattr(&self, ctx: &Context, nodeid: u64, attr: &SetattrIn) -> FsResult<AttrReply> {
        if attr.valid & fattr::SIZE == 0 {
            return self.inner.setattr(ctx, nodeid, attr);
        }
        let Some(coherence) = self.coherence.as_ref() else {
            let before = self.inner.host_file(nodeid, None, false).ok();
            let r = self.inner.setattr(ctx, nodeid, attr)?;
            if let Some(f) = before.filter(|f| attr.size < f.size) {
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
        {
            let from = f.size.min(attr.size);
            let to = f
                .size
                .max(attr.size)
                .div_ceil(EXTENT_SIZE)
                .saturating_mul(EXTENT_SIZE);
            coherence.evict_file_range(f.key, from, to - from);
        }
        let r = self.inner.setattr(ctx, nodeid, attr)?;
        if let Some(f) = before.filter(|f| attr.size < f.size) {
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
        // O_TRUNC (FUSE_ATOMIC_O_TRUNC): a truncation to 0, as SETATTR.
        let key = self.inner.file_key(nodeid, None).ok();
        let guard = match (self.coherence.as_ref(), key) {
            (Some(c), Some(k)) => {
                let g = c.change_guard(k);
                c.evict_file_range(k, 0, u64::MAX);
                Some(g)
            }
            _ => None,
        };
        let r = self.inner.open(ctx, nodeid, flags, open_flags)?;
        if let Some(k) = key {
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
