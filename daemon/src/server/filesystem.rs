//! The [`FileSystem`] trait: what the FUSE [`Server`](super::Server) asks
//! of a filesystem, one method per FUSE operation (virtiofsd's shape).
//!
//! Every method has a default that answers `ENOSYS`, so a filesystem (or a
//! layer wrapping one, like the timing layer's `TimedFs`) implements only what
//! it serves. Each call gets a [`Context`] (the caller and the request's
//! arrival in device time) and returns its value as [`Timed`]: the reply
//! plus the device time it may be released at (`None`: at once).

use crate::abi::{Attr, EntryOut, FileLock, Kstatfs, SetattrIn};
use crate::ids::FileKey;
use crate::server::payload::PayloadIo;
use rustix::io::Errno;
use std::fs::File;
use std::time::Duration;

/// Who sent a request and when it arrived.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Context {
    /// Caller's uid in the guest.
    pub uid: u32,
    /// Caller's gid in the guest.
    pub gid: u32,
    /// Caller's pid in the guest.
    pub pid: u32,
    /// Arrival, in device time (ns since the daemon started).
    pub arrival_ns: u64,
}

/// A reply value and when it may be released.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timed<T> {
    /// The reply.
    pub value: T,
    /// Device time the reply may be released at; `None`: at once.
    pub completes_at_ns: Option<u64>,
}

impl<T> Timed<T> {
    /// A reply released at once.
    pub fn now(value: T) -> Self {
        Timed {
            value,
            completes_at_ns: None,
        }
    }

    /// The same release time with another value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Timed<U> {
        Timed {
            value: f(self.value),
            completes_at_ns: self.completes_at_ns,
        }
    }
}

/// What a filesystem method returns.
pub type FsResult<T> = Result<Timed<T>, Errno>;

/// An open file or directory: `(fh, FOPEN_* flags)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The handle.
    pub fh: u64,
    /// `FOPEN_*` flags.
    pub open_flags: u32,
}

/// Attributes and how long the guest may cache them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttrReply {
    /// The attributes.
    pub attr: Attr,
    /// Attribute cache timeout.
    pub timeout: Duration,
}

/// A name in a directory: what LOOKUP-like operations act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named<'a> {
    /// The directory's node.
    pub parent: u64,
    /// One path component (not yet checked).
    pub name: &'a [u8],
}

/// How a node is created: the guest's mode and umask, and for CREATE its
/// `O_*` open flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Creation {
    /// Requested mode bits.
    pub mode: u32,
    /// The caller's umask.
    pub umask: u32,
    /// `O_*` flags (CREATE; 0 for MKDIR).
    pub flags: u32,
    /// `FUSE_OPEN_*` flags of CREATE (`abi::open_in_flags`; 0 for MKDIR).
    pub open_flags: u32,
}

impl Creation {
    /// The permission bits the node gets: `mode` without the umask's.
    pub fn permissions(&self) -> rustix::fs::Mode {
        rustix::fs::Mode::from_raw_mode(self.mode & !self.umask & 0o7777)
    }
}

/// What CREATE returns: the new node and its open handle.
pub type Created = (EntryOut, Opened);

/// Where READDIR puts entries: returns `false` when the reply is full.
pub type DirSink<'a> = &'a mut dyn FnMut(&DirEntry) -> bool;

/// A directory entry for READDIR(PLUS).
#[derive(Debug, Clone)]
pub struct DirEntry {
    /// Host inode number.
    pub ino: u64,
    /// Cookie of the next entry.
    pub next_off: u64,
    /// `DT_*` type.
    pub typ: u32,
    /// Name.
    pub name: Vec<u8>,
}

/// A host file as the server's seams (DAX mapper, ioctl handler) and the
/// timing layer see it: its identity, size and kind, and — when asked —
/// the file opened for the residency plane.
#[derive(Debug)]
pub struct HostFile {
    /// Host identity (also the pool key).
    pub key: FileKey,
    /// Size in bytes now.
    pub size: u64,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Opened for the residency plane's traps and write-backs (read-write
    /// when the daemon may), if asked for and a regular file.
    pub pool_file: Option<File>,
}

