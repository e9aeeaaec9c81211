//! `FUSE_IOCTL`: cache hints from applications inside a guest.
//!
//! A guest application issues `CXLFS_IOC_HINT` (`hint/include/cxlfs_hint.h`)
//! on a file of the share, or on the share's directory for the device-wide
//! commands. The guest kernel forwards it as a *restricted* ioctl: the
//! command word encodes the size and direction, so the kernel copies the
//! 184-byte `struct cxlfs_hint` in and back out by itself, and no guest
//! kernel change is needed (`fs/fuse/ioctl.c`, any kernel since 2.6.29).
//!
//! The ioctl acts on the open file handle (`fh`): a guest can only name a
//! file it was allowed to open, and only that file's own pages. Errors go
//! back as the ioctl's result (`-errno`), with the "out" fields (this VM's
//! statistics, its pinned bytes and quota) filled in.
//!
//! A hint runs on the same executor as the socket's commands: a range hint
//! as a range command on the resolved open file ([`Controller::range`]),
//! a device-wide one as the protocol's [`Request`] ([`Controller::execute`]).

use super::{ControlCommandError, Controller, Principal, ResolvedFile, Target};
use crate::abi::Cursor;
use crate::fs::PassthroughFs;
use crate::pool::FileKey;
use cxlfs_api::control::{RangeOp, Request};
use cxlfs_hint::{HintOp, HintReply, HintRequest, ABI_VERSION, CXLFS_IOC_HINT, HINT_SIZE};
use rustix::io::Errno;
use std::sync::Arc;

/// `fuse_ioctl_in.flags`: an unrestricted ioctl (CUSE only).
pub const FUSE_IOCTL_UNRESTRICTED: u32 = 1 << 1;
/// `fuse_ioctl_in.flags`: the ioctl is on a directory.
pub const FUSE_IOCTL_DIR: u32 = 1 << 4;
/// Bytes of `fuse_ioctl_in`.
pub const IOCTL_IN_LEN: usize = 32;
/// Bytes of `fuse_ioctl_out`.
pub const IOCTL_OUT_LEN: usize = 16;

/// A `FUSE_IOCTL` request's fixed part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoctlIn {
    /// File handle.
    pub fh: u64,
    /// `FUSE_IOCTL_*` flags.
    pub flags: u32,
    /// The ioctl command word.
    pub cmd: u32,
    /// The guest's argument pointer (unused: restricted ioctls carry data).
    pub arg: u64,
    /// Bytes of input that follow.
    pub in_size: u32,
    /// Bytes of output the guest takes.
    pub out_size: u32,
}

/// What the ioctl answered: the reply payload (`fuse_ioctl_out` + the
/// struct) and when it may be released (a range command's modeled completion).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoctlReply {
    /// Payload after the FUSE out header.
    pub payload: Vec<u8>,
    /// Device time to hold the reply until.
    pub completes_at_ns: Option<u64>,
}

/// Handles `FUSE_IOCTL` for VM `vm`. `Err` is a FUSE-level error (the
/// ioctl is not ours, or malformed); a refused hint is an `Ok` reply whose
/// result is `-errno`.
pub fn handle_ioctl(
    controller: &Controller,
    fs: &PassthroughFs,
    vm: &str,
    args: &mut Cursor<'_>,
) -> Result<IoctlReply, Errno> {
    let bad = |_| Errno::INVAL;
    let ioc = IoctlIn {
        fh: args.u64().map_err(bad)?,
        flags: args.u32().map_err(bad)?,
        cmd: args.u32().map_err(bad)?,
        arg: args.u64().map_err(bad)?,
        in_size: args.u32().map_err(bad)?,
        out_size: args.u32().map_err(bad)?,
    };
    if ioc.cmd != CXLFS_IOC_HINT || ioc.flags & FUSE_IOCTL_UNRESTRICTED != 0 {
        // Not ours (e.g. FS_IOC_GETFLAGS from lsattr): as for any file
        // system without that ioctl.
        return Err(Errno::NOTTY);
    }
    let data = args.rest();
    if (ioc.in_size as usize) < HINT_SIZE
        || data.len() < HINT_SIZE
        || (ioc.out_size as usize) < HINT_SIZE
    {
        return Err(Errno::INVAL);
    }
    let Some((req, _)) = cxlfs_hint::decode(data) else {
        return Err(Errno::INVAL);
    };
    let handle = fs.handle(ioc.fh)?;
    let who = Principal::Vm(vm.to_string());
    let mut reply = HintReply::default();
    let mut completes_at = None;
    let result = run(
        controller,
        fs,
        &who,
        &req,
        &handle,
        &ioc,
        &mut reply,
        &mut completes_at,
    );
    let errno = match result {
        Ok(()) => 0,
        Err(e) => {
            tracing::debug!(vm, op = req.op, error = %e, "guest hint refused");
            -e.errno().raw_os_error()
        }
    };
    let s = controller.vm_stats(vm);
    reply.hits = s.hits;
    reply.misses = s.misses;
    reply.traps = s.traps;
    reply.pinned_bytes = s.pinned_bytes;
    reply.pin_quota_bytes = controller.options().pin_quota_bytes;
    let (policy, degree, stride) = controller.policy_and_prefetch();
    reply.current_policy = cxlfs_hint::policy_field(&policy).unwrap_or_default();
    reply.prefetch_degree = degree;
    reply.prefetch_stride = stride;
    let mut payload = Vec::with_capacity(IOCTL_OUT_LEN + HINT_SIZE);
    payload.extend_from_slice(&errno.to_le_bytes());
    payload.extend_from_slice(&[0u8; 12]); // flags, in_iovs, out_iovs
    payload.extend_from_slice(&cxlfs_hint::encode(&req, &reply));
    Ok(IoctlReply {
        payload,
        completes_at_ns: completes_at,
    })
}

