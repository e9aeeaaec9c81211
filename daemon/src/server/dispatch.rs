//! One request from bytes to reply: the header and its length checked, the
//! requests that take no reply (FORGET, BATCH_FORGET, INTERRUPT), and every
//! other opcode handed, by group, to the [`FileSystem`] or to its decoder in
//! `ops`, `session` or `lock_waits`.

use super::ops::{check_xattr_name, parse_err};
use super::reply::{attr_bytes, entry_bytes, error_reply, now, open_bytes, xattr_bytes, OpResult};
use super::{
    Context, Fallocate, FileSystem, Handled, Incoming, LockRequest, PayloadIo, Server,
    XATTR_SIZE_MAX,
};
use crate::abi::{
    self, lk_flags, opcode, release_flags, AccessIn, BatchForgetIn, Cursor, FallocateIn, FlushIn,
    ForgetIn, ForgetOne, FsyncIn, GetattrIn, GetxattrIn, InHeader, InterruptIn, LkIn, LkOut,
    LseekIn, LseekOut, OpenIn, ParseRequestError, ReleaseIn, SetattrIn, OUT_HEADER_LEN,
};
use rustix::io::Errno;
use std::sync::atomic::Ordering;
use zerocopy::IntoBytes;

/// A request whose header checked out: who asks, its arguments (as long as
/// the header says), and the room for its reply.
struct Request<'a> {
    h: InHeader,
    ctx: Context,
    args: Cursor<'a>,
    /// The request's length, as its header gives it.
    hlen: usize,
    /// Room in the chain's writable part.
    out_cap: usize,
}

impl<'a> Request<'a> {
    /// The request after its header `h`; `None` (logged) if the header's
    /// length is shorter than a header or longer than what the transport
    /// supplied.
    fn new(h: InHeader, incoming: Incoming<'a>) -> Option<Self> {
        let Incoming {
            arrival_ns,
            bytes: req,
            total: req_total,
            out_cap,
        } = incoming;
        let hlen = h.len as usize;
        let supplied = if h.opcode == opcode::WRITE {
            req_total.max(req.len())
        } else {
            req.len()
        };
        let header_len = std::mem::size_of::<InHeader>();
        if hlen > supplied || hlen < header_len {
            tracing::debug!(
                error = %ParseRequestError::LengthMismatch { header: h.len, actual: supplied },
                "bad FUSE request length"
            );
            return None;
        }
        // Arguments are what the header claims, not what the chain holds.
        let args = Cursor::new(&req[header_len..hlen.min(req.len())]);
        let ctx = Context {
            uid: h.uid,
            gid: h.gid,
            pid: h.pid,
            arrival_ns,
        };
        Some(Request {
            h,
            ctx,
            args,
            hlen,
            out_cap,
        })
    }
}

/// A GETLK / SETLK / SETLKW argument as the filesystem takes it.
fn lock_request(l: &LkIn) -> LockRequest {
    LockRequest {
        fh: l.fh,
        owner: l.owner,
        lock: l.lk,
        flock: l.lk_flags & lk_flags::FLOCK != 0,
    }
}