/// One FUSE filesystem. Node ids and file handles are the filesystem's own.
#[allow(unused_variables)]
pub trait FileSystem: Send + Sync {
    /// FUSE_INIT (a new session, or a restart of one): forget the old
    /// session's state. `kernel_flags`: what the guest offers; returns the
    /// `FUSE_*` init flags this filesystem wants on top of the server's.
    fn init(&self, kernel_flags: u64) -> Result<u64, Errno> {
        Ok(0)
    }

    /// FUSE_DESTROY: the session ends.
    fn destroy(&self) {}

    /// LOOKUP of `name` in `parent`; takes one reference on the node.
    fn lookup(&self, ctx: &Context, parent: u64, name: &[u8]) -> FsResult<EntryOut> {
        Err(Errno::NOSYS)
    }

    /// FORGET: drops `nlookup` references (no reply).
    fn forget(&self, ctx: &Context, nodeid: u64, nlookup: u64) {}

    /// GETATTR, of the handle `fh` when given.
    fn getattr(&self, ctx: &Context, nodeid: u64, fh: Option<u64>) -> FsResult<AttrReply> {
        Err(Errno::NOSYS)
    }

    /// SETATTR.
    fn setattr(&self, ctx: &Context, nodeid: u64, attr: &SetattrIn) -> FsResult<AttrReply> {
        Err(Errno::NOSYS)
    }

    /// READLINK.
    fn readlink(&self, ctx: &Context, nodeid: u64) -> FsResult<Vec<u8>> {
        Err(Errno::NOSYS)
    }

    /// SYMLINK: `at` pointing at `target`.
    fn symlink(&self, ctx: &Context, at: Named<'_>, target: &[u8]) -> FsResult<EntryOut> {
        Err(Errno::NOSYS)
    }

    /// MKDIR.
    fn mkdir(&self, ctx: &Context, at: Named<'_>, how: Creation) -> FsResult<EntryOut> {
        Err(Errno::NOSYS)
    }

    /// UNLINK (`dir` false) or RMDIR (`dir` true).
    fn unlink(&self, ctx: &Context, at: Named<'_>, dir: bool) -> FsResult<()> {
        Err(Errno::NOSYS)
    }

    /// RENAME / RENAME2 (`flags`: `RENAME_*`).
    fn rename(&self, ctx: &Context, from: Named<'_>, to: Named<'_>, flags: u32) -> FsResult<()> {
        Err(Errno::NOSYS)
    }

    /// OPEN with the guest's `O_*` flags and `FUSE_OPEN_*` `open_flags`
    /// (`abi::open_in_flags`).
    fn open(&self, ctx: &Context, nodeid: u64, flags: u32, open_flags: u32) -> FsResult<Opened> {
        Err(Errno::NOSYS)
    }

    /// CREATE (and open) `at`.
    fn create(&self, ctx: &Context, at: Named<'_>, how: Creation) -> FsResult<Created> {
        Err(Errno::NOSYS)
    }

    /// READ of up to `size` bytes at `offset` of `fh`: the data goes into
    /// the reply through `io` (reply byte `at` on); returns the bytes read.
    fn read(&self, ctx: &Context, io: FileIo<'_>) -> FsResult<usize> {
        Err(Errno::NOSYS)
    }

    /// WRITE of `size` request bytes (request byte `at` on) through `io` to
    /// `fh` at `offset`; returns the bytes written.
    fn write(&self, ctx: &Context, io: FileIo<'_>) -> FsResult<usize> {
        Err(Errno::NOSYS)
    }

    /// FLUSH (on every close of a file descriptor in the guest).
    fn flush(&self, ctx: &Context, nodeid: u64, fh: u64) -> FsResult<()> {
        Err(Errno::NOSYS)
    }

    /// FSYNC / FSYNCDIR.
    fn fsync(&self, ctx: &Context, nodeid: u64, fh: u64, datasync: bool) -> FsResult<()> {
        Err(Errno::NOSYS)
    }

    /// RELEASE / RELEASEDIR (no error reaches the guest).
    fn release(&self, ctx: &Context, nodeid: u64, fh: u64) {}

