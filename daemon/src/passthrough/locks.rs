//! POSIX locks and flocks, held on the host as open-file-description
//! (OFD) locks, so that two VMs sharing a file — and a VM and a host
//! process — conflict as two processes on one machine would.
//!
//! A guest lock owner (a process's file table for POSIX locks, a `struct
//! file` for flock) gets one host open file description per file: its
//! locks merge and split among themselves and conflict with every other
//! owner's, in this VM or another. FLUSH (a close in the guest) closes the
//! owner's description, which drops its POSIX locks on that file as
//! `close(2)` does; RELEASE drops what was first locked through its handle
//! (a flock, or a guest OFD lock, whose owner is the guest file); the
//! session's end drops them all.
//!
//! Not kept: deadlock detection (`EDEADLK`; OFD locks have none), and the
//! holder's pid across VMs (GETLK reports the holder's guest pid only when
//! exactly one other owner of this session holds the file, 0 otherwise).

use super::PassthroughFs;
use crate::abi::FileLock;
use crate::ids::FileKey;
use crate::server::{Context, FsResult, Timed};
use crate::server::{LockRequest, LockWaiter};
use rustix::fs::OFlags;
use rustix::io::Errno;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Most lock owners (each a host fd) one session may have.
pub const MAX_LOCK_OWNERS: usize = 4096;
/// The kernel's `OFFSET_MAX`: a lock to the end of the file.
const OFFSET_MAX: u64 = i64::MAX as u64;
/// First and longest pause between two tries of a waiting SETLKW.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const LONGEST_PAUSE: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct OwnerKey {
    file: FileKey,
    owner: u64,
    flock: bool,
}

/// One owner's open file description of one file.
#[derive(Debug)]
pub struct LockFd {
    file: File,
    /// The guest pid that last locked through it.
    pid: AtomicU32,
    /// The guest handle it was first used through: an OFD lock's owner is
    /// that very guest file, so the description goes when the handle does.
    via_fh: u64,
}

/// The lock owners of one session.
#[derive(Debug, Default)]
pub struct LockTable {
    owners: Mutex<HashMap<OwnerKey, Arc<LockFd>>>,
}

impl LockTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<OwnerKey, Arc<LockFd>>> {
        crate::sync::lock(&self.owners)
    }

    /// The description of `req`'s owner on `file`, opened with `open` the
    /// first time.
    pub fn fd_for(
        &self,
        file: FileKey,
        req: &LockRequest,
        pid: u32,
        open: impl FnOnce() -> Result<File, Errno>,
    ) -> Result<Arc<LockFd>, Errno> {
        let key = OwnerKey {
            file,
            owner: req.owner,
            flock: req.flock,
        };
        if let Some(fd) = self.lock().get(&key) {
            fd.pid.store(pid, Ordering::Relaxed);
            return Ok(fd.clone());
        }
        // Opened outside the table's lock: a slow open holds up no other file.
        let fd = Arc::new(LockFd {
            file: open()?,
            pid: AtomicU32::new(pid),
            via_fh: req.fh,
        });
        let mut owners = self.lock();
        if owners.len() >= MAX_LOCK_OWNERS {
            return Err(Errno::NOLCK);
        }
        Ok(owners.entry(key).or_insert(fd).clone())
    }

    /// Drops an owner's description (and with it every lock it holds).
    pub fn drop_owner(&self, file: FileKey, owner: u64, flock: bool) {
        self.lock().remove(&OwnerKey { file, owner, flock });
    }

    /// RELEASE of guest handle `fh`: the descriptions first used through
    /// it go. A POSIX owner's are gone already (its close sent FLUSH); an
    /// OFD lock's owner is the guest file itself, whose last close is this
    /// RELEASE (the guest keeps no record of remote locks, so it sends no
    /// unlock of its own).
    pub fn drop_handle(&self, fh: u64) {
        self.lock().retain(|_, fd| fd.via_fh != fh);
    }

    /// Forgets every owner (the session ends): their locks go.
    pub fn clear(&self) {
        std::mem::take(&mut *self.lock());
    }

    /// Owners known.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no owner is known.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The guest pid of the only other POSIX owner of `file`, or 0.
    fn other_pid(&self, file: FileKey, owner: u64) -> u32 {
        let owners = self.lock();
        let mut others = owners
            .iter()
            .filter(|(k, _)| k.file == file && k.owner != owner && !k.flock);
        match (others.next(), others.next()) {
            (Some((_, fd)), None) => fd.pid.load(Ordering::Relaxed),
            _ => 0,
        }
    }

    /// GETLK: the first lock that conflicts with `req`'s, or `F_UNLCK`.
    pub fn test(&self, file: FileKey, fd: &LockFd, req: &LockRequest) -> Result<FileLock, Errno> {
        let mut fl = to_flock(&req.lock)?;
        fcntl(fd, libc::F_OFD_GETLK, &mut fl)?;
        if i32::from(fl.l_type) == libc::F_UNLCK {
            return Ok(FileLock {
                typ: libc::F_UNLCK as u32,
                ..req.lock
            });
        }
        let start = u64::try_from(fl.l_start).map_err(|_| Errno::IO)?;
        let end = match u64::try_from(fl.l_len).map_err(|_| Errno::IO)? {
            0 => OFFSET_MAX,
            len => start.saturating_add(len - 1).min(OFFSET_MAX),
        };
        Ok(FileLock {
            start,
            end,
            typ: fl.l_type as u32,
            pid: self.other_pid(file, req.owner),
        })
    }
}

