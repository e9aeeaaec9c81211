//! Attributes: a host stat as the guest's `fuse_attr`, GETATTR, SETATTR
//! (mode, owner, size, times), clearing set-id bits, STATFS and ACCESS.

use super::{attr_from_stat, Inode, PassthroughFs};
use crate::abi::{self, fattr, Attr, SetattrIn};
use crate::server::{AttrReply, Context, FsResult, Timed};
use rustix::fs::{AtFlags, Mode, OFlags, Stat, Timespec, Timestamps, UTIME_NOW, UTIME_OMIT};
use rustix::io::Errno;
use rustix::path::DecInt;

impl PassthroughFs {
    /// A host stat as the guest sees it (owner and group translated).
    pub(super) fn attr(&self, st: &Stat) -> Attr {
        self.ids.attr_to_guest(attr_from_stat(st))
    }

    pub(super) fn attr_reply(&self, attr: Attr) -> Timed<AttrReply> {
        Timed::now(AttrReply {
            attr,
            timeout: self.cache.timeout(),
        })
    }

    /// Clears S_ISUID, and S_ISGID when the group may execute, of a
    /// regular file (what the kernel does on a write or truncation by a
    /// caller without CAP_FSETID): the guest asked for it under
    /// HANDLE_KILLPRIV_V2, and the daemon, root, would not lose them itself.
    pub(super) fn kill_suidgid(&self, inode: &Inode) -> Result<(), Errno> {
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
        let inode = self.inode(nodeid)?;
        let handle = match (valid & fattr::FH != 0).then_some(a.fh) {
            Some(fh) => Some(self.handle(fh)?),
            None => None,
        };
        // Checked before anything changes: a guest-chosen size beyond
        // off_t is what ftruncate(2) refuses with EINVAL.
        let size = if valid & fattr::SIZE != 0 {
            Some(i64::try_from(a.size).map_err(|_| Errno::INVAL)?)
        } else {
            None
        };
        self.set_mode_and_owner(ctx, &inode, a)?;
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
        self.set_times(&inode, a)?;
        Ok(self.attr(&rustix::fs::fstat(&inode.fd)?))
    }

    /// SETATTR's mode, uid and gid (the caller must own the file or be
    /// guest root); a symlink's mode cannot change.
    fn set_mode_and_owner(&self, ctx: &Context, inode: &Inode, a: &SetattrIn) -> Result<(), Errno> {
        let valid = a.valid;
        let (mode, uid, gid) = (a.mode, a.uid, a.gid);
        if valid & (fattr::MODE | fattr::UID | fattr::GID) != 0 {
            let creds = self.ids.host_creds(ctx)?;
            let owner = rustix::fs::fstat(&inode.fd)?.st_uid;
            if !self.ids.may_change_owned(ctx, creds, owner) {
                return Err(Errno::PERM);
            }
        }
        if valid & fattr::MODE != 0 {
            if inode.kind == libc::S_IFLNK {
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
        Ok(())
    }

    /// SETATTR's atime and mtime (each a time, "now", or left alone); a
    /// symlink's own times, not its target's.
    fn set_times(&self, inode: &Inode, a: &SetattrIn) -> Result<(), Errno> {
        let valid = a.valid;
        let atime = (a.atime, a.atimensec);
        let mtime = (a.mtime, a.mtimensec);
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
            if inode.kind == libc::S_IFLNK {
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
        Ok(())
    }

    pub(super) fn getattr(
        &self,
        _ctx: &Context,
        nodeid: u64,
        fh: Option<u64>,
    ) -> FsResult<AttrReply> {
        let st = match fh {
            Some(fh) => rustix::fs::fstat(&self.handle(fh)?.file)?,
            None => rustix::fs::fstat(&self.inode(nodeid)?.fd)?,
        };
        Ok(self.attr_reply(self.attr(&st)))
    }

    pub(super) fn setattr(&self, ctx: &Context, nodeid: u64, a: &SetattrIn) -> FsResult<AttrReply> {
        Ok(self.attr_reply(self.set_attributes(ctx, nodeid, a)?))
    }

    pub(super) fn statfs(&self, _ctx: &Context, nodeid: u64) -> FsResult<abi::Kstatfs> {
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

    /// ACCESS as the caller (effective ids, as the guest's access(2) with
    /// AT_EACCESS; a guest mounted with default_permissions never asks).
    pub(super) fn access(&self, ctx: &Context, nodeid: u64, mask: u32) -> FsResult<()> {
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
}

#[cfg(test)]
mod tests {
    use crate::abi::{self, fattr, SetattrIn};
    use crate::passthrough::testing::{create, fs, v, C};
    use rustix::io::Errno;
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
}