    /// OPENDIR.
    fn opendir(&self, ctx: &Context, nodeid: u64) -> FsResult<Opened> {
        Err(Errno::NOSYS)
    }

    /// READDIR from cookie `offset`: calls `emit` per entry until it
    /// returns `false` (reply full).
    fn readdir(&self, ctx: &Context, fh: u64, offset: u64, emit: DirSink<'_>) -> FsResult<()> {
        Err(Errno::NOSYS)
    }

    /// STATFS.
    fn statfs(&self, ctx: &Context, nodeid: u64) -> FsResult<Kstatfs> {
        Err(Errno::NOSYS)
    }

    /// LINK: a new name `at` for the existing node `nodeid` (a hard link:
    /// one file, one set of pool extents).
    fn link(&self, ctx: &Context, nodeid: u64, at: Named<'_>) -> FsResult<EntryOut> {
        Err(Errno::NOSYS)
    }

    /// MKNOD: a FIFO, socket, character or block device (`how.mode`
    /// carries the file type), or a regular file.
    fn mknod(&self, ctx: &Context, at: Named<'_>, how: Creation, rdev: u32) -> FsResult<EntryOut> {
        Err(Errno::NOSYS)
    }

    /// TMPFILE: an unnamed regular file in directory `parent`, opened.
    fn tmpfile(&self, ctx: &Context, parent: u64, how: Creation) -> FsResult<Created> {
        Err(Errno::NOSYS)
    }

    /// GETXATTR of `name`; `size` 0 asks for the value's size.
    fn getxattr(&self, ctx: &Context, nodeid: u64, name: &[u8], size: u32) -> FsResult<Xattr> {
        Err(Errno::NOSYS)
    }

    /// LISTXATTR; `size` 0 asks for the list's size.
    fn listxattr(&self, ctx: &Context, nodeid: u64, size: u32) -> FsResult<Xattr> {
        Err(Errno::NOSYS)
    }

    /// SETXATTR of `name` to `value` (`flags`: `XATTR_CREATE` / `XATTR_REPLACE`).
    fn setxattr(
        &self,
        ctx: &Context,
        nodeid: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        Err(Errno::NOSYS)
    }

    /// REMOVEXATTR of `name`.
    fn removexattr(&self, ctx: &Context, nodeid: u64, name: &[u8]) -> FsResult<()> {
        Err(Errno::NOSYS)
    }

    /// FALLOCATE: `fallocate(2)` of the handle's file.
    fn fallocate(&self, ctx: &Context, range: Fallocate) -> FsResult<()> {
        Err(Errno::NOSYS)
    }

    /// LSEEK (SEEK_DATA / SEEK_HOLE; others the guest answers itself).
    fn lseek(
        &self,
        ctx: &Context,
        nodeid: u64,
        fh: u64,
        offset: u64,
        whence: u32,
    ) -> FsResult<u64> {
        Err(Errno::NOSYS)
    }

    /// COPY_FILE_RANGE; returns the bytes copied.
    fn copy_file_range(&self, ctx: &Context, copy: CopyRange) -> FsResult<usize> {
        Err(Errno::NOSYS)
    }

    /// GETLK: the first lock that would conflict with `lock`, or one of
    /// type `F_UNLCK`.
    fn getlk(&self, ctx: &Context, nodeid: u64, lock: &LockRequest) -> FsResult<FileLock> {
        Err(Errno::NOSYS)
    }

    /// SETLK (and the first, non-blocking try of a SETLKW): takes, changes
    /// or drops a POSIX lock or a flock; `EAGAIN` on a conflict.
    fn setlk(&self, ctx: &Context, nodeid: u64, lock: &LockRequest) -> FsResult<()> {
        Err(Errno::NOSYS)
    }

    /// SETLKW after its first try met a conflict: a waiter that takes the
    /// lock off the request path (it must not block a queue worker: the
    /// holder's unlock may be queued behind it).
    fn lock_waiter(
        &self,
        ctx: &Context,
        nodeid: u64,
        lock: &LockRequest,
    ) -> Result<LockWaiter, Errno> {
        Err(Errno::NOSYS)
    }

