//! The inode table: the guest's node ids for host inodes (each held as an
//! `O_PATH | O_NOFOLLOW` fd), name checks, LOOKUP and FORGET, and the
//! [`InodeObserver`] told when a regular file enters and leaves it.

use super::{lock, PassthroughFs};
use crate::abi::{self, Attr, EntryOut};
use crate::ids::FileKey;
use crate::server::{Context, FsResult, Timed};
use rustix::fs::{Mode, OFlags, Stat};
use rustix::io::Errno;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
    pub(super) fn is_reg(&self) -> bool {
        self.kind == libc::S_IFREG
    }
    pub(super) fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }
}

/// Told when a regular file's inode enters and leaves a session's tables
/// (the pool keeps one reference per session that knows the file).
pub trait InodeObserver: Send + Sync + std::fmt::Debug {
    /// The session registered the regular file `key`.
    fn inode_added(&self, key: FileKey);
    /// The session forgot it; `deleted`: the host file has no links left.
    fn inode_dropped(&self, key: FileKey, deleted: bool);
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

impl PassthroughFs {
    pub(super) fn install_root(&self, st: &Stat) -> Result<(), Errno> {
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

    /// The inode for `nodeid`.
    pub fn inode(&self, nodeid: u64) -> Result<Arc<Inode>, Errno> {
        lock(&self.tables)
            .inodes
            .get(&nodeid)
            .map(|(i, _)| i.clone())
            .ok_or(Errno::BADF)
    }

    /// Number of live inodes (root included) and handles.
    pub fn counts(&self) -> (usize, usize) {
        let t = lock(&self.tables);
        (t.inodes.len(), t.handles.len())
    }

    pub(super) fn entry(&self, inode: &Inode, st: &Stat) -> EntryOut {
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
    pub(super) fn register(&self, fd: OwnedFd) -> Result<(Arc<Inode>, Stat), Errno> {
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
    pub(super) fn drop_refs(&self, nodeid: u64, n: u64) {
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
    pub(super) fn release_from_pool(&self, inode: &Inode) {
        if let Some(o) = self.observer.as_ref().filter(|_| inode.is_reg()) {
            let deleted = rustix::fs::fstat(&inode.fd).is_ok_and(|st| st.st_nlink == 0);
            o.inode_dropped(inode.key, deleted);
        }
    }

    pub(super) fn lookup(&self, _ctx: &Context, parent: u64, name: &[u8]) -> FsResult<EntryOut> {
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

    pub(super) fn forget(&self, _ctx: &Context, nodeid: u64, nlookup: u64) {
        self.drop_refs(nodeid, nlookup);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passthrough::testing::{fs, v, C};
    #[test]
    fn names_are_checked() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b"] {
            assert_eq!(check_name(bad), Err(Errno::INVAL), "{bad:?}");
        }
        assert!(check_name(b"...").is_ok());
        assert!(check_name(b"a").is_ok());
    }

    #[test]
    fn names_over_255_bytes_are_too_long() {
        assert_eq!(check_name(&[b'a'; 255]), Ok(&[b'a'; 255][..]));
        assert_eq!(check_name(&[b'a'; 256]), Err(Errno::NAMETOOLONG));
        assert_eq!(check_name(&[b'a'; 1024]), Err(Errno::NAMETOOLONG));
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
}
