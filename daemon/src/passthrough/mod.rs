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
//! asked for (see [`PassthroughFs::creation_mode`] for the umask). Files are opened
//! with the access mode the guest asked for.
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
//!
//! The operations are grouped by job: the inode table and LOOKUP
//! (`inodes`), open files (`handles`), attributes (`attrs`), names in
//! directories (`nodes`), directory reading (`dirs`), file data (`data`),
//! space (`space`), extended attributes ([`xattr`]) and locks ([`locks`]);
//! `filesystem` hands each [`FileSystem`](crate::server::FileSystem)
//! operation to them.

mod attrs;
mod cache_mode;
pub mod creds;
mod data;
mod dirs;
mod filesystem;
mod handles;
pub mod idmap;
mod inodes;
pub mod locks;
mod nodes;
mod space;
#[cfg(test)]
mod testing;
pub mod xattr;

pub use crate::server::DirEntry;
pub use cache_mode::CacheMode;
pub use creds::GuestIds;
pub use handles::Handle;
pub use idmap::{IdMap, ParseIdMapError};
pub use inodes::{attr_from_stat, check_name, Inode, InodeObserver};

use crate::abi;
use crate::ids::FileKey;
use locks::LockTable;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

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

/// The session's inodes (with their FUSE lookup counts) and open handles.
#[derive(Debug, Default)]
struct Tables {
    inodes: HashMap<u64, (Arc<Inode>, u64)>,
    by_key: HashMap<FileKey, u64>,
    handles: HashMap<u64, Arc<Handle>>,
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

use crate::sync::lock;

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

    /// Translates ids and strips set-id bits as `ids` says.
    pub fn with_guest_ids(mut self, ids: GuestIds) -> Self {
        self.ids = ids;
        self
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
}
