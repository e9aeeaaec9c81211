//! The passthrough filesystem over `--shared-dir`.
//!
//! Safety rules (nothing may escape the shared directory):
//! * every inode is held as an `O_PATH | O_NOFOLLOW` fd; every operation is
//!   an `*at()` call relative to such a fd with a single path component;
//! * names are checked: no empty name, no `.` / `..`, no `/`, no NUL;
//! * symlinks are never followed: lookups use `O_NOFOLLOW`, creation uses
//!   `O_NOFOLLOW`, and a symlink inode is never re-opened for I/O;
//! * files are (re)opened through `/proc/self/fd/N` of the inode's own
//!   `O_PATH` fd, so a rename or a swapped-in symlink between lookup and
//!   open cannot redirect the open (the fd pins the inode, not the path);
//! * only regular files and directories are ever opened for I/O: a FIFO,
//!   socket or device node in the share is never opened by the daemon (a
//!   FIFO would block a worker; a device node would hand a guest the
//!   host's device), as in virtiofsd since CVE-2020-35517.
//!
//! Guest credentials ([`creds`]): nodes are created (CREATE, MKDIR,
//! SYMLINK) as the caller — the worker thread takes the caller's
//! (translated) uid and gid for the call — with exactly the mode the guest
//! asked for (see [`PassthroughFs::creation_mode`] for the umask). Files are opened with the access mode the guest asked for.
//! SETATTR, OPEN, READ and WRITE act as the daemon (root), as in
//! virtiofsd: the guest kernel has checked the caller's rights; what a
//! guest root can do to the host's files is in `DESIGN.md` ("Guest
//! credentials"). [`GuestIds`] holds `--translate-uid/-gid`
//! ([`idmap`]) and `--strip-setid`.
//!
//! One [`PassthroughFs`] per VM connection (FUSE node ids are per session).
//! It does host I/O only: device timing, pool extents and DAX coherence
//! are the timing layer's (`timing/`). Whoever needs to know when
//! a regular file's inode comes and goes (the pool's references) registers
//! an [`InodeObserver`].

pub mod creds;
pub mod idmap;
pub mod locks;
pub mod xattr;

pub use creds::{GuestIds, HostCreds};
pub use idmap::{IdMap, ParseIdMapError};

use crate::abi::{self, fattr, open_in_flags, write_flags, Attr, EntryOut, SetattrIn};
use crate::ids::FileKey;
use crate::server::{
    AttrReply, Context, CopyRange, Created, Creation, DirSink, Direction, Fallocate, FileIo,
    FileSystem, FsResult, HostFile, LockRequest, LockWaiter, Named, Opened, Timed, Transfer, Xattr,
};
use crate::sync::lock;
use creds::CallerGuard;
use locks::LockTable;
use rustix::fs::{AtFlags, Mode, OFlags, Stat, Timespec, Timestamps, UTIME_NOW, UTIME_OMIT};
use rustix::io::Errno;
use rustix::path::DecInt;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use xattr::XattrMap;

/// How much the guest's own caches may keep (as in virtiofsd).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Every read and write reaches the daemon (FOPEN_DIRECT_IO, no attr caching).
    Never,
    /// Guest page cache, invalidated when the file changes; 1 s attr timeout.
    #[default]
    Auto,
    /// Guest page cache kept across opens (FOPEN_KEEP_CACHE); long timeouts.
    Always,
}

impl std::str::FromStr for CacheMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "never" | "none" => Ok(CacheMode::Never),
            "auto" => Ok(CacheMode::Auto),
            "always" => Ok(CacheMode::Always),
            other => Err(format!(
                "cache mode must be never|auto|always, got `{other}`"
            )),
        }
    }
}

impl CacheMode {
    /// Entry and attribute timeout.
    pub fn timeout(self) -> Duration {
        match self {
            CacheMode::Never => Duration::ZERO,
            CacheMode::Auto => Duration::from_secs(1),
            CacheMode::Always => Duration::from_secs(86400),
        }
    }

    /// `fuse_open_out.open_flags` for regular files.
    pub fn file_open_flags(self) -> u32 {
        match self {
            CacheMode::Never => abi::fopen::DIRECT_IO,
            CacheMode::Auto => 0,
            CacheMode::Always => abi::fopen::KEEP_CACHE,
        }
    }

    /// `fuse_open_out.open_flags` for directories.
    pub fn dir_open_flags(self) -> u32 {
        match self {
            CacheMode::Always => abi::fopen::CACHE_DIR,
            _ => 0,
        }
    }
}

/// Why the shared directory could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenSharedDirError {
    /// `open(shared_dir)` failed.
    #[error("cannot open shared directory {path}")]
    Open {
        /// The directory.
        path: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// One inode known to the guest.
#[derive(Debug)]
pub struct Inode {
    /// FUSE node id.
    pub nodeid: u64,
    /// Host identity (also the pool key).
    pub key: FileKey,
    /// `O_PATH | O_NOFOLLOW` fd.
    pub fd: OwnedFd,
    /// File type bits of `st_mode`.
    pub kind: u32,
}

impl Inode {
    fn is_reg(&self) -> bool {
        self.kind == libc::S_IFREG
    }
    fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }
}

/// An open file or directory.
#[derive(Debug)]
pub struct Handle {
    /// The inode it was opened from.
    pub inode: Arc<Inode>,
    /// The open file.
    pub file: File,
    /// Serialises seek + getdents on directories.
    dir_lock: Mutex<()>,
}

#[derive(Debug, Default)]
struct Tables {
    inodes: HashMap<u64, (Arc<Inode>, u64)>,
    by_key: HashMap<FileKey, u64>,
    handles: HashMap<u64, Arc<Handle>>,
}

pub use crate::server::DirEntry;

/// Told when a regular file's inode enters and leaves a session's tables
/// (the pool keeps one reference per session that knows the file).
pub trait InodeObserver: Send + Sync + std::fmt::Debug {
    /// The session registered the regular file `key`.
    fn inode_added(&self, key: FileKey);
    /// The session forgot it; `deleted`: the host file has no links left.
    fn inode_dropped(&self, key: FileKey, deleted: bool);
}

/// The passthrough filesystem of one VM session.
#[derive(Debug)]
pub struct PassthroughFs {
    root: OwnedFd,
    proc_self_fd: OwnedFd,
    tables: Mutex<Tables>,
    next_nodeid: AtomicU64,
    next_fh: AtomicU64,
    observer: Option<Arc<dyn InodeObserver>>,
    ids: GuestIds,
    locks: LockTable,
    /// Cache mode.
    pub cache: CacheMode,
}

fn errno(e: &io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

/// Rejects names that are not a single, real path component.
pub fn check_name(name: &[u8]) -> Result<&[u8], Errno> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err(Errno::INVAL);
    }
    if name.len() > 255 {
        return Err(Errno::NAMETOOLONG);
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(Errno::INVAL);
    }
    Ok(name)
}