impl<F: FileSystem> Server<F> {
    /// Decodes the header, counts the request, and serves it in its span.
    pub(super) fn handle_request(&self, incoming: Incoming<'_>, io: &mut dyn PayloadIo) -> Handled {
        let mut c = Cursor::new(incoming.bytes);
        let h = match c.read::<InHeader>() {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!(error = %e, "request shorter than a FUSE header");
                self.metrics.count_request(opcode::MAX);
                return Handled {
                    reply: (incoming.out_cap >= OUT_HEADER_LEN)
                        .then(|| error_reply(0, Errno::INVAL)),
                    ..Handled::default()
                };
            }
        };
        self.metrics.count_request(h.opcode);
        // One span per request (cheap when debug is off: a static check).
        let span = tracing::debug_span!(
            "fuse_request",
            vm = %self.metrics.name,
            opcode = opcode::name(h.opcode),
            unique = h.unique,
            nodeid = h.nodeid
        );
        let _entered = span.enter();
        match Request::new(h, incoming) {
            Some(mut r) => self.serve(&mut r, io),
            None => self.finish(&h, Err(Errno::INVAL), incoming.out_cap, 0),
        }
    }

    /// Serves a request: no reply, `EIO` before INIT, READ (its data
    /// already in place), SETLKW (perhaps deferred), or one reply now.
    fn serve(&self, r: &mut Request<'_>, io: &mut dyn PayloadIo) -> Handled {
        let (h, out_cap) = (r.h, r.out_cap);
        match h.opcode {
            opcode::FORGET | opcode::BATCH_FORGET | opcode::INTERRUPT => {
                self.without_reply(r);
                Handled::default()
            }
            _ if h.opcode != opcode::INIT && !self.initialized.load(Ordering::Acquire) => {
                self.finish(&h, Err(Errno::IO), out_cap, 0)
            }
            opcode::READ => {
                let mut in_place = 0usize;
                let result = self.read(&r.ctx, &h, &mut r.args, out_cap, io).map(|t| {
                    in_place = t.value;
                    t.map(|_| Vec::new())
                });
                self.finish(&h, result, out_cap, in_place)
            }
            opcode::SETLKW => match r.args.read::<LkIn>() {
                Ok(l) => self.setlkw(&r.ctx, &h, &lock_request(&l), out_cap),
                Err(e) => self.finish(&h, Err(parse_err(e)), out_cap, 0),
            },
            _ => {
                let result = self.dispatch(r, io);
                self.finish(&h, result, out_cap, 0)
            }
        }
    }

    /// FORGET, BATCH_FORGET and INTERRUPT: acted on, never answered.
    fn without_reply(&self, r: &mut Request<'_>) {
        match r.h.opcode {
            opcode::FORGET => {
                if let Ok(f) = r.args.read::<ForgetIn>() {
                    self.fs.forget(&r.ctx, r.h.nodeid, f.nlookup);
                }
            }
            opcode::BATCH_FORGET => self.batch_forget(&r.ctx, &mut r.args),
            opcode::INTERRUPT => {
                // Only a waiting SETLKW can be interrupted; every other
                // request is answered before the next is read.
                if let Ok(i) = r.args.read::<InterruptIn>() {
                    self.waits.interrupt(i.unique);
                }
            }
            _ => {}
        }
    }

    fn batch_forget(&self, ctx: &Context, args: &mut Cursor<'_>) {
        let Ok(b) = args.read::<BatchForgetIn>() else {
            return;
        };
        // Bounded by the request: each entry is read before it is acted on.
        for _ in 0..b.count {
            let Ok(one) = args.read::<ForgetOne>() else {
                return;
            };
            self.fs.forget(ctx, one.nodeid, one.nlookup);
        }
    }

    /// The reply payload of an opcode answered at once, by group.
    fn dispatch(&self, r: &mut Request<'_>, io: &mut dyn PayloadIo) -> OpResult {
        match r.h.opcode {
            opcode::INIT
            | opcode::DESTROY
            | opcode::SETUPMAPPING
            | opcode::REMOVEMAPPING
            | opcode::IOCTL => self.session_op(r),
            opcode::LOOKUP
            | opcode::GETATTR
            | opcode::SETATTR
            | opcode::READLINK
            | opcode::STATFS
            | opcode::ACCESS
            | opcode::SYNCFS => self.inode_op(r),
            opcode::CREATE
            | opcode::MKDIR
            | opcode::SYMLINK
            | opcode::MKNOD
            | opcode::LINK
            | opcode::TMPFILE
            | opcode::UNLINK
            | opcode::RMDIR
            | opcode::RENAME
            | opcode::RENAME2 => self.name_op(r),
            opcode::OPEN
            | opcode::WRITE
            | opcode::RELEASE
            | opcode::RELEASEDIR
            | opcode::FLUSH
            | opcode::FSYNC
            | opcode::FSYNCDIR
            | opcode::OPENDIR
            | opcode::READDIR
            | opcode::READDIRPLUS => self.file_op(r, io),
            opcode::FALLOCATE | opcode::LSEEK | opcode::COPY_FILE_RANGE => self.space_op(r),
            opcode::GETXATTR | opcode::LISTXATTR | opcode::SETXATTR | opcode::REMOVEXATTR => {
                self.xattr_op(r)
            }
            opcode::GETLK | opcode::SETLK => self.lock_op(r),
            _ => Err(Errno::NOSYS),
        }
    }

    /// The session and its seams: INIT, DESTROY, the DAX window, IOCTL.
    fn session_op(&self, r: &mut Request<'_>) -> OpResult {
        match r.h.opcode {
            opcode::INIT => self.init(&mut r.args),
            opcode::DESTROY => self.destroy(),
            opcode::SETUPMAPPING => self.setup_mapping(r.h.nodeid, &mut r.args),
            opcode::REMOVEMAPPING => self.remove_mapping(&mut r.args),
            opcode::IOCTL => self.ioctl(&r.ctx, &mut r.args),
            _ => Err(Errno::NOSYS),
        }
    }

    /// Operations on the node the header names: LOOKUP (of a name in it),
    /// attributes, READLINK, STATFS, ACCESS, SYNCFS.
    fn inode_op(&self, r: &mut Request<'_>) -> OpResult {
        let (ctx, nodeid, args) = (&r.ctx, r.h.nodeid, &mut r.args);
        match r.h.opcode {
            opcode::LOOKUP => {
                let name = args.name().map_err(parse_err);
                name.and_then(|n| self.fs.lookup(ctx, nodeid, n))
                    .map(|e| e.map(|e| entry_bytes(&e)))
            }
            opcode::GETATTR => {
                // A short GETATTR (old kernels) is a plain getattr.
                let fh = args
                    .read::<GetattrIn>()
                    .ok()
                    .filter(|g| g.getattr_flags & abi::GETATTR_FH != 0)
                    .map(|g| g.fh);
                self.fs
                    .getattr(ctx, nodeid, fh)
                    .map(|a| a.map(|a| attr_bytes(&a)))
            }
            opcode::SETATTR => args.read::<SetattrIn>().map_err(parse_err).and_then(|s| {
                self.fs
                    .setattr(ctx, nodeid, &s)
                    .map(|a| a.map(|a| attr_bytes(&a)))
            }),
            opcode::READLINK => self.fs.readlink(ctx, nodeid),
            opcode::STATFS => self.fs.statfs(ctx, nodeid).map(|s| {
                s.map(|st| {
                    let mut b = Vec::with_capacity(80);
                    st.encode(&mut b);
                    b
                })
            }),
            opcode::ACCESS => args.read::<AccessIn>().map_err(parse_err).and_then(|a| {
                self.fs
                    .access(ctx, nodeid, a.mask)
                    .map(|t| t.map(|()| Vec::new()))
            }),
            opcode::SYNCFS => self.fs.syncfs(ctx, nodeid).map(|t| t.map(|()| Vec::new())),
            _ => Err(Errno::NOSYS),
        }
    }

    /// Names in directories: making, linking, removing and renaming them.
    fn name_op(&self, r: &mut Request<'_>) -> OpResult {
        let (ctx, h, a) = (&r.ctx, &r.h, &mut r.args);
        match h.opcode {
            opcode::CREATE => self.create(ctx, h, a),
            opcode::MKDIR => self.mkdir(ctx, h, a),
            opcode::SYMLINK => self.symlink(ctx, h, a),
            opcode::MKNOD => self.mknod(ctx, h, a),
            opcode::LINK => self.link(ctx, h, a),
            opcode::TMPFILE => self.tmpfile(ctx, h, a),
            opcode::UNLINK => self.unlink(ctx, h, a, false),
            opcode::RMDIR => self.unlink(ctx, h, a, true),
            opcode::RENAME => self.rename(ctx, h, a, false),
            opcode::RENAME2 => self.rename(ctx, h, a, true),
            _ => Err(Errno::NOSYS),
        }
    }

    /// Open files and directories: OPEN, WRITE, RELEASE, FLUSH, FSYNC,
    /// OPENDIR, READDIR (READ is [`Self::serve`]'s: its data goes in place).
    fn file_op(&self, r: &mut Request<'_>, io: &mut dyn PayloadIo) -> OpResult {
        let (ctx, h, args) = (&r.ctx, &r.h, &mut r.args);
        match h.opcode {
            opcode::OPEN => args.read::<OpenIn>().map_err(parse_err).and_then(|o| {
                self.fs
                    .open(ctx, h.nodeid, o.flags, o.open_flags)
                    .map(|o| o.map(|o| open_bytes(&o)))
            }),
            opcode::WRITE => self.write(ctx, h, args, r.hlen, io),
            opcode::RELEASE | opcode::RELEASEDIR => {
                args.read::<ReleaseIn>().map_err(parse_err).and_then(|rel| {
                    if rel.release_flags & release_flags::FLOCK_UNLOCK != 0 {
                        self.fs.unlock_owner(ctx, h.nodeid, rel.lock_owner, true);
                    }
                    self.fs.release(ctx, h.nodeid, rel.fh);
                    now(Vec::new())
                })
            }
            opcode::FLUSH => args.read::<FlushIn>().map_err(parse_err).and_then(|f| {
                // A close in the guest drops the closing process's POSIX
                // locks on the file, whichever descriptor took them.
                self.fs.unlock_owner(ctx, h.nodeid, f.lock_owner, false);
                self.fs
                    .flush(ctx, h.nodeid, f.fh)
                    .map(|t| t.map(|()| Vec::new()))
            }),
            opcode::FSYNC | opcode::FSYNCDIR => {
                args.read::<FsyncIn>().map_err(parse_err).and_then(|f| {
                    self.fs
                        .fsync(ctx, h.nodeid, f.fh, f.fsync_flags & 1 != 0)
                        .map(|t| t.map(|()| Vec::new()))
                })
            }
            opcode::OPENDIR => self
                .fs
                .opendir(ctx, h.nodeid)
                .map(|o| o.map(|o| open_bytes(&o))),
            opcode::READDIR => self.readdir(ctx, h, args, false, r.out_cap),
            opcode::READDIRPLUS => self.readdir(ctx, h, args, true, r.out_cap),
            _ => Err(Errno::NOSYS),
        }
    }

    /// Space: FALLOCATE, LSEEK, COPY_FILE_RANGE.
    fn space_op(&self, r: &mut Request<'_>) -> OpResult {
        let (ctx, h, args) = (&r.ctx, &r.h, &mut r.args);
        match h.opcode {
            opcode::FALLOCATE => args.read::<FallocateIn>().map_err(parse_err).and_then(|f| {
                let range = Fallocate {
                    nodeid: h.nodeid,
                    fh: f.fh,
                    offset: f.offset,
                    length: f.length,
                    mode: f.mode,
                };
                self.fs
                    .fallocate(ctx, range)
                    .map(|t| t.map(|()| Vec::new()))
            }),
            opcode::LSEEK => args.read::<LseekIn>().map_err(parse_err).and_then(|l| {
                let t = self.fs.lseek(ctx, h.nodeid, l.fh, l.offset, l.whence)?;
                Ok(t.map(|offset| LseekOut { offset }.as_bytes().to_vec()))
            }),
            opcode::COPY_FILE_RANGE => self.copy_file_range(ctx, h, args),
            _ => Err(Errno::NOSYS),
        }
    }

    /// Extended attributes.
    fn xattr_op(&self, r: &mut Request<'_>) -> OpResult {
        let (ctx, h, args) = (&r.ctx, &r.h, &mut r.args);
        match h.opcode {
            opcode::GETXATTR => self.getxattr(ctx, h, args),
            opcode::LISTXATTR => args.read::<GetxattrIn>().map_err(parse_err).and_then(|g| {
                let size = g.size.min(XATTR_SIZE_MAX);
                let x = self.fs.listxattr(ctx, h.nodeid, size)?;
                Ok(x.map(xattr_bytes))
            }),
            opcode::SETXATTR => self.setxattr(ctx, h, args),
            opcode::REMOVEXATTR => {
                let name = args.name().map_err(parse_err);
                name.and_then(check_xattr_name)
                    .and_then(|n| self.fs.removexattr(ctx, h.nodeid, n))
                    .map(|t| t.map(|()| Vec::new()))
            }
            _ => Err(Errno::NOSYS),
        }
    }

    /// GETLK and SETLK (SETLKW is [`Self::serve`]'s: it may wait).
    fn lock_op(&self, r: &mut Request<'_>) -> OpResult {
        let (ctx, nodeid, args) = (&r.ctx, r.h.nodeid, &mut r.args);
        match r.h.opcode {
            opcode::GETLK => args.read::<LkIn>().map_err(parse_err).and_then(|l| {
                let lk = self.fs.getlk(ctx, nodeid, &lock_request(&l))?;
                Ok(lk.map(|lk| LkOut { lk }.as_bytes().to_vec()))
            }),
            opcode::SETLK => args.read::<LkIn>().map_err(parse_err).and_then(|l| {
                let t = self.fs.setlk(ctx, nodeid, &lock_request(&l))?;
                Ok(t.map(|()| Vec::new()))
            }),
            _ => Err(Errno::NOSYS),
        }
    }
}
