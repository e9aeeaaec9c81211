//! Extended attributes: which names a guest may use, and where each lives
//! on the host (virtiofsd's `--xattrmap` idea, with one fixed map).
//!
//! The daemon is root on the host, so a guest's `trusted.*` or
//! `security.*` attribute written verbatim would act on the host: a
//! `security.capability` would give a host binary file capabilities, a
//! `security.selinux` would relabel a host file. Those namespaces are
//! therefore stored under [`HOST_PREFIX`] in the host's `user.*` space,
//! where they mean nothing to the host and everything to the guest:
//!
//! | guest name | host name |
//! | --- | --- |
//! | `user.X` | `user.X` |
//! | `trusted.X`, `security.X` | `user.cxlfs.trusted.X`, `user.cxlfs.security.X` |
//! | `user.cxlfs.X` (a guest's own name that looks mapped) | `user.cxlfs.user.cxlfs.X` |
//! | `system.posix_acl_access`, `system.posix_acl_default` | the same, when ids are not translated; `EOPNOTSUPP` otherwise |
//! | any other `system.*` or namespace | `EOPNOTSUPP` |
//!
//! LISTXATTR maps back and hides what a guest could not have set (the
//! host's own `trusted.*` / `security.*`), and `trusted.*` from callers
//! other than guest root. Linux allows `user.*` only on regular files and
//! directories, so a guest's `trusted.*` / `security.*` attribute on a
//! symlink, FIFO, socket or device node gets EPERM where ext4 would take
//! it (virtiofsd's `user.virtiofs.` map has the same limit; the
//! `trusted.virtiofs.` alternative needs CAP_SYS_ADMIN, which the daemon
//! drops).

use std::borrow::Cow;

use super::{Inode, PassthroughFs};
use crate::server::{Context, FsResult, Timed, Xattr};
use rustix::io::Errno;

/// Where the namespaces a guest must not write verbatim live on the host.
pub const HOST_PREFIX: &[u8] = b"user.cxlfs.";
/// Longest attribute name the host takes (`XATTR_NAME_MAX`).
const NAME_MAX: usize = 255;
const ACLS: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];

/// How guest names map to host names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XattrMap {
    /// POSIX ACLs pass through (their entries hold raw ids, so only when
    /// guest and host ids are the same).
    pub acls: bool,
}

impl XattrMap {
    /// The host name of guest attribute `name`.
    pub fn to_host<'a>(self, name: &'a [u8]) -> Result<Cow<'a, [u8]>, Errno> {
        let mapped = name.starts_with(HOST_PREFIX)
            || name.starts_with(b"trusted.")
            || name.starts_with(b"security.");
        if mapped {
            let host = [HOST_PREFIX, name].concat();
            if host.len() > NAME_MAX {
                return Err(Errno::RANGE);
            }
            return Ok(Cow::Owned(host));
        }
        if name.starts_with(b"user.") {
            return Ok(Cow::Borrowed(name));
        }
        if ACLS.contains(&name) {
            return match self.acls {
                true => Ok(Cow::Borrowed(name)),
                false => Err(Errno::OPNOTSUPP),
            };
        }
        Err(Errno::OPNOTSUPP)
    }

    /// The guest name of host attribute `host`, if a guest may see it.
    pub fn to_guest(self, host: &[u8]) -> Option<&[u8]> {
        if let Some(name) = host.strip_prefix(HOST_PREFIX) {
            return Some(name);
        }
        if host.starts_with(b"user.") || (self.acls && ACLS.contains(&host)) {
            return Some(host);
        }
        None
    }

    /// A host LISTXATTR list (NUL-terminated names) as the guest sees it;
    /// `trusted.*` only for a `privileged` caller.
    pub fn list_to_guest(&self, host: &[u8], privileged: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(host.len());
        for name in host.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            let guest = self.to_guest(name);
            if let Some(g) = guest.filter(|g| privileged || !g.starts_with(b"trusted.")) {
                out.extend_from_slice(g);
                out.push(0);
            }
        }
        out
    }
}

impl PassthroughFs {
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

    pub(super) fn getxattr(
        &self,
        _ctx: &Context,
        nodeid: u64,
        name: &[u8],
        size: u32,
    ) -> FsResult<Xattr> {
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

    pub(super) fn listxattr(&self, ctx: &Context, nodeid: u64, size: u32) -> FsResult<Xattr> {
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

    pub(super) fn setxattr(
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

    pub(super) fn removexattr(&self, _ctx: &Context, nodeid: u64, name: &[u8]) -> FsResult<()> {
        let inode = self.inode(nodeid)?;
        let host = self.xattr_map().to_host(name)?;
        rustix::fs::removexattr(Self::proc_path(&inode).as_str(), &*host)?;
        Ok(Timed::now(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi;
    use crate::passthrough::testing::{create, fs, v, C};

    const MAP: XattrMap = XattrMap { acls: true };

    #[test]
    fn privileged_namespaces_are_stored_under_the_prefix() {
        assert_eq!(&*MAP.to_host(b"user.a").unwrap(), b"user.a");
        assert_eq!(
            &*MAP.to_host(b"security.capability").unwrap(),
            b"user.cxlfs.security.capability"
        );
        assert_eq!(
            &*MAP.to_host(b"trusted.x").unwrap(),
            b"user.cxlfs.trusted.x"
        );
        // A guest cannot forge a mapped name: its own gets prefixed again.
        assert_eq!(
            &*MAP.to_host(b"user.cxlfs.trusted.x").unwrap(),
            b"user.cxlfs.user.cxlfs.trusted.x"
        );
        assert_eq!(MAP.to_host(b"system.foo").unwrap_err(), Errno::OPNOTSUPP);
        assert_eq!(MAP.to_host(b"other.x").unwrap_err(), Errno::OPNOTSUPP);
        let long = [b"trusted.".as_slice(), &[b'a'; 240]].concat();
        assert_eq!(MAP.to_host(&long).unwrap_err(), Errno::RANGE);
    }

    #[test]
    fn acls_pass_only_without_id_translation() {
        assert!(MAP.to_host(b"system.posix_acl_access").is_ok());
        let translated = XattrMap { acls: false };
        assert_eq!(
            translated.to_host(b"system.posix_acl_default").unwrap_err(),
            Errno::OPNOTSUPP
        );
        assert_eq!(translated.to_guest(b"system.posix_acl_access"), None);
    }

    #[test]
    fn lists_map_back_and_hide_host_only_names() {
        let host = b"user.a\0user.cxlfs.security.selinux\0security.selinux\0trusted.x\0user.cxlfs.user.cxlfs.z\0";
        assert_eq!(
            MAP.list_to_guest(host, true),
            b"user.a\0security.selinux\0user.cxlfs.z\0".to_vec()
        );
        let with_trusted = b"user.cxlfs.trusted.t\0user.a\0";
        assert_eq!(
            MAP.list_to_guest(with_trusted, true),
            b"trusted.t\0user.a\0".to_vec()
        );
        assert_eq!(MAP.list_to_guest(with_trusted, false), b"user.a\0".to_vec());
        for name in [&b"user.q"[..], b"trusted.q", b"security.q", b"user.cxlfs.q"] {
            let host = MAP.to_host(name).unwrap();
            assert_eq!(MAP.to_guest(&host), Some(name), "round trip");
        }
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
}
