//! Acting as the guest caller on the host: a per-thread credential switch
//! for the operations that create nodes (the kernel then gives the node the
//! caller's owner and group and checks the caller's access to the parent).
//!
//! POSIX credentials are per process, and glibc's `setresuid` broadcasts to
//! every thread. Linux keeps them per thread, and the raw syscalls (what
//! `rustix::thread::set_thread_res_uid` makes) change only the calling
//! thread: what virtiofsd does, so that one worker creating a file as uid
//! 1000 does not change what another worker does meanwhile. Only the
//! effective ids change (the fs ids follow them); the real and saved ids stay
//! 0, so the switch back needs no capability. While the effective uid is not
//! 0 the kernel clears the thread's effective capabilities (CAP_DAC_OVERRIDE,
//! CAP_CHOWN, CAP_FSETID, ...): the host checks the caller's own rights.

use super::idmap::IdMap;
use super::PassthroughFs;
use crate::abi::Attr;
use crate::server::Context;
use rustix::fs::{Gid, Uid};
use rustix::io::Errno;
use rustix::thread::{set_thread_res_gid, set_thread_res_uid};

/// How guest ids and set-id bits reach the host: `--translate-uid`,
/// `--translate-gid`, `--strip-setid`. The default passes every id
/// unchanged and keeps every mode bit (virtiofsd's default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestIds {
    /// uid translation.
    pub uids: IdMap,
    /// gid translation.
    pub gids: IdMap,
    /// Strip S_ISUID (and S_ISGID from non-directories) from the modes
    /// guests set by CREATE, MKDIR and chmod: for hosts that mount the
    /// shared directory without `nosuid`.
    pub strip_setid: bool,
}

impl GuestIds {
    /// The host identity `ctx`'s caller acts as; `EPERM` for an id a
    /// `forbid-guest` rule refuses.
    pub fn host_creds(&self, ctx: &Context) -> Result<HostCreds, Errno> {
        let creds = HostCreds {
            uid: self.uids.to_host(ctx.uid).map_err(|_| Errno::PERM)?,
            gid: self.gids.to_host(ctx.gid).map_err(|_| Errno::PERM)?,
        };
        // (uid_t)-1 means "no change" to the set*id calls, never an
        // identity: the guest kernel refuses such a caller (EOVERFLOW), a
        // forged header gets the same.
        if creds.uid == u32::MAX || creds.gid == u32::MAX {
            return Err(Errno::OVERFLOW);
        }
        Ok(creds)
    }

    /// Host owner and group as the guest sees them.
    pub fn attr_to_guest(&self, mut attr: Attr) -> Attr {
        attr.uid = self.uids.to_guest(attr.uid);
        attr.gid = self.gids.to_guest(attr.gid);
        attr
    }

    /// The permission bits a guest asks for, without the set-id bits when
    /// they are stripped. S_ISGID on a directory only makes new entries
    /// inherit its group: kept.
    pub fn mode_bits(&self, mode: u32, is_dir: bool) -> u32 {
        let mut m = mode & 0o7777;
        if self.strip_setid {
            m &= !libc::S_ISUID;
            if !is_dir {
                m &= !libc::S_ISGID;
            }
        }
        m
    }

    /// Whether the caller (guest `ctx`, acting as host `creds`) may change
    /// the mode or owner of a host file owned by `host_owner`. A caller
    /// acting as host root may (virtiofsd's default: the guest kernel has
    /// checked); any other caller only on what it owns on the host, and a
    /// guest root on what its own translated users own. With translation,
    /// a guest root therefore cannot chmod or chown a file of a host user
    /// outside its map (host root's setuid binaries, say).
    pub fn may_change_owned(&self, ctx: &Context, creds: HostCreds, host_owner: u32) -> bool {
        creds.uid == 0
            || host_owner == creds.uid
            || (ctx.uid == 0 && self.uids.is_guest_owned_host_id(host_owner))
    }
}

/// The host identity a request acts as (after `--translate-uid/-gid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCreds {
    /// Host uid.
    pub uid: u32,
    /// Host gid.
    pub gid: u32,
}

/// While alive, the calling thread's effective uid/gid are the caller's;
/// dropped, they are root's again. Not `Send`: it must be dropped on the
/// thread that made it.
#[derive(Debug)]
pub struct CallerGuard {
    switched_uid: bool,
    switched_gid: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl CallerGuard {
    /// Switches the calling thread to `creds` (nothing to do for root:
    /// the daemon already is root). The gid first: once the uid is not 0
    /// the thread may no longer change it.
    pub fn switch_to(creds: HostCreds) -> Result<Self, Errno> {
        let mut guard = CallerGuard {
            switched_uid: false,
            switched_gid: false,
            _not_send: std::marker::PhantomData,
        };
        if creds.gid != 0 {
            set_thread_res_gid(None, Some(Gid::from_raw(creds.gid)), None)?;
            guard.switched_gid = true;
        }
        if creds.uid != 0 {
            // On failure the guard restores the gid as it drops.
            set_thread_res_uid(None, Some(Uid::from_raw(creds.uid)), None)?;
            guard.switched_uid = true;
        }
        Ok(guard)
    }
}

impl Drop for CallerGuard {
    fn drop(&mut self) {
        // The real and saved ids are 0, so going back cannot be refused; if
        // it were, this thread would serve the next request (of any guest
        // user) with a guest user's identity: stop rather than do that.
        if self.switched_uid {
            if let Err(e) = set_thread_res_uid(None, Some(Uid::ROOT), None) {
                tracing::error!(error = %e, "cannot switch a worker back to uid 0; aborting");
                std::process::abort();
            }
        }
        if self.switched_gid {
            if let Err(e) = set_thread_res_gid(None, Some(Gid::ROOT), None) {
                tracing::error!(error = %e, "cannot switch a worker back to gid 0; aborting");
                std::process::abort();
            }
        }
    }
}

impl PassthroughFs {
    /// The calling worker thread acts as `ctx`'s caller until the guard
    /// drops.
    pub(super) fn as_caller(&self, ctx: &Context) -> Result<CallerGuard, Errno> {
        CallerGuard::switch_to(self.ids.host_creds(ctx)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minus_one_is_no_caller() {
        let ids = GuestIds::default();
        for (uid, gid) in [(u32::MAX, 0), (0, u32::MAX)] {
            let ctx = Context {
                uid,
                gid,
                ..Context::default()
            };
            assert_eq!(ids.host_creds(&ctx), Err(Errno::OVERFLOW));
        }
    }

    #[test]
    fn guard_switches_this_thread_only_and_back() {
        if !super::super::testing::running_as_root() {
            return;
        }
        std::thread::spawn(|| {
            let g = CallerGuard::switch_to(HostCreds {
                uid: 4321,
                gid: 8765,
            })
            .unwrap();
            assert_eq!(rustix::process::geteuid().as_raw(), 4321);
            assert_eq!(rustix::process::getegid().as_raw(), 8765);
            drop(g);
            assert!(rustix::process::geteuid().is_root());
            assert_eq!(rustix::process::getegid().as_raw(), 0);
        })
        .join()
        .unwrap();
    }
}