#[allow(clippy::too_many_arguments)]
fn run(
    controller: &Controller,
    fs: &PassthroughFs,
    who: &Principal,
    req: &HintRequest,
    handle: &crate::fs::Handle,
    ioc: &IoctlIn,
    reply: &mut HintReply,
    completes_at: &mut Option<u64>,
) -> Result<(), ControlCommandError> {
    let bad = |m: &str| ControlCommandError::BadRequest(m.to_string());
    if req.abi_version != ABI_VERSION {
        return Err(bad("unsupported cxlfs_hint abi_version"));
    }
    if req.flags != 0 {
        return Err(bad("cxlfs_hint flags must be 0"));
    }
    let op = HintOp::from_u32(req.op).ok_or_else(|| bad("unknown cxlfs_hint op"))?;
    let execute = |request: Request| controller.execute(who, request).map(drop);
    let range_op = match op {
        HintOp::Prefetch => RangeOp::Prefetch,
        HintOp::Pin => RangeOp::Pin,
        HintOp::Unpin => RangeOp::Unpin,
        HintOp::Evict => RangeOp::Evict,
        // The reply's "out" fields carry this VM's statistics anyway.
        HintOp::QueryStats => return Ok(()),
        HintOp::SetPolicy => {
            let name = req
                .policy_name()
                .ok_or_else(|| bad("policy name is not a NUL-terminated UTF-8 string"))?;
            return execute(Request::SetPolicy {
                name: name.to_string(),
                params: serde_json::Map::new(),
            });
        }
        HintOp::SetPrefetch => {
            return execute(Request::SetPrefetch {
                degree: req.degree,
                stride: (req.stride != 0).then_some(req.stride),
            })
        }
        HintOp::SetCxlRatio => {
            return execute(Request::SetCxlRatio {
                percent: req.percent,
            })
        }
        HintOp::ResetStats => return execute(Request::ResetStats {}),
    };
    let is_dir =
        ioc.flags & FUSE_IOCTL_DIR != 0 || handle.file.metadata().is_ok_and(|m| m.is_dir());
    if is_dir {
        return Err(bad("a range hint needs a regular file, not a directory"));
    }
    let size = handle
        .file
        .metadata()
        .map_err(|e| ControlCommandError::Io {
            what: "stat the file".into(),
            source: e,
        })?
        .len();
    let key: FileKey = handle.inode.key;
    let plane = match controller
        .dax_on()
        .then(|| controller.shared_pool_file(key))
    {
        None => None,
        Some(Some(f)) => Some(f),
        Some(None) => Some(Arc::new(fs.open_for_pool(&handle.inode).map_err(|e| {
            ControlCommandError::Io {
                what: "open the file for the residency plane".into(),
                source: e.into(),
            }
        })?)),
    };
    let target = Target::File {
        file: ResolvedFile { key, plane, size },
        offset: req.offset,
        len: req.length,
    };
    let r = controller.range(who, range_op, target)?;
    reply.pages = r.pages;
    reply.changed = r.changed;
    reply.skipped = r.skipped;
    reply.latency_ns = r.latency_ns;
    *completes_at = Some(r.completes_at_ns);
    Ok(())
}