/// `struct flock` of a FUSE lock range (`end` inclusive; `OFFSET_MAX`:
/// to the end of the file).
fn to_flock(lock: &FileLock) -> Result<libc::flock, Errno> {
    let typ = match lock.typ as i32 {
        t @ (libc::F_RDLCK | libc::F_WRLCK | libc::F_UNLCK) => t as libc::c_short,
        _ => return Err(Errno::INVAL),
    };
    if lock.end < lock.start || lock.start > OFFSET_MAX {
        return Err(Errno::INVAL);
    }
    let len = if lock.end >= OFFSET_MAX {
        0
    } else {
        // start <= end < OFFSET_MAX: fits an off_t.
        (lock.end - lock.start + 1) as libc::off_t
    };
    // SAFETY: `flock` is plain old data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = lock.start as libc::off_t;
    fl.l_len = len;
    Ok(fl)
}

fn fcntl(fd: &LockFd, cmd: libc::c_int, fl: &mut libc::flock) -> Result<(), Errno> {
    // SAFETY: `fd.file` is an open descriptor we own for the whole call;
    // `fl` points at a valid, writable `struct flock`, which is what the
    // OFD lock commands read and (GETLK) write.
    let r = unsafe { libc::fcntl(fd.file.as_raw_fd(), cmd, fl as *mut libc::flock) };
    if r == -1 {
        // A conflict is EAGAIN or EACCES depending on the file system.
        return Err(
            match Errno::from_io_error(&std::io::Error::last_os_error()) {
                Some(Errno::ACCESS) | None => Errno::AGAIN,
                Some(e) => e,
            },
        );
    }
    Ok(())
}

/// One try, never blocking: takes, changes or drops `req`'s lock; `EAGAIN`
/// on a conflict.
pub fn try_lock(fd: &LockFd, req: &LockRequest) -> Result<(), Errno> {
    if req.flock {
        use rustix::fs::FlockOperation as Op;
        let op = match req.lock.typ as i32 {
            libc::F_RDLCK => Op::NonBlockingLockShared,
            libc::F_WRLCK => Op::NonBlockingLockExclusive,
            libc::F_UNLCK => Op::Unlock,
            _ => return Err(Errno::INVAL),
        };
        return rustix::fs::flock(&fd.file, op);
    }
    let mut fl = to_flock(&req.lock)?;
    fcntl(fd, libc::F_OFD_SETLK, &mut fl)
}

