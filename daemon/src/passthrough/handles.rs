//! Open files: the handle table, re-opening an inode for I/O through
//! `/proc/self/fd/N` (regular files and directories only), OPEN, RELEASE,
//! and the host file behind a node for the timing layer and the pool.

use super::{lock, Inode, PassthroughFs};
use crate::abi::{open_in_flags, EntryOut};
use crate::ids::FileKey;
use crate::server::{Context, FsResult, HostFile, Opened, Timed};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::path::DecInt;
use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// An open file or directory.
#[derive(Debug)]
pub struct Handle {
    /// The inode it was opened from.
    pub inode: Arc<Inode>,
    /// The open file.
    pub file: File,
    /// Serialises seek + getdents on directories.
    pub(super) dir_lock: Mutex<()>,
}

/// Open flags the guest may pass through (no O_DIRECT: our bounce buffers
/// are not aligned; no O_NOATIME / O_PATH / O_CREAT games).
pub(super) fn sanitize_open_flags(flags: u32) -> OFlags {
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
    /// The handle `fh`.
    pub fn handle(&self, fh: u64) -> Result<Arc<Handle>, Errno> {
        lock(&self.tables)
            .handles
            .get(&fh)
            .cloned()
            .ok_or(Errno::BADF)
    }

    /// OPEN of an existing regular file (never a special file) with the
    /// guest's access mode; O_TRUNC with `FUSE_OPEN_KILL_SUIDGID` also
    /// clears its set-id bits.
    pub(super) fn open_existing(
        &self,
        inode: Arc<Inode>,
        flags: u32,
        open_flags: u32,
    ) -> Result<u64, Errno> {
        let file = self.reopen(&inode, sanitize_open_flags(flags))?;
        if flags & libc::O_TRUNC as u32 != 0 && open_flags & open_in_flags::KILL_SUIDGID != 0 {
            self.kill_suidgid(&inode)?;
        }
        Ok(self.add_handle(inode, file))
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
    pub(super) fn reopen(&self, inode: &Inode, flags: OFlags) -> Result<File, Errno> {
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
    pub(super) fn register_opened(&self, file: File) -> Result<(EntryOut, u64), Errno> {
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

    pub(super) fn add_handle(&self, inode: Arc<Inode>, file: File) -> u64 {
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

    pub(super) fn open(
        &self,
        _ctx: &Context,
        nodeid: u64,
        flags: u32,
        open_flags: u32,
    ) -> FsResult<Opened> {
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

    pub(super) fn release(&self, _ctx: &Context, _nodeid: u64, fh: u64) {
        // OFD locks the guest took through this file end with it (the
        // guest keeps no record of remote locks, so it sends no unlock).
        self.locks.drop_handle(fh);
        lock(&self.tables).handles.remove(&fh);
    }

    pub(super) fn host_file(
        &self,
        nodeid: u64,
        fh: Option<u64>,
        for_pool: bool,
    ) -> Result<HostFile, Errno> {
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

    pub(super) fn file_key(&self, nodeid: u64, fh: Option<u64>) -> Result<FileKey, Errno> {
        match fh {
            Some(fh) => Ok(self.handle(fh)?.inode.key),
            None => Ok(self.inode(nodeid)?.key),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::abi;
    use crate::passthrough::testing::{create, fs, read, v, C};
    use rustix::io::Errno;
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
}