    /// The POSIX locks `owner` holds on `nodeid` go (a close in the guest:
    /// FLUSH with a lock owner), or its flocks (`flock`: RELEASE with
    /// `FLOCK_UNLOCK`).
    fn unlock_owner(&self, ctx: &Context, nodeid: u64, owner: u64, flock: bool) {}

    /// SYNCFS: the host file system of the share.
    fn syncfs(&self, ctx: &Context, nodeid: u64) -> FsResult<()> {
        Err(Errno::NOSYS)
    }

    /// ACCESS: whether the caller may access `nodeid` with `mask`.
    fn access(&self, ctx: &Context, nodeid: u64, mask: u32) -> FsResult<()> {
        Err(Errno::NOSYS)
    }

    /// The host file behind `nodeid` (or the handle `fh`), for the seams
    /// and layers that act on host files; `for_pool`: also open it for the
    /// residency plane.
    fn host_file(&self, nodeid: u64, fh: Option<u64>, for_pool: bool) -> Result<HostFile, Errno> {
        Err(Errno::NOSYS)
    }

    /// The host identity of `nodeid` (or of the handle `fh`), without a
    /// syscall: what the data path charges the device for.
    fn file_key(&self, nodeid: u64, fh: Option<u64>) -> Result<FileKey, Errno> {
        Err(Errno::NOSYS)
    }
}

/// A READ or WRITE: the file range and where its payload moves.
pub struct FileIo<'a> {
    /// The node.
    pub nodeid: u64,
    /// The handle.
    pub fh: u64,
    /// File offset.
    pub offset: u64,
    /// Bytes to move.
    pub size: u32,
    /// `fuse_write_in.write_flags` (WRITE; `abi::write_flags`) or
    /// `fuse_read_in.read_flags` (READ).
    pub flags: u32,
    /// Where the payload starts in the request (WRITE) or reply (READ).
    pub at: usize,
    /// Moves the payload between the message and the file.
    pub payload: &'a mut dyn PayloadIo,
}

impl std::fmt::Debug for FileIo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileIo")
            .field("nodeid", &self.nodeid)
            .field("fh", &self.fh)
            .field("offset", &self.offset)
            .field("size", &self.size)
            .field("flags", &self.flags)
            .finish_non_exhaustive()
    }
}

/// The reply to GETXATTR / LISTXATTR: the size asked for, or the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Xattr {
    /// Bytes needed (the request's size was 0).
    Size(u32),
    /// The value, or the NUL-separated names.
    Data(Vec<u8>),
}

/// A FALLOCATE: the handle's file range and the `fallocate(2)` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallocate {
    /// The node.
    pub nodeid: u64,
    /// The handle.
    pub fh: u64,
    /// First byte.
    pub offset: u64,
    /// Bytes.
    pub length: u64,
    /// `FALLOC_FL_*`.
    pub mode: u32,
}

/// A COPY_FILE_RANGE: source and destination handles and ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyRange {
    /// Source node.
    pub nodeid_in: u64,
    /// Source handle.
    pub fh_in: u64,
    /// Source offset.
    pub off_in: u64,
    /// Destination node.
    pub nodeid_out: u64,
    /// Destination handle.
    pub fh_out: u64,
    /// Destination offset.
    pub off_out: u64,
    /// Bytes.
    pub len: u64,
}

/// A lock request of GETLK / SETLK / SETLKW.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockRequest {
    /// The handle it came through.
    pub fh: u64,
    /// The guest's lock owner (a process's files, or a `struct file` for flock).
    pub owner: u64,
    /// The range and type (`F_RDLCK` / `F_WRLCK` / `F_UNLCK`).
    pub lock: FileLock,
    /// A BSD flock rather than a POSIX lock.
    pub flock: bool,
}

/// How a waiter learns that its wait is over without the lock: the guest
/// interrupted the request, or the session ends.
pub type StopWaiting<'a> = &'a (dyn Fn() -> bool + Send + Sync);

/// Takes a lock off the request path: runs on a thread of its own, polls
/// `stop`, returns when it holds the lock or gives up (`EINTR`).
pub type LockWaiter = Box<dyn FnOnce(StopWaiting<'_>) -> Result<(), Errno> + Send>;