/// A SETLKW wait: tries again with growing pauses (1 to 10 ms) until it
/// holds the lock, the guest interrupts it, or the session ends. Polling
/// rather than a blocking `F_OFD_SETLKW` keeps the wait stoppable.
pub fn waiter(fd: Arc<LockFd>, req: LockRequest) -> LockWaiter {
    Box::new(move |stop| {
        let mut pause = FIRST_PAUSE;
        loop {
            match try_lock(&fd, &req) {
                Err(Errno::AGAIN) => {}
                done => return done,
            }
            if stop() {
                return Err(Errno::INTR);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    })
}

impl PassthroughFs {
    /// The lock description of `req`'s owner on `nodeid`'s file.
    fn lock_fd(&self, ctx: &Context, nodeid: u64, req: &LockRequest) -> Result<Arc<LockFd>, Errno> {
        let inode = self
            .handle(req.fh)
            .map(|h| h.inode.clone())
            .or_else(|_| self.inode(nodeid))?;
        if !inode.is_reg() {
            return Err(Errno::INVAL);
        }
        self.locks.fd_for(inode.key, req, ctx.pid, || {
            self.reopen(&inode, OFlags::RDWR | OFlags::CLOEXEC)
                .or_else(|_| self.reopen(&inode, OFlags::RDONLY | OFlags::CLOEXEC))
        })
    }

    pub(super) fn getlk(
        &self,
        ctx: &Context,
        nodeid: u64,
        lock: &LockRequest,
    ) -> FsResult<FileLock> {
        let fd = self.lock_fd(ctx, nodeid, lock)?;
        let key = self
            .file_key(nodeid, Some(lock.fh))
            .or_else(|_| self.file_key(nodeid, None))?;
        Ok(Timed::now(self.locks.test(key, &fd, lock)?))
    }

    pub(super) fn setlk(&self, ctx: &Context, nodeid: u64, lock: &LockRequest) -> FsResult<()> {
        let fd = self.lock_fd(ctx, nodeid, lock)?;
        try_lock(&fd, lock)?;
        Ok(Timed::now(()))
    }

    pub(super) fn lock_waiter(
        &self,
        ctx: &Context,
        nodeid: u64,
        lock: &LockRequest,
    ) -> Result<LockWaiter, Errno> {
        Ok(waiter(self.lock_fd(ctx, nodeid, lock)?, *lock))
    }

    pub(super) fn unlock_owner(&self, _ctx: &Context, nodeid: u64, owner: u64, flock: bool) {
        if let Ok(inode) = self.inode(nodeid) {
            self.locks.drop_owner(inode.key, owner, flock);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi;
    use crate::passthrough::testing::{create, fs, v, C};

    fn req(owner: u64, typ: i32, start: u64, end: u64) -> LockRequest {
        LockRequest {
            fh: 0,
            owner,
            lock: FileLock {
                start,
                end,
                typ: typ as u32,
                pid: 0,
            },
            flock: false,
        }
    }

    fn key() -> FileKey {
        FileKey { dev: 1, ino: 2 }
    }

    /// A file holding `data` in a fresh directory, and how to open it again.
    fn file_with(data: &[u8]) -> (tempfile::TempDir, impl Fn() -> Result<File, Errno>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, data).unwrap();
        let open = move || {
            File::options()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|_| Errno::IO)
        };
        (dir, open)
    }

    #[test]
    fn owners_conflict_and_getlk_reports_the_range() {
        let (_dir, open) = file_with(b"0123456789");
        let table = LockTable::default();
        let a = req(1, libc::F_WRLCK, 2, 5);
        let fa = table.fd_for(key(), &a, 100, &open).unwrap();
        try_lock(&fa, &a).unwrap();
        let b = req(2, libc::F_RDLCK, 0, OFFSET_MAX);
        let fb = table.fd_for(key(), &b, 200, &open).unwrap();
        assert_eq!(try_lock(&fb, &b), Err(Errno::AGAIN));
        let seen = table.test(key(), &fb, &b).unwrap();
        assert_eq!(
            (seen.typ as i32, seen.start, seen.end, seen.pid),
            (libc::F_WRLCK, 2, 5, 100)
        );
        // Outside the held range: free.
        let c = req(2, libc::F_WRLCK, 6, 9);
        try_lock(&fb, &c).unwrap();
        // The owner's close drops its locks.
        table.drop_owner(key(), 1, false);
        drop(fa);
        try_lock(&fb, &b).unwrap();
        assert_eq!(table.len(), 1);
        // So does the release of the handle it was taken through.
        let c = LockRequest {
            fh: 9,
            ..req(3, libc::F_RDLCK, 200, 299)
        };
        let fc = table.fd_for(key(), &c, 300, &open).unwrap();
        try_lock(&fc, &c).unwrap();
        assert_eq!(
            try_lock(&fb, &req(2, libc::F_WRLCK, 200, 299)),
            Err(Errno::AGAIN)
        );
        drop(fc);
        table.drop_handle(9);
        assert_eq!(table.len(), 1);
        try_lock(&fb, &req(2, libc::F_WRLCK, 200, 299)).unwrap();
        table.clear();
        assert!(table.is_empty());
    }

    #[test]
    fn bad_ranges_and_types_are_refused() {
        assert_eq!(
            to_flock(&req(1, libc::F_WRLCK, 5, 4).lock).unwrap_err(),
            Errno::INVAL
        );
        assert_eq!(to_flock(&req(1, 7, 0, 1).lock).unwrap_err(), Errno::INVAL);
        assert_eq!(
            to_flock(&req(1, libc::F_RDLCK, u64::MAX, u64::MAX).lock).unwrap_err(),
            Errno::INVAL
        );
        assert_eq!(
            to_flock(&req(1, libc::F_RDLCK, 3, OFFSET_MAX).lock)
                .unwrap()
                .l_len,
            0
        );
    }

    #[test]
    fn a_waiter_stops_when_told_and_takes_the_lock_when_freed() {
        let (_dir, open) = file_with(b"x");
        let table = LockTable::default();
        let a = req(1, libc::F_WRLCK, 0, OFFSET_MAX);
        let fa = table.fd_for(key(), &a, 1, &open).unwrap();
        try_lock(&fa, &a).unwrap();
        let b = req(2, libc::F_WRLCK, 0, OFFSET_MAX);
        let fb = table.fd_for(key(), &b, 2, &open).unwrap();
        let stopped = || true;
        assert_eq!(waiter(fb.clone(), b)(&stopped), Err(Errno::INTR));
        let w = waiter(fb, b);
        let t = std::thread::spawn(move || w(&|| false));
        std::thread::sleep(Duration::from_millis(30));
        table.drop_owner(key(), 1, false);
        drop(fa);
        assert_eq!(t.join().unwrap(), Ok(()));
    }

    fn lock_req(fh: u64, owner: u64, typ: i32) -> LockRequest {
        LockRequest {
            fh,
            owner,
            lock: abi::FileLock {
                start: 0,
                end: i64::MAX as u64,
                typ: typ as u32,
                pid: 0,
            },
            flock: false,
        }
    }

    #[test]
    fn posix_locks_conflict_between_owners_and_go_with_the_owner() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let (e, o) = create(&fs, abi::ROOT_ID, b"f", libc::O_RDWR as u32).unwrap();
        let n = e.nodeid;
        let ctx = Context { pid: 42, ..C };
        v(fs.setlk(&ctx, n, &lock_req(o.fh, 1, libc::F_WRLCK))).unwrap();
        assert_eq!(
            v(fs.setlk(&C, n, &lock_req(o.fh, 2, libc::F_RDLCK))).unwrap_err(),
            Errno::AGAIN
        );
        let seen = v(fs.getlk(&C, n, &lock_req(o.fh, 2, libc::F_RDLCK))).unwrap();
        assert_eq!((seen.typ as i32, seen.pid), (libc::F_WRLCK, 42));
        // The same owner may change its own lock.
        v(fs.setlk(&ctx, n, &lock_req(o.fh, 1, libc::F_RDLCK))).unwrap();
        v(fs.setlk(&C, n, &lock_req(o.fh, 2, libc::F_RDLCK))).unwrap();
        assert_eq!(
            v(fs.setlk(&C, n, &lock_req(o.fh, 2, libc::F_WRLCK))).unwrap_err(),
            Errno::AGAIN
        );
        // A close by owner 1 (FLUSH) drops its locks.
        fs.unlock_owner(&C, n, 1, false);
        v(fs.setlk(&C, n, &lock_req(o.fh, 2, libc::F_WRLCK))).unwrap();
        // flocks: their own owners.
        let fl = |owner, typ| LockRequest {
            flock: true,
            ..lock_req(o.fh, owner, typ)
        };
        v(fs.setlk(&C, n, &fl(10, libc::F_WRLCK))).unwrap();
        assert_eq!(
            v(fs.setlk(&C, n, &fl(11, libc::F_WRLCK))).unwrap_err(),
            Errno::AGAIN
        );
        fs.unlock_owner(&C, n, 10, true);
        v(fs.setlk(&C, n, &fl(11, libc::F_WRLCK))).unwrap();
        // A new session forgets every lock.
        fs.reset();
    }
}
