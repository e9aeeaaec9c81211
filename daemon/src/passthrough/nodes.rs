//! Names in directories: CREATE, MKDIR, MKNOD, SYMLINK, LINK, TMPFILE,
//! UNLINK, RENAME and READLINK. New nodes are made as the caller, with the
//! mode the guest asked for.

use super::handles::sanitize_open_flags;
use super::{check_name, Inode, PassthroughFs};
use crate::abi::EntryOut;
use crate::server::{Context, Created, Creation, FsResult, Named, Opened, Timed};
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use rustix::path::DecInt;
use std::fs::File;
use std::os::fd::AsFd;

impl PassthroughFs {
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
    pub(super) fn restore_mode(&self, fd: &impl AsFd, want: Mode) -> Result<(), Errno> {
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

    pub(super) fn readlink(&self, _ctx: &Context, nodeid: u64) -> FsResult<Vec<u8>> {
        let inode = self.inode(nodeid)?;
        let target = rustix::fs::readlinkat(&inode.fd, "", Vec::new())?;
        Ok(Timed::now(target.into_bytes()))
    }

    /// SYMLINK: creates `name` -> `target` as the caller (the target is
    /// never resolved here).
    pub(super) fn symlink(
        &self,
        ctx: &Context,
        at: Named<'_>,
        target: &[u8],
    ) -> FsResult<EntryOut> {
        let name = check_name(at.name)?;
        let dir = self.inode(at.parent)?;
        {
            let _caller = self.as_caller(ctx)?;
            rustix::fs::symlinkat(target, &dir.fd, name)?;
        }
        self.lookup(ctx, at.parent, name)
    }

    /// MKDIR as the caller, with the mode the guest asked for.
    pub(super) fn mkdir(&self, ctx: &Context, at: Named<'_>, how: Creation) -> FsResult<EntryOut> {
        // mkdir(2) ignores set-id bits (`mkdir -m 2775` is a chmod after).
        let mode = Mode::from_raw_mode(self.creation_mode(how, true).as_raw_mode() & 0o1777);
        self.make_node(ctx, at, mode, OFlags::DIRECTORY, |dir, name| {
            rustix::fs::mkdirat(&dir.fd, name, mode)
        })
    }

    /// MKNOD as the caller: FIFOs, sockets, device nodes (the daemon never
    /// opens any of them: see `reopen`) and regular files.
    pub(super) fn mknod(
        &self,
        ctx: &Context,
        at: Named<'_>,
        how: Creation,
        rdev: u32,
    ) -> FsResult<EntryOut> {
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

    /// LINK: the host `linkat` of the inode itself (through its /proc
    /// path: an O_TMPFILE file gets its first name this way too).
    pub(super) fn link(&self, ctx: &Context, nodeid: u64, at: Named<'_>) -> FsResult<EntryOut> {
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

    /// CREATE: a new file made as the caller with the mode asked for, or —
    /// without O_EXCL — the existing one opened as OPEN would (so never a
    /// FIFO or device node, and no change to its owner).
    pub(super) fn create(&self, ctx: &Context, at: Named<'_>, how: Creation) -> FsResult<Created> {
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

    /// TMPFILE: an O_TMPFILE file in `parent`, made as the caller and
    /// opened with the guest's access mode.
    pub(super) fn tmpfile(&self, ctx: &Context, parent: u64, how: Creation) -> FsResult<Created> {
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

    pub(super) fn unlink(&self, _ctx: &Context, at: Named<'_>, dir: bool) -> FsResult<()> {
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

    pub(super) fn rename(
        &self,
        _ctx: &Context,
        from: Named<'_>,
        to: Named<'_>,
        flags: u32,
    ) -> FsResult<()> {
        let oldname = check_name(from.name)?;
        let newname = check_name(to.name)?;
        let od = self.inode(from.parent)?;
        let nd = self.inode(to.parent)?;
        let flags = rustix::fs::RenameFlags::from_bits(flags).ok_or(Errno::INVAL)?;
        rustix::fs::renameat_with(&od.fd, oldname, &nd.fd, newname, flags)?;
        Ok(Timed::now(()))
    }
}

#[cfg(test)]
mod tests {
    use crate::abi;
    use crate::passthrough::testing::{at, create, fs, read, v, write, C};
    use crate::server::Creation;
    use rustix::io::Errno;
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
}