/// `fuse_attr` from a host stat.
pub fn attr_from_stat(st: &Stat) -> Attr {
    Attr {
        ino: st.st_ino,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: st.st_atime as u64,
        mtime: st.st_mtime as u64,
        ctime: st.st_ctime as u64,
        atimensec: st.st_atime_nsec as u32,
        mtimensec: st.st_mtime_nsec as u32,
        ctimensec: st.st_ctime_nsec as u32,
        mode: st.st_mode,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// Open flags the guest may pass through (no O_DIRECT: our bounce buffers
/// are not aligned; no O_NOATIME / O_PATH / O_CREAT games).
fn sanitize_open_flags(flags: u32) -> OFlags {
    let f = OFlags::from_bits_retain(flags);
    let allowed = OFlags::ACCMODE
        | OFlags::APPEND
        | OFlags::TRUNC
        | OFlags::SYNC
        | OFlags::DSYNC
        | OFlags::NONBLOCK
        | OFlags::LARGEFILE;
    (f & allowed) | OFlags::CLOEXEC
}

impl PassthroughFs {
    /// Opens the shared directory as the root inode.
    pub fn new(shared_dir: &Path, cache: CacheMode) -> Result<Self, OpenSharedDirError> {
        let open_err = |path: &Path, e: Errno| OpenSharedDirError::Open {
            path: path.display().to_string(),
            source: e.into(),
        };
        let root = rustix::fs::open(
            shared_dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| open_err(shared_dir, e))?;
        let proc_path = Path::new("/proc/self/fd");
        let proc_self_fd = rustix::fs::open(
            proc_path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| open_err(proc_path, e))?;
        let st = rustix::fs::fstat(&root).map_err(|e| open_err(shared_dir, e))?;
        let fs = PassthroughFs {
            root,
            proc_self_fd,
            tables: Mutex::new(Tables::default()),
            next_nodeid: AtomicU64::new(abi::ROOT_ID + 1),
            next_fh: AtomicU64::new(1),
            observer: None,
            ids: GuestIds::default(),
            locks: LockTable::default(),
            cache,
        };
        fs.install_root(&st).map_err(|e| open_err(shared_dir, e))?;
        Ok(fs)
    }

    /// Tells `observer` about every regular file's inode from now on.
    pub fn with_inode_observer(mut self, observer: Option<Arc<dyn InodeObserver>>) -> Self {
        self.observer = observer;
        self
    }

    /// The calling worker thread acts as `ctx`'s caller until the guard
    /// drops (see [`creds`]).
    fn as_caller(&self, ctx: &Context) -> Result<CallerGuard, Errno> {
        CallerGuard::switch_to(self.ids.host_creds(ctx)?)
    }

    /// The permission bits a new node gets: the guest's mode (its kernel
    /// already took the caller's umask off; taking the request's `umask`
    /// off again changes nothing then, and is right if it did not), set-id
    /// bits stripped if asked.
    ///
    /// The daemon's own umask must not mask it a second time. virtiofsd
    /// sets the process umask to 0; here the sockets, pool and metrics file
    /// the daemon creates keep the umask it was started with, and a node
    /// the umask narrowed gets its mode back with one chmod, made as the
    /// caller (so the kernel's rules on S_ISGID still apply). A per-thread
    /// umask (`unshare(CLONE_FS)`) would need `unshare` in the seccomp
    /// allow-list of the data path.
    pub fn creation_mode(&self, how: Creation, is_dir: bool) -> Mode {
        Mode::from_raw_mode(self.ids.mode_bits(how.mode & !how.umask, is_dir))
    }

    /// Gives a node just created as the caller (still acting as it) the
    /// permission bits the daemon's umask took off. `fd`: the node, opened
    /// for I/O or `O_PATH`.
    fn restore_mode(&self, fd: &impl AsFd, want: Mode) -> Result<(), Errno> {
        let st = rustix::fs::fstat(fd)?;
        let want = want.as_raw_mode();
        if st.st_mode & 0o777 == want & 0o777 {
            return Ok(());
        }
        // Keep an S_ISGID a directory inherited from its parent.
        let keep = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            st.st_mode & libc::S_ISGID
        } else {
            0
        };
        rustix::fs::chmodat(
            &self.proc_self_fd,
            DecInt::from_fd(fd),
            Mode::from_raw_mode(keep | want),
            AtFlags::empty(),
        )
    }

    /// OPEN of an existing regular file (never a special file) with the
    /// guest's access mode; O_TRUNC with `FUSE_OPEN_KILL_SUIDGID` also
    /// clears its set-id bits.
    fn open_existing(&self, inode: Arc<Inode>, flags: u32, open_flags: u32) -> Result<u64, Errno> {
        let file = self.reopen(&inode, sanitize_open_flags(flags))?;
        if flags & libc::O_TRUNC as u32 != 0 && open_flags & open_in_flags::KILL_SUIDGID != 0 {
            self.kill_suidgid(&inode)?;
        }
        Ok(self.add_handle(inode, file))
    }

    /// Translates ids and strips set-id bits as `ids` says.
    pub fn with_guest_ids(mut self, ids: GuestIds) -> Self {
        self.ids = ids;
        self
    }

    fn install_root(&self, st: &Stat) -> Result<(), Errno> {
        let fd = rustix::io::dup(&self.root)?;
        let inode = Arc::new(Inode {
            nodeid: abi::ROOT_ID,
            key: FileKey {
                dev: st.st_dev,
                ino: st.st_ino,
            },
            fd,
            kind: st.st_mode & libc::S_IFMT,
        });
        let mut t = lock(&self.tables);
        t.by_key.insert(inode.key, abi::ROOT_ID);
        t.inodes.insert(abi::ROOT_ID, (inode, u64::MAX / 2));
        Ok(())
    }

    /// Forgets every inode and handle (FUSE_INIT of a new session, DESTROY).
    pub fn reset(&self) {
        self.locks.clear();
        let old = std::mem::take(&mut *lock(&self.tables));
        for (id, (inode, _)) in old.inodes {
            if id != abi::ROOT_ID {
                self.release_from_pool(&inode);
            }
        }
        if let Ok(st) = rustix::fs::fstat(&self.root) {
            if let Err(e) = self.install_root(&st) {
                tracing::error!(error = %e, "cannot re-install the root inode");
            }
        }
    }

    /// The inode for `nodeid`.
    pub fn inode(&self, nodeid: u64) -> Result<Arc<Inode>, Errno> {
        lock(&self.tables)
            .inodes
            .get(&nodeid)
            .map(|(i, _)| i.clone())
            .ok_or(Errno::BADF)
    }

    /// The handle `fh`.
    pub fn handle(&self, fh: u64) -> Result<Arc<Handle>, Errno> {
        lock(&self.tables)
            .handles
            .get(&fh)
            .cloned()
            .ok_or(Errno::BADF)
    }

    /// Number of live inodes (root included) and handles.
    pub fn counts(&self) -> (usize, usize) {
        let t = lock(&self.tables);
        (t.inodes.len(), t.handles.len())
    }

    fn entry(&self, inode: &Inode, st: &Stat) -> EntryOut {
        let t = self.cache.timeout();
        EntryOut {
            nodeid: inode.nodeid,
            generation: 0,
            entry_valid: t.as_secs(),
            attr_valid: t.as_secs(),
            entry_valid_nsec: t.subsec_nanos(),
            attr_valid_nsec: t.subsec_nanos(),
            attr: self.ids.attr_to_guest(attr_from_stat(st)),
        }
    }

    /// Registers (or re-references) the inode behind an `O_PATH` fd.
    fn register(&self, fd: OwnedFd) -> Result<(Arc<Inode>, Stat), Errno> {
        let st = rustix::fs::fstat(&fd)?;
        let key = FileKey {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let mut t = lock(&self.tables);
        if let Some(&id) = t.by_key.get(&key) {
            if let Some((inode, refs)) = t.inodes.get_mut(&id) {
                *refs += 1;
                return Ok((inode.clone(), st));
            }
        }
        let nodeid = self.next_nodeid.fetch_add(1, Ordering::Relaxed);
        let inode = Arc::new(Inode {
            nodeid,
            key,
            fd,
            kind: st.st_mode & libc::S_IFMT,
        });
        if let Some(o) = self.observer.as_ref().filter(|_| inode.is_reg()) {
            o.inode_added(key);
        }
        t.by_key.insert(key, nodeid);
        t.inodes.insert(nodeid, (inode.clone(), 1));
        Ok((inode, st))
    }

    /// FORGET: drops `n` references.
    fn drop_refs(&self, nodeid: u64, n: u64) {
        let mut t = lock(&self.tables);
        let gone = match t.inodes.get_mut(&nodeid) {
            Some((_, refs)) if nodeid != abi::ROOT_ID => {
                *refs = refs.saturating_sub(n);
                *refs == 0
            }
            _ => false,
        };
        if gone {
            if let Some((inode, _)) = t.inodes.remove(&nodeid) {
                if t.by_key.get(&inode.key) == Some(&nodeid) {
                    t.by_key.remove(&inode.key);
                }
                drop(t);
                self.release_from_pool(&inode);
            }
        }
    }

    /// Tells the observer this session forgot a regular file (and whether
    /// the host file is gone: no links left).
    fn release_from_pool(&self, inode: &Inode) {
        if let Some(o) = self.observer.as_ref().filter(|_| inode.is_reg()) {
            let deleted = rustix::fs::fstat(&inode.fd).is_ok_and(|st| st.st_nlink == 0);
            o.inode_dropped(inode.key, deleted);
        }
    }

    /// Opens a regular file's inode for the residency plane (DAX): read-write
    /// when the daemon may, read-only otherwise. Traps read from it and
    /// write-backs go to it.
    pub fn open_for_pool(&self, inode: &Inode) -> Result<File, Errno> {
        if !inode.is_reg() {
            return Err(Errno::INVAL);
        }
        self.reopen(inode, OFlags::RDWR | OFlags::CLOEXEC)
            .or_else(|_| self.reopen(inode, OFlags::RDONLY | OFlags::CLOEXEC))
    }

    /// Re-opens an inode for I/O through `/proc/self/fd/N`: regular files
    /// and directories only. A symlink gives ELOOP (what `O_NOFOLLOW`
    /// gives); a FIFO, socket or device node EBADF, as virtiofsd answers
    /// (the guest kernel opens those itself and never sends OPEN for them).
    fn reopen(&self, inode: &Inode, flags: OFlags) -> Result<File, Errno> {
        if !(inode.is_reg() || inode.is_dir()) {
            return Err(if inode.kind == libc::S_IFLNK {
                Errno::LOOP
            } else {
                Errno::BADF
            });
        }
        let fd = rustix::fs::openat(
            &self.proc_self_fd,
            DecInt::from_fd(&inode.fd),
            flags,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// A file just created and opened (CREATE, TMPFILE): its inode
    /// registered through an `O_PATH` fd of its own, and a handle.
    fn register_opened(&self, file: File) -> Result<(EntryOut, u64), Errno> {
        let path_fd = rustix::fs::openat(
            &self.proc_self_fd,
            DecInt::from_fd(&file),
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let (inode, st) = self.register(path_fd)?;
        let entry = self.entry(&inode, &st);
        Ok((entry, self.add_handle(inode, file)))
    }

    fn add_handle(&self, inode: Arc<Inode>, file: File) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.tables).handles.insert(
            fh,
            Arc::new(Handle {
                inode,
                file,
                dir_lock: Mutex::new(()),
            }),
        );
        fh
    }

    /// Clears S_ISUID, and S_ISGID when the group may execute, of a
    /// regular file (what the kernel does on a write or truncation by a
    /// caller without CAP_FSETID): the guest asked for it under
    /// HANDLE_KILLPRIV_V2, and the daemon, root, would not lose them itself.
    fn kill_suidgid(&self, inode: &Inode) -> Result<(), Errno> {
        if !inode.is_reg() {
            return Ok(());
        }
        let mode = rustix::fs::fstat(&inode.fd)?.st_mode & 0o7777;
        let mut kept = mode & !libc::S_ISUID;
        if kept & libc::S_IXGRP != 0 {
            kept &= !libc::S_ISGID;
        }
        if kept == mode {
            return Ok(());
        }
        rustix::fs::chmodat(
            &self.proc_self_fd,
            DecInt::from_fd(&inode.fd),
            Mode::from_raw_mode(kept),
            AtFlags::empty(),
        )
    }

    /// SETATTR; returns the new attributes.
    fn set_attributes(&self, ctx: &Context, nodeid: u64, a: &SetattrIn) -> Result<Attr, Errno> {
        let valid = a.valid;
        let (mode, uid, gid, size) = (a.mode, a.uid, a.gid, a.size);
        let atime = (a.atime, a.atimensec);
        let mtime = (a.mtime, a.mtimensec);
        let inode = self.inode(nodeid)?;
        let handle = match (valid & fattr::FH != 0).then_some(a.fh) {
            Some(fh) => Some(self.handle(fh)?),
            None => None,
        };
        // Checked before anything changes: a guest-chosen size beyond
        // off_t is what ftruncate(2) refuses with EINVAL.
        let size = if valid & fattr::SIZE != 0 {
            Some(i64::try_from(size).map_err(|_| Errno::INVAL)?)
        } else {
            None
        };
        let is_link = inode.kind == libc::S_IFLNK;
        if valid & (fattr::MODE | fattr::UID | fattr::GID) != 0 {
            let creds = self.ids.host_creds(ctx)?;
            let owner = rustix::fs::fstat(&inode.fd)?.st_uid;
            if !self.ids.may_change_owned(ctx, creds, owner) {
                return Err(Errno::PERM);
            }
        }
        if valid & fattr::MODE != 0 {
            if is_link {
                return Err(Errno::OPNOTSUPP);
            }
            rustix::fs::chmodat(
                &self.proc_self_fd,
                DecInt::from_fd(&inode.fd),
                Mode::from_raw_mode(self.ids.mode_bits(mode, inode.is_dir())),
                AtFlags::empty(),
            )?;
        }
        if valid & (fattr::UID | fattr::GID) != 0 {
            let perm = |_| Errno::PERM;
            let u = match valid & fattr::UID != 0 {
                true => Some(rustix::fs::Uid::from_raw_unchecked(
                    self.ids.uids.to_host(uid).map_err(perm)?,
                )),
                false => None,
            };
            let g = match valid & fattr::GID != 0 {
                true => Some(rustix::fs::Gid::from_raw_unchecked(
                    self.ids.gids.to_host(gid).map_err(perm)?,
                )),
                false => None,
            };
            rustix::fs::chownat(
                &inode.fd,
                "",
                u,
                g,
                AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        if let Some(size) = size {
            // `size` is in 0..=i64::MAX, so the cast keeps it.
            let size = size as u64;
            match &handle {
                Some(h) => rustix::fs::ftruncate(&h.file, size)?,
                None => rustix::fs::ftruncate(
                    self.reopen(&inode, OFlags::WRONLY | OFlags::CLOEXEC)?,
                    size,
                )?,
            }
        }
        if valid & fattr::KILL_SUIDGID != 0 && valid & fattr::MODE == 0 {
            self.kill_suidgid(&inode)?;
        }
        // Under HANDLE_KILLPRIV_V2 the guest's `chown(f, -1, -1)` arrives
        // as a SETATTR that changes nothing (its kill-suid part is left to
        // the server, and the change time is not sent without a writeback
        // cache): the host's own chown(-1, -1) does exactly what the kernel
        // does there (ctime, S_ISUID, S_ISGID when group-executable).
        let changes =
            fattr::MODE | fattr::UID | fattr::GID | fattr::SIZE | fattr::ATIME | fattr::MTIME;
        if valid & changes == 0 {
            rustix::fs::chownat(
                &inode.fd,
                "",
                None,
                None,
                AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        let t = |set: bool, now: bool, (s, ns): (u64, u32)| -> Timespec {
            let tv_nsec = if !set {
                UTIME_OMIT
            } else if now {
                UTIME_NOW
            } else {
                i64::from(ns)
            };
            Timespec {
                tv_sec: s as i64,
                tv_nsec,
            }
        };
        if valid & (fattr::ATIME | fattr::MTIME) != 0 {
            let times = Timestamps {
                last_access: t(
                    valid & fattr::ATIME != 0,
                    valid & fattr::ATIME_NOW != 0,
                    atime,
                ),
                last_modification: t(
                    valid & fattr::MTIME != 0,
                    valid & fattr::MTIME_NOW != 0,
                    mtime,
                ),
            };
            if is_link {
                // The link itself, through its O_PATH fd (the /proc path
                // would reach its target).
                rustix::fs::utimensat(&inode.fd, "", &times, AtFlags::EMPTY_PATH)?;
            } else {
                rustix::fs::utimensat(
                    &self.proc_self_fd,
                    DecInt::from_fd(&inode.fd),
                    &times,
                    AtFlags::empty(),
                )?;
            }
        }
        Ok(self.attr(&rustix::fs::fstat(&inode.fd)?))
    }

    /// A host stat as the guest sees it (owner and group translated).
    fn attr(&self, st: &Stat) -> Attr {
        self.ids.attr_to_guest(attr_from_stat(st))
    }

    /// Every open handle's inode key and `fsync` (shutdown).
    pub fn sync_all(&self) {
        let handles: Vec<Arc<Handle>> = lock(&self.tables).handles.values().cloned().collect();
        for h in handles {
            if let Err(e) = rustix::fs::fsync(&h.file) {
                tracing::warn!(error = %e, "fsync on shutdown failed");
            }
        }
        // `root` is an O_PATH fd, which syncfs refuses (EBADF): open the
        // directory itself for it.
        let synced = rustix::fs::openat(
            &self.root,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .and_then(|dir| rustix::fs::syncfs(&dir));
        if let Err(e) = synced {
            tracing::warn!(error = %e, "syncfs on shutdown failed");
        }
    }

    /// How guest xattr names map to the host's ([`xattr`]): ACLs hold raw
    /// ids, so they pass only when ids are not translated.
    fn xattr_map(&self) -> XattrMap {
        XattrMap {
            acls: self.ids.uids.is_identity() && self.ids.gids.is_identity(),
        }
    }

    /// The `/proc/self/fd/N` path of an inode's O_PATH fd: the path-based
    /// xattr calls reach the inode itself through it, a symlink included
    /// (the magic link is not followed further).
    fn proc_path(inode: &Inode) -> String {
        format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&inode.fd)
        )
    }

    /// A new node `name` in `dir`, made as the caller by `make`, given
    /// the mode asked for, registered. `expect`: `O_DIRECTORY` when the
    /// node must be a directory (whatever has its name by now is opened).
    fn make_node(
        &self,
        ctx: &Context,
        at: Named<'_>,
        mode: Mode,
        expect: OFlags,
        make: impl FnOnce(&Inode, &[u8]) -> Result<(), Errno>,
    ) -> FsResult<EntryOut> {
        let name = check_name(at.name)?;
        let dir = self.inode(at.parent)?;
        let made = {
            let _caller = self.as_caller(ctx)?;
            make(&dir, name)?;
            rustix::fs::openat(
                &dir.fd,
                name,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC | expect,
                Mode::empty(),
            )
            .and_then(|fd| self.restore_mode(&fd, mode).map(|()| fd))
        };
        let (inode, st) = self.register(made?)?;
        Ok(Timed::now(self.entry(&inode, &st)))
    }

    /// The lock description of `req`'s owner on `nodeid`'s file.
    fn lock_fd(
        &self,
        ctx: &Context,
        nodeid: u64,
        req: &LockRequest,
    ) -> Result<Arc<locks::LockFd>, Errno> {
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

    fn attr_reply(&self, attr: Attr) -> Timed<AttrReply> {
        Timed::now(AttrReply {
            attr,
            timeout: self.cache.timeout(),
        })
    }

    /// READ / WRITE: the payload moves between the message and the handle's file.
    fn move_payload(&self, io: FileIo<'_>, direction: Direction) -> FsResult<usize> {
        let h = self.handle(io.fh)?;
        if direction == Direction::RequestToFile && io.flags & write_flags::KILL_SUIDGID != 0 {
            // Before the data changes, as the kernel's file_remove_privs.
            self.kill_suidgid(&h.inode)?;
        }
        let n = io
            .payload
            .transfer(Transfer {
                direction,
                file: &h.file,
                offset: io.offset,
                at: io.at,
                len: io.size as usize,
            })
            .map_err(|e| errno(&e))?;
        Ok(Timed::now(n))
    }
}

impl FileSystem for PassthroughFs {
    fn init(&self, _kernel_flags: u64) -> Result<u64, Errno> {
        self.reset();
        // HANDLE_KILLPRIV_V2: the guest kernel leaves killing set-id bits on
        // write, truncation and chown to the server and says when to
        // (KILL_SUIDGID flags); without it, it would send a SETATTR of the
        // mode before each such write.
        // POSIX locks and flocks are held on the host (`locks`), so they
        // conflict across VMs.
        let killpriv = abi::init_flags::HANDLE_KILLPRIV_V2
            | abi::init_flags::POSIX_LOCKS
            | abi::init_flags::FLOCK_LOCKS;
        Ok(if self.cache == CacheMode::Auto {
            abi::init_flags::AUTO_INVAL_DATA | killpriv
        } else {
            killpriv
        })
    }

    fn destroy(&self) {
        self.reset();
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &[u8]) -> FsResult<EntryOut> {
        let name = check_name(name)?;
        let dir = self.inode(parent)?;
        let fd = rustix::fs::openat(
            &dir.fd,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let (inode, st) = self.register(fd)?;
        Ok(Timed::now(self.entry(&inode, &st)))
    }

    fn forget(&self, _ctx: &Context, nodeid: u64, nlookup: u64) {
        self.drop_refs(nodeid, nlookup);
    }

    fn getattr(&self, _ctx: &Context, nodeid: u64, fh: Option<u64>) -> FsResult<AttrReply> {
        let st = match fh {
            Some(fh) => rustix::fs::fstat(&self.handle(fh)?.file)?,
            None => rustix::fs::fstat(&self.inode(nodeid)?.fd)?,
        };
        Ok(self.attr_reply(self.attr(&st)))
    }

    fn setattr(&self, ctx: &Context, nodeid: u64, a: &SetattrIn) -> FsResult<AttrReply> {
        Ok(self.attr_reply(self.set_attributes(ctx, nodeid, a)?))
    }

    fn readlink(&self, _ctx: &Context, nodeid: u64) -> FsResult<Vec<u8>> {
        let inode = self.inode(nodeid)?;
        let target = rustix::fs::readlinkat(&inode.fd, "", Vec::new())?;
        Ok(Timed::now(target.into_bytes()))
    }

    /// SYMLINK: creates `name` -> `target` as the caller (the target is
    /// never resolved here).
    fn symlink(&self, ctx: &Context, at: Named<'_>, target: &[u8]) -> FsResult<EntryOut> {
        let name = check_name(at.name)?;
        let dir = self.inode(at.parent)?;
        {
            let _caller = self.as_caller(ctx)?;
            rustix::fs::symlinkat(target, &dir.fd, name)?;
        }
        self.lookup(ctx, at.parent, name)
    }

    /// MKDIR as the caller, with the mode the guest asked for.
    fn mkdir(&self, ctx: &Context, at: Named<'_>, how: Creation) -> FsResult<EntryOut> {
        // mkdir(2) ignores set-id bits (`mkdir -m 2775` is a chmod after).
        let mode = Mode::from_raw_mode(self.creation_mode(how, true).as_raw_mode() & 0o1777);
        self.make_node(ctx, at, mode, OFlags::DIRECTORY, |dir, name| {
            rustix::fs::mkdirat(&dir.fd, name, mode)
        })
    }

    fn unlink(&self, _ctx: &Context, at: Named<'_>, dir: bool) -> FsResult<()> {
        let name = check_name(at.name)?;
        let parent = self.inode(at.parent)?;
        let flags = if dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(&parent.fd, name, flags)?;
        Ok(Timed::now(()))
    }

    fn rename(&self, _ctx: &Context, from: Named<'_>, to: Named<'_>, flags: u32) -> FsResult<()> {
        let oldname = check_name(from.name)?;
        let newname = check_name(to.name)?;
        let od = self.inode(from.parent)?;
        let nd = self.inode(to.parent)?;
        let flags = rustix::fs::RenameFlags::from_bits(flags).ok_or(Errno::INVAL)?;
        rustix::fs::renameat_with(&od.fd, oldname, &nd.fd, newname, flags)?;
        Ok(Timed::now(()))
    }

    fn open(&self, _ctx: &Context, nodeid: u64, flags: u32, open_flags: u32) -> FsResult<Opened> {
        let inode = self.inode(nodeid)?;
        if inode.is_dir() {
            return Err(Errno::ISDIR);
        }
        let fh = self.open_existing(inode, flags, open_flags)?;
        Ok(Timed::now(Opened {
            fh,
            open_flags: self.cache.file_open_flags(),
        }))
    }

    /// CREATE: a new file made as the caller with the mode asked for, or —
    /// without O_EXCL — the existing one opened as OPEN would (so never a
    /// FIFO or device node, and no change to its owner).
    fn create(&self, ctx: &Context, at: Named<'_>, how: Creation) -> FsResult<Created> {
        let name = check_name(at.name)?;
        let dir = self.inode(at.parent)?;
        // O_EXCL always: an existing name never gets opened by this call
        // (O_CREAT | O_EXCL does not follow a symlink either).
        let oflags = sanitize_open_flags(how.flags)
            | OFlags::CREATE
            | OFlags::EXCL
            | OFlags::NOFOLLOW
            | OFlags::CLOEXEC;
        let mode = self.creation_mode(how, false);
        let created = {
            let _caller = self.as_caller(ctx)?;
            rustix::fs::openat(&dir.fd, name, oflags, mode)
                .and_then(|fd| self.restore_mode(&fd, mode).map(|()| fd))
        };
        let (entry, fh) = match created {
            Ok(fd) => self.register_opened(File::from(fd))?,
            Err(Errno::EXIST) if how.flags & libc::O_EXCL as u32 == 0 => {
                let entry = self.lookup(ctx, at.parent, name)?.value;
                let opened = self
                    .inode(entry.nodeid)
                    .and_then(|inode| match inode.is_dir() {
                        true => Err(Errno::ISDIR),
                        false => self.open_existing(inode, how.flags, how.open_flags),
                    });
                match opened {
                    Ok(fh) => (entry, fh),
                    Err(e) => {
                        // The reply is an error: the lookup's reference is
                        // not the guest's.
                        self.drop_refs(entry.nodeid, 1);
                        return Err(e);
                    }
                }
            }
            Err(e) => return Err(e),
        };
        let open_flags = self.cache.file_open_flags();
        Ok(Timed::now((entry, Opened { fh, open_flags })))
    }

    fn read(&self, _ctx: &Context, io: FileIo<'_>) -> FsResult<usize> {
        self.move_payload(io, Direction::FileToReply)
    }

    fn write(&self, _ctx: &Context, io: FileIo<'_>) -> FsResult<usize> {
        self.move_payload(io, Direction::RequestToFile)
    }

    fn flush(&self, _ctx: &Context, _nodeid: u64, _fh: u64) -> FsResult<()> {
        // Nothing is buffered here: the host file has every byte.
        Ok(Timed::now(()))
    }

    fn fsync(&self, _ctx: &Context, _nodeid: u64, fh: u64, datasync: bool) -> FsResult<()> {
        let h = self.handle(fh)?;
        if datasync {
            rustix::fs::fdatasync(&h.file)?;
        } else {
            rustix::fs::fsync(&h.file)?;
        }
        Ok(Timed::now(()))
    }

    fn release(&self, _ctx: &Context, _nodeid: u64, fh: u64) {
        // OFD locks the guest took through this file end with it (the
        // guest keeps no record of remote locks, so it sends no unlock).
        self.locks.drop_handle(fh);
        lock(&self.tables).handles.remove(&fh);
    }

    fn opendir(&self, _ctx: &Context, nodeid: u64) -> FsResult<Opened> {
        let inode = self.inode(nodeid)?;
        if !inode.is_dir() {
            return Err(Errno::NOTDIR);
        }
        let fd = rustix::fs::openat(
            &inode.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let fh = self.add_handle(inode, File::from(fd));
        Ok(Timed::now(Opened {
            fh,
            open_flags: self.cache.dir_open_flags(),
        }))
    }

    fn readdir(&self, _ctx: &Context, fh: u64, offset: u64, emit: DirSink<'_>) -> FsResult<()> {
        let h = self.handle(fh)?;
        if !h.inode.is_dir() {
            return Err(Errno::NOTDIR);
        }
        let _guard = lock(&h.dir_lock);
        rustix::fs::seek(&h.file, rustix::fs::SeekFrom::Start(offset))?;
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 16 * 1024];
        let mut dir = rustix::fs::RawDir::new(h.file.as_fd(), &mut buf);
        while let Some(entry) = dir.next() {
            let entry = entry?;
            let e = DirEntry {
                ino: entry.ino(),
                next_off: entry.next_entry_cookie(),
                typ: entry.file_type().as_raw_mode() >> 12,
                name: entry.file_name().to_bytes().to_vec(),
            };
            if !emit(&e) {
                break;
            }
        }
        Ok(Timed::now(()))
    }

    fn statfs(&self, _ctx: &Context, nodeid: u64) -> FsResult<abi::Kstatfs> {
        let inode = self.inode(nodeid)?;
        let s = rustix::fs::fstatvfs(&inode.fd)?;
        Ok(Timed::now(abi::Kstatfs {
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            bsize: s.f_bsize as u32,
            namelen: s.f_namemax as u32,
            frsize: s.f_frsize as u32,
            ..abi::Kstatfs::default()
        }))
    }

    /// LINK: the host `linkat` of the inode itself (through its /proc
    /// path: an O_TMPFILE file gets its first name this way too).
    fn link(&self, ctx: &Context, nodeid: u64, at: Named<'_>) -> FsResult<EntryOut> {
        let name = check_name(at.name)?;
        let inode = self.inode(nodeid)?;
        if inode.is_dir() {
            return Err(Errno::PERM);
        }
        let dir = self.inode(at.parent)?;
        rustix::fs::linkat(
            &self.proc_self_fd,
            DecInt::from_fd(&inode.fd),
            &dir.fd,
            name,
            AtFlags::SYMLINK_FOLLOW,
        )?;
        self.lookup(ctx, at.parent, name)
    }

    /// MKNOD as the caller: FIFOs, sockets, device nodes (the daemon never
    /// opens any of them: see `reopen`) and regular files.
    fn mknod(&self, ctx: &Context, at: Named<'_>, how: Creation, rdev: u32) -> FsResult<EntryOut> {
        let kind = match how.mode & libc::S_IFMT {
            0 | libc::S_IFREG => rustix::fs::FileType::RegularFile,
            libc::S_IFIFO => rustix::fs::FileType::Fifo,
            libc::S_IFSOCK => rustix::fs::FileType::Socket,
            libc::S_IFCHR => rustix::fs::FileType::CharacterDevice,
            libc::S_IFBLK => rustix::fs::FileType::BlockDevice,
            _ => return Err(Errno::INVAL),
        };
        let mode = self.creation_mode(how, false);
        let dev = rustix::fs::Dev::from(rdev);
        self.make_node(ctx, at, mode, OFlags::empty(), |dir, name| {
            rustix::fs::mknodat(&dir.fd, name, kind, mode, dev)
        })
    }

    /// TMPFILE: an O_TMPFILE file in `parent`, made as the caller and
    /// opened with the guest's access mode.
    fn tmpfile(&self, ctx: &Context, parent: u64, how: Creation) -> FsResult<Created> {
        let dir = self.inode(parent)?;
        if !dir.is_dir() {
            return Err(Errno::NOTDIR);
        }
        let oflags = sanitize_open_flags(how.flags) & !OFlags::TRUNC & !OFlags::APPEND
            | OFlags::TMPFILE
            | OFlags::CLOEXEC;
        let mode = self.creation_mode(how, false);
        let fd = {
            let _caller = self.as_caller(ctx)?;
            rustix::fs::openat(&dir.fd, ".", oflags, mode)
                .and_then(|fd| self.restore_mode(&fd, mode).map(|()| fd))?
        };
        let (entry, fh) = self.register_opened(File::from(fd))?;
        let open_flags = self.cache.file_open_flags();
        Ok(Timed::now((entry, Opened { fh, open_flags })))
    }

    fn getxattr(&self, _ctx: &Context, nodeid: u64, name: &[u8], size: u32) -> FsResult<Xattr> {
        let inode = self.inode(nodeid)?;
        let host = self.xattr_map().to_host(name)?;
        let path = Self::proc_path(&inode);
        if size == 0 {
            let n = rustix::fs::getxattr_query(path.as_str(), &*host)?;
            return Ok(Timed::now(Xattr::Size(
                u32::try_from(n).map_err(|_| Errno::TOOBIG)?,
            )));
        }
        let mut buf = vec![0u8; size as usize];
        let n = rustix::fs::getxattr(path.as_str(), &*host, &mut buf[..])?;
        buf.truncate(n);
        Ok(Timed::now(Xattr::Data(buf)))
    }

    fn listxattr(&self, ctx: &Context, nodeid: u64, size: u32) -> FsResult<Xattr> {
        let inode = self.inode(nodeid)?;
        // The whole host list (bounded by the kernel's XATTR_LIST_MAX),
        // then the guest's view of it.
        let mut buf = vec![0u8; crate::server::XATTR_SIZE_MAX as usize];
        let n = rustix::fs::listxattr(Self::proc_path(&inode).as_str(), &mut buf[..])?;
        // `trusted.*` names are listed to a privileged caller only, as the
        // guest's own file systems do (guest root stands for CAP_SYS_ADMIN).
        let list = self.xattr_map().list_to_guest(&buf[..n], ctx.uid == 0);
        let len = u32::try_from(list.len()).map_err(|_| Errno::TOOBIG)?;
        Ok(Timed::now(match size {
            0 => Xattr::Size(len),
            s if len > s => return Err(Errno::RANGE),
            _ => Xattr::Data(list),
        }))
    }

    fn setxattr(
        &self,
        _ctx: &Context,
        nodeid: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        let inode = self.inode(nodeid)?;
        let host = self.xattr_map().to_host(name)?;
        let flags = rustix::fs::XattrFlags::from_bits(flags).ok_or(Errno::INVAL)?;
        rustix::fs::setxattr(Self::proc_path(&inode).as_str(), &*host, value, flags)?;
        Ok(Timed::now(()))
    }

    fn removexattr(&self, _ctx: &Context, nodeid: u64, name: &[u8]) -> FsResult<()> {
        let inode = self.inode(nodeid)?;
        let host = self.xattr_map().to_host(name)?;
        rustix::fs::removexattr(Self::proc_path(&inode).as_str(), &*host)?;
        Ok(Timed::now(()))
    }

    /// FALLOCATE on the handle's file, every mode the host takes.
    fn fallocate(&self, _ctx: &Context, range: Fallocate) -> FsResult<()> {
        let h = self.handle(range.fh)?;
        let end = range.offset.checked_add(range.length).ok_or(Errno::FBIG)?;
        if end > i64::MAX as u64 {
            return Err(Errno::FBIG);
        }
        let mode = rustix::fs::FallocateFlags::from_bits(range.mode).ok_or(Errno::OPNOTSUPP)?;
        rustix::fs::fallocate(&h.file, mode, range.offset, range.length)?;
        Ok(Timed::now(()))
    }

    /// LSEEK: SEEK_DATA / SEEK_HOLE on the host's layout (the guest
    /// answers SEEK_SET / CUR / END itself).
    fn lseek(
        &self,
        _ctx: &Context,
        _nodeid: u64,
        fh: u64,
        offset: u64,
        whence: u32,
    ) -> FsResult<u64> {
        let h = self.handle(fh)?;
        let offset = i64::try_from(offset).map_err(|_| Errno::NXIO)?;
        let pos = match whence as i32 {
            libc::SEEK_DATA => rustix::fs::SeekFrom::Data(offset as u64),
            libc::SEEK_HOLE => rustix::fs::SeekFrom::Hole(offset as u64),
            libc::SEEK_SET => rustix::fs::SeekFrom::Start(offset as u64),
            libc::SEEK_END => rustix::fs::SeekFrom::End(offset),
            _ => return Err(Errno::INVAL),
        };
        Ok(Timed::now(rustix::fs::seek(&h.file, pos)?))
    }

    fn copy_file_range(&self, _ctx: &Context, c: CopyRange) -> FsResult<usize> {
        let from = self.handle(c.fh_in)?;
        let to = self.handle(c.fh_out)?;
        for (off, len) in [(c.off_in, c.len), (c.off_out, c.len)] {
            if off
                .checked_add(len)
                .map_or(true, |end| end > i64::MAX as u64)
            {
                return Err(Errno::INVAL);
            }
        }
        let (mut off_in, mut off_out) = (c.off_in, c.off_out);
        let len = usize::try_from(c.len).map_err(|_| Errno::INVAL)?;
        let n = rustix::fs::copy_file_range(
            &from.file,
            Some(&mut off_in),
            &to.file,
            Some(&mut off_out),
            len,
        )?;
        Ok(Timed::now(n))
    }

    fn getlk(&self, ctx: &Context, nodeid: u64, lock: &LockRequest) -> FsResult<abi::FileLock> {
        let fd = self.lock_fd(ctx, nodeid, lock)?;
        let key = self
            .file_key(nodeid, Some(lock.fh))
            .or_else(|_| self.file_key(nodeid, None))?;
        Ok(Timed::now(self.locks.test(key, &fd, lock)?))
    }

    fn setlk(&self, ctx: &Context, nodeid: u64, lock: &LockRequest) -> FsResult<()> {
        let fd = self.lock_fd(ctx, nodeid, lock)?;
        locks::try_lock(&fd, lock)?;
        Ok(Timed::now(()))
    }

    fn lock_waiter(
        &self,
        ctx: &Context,
        nodeid: u64,
        lock: &LockRequest,
    ) -> Result<LockWaiter, Errno> {
        Ok(locks::waiter(self.lock_fd(ctx, nodeid, lock)?, *lock))
    }

    fn unlock_owner(&self, _ctx: &Context, nodeid: u64, owner: u64, flock: bool) {
        if let Ok(inode) = self.inode(nodeid) {
            self.locks.drop_owner(inode.key, owner, flock);
        }
    }

    fn syncfs(&self, _ctx: &Context, _nodeid: u64) -> FsResult<()> {
        // `root` is O_PATH, which syncfs refuses: the directory itself.
        let dir = rustix::fs::openat(
            &self.root,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        rustix::fs::syncfs(&dir)?;
        Ok(Timed::now(()))
    }

    /// ACCESS as the caller (effective ids, as the guest's access(2) with
    /// AT_EACCESS; a guest mounted with default_permissions never asks).
    fn access(&self, ctx: &Context, nodeid: u64, mask: u32) -> FsResult<()> {
        let inode = self.inode(nodeid)?;
        let access = rustix::fs::Access::from_bits(mask).ok_or(Errno::INVAL)?;
        let _caller = self.as_caller(ctx)?;
        rustix::fs::accessat(
            &self.proc_self_fd,
            DecInt::from_fd(&inode.fd),
            access,
            AtFlags::EACCESS,
        )?;
        Ok(Timed::now(()))
    }

    fn host_file(&self, nodeid: u64, fh: Option<u64>, for_pool: bool) -> Result<HostFile, Errno> {
        let inode = match fh {
            Some(fh) => self.handle(fh)?.inode.clone(),
            None => self.inode(nodeid)?,
        };
        let st = rustix::fs::fstat(&inode.fd)?;
        let pool_file = if for_pool && inode.is_reg() {
            Some(self.open_for_pool(&inode)?)
        } else {
            None
        };
        Ok(HostFile {
            key: inode.key,
            size: st.st_size as u64,
            is_dir: inode.is_dir(),
            pool_file,
        })
    }

    fn file_key(&self, nodeid: u64, fh: Option<u64>) -> Result<FileKey, Errno> {
        match fh {
            Some(fh) => Ok(self.handle(fh)?.inode.key),
            None => Ok(self.inode(nodeid)?.key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{BufferIo, PayloadIo};

    const C: Context = Context {
        uid: 0,
        gid: 0,
        pid: 0,
        arrival_ns: 0,
    };

    /// Whether the tests run as root (what credential switches need); a
    /// run without root under CI is a failure, not a skip.
    pub(super) fn running_as_root() -> bool {
        let root = rustix::process::geteuid().is_root();
        assert!(
            root || std::env::var("CI").as_deref() != Ok("true"),
            "credential tests need root (CI=true)"
        );
        root
    }

    fn fs(dir: &Path) -> PassthroughFs {
        PassthroughFs::new(dir, CacheMode::Auto).unwrap()
    }

    /// The reply value (the passthrough never delays one).
    fn v<T>(r: FsResult<T>) -> Result<T, Errno> {
        r.map(|t| t.value)
    }

    fn at(parent: u64, name: &[u8]) -> Named<'_> {
        Named { parent, name }
    }

    fn create(fs: &PassthroughFs, parent: u64, name: &[u8], flags: u32) -> Result<Created, Errno> {
        let how = Creation {
            mode: 0o644,
            umask: 0o022,
            flags,
            open_flags: 0,
        };
        v(fs.create(&C, at(parent, name), how))
    }

    /// Up to `size` bytes of `fh` at `offset`, through the READ path.
    fn read(fs: &PassthroughFs, fh: u64, offset: u64, size: u32) -> Vec<u8> {
        let mut io = BufferIo {
            req: &[],
            data: Vec::new(),
        };
        let payload: &mut dyn PayloadIo = &mut io;
        let io_args = FileIo {
            nodeid: 0,
            fh,
            offset,
            size,
            flags: 0,
            at: 0,
            payload,
        };
        v(FileSystem::read(fs, &C, io_args)).unwrap();
        io.data
    }

    /// `data` to `fh` at `offset`, through the WRITE path.
    fn write(fs: &PassthroughFs, fh: u64, offset: u64, data: &[u8]) {
        let mut io = BufferIo {
            req: data,
            data: Vec::new(),
        };
        let io_args = FileIo {
            nodeid: 0,
            fh,
            offset,
            size: data.len() as u32,
            flags: 0,
            at: 0,
            payload: &mut io,
        };
        assert_eq!(v(FileSystem::write(fs, &C, io_args)).unwrap(), data.len());
    }

    #[test]
    fn names_are_checked() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b"] {
            assert_eq!(check_name(bad), Err(Errno::INVAL), "{bad:?}");
        }
        assert!(check_name(b"...").is_ok());
        assert!(check_name(b"a").is_ok());
    }

    #[test]
    fn dotdot_and_slash_cannot_escape() {
        let outer = tempfile::tempdir().unwrap();
        std::fs::write(outer.path().join("secret"), b"x").unwrap();
        let shared = outer.path().join("share");
        std::fs::create_dir(&shared).unwrap();
        let fs = fs(&shared);
        assert_eq!(
            v(fs.lookup(&C, abi::ROOT_ID, b"..")).unwrap_err(),
            Errno::INVAL
        );
        assert_eq!(
            v(fs.lookup(&C, abi::ROOT_ID, b"../secret")).unwrap_err(),
            Errno::INVAL
        );
        let abs = outer.path().join("secret");
        let abs = abs.as_os_str().as_encoded_bytes();
        assert_eq!(
            v(fs.lookup(&C, abi::ROOT_ID, abs)).unwrap_err(),
            Errno::INVAL
        );
    }

    #[test]
    fn symlinks_are_not_followed() {
        let outer = tempfile::tempdir().unwrap();
        std::fs::write(outer.path().join("secret"), b"top secret").unwrap();
        std::fs::create_dir(outer.path().join("outside")).unwrap();
        let shared = outer.path().join("share");
        std::fs::create_dir(&shared).unwrap();
        std::os::unix::fs::symlink(outer.path().join("secret"), shared.join("link")).unwrap();
        std::os::unix::fs::symlink(outer.path().join("outside"), shared.join("dirlink")).unwrap();
        let fs = fs(&shared);
        // The link itself is visible, as a link.
        let e = v(fs.lookup(&C, abi::ROOT_ID, b"link")).unwrap();
        assert_eq!(e.attr.mode & libc::S_IFMT, libc::S_IFLNK);
        // Opening it does not reach the target.
        assert_eq!(
            v(fs.open(&C, e.nodeid, libc::O_RDONLY as u32, 0)).unwrap_err(),
            Errno::LOOP
        );
        // Creating through it does not either.
        let err = create(&fs, abi::ROOT_ID, b"link", 0o1).unwrap_err();
        assert_eq!(err, Errno::LOOP);
        // A symlinked directory cannot be used as a directory.
        let d = v(fs.lookup(&C, abi::ROOT_ID, b"dirlink")).unwrap();
        assert!(v(fs.lookup(&C, d.nodeid, b"anything")).is_err());
        assert!(v(fs.opendir(&C, d.nodeid)).is_err());
        assert!(create(&fs, d.nodeid, b"f", 0o1).is_err());
        assert!(!outer.path().join("outside/f").exists());
        assert_eq!(
            std::fs::read(outer.path().join("secret")).unwrap(),
            b"top secret"
        );
    }

    #[test]
    fn rename_swap_race_cannot_redirect_an_open() {
        // Look a file up, then swap a symlink in under its name: the open
        // goes to the inode looked up, not to the new link's target.
        let outer = tempfile::tempdir().unwrap();
        std::fs::write(outer.path().join("secret"), b"secret").unwrap();
        let shared = outer.path().join("share");
        std::fs::create_dir(&shared).unwrap();
        std::fs::write(shared.join("f"), b"public").unwrap();
        let fs = fs(&shared);
        let e = v(fs.lookup(&C, abi::ROOT_ID, b"f")).unwrap();
        std::fs::rename(shared.join("f"), shared.join("g")).unwrap();
        std::os::unix::fs::symlink(outer.path().join("secret"), shared.join("f")).unwrap();
        let fh = v(fs.open(&C, e.nodeid, libc::O_RDONLY as u32, 0))
            .unwrap()
            .fh;
        assert_eq!(read(&fs, fh, 0, 100), b"public");
    }

    #[test]
    fn create_write_read_readdir_unlink() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let (e, opened) = create(&fs, abi::ROOT_ID, b"a", libc::O_RDWR as u32).unwrap();
        let fh = opened.fh;
        write(&fs, fh, 0, b"hello");
        assert_eq!(read(&fs, fh, 1, 10), b"ello");
        assert_eq!(v(fs.getattr(&C, e.nodeid, None)).unwrap().attr.size, 5);
        let how = Creation {
            mode: 0o755,
            ..Creation::default()
        };
        let m = v(fs.mkdir(&C, at(abi::ROOT_ID, b"d"), how)).unwrap();
        assert_eq!(m.attr.mode & libc::S_IFMT, libc::S_IFDIR);
        let dfh = v(fs.opendir(&C, abi::ROOT_ID)).unwrap().fh;
        let mut names = Vec::new();
        v(fs.readdir(&C, dfh, 0, &mut |d| {
            names.push(String::from_utf8_lossy(&d.name).into_owned());
            true
        }))
        .unwrap();
        names.sort();
        assert_eq!(names, [".", "..", "a", "d"]);
        fs.release(&C, e.nodeid, fh);
        v(fs.unlink(&C, at(abi::ROOT_ID, b"a"), false)).unwrap();
        v(fs.unlink(&C, at(abi::ROOT_ID, b"d"), true)).unwrap();
        fs.forget(&C, e.nodeid, 1);
        fs.forget(&C, m.nodeid, 1);
        fs.release(&C, abi::ROOT_ID, dfh);
        assert_eq!(fs.counts(), (1, 0));
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
    fn names_over_255_bytes_are_too_long() {
        assert_eq!(check_name(&[b'a'; 255]), Ok(&[b'a'; 255][..]));
        assert_eq!(check_name(&[b'a'; 256]), Err(Errno::NAMETOOLONG));
        assert_eq!(check_name(&[b'a'; 1024]), Err(Errno::NAMETOOLONG));
    }

    #[test]
    fn link_shares_the_inode() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let (e, o) = create(&fs, abi::ROOT_ID, b"a", libc::O_RDWR as u32).unwrap();
        write(&fs, o.fh, 0, b"shared");
        let l = v(fs.link(&C, e.nodeid, at(abi::ROOT_ID, b"b"))).unwrap();
        assert_eq!(l.nodeid, e.nodeid, "one inode, one node id");
        assert_eq!(l.attr.nlink, 2);
        assert_eq!(std::fs::read(dir.path().join("b")).unwrap(), b"shared");
        assert_eq!(
            v(fs.link(&C, e.nodeid, at(abi::ROOT_ID, b"b"))).unwrap_err(),
            Errno::EXIST
        );
        let d = v(fs.mkdir(
            &C,
            at(abi::ROOT_ID, b"d"),
            Creation {
                mode: 0o755,
                ..Creation::default()
            },
        ))
        .unwrap();
        assert_eq!(
            v(fs.link(&C, d.nodeid, at(abi::ROOT_ID, b"dl"))).unwrap_err(),
            Errno::PERM
        );
    }

    #[test]
    fn mknod_makes_fifos_and_sockets_that_are_never_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        for (name, kind) in [(&b"p"[..], libc::S_IFIFO), (b"s", libc::S_IFSOCK)] {
            let how = Creation {
                mode: kind | 0o640,
                ..Creation::default()
            };
            let e = v(fs.mknod(&C, at(abi::ROOT_ID, name), how, 0)).unwrap();
            assert_eq!(e.attr.mode & libc::S_IFMT, kind);
            assert_eq!(e.attr.mode & 0o7777, 0o640, "the mode asked for");
            assert_eq!(
                v(fs.open(&C, e.nodeid, libc::O_RDONLY as u32, 0)).unwrap_err(),
                Errno::BADF
            );
        }
        let bad = Creation {
            mode: 0o170000 | 0o600,
            ..Creation::default()
        };
        assert_eq!(
            v(fs.mknod(&C, at(abi::ROOT_ID, b"x"), bad, 0)).unwrap_err(),
            Errno::INVAL
        );
    }

    #[test]
    fn tmpfile_is_unnamed_until_linked() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let how = Creation {
            mode: 0o600,
            flags: libc::O_RDWR as u32,
            ..Creation::default()
        };
        let (e, o) = v(fs.tmpfile(&C, abi::ROOT_ID, how)).unwrap();
        assert_eq!(e.attr.nlink, 0);
        write(&fs, o.fh, 0, b"tmp");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        v(fs.link(&C, e.nodeid, at(abi::ROOT_ID, b"named"))).unwrap();
        assert_eq!(std::fs::read(dir.path().join("named")).unwrap(), b"tmp");
    }

    #[test]
    fn xattrs_round_trip_with_the_privileged_namespaces_mapped() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let (e, _) = create(&fs, abi::ROOT_ID, b"f", libc::O_RDWR as u32).unwrap();
        let n = e.nodeid;
        v(fs.setxattr(&C, n, b"user.k", b"v1", 0)).unwrap();
        v(fs.setxattr(&C, n, b"security.k", b"sec", 0)).unwrap();
        assert_eq!(v(fs.getxattr(&C, n, b"user.k", 0)).unwrap(), Xattr::Size(2));
        assert_eq!(
            v(fs.getxattr(&C, n, b"user.k", 64)).unwrap(),
            Xattr::Data(b"v1".to_vec())
        );
        assert_eq!(
            v(fs.getxattr(&C, n, b"user.k", 1)).unwrap_err(),
            Errno::RANGE
        );
        assert_eq!(
            v(fs.getxattr(&C, n, b"user.none", 64)).unwrap_err(),
            Errno::NODATA
        );
        // The host holds the guest's security.* under user.cxlfs.
        let host =
            rustix::fs::getxattr_query(dir.path().join("f"), "user.cxlfs.security.k").unwrap();
        assert_eq!(host, 3);
        assert!(rustix::fs::getxattr_query(dir.path().join("f"), "security.k").is_err());
        let list = v(fs.listxattr(&C, n, 4096)).unwrap();
        let Xattr::Data(list) = list else {
            panic!("{list:?}")
        };
        let mut names: Vec<&[u8]> = list.split(|&b| b == 0).filter(|n| !n.is_empty()).collect();
        names.sort();
        assert_eq!(names, [&b"security.k"[..], b"user.k"]);
        assert_eq!(
            v(fs.listxattr(&C, n, 0)).unwrap(),
            Xattr::Size(list.len() as u32)
        );
        assert_eq!(v(fs.listxattr(&C, n, 3)).unwrap_err(), Errno::RANGE);
        let create_flag = libc::XATTR_CREATE as u32;
        assert_eq!(
            v(fs.setxattr(&C, n, b"user.k", b"x", create_flag)).unwrap_err(),
            Errno::EXIST
        );
        let replace = libc::XATTR_REPLACE as u32;
        assert_eq!(
            v(fs.setxattr(&C, n, b"user.new", b"x", replace)).unwrap_err(),
            Errno::NODATA
        );
        v(fs.removexattr(&C, n, b"user.k")).unwrap();
        assert_eq!(
            v(fs.removexattr(&C, n, b"user.k")).unwrap_err(),
            Errno::NODATA
        );
        assert_eq!(
            v(fs.setxattr(&C, n, b"system.x", b"x", 0)).unwrap_err(),
            Errno::OPNOTSUPP
        );
    }

    #[test]
    fn punch_hole_seek_data_and_copy_range() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let (e, o) = create(&fs, abi::ROOT_ID, b"f", libc::O_RDWR as u32).unwrap();
        let fh = o.fh;
        let data = vec![7u8; 3 << 20];
        write(&fs, fh, 0, &data);
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let range = |mode: i32, offset: u64, length: u64| Fallocate {
            nodeid: e.nodeid,
            fh,
            offset,
            length,
            mode: mode as u32,
        };
        v(fs.fallocate(&C, range(punch, 1 << 20, 1 << 20))).unwrap();
        assert_eq!(read(&fs, fh, 1 << 20, 8), vec![0u8; 8]);
        let seek = |off, whence| v(fs.lseek(&C, e.nodeid, fh, off, whence as u32));
        assert_eq!(seek(0, libc::SEEK_HOLE).unwrap(), 1 << 20);
        assert_eq!(seek(1 << 20, libc::SEEK_DATA).unwrap(), 2 << 20);
        assert_eq!(seek(4 << 20, libc::SEEK_DATA).unwrap_err(), Errno::NXIO);
        assert_eq!(seek(0, 99).unwrap_err(), Errno::INVAL);
        // Allocation with KEEP_SIZE keeps the size; without, it grows.
        v(fs.fallocate(&C, range(libc::FALLOC_FL_KEEP_SIZE, 0, 8 << 20))).unwrap();
        assert_eq!(
            v(fs.getattr(&C, e.nodeid, None)).unwrap().attr.size,
            3 << 20
        );
        v(fs.fallocate(&C, range(0, 0, 4 << 20))).unwrap();
        assert_eq!(
            v(fs.getattr(&C, e.nodeid, None)).unwrap().attr.size,
            4 << 20
        );
        assert_eq!(
            v(fs.fallocate(&C, range(0, u64::MAX, 2))).unwrap_err(),
            Errno::FBIG
        );
        assert_eq!(
            v(fs.fallocate(&C, range(1 << 30, 0, 2))).unwrap_err(),
            Errno::OPNOTSUPP
        );
        // Copy 4 KiB of data into a second file.
        let (e2, o2) = create(&fs, abi::ROOT_ID, b"g", libc::O_RDWR as u32).unwrap();
        let copy = CopyRange {
            nodeid_in: e.nodeid,
            fh_in: fh,
            off_in: 4096,
            nodeid_out: e2.nodeid,
            fh_out: o2.fh,
            off_out: 100,
            len: 4096,
        };
        assert_eq!(v(fs.copy_file_range(&C, copy)).unwrap(), 4096);
        let g = std::fs::read(dir.path().join("g")).unwrap();
        assert_eq!(g.len(), 4196);
        assert!(g[..100].iter().all(|&b| b == 0) && g[100..].iter().all(|&b| b == 7));
        let past = CopyRange {
            off_out: u64::MAX - 10,
            ..copy
        };
        assert_eq!(v(fs.copy_file_range(&C, past)).unwrap_err(), Errno::INVAL);
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

    #[test]
    fn times_are_set_on_symlinks_themselves() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t"), b"x").unwrap();
        std::os::unix::fs::symlink("t", dir.path().join("l")).unwrap();
        let fs = fs(dir.path());
        let l = v(fs.lookup(&C, abi::ROOT_ID, b"l")).unwrap();
        let set = SetattrIn {
            valid: fattr::MTIME,
            mtime: 1000,
            ..SetattrIn::default()
        };
        let a = v(fs.setattr(&C, l.nodeid, &set)).unwrap();
        assert_eq!(a.attr.mtime, 1000);
        let target = std::fs::metadata(dir.path().join("t")).unwrap();
        assert_ne!(std::os::unix::fs::MetadataExt::mtime(&target), 1000);
    }

    #[test]
    fn access_syncfs() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let (e, _) = create(&fs, abi::ROOT_ID, b"f", libc::O_RDWR as u32).unwrap();
        v(fs.access(&C, e.nodeid, libc::R_OK as u32)).unwrap();
        assert_eq!(
            v(fs.access(&C, e.nodeid, 1 << 20)).unwrap_err(),
            Errno::INVAL
        );
        v(fs.syncfs(&C, abi::ROOT_ID)).unwrap();
    }

    #[test]
    fn a_setattr_that_changes_nothing_is_the_guests_chown_minus_one() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let (e, _) = create(&fs, abi::ROOT_ID, b"f", libc::O_RDWR as u32).unwrap();
        let chmod = SetattrIn {
            valid: fattr::MODE,
            mode: 0o4755,
            ..SetattrIn::default()
        };
        v(fs.setattr(&C, e.nodeid, &chmod)).unwrap();
        let ctime_only = SetattrIn {
            valid: fattr::CTIME,
            ..SetattrIn::default()
        };
        let a = v(fs.setattr(&C, e.nodeid, &ctime_only)).unwrap();
        assert_eq!(a.attr.mode & 0o7777, 0o755, "S_ISUID goes, as on the host");
    }
}
