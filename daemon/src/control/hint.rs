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
use crate::abi::{ioctl_flags, IoctlIn, IoctlOut};
use crate::server::{Context, FileSystem, IoctlHandler, Timed};
use cxlfs_api::control::{RangeOp, Request};
use cxlfs_hint::{HintOp, HintReply, HintRequest, ABI_VERSION, CXLFS_IOC_HINT, HINT_SIZE};
use rustix::io::Errno;
use std::sync::Arc;
use zerocopy::IntoBytes;

/// The server's ioctl seam for one VM: `CXLFS_IOC_HINT` through the
/// controller.
#[derive(Debug)]
pub struct HintHandler {
    controller: Arc<Controller>,
    vm: String,
}

impl HintHandler {
    /// Hints of VM `vm` go to `controller`.
    pub fn new(controller: Arc<Controller>, vm: &str) -> Self {
        HintHandler {
            controller,
            vm: vm.to_string(),
        }
    }
}

impl IoctlHandler for HintHandler {
    /// `Err` is a FUSE-level error (the ioctl is not ours, or malformed); a
    /// refused hint is an `Ok` reply whose result is `-errno`.
    fn ioctl(
        &self,
        _ctx: &Context,
        fs: &dyn FileSystem,
        ioc: &IoctlIn,
        data: &[u8],
    ) -> Result<Timed<Vec<u8>>, Errno> {
        let (controller, vm) = (&*self.controller, self.vm.as_str());
        if ioc.cmd != CXLFS_IOC_HINT || ioc.flags & ioctl_flags::UNRESTRICTED != 0 {
            // Not ours (e.g. FS_IOC_GETFLAGS from lsattr): as for any file
            // system without that ioctl.
            return Err(Errno::NOTTY);
        }
        if (ioc.in_size as usize) < HINT_SIZE
            || data.len() < HINT_SIZE
            || (ioc.out_size as usize) < HINT_SIZE
        {
            return Err(Errno::INVAL);
        }
        let Some((req, _)) = cxlfs_hint::decode(data) else {
            return Err(Errno::INVAL);
        };
        // The guest could open the file: its handle names it.
        fs.file_key(0, Some(ioc.fh))?;
        let who = Principal::Vm(vm.to_string());
        let mut reply = HintReply::default();
        let mut completes_at = None;
        let result = run(
            controller,
            fs,
            &who,
            &req,
            ioc,
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
        let out = IoctlOut {
            result: errno,
            ..IoctlOut::default()
        };
        let mut payload = Vec::with_capacity(std::mem::size_of::<IoctlOut>() + HINT_SIZE);
        payload.extend_from_slice(out.as_bytes());
        payload.extend_from_slice(&cxlfs_hint::encode(&req, &reply));
        Ok(Timed {
            value: payload,
            completes_at_ns: completes_at,
        })
    }
}

fn run(
    controller: &Controller,
    fs: &dyn FileSystem,
    who: &Principal,
    req: &HintRequest,
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
    let io = |what: &str| {
        let what = what.to_string();
        move |e: Errno| ControlCommandError::Io {
            what,
            source: e.into(),
        }
    };
    let file = fs
        .host_file(0, Some(ioc.fh), false)
        .map_err(io("stat the file"))?;
    if ioc.flags & ioctl_flags::DIR != 0 || file.is_dir {
        return Err(bad("a range hint needs a regular file, not a directory"));
    }
    let (key, size) = (file.key, file.size);
    // The file open for its layout (and the plane's fills, DAX on): the
    // pool's copy if it has one, else a fresh open of the handle's inode.
    let data = match controller.shared_pool_file(key) {
        Some(f) => f,
        None => Arc::new(
            fs.host_file(0, Some(ioc.fh), true)
                .map_err(io("open the file"))?
                .pool_file
                .ok_or_else(|| bad("not a regular file"))?,
        ),
    };
    let target = Target::File {
        file: ResolvedFile {
            key,
            plane: controller.dax_on().then(|| data.clone()),
            data,
            size,
        },
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
