//! The pool's FUSE server: [`Server`] answers one request at a time, from
//! its bytes to a reply in a buffer and an [`Outcome`] that says when to
//! write it. It owns no thread and no descriptor, so every transport
//! (`/dev/fuse` readers, ring workers, a split plane's helper) and the
//! tests drive the same code.
//!
//! This module decodes the request and answers the namespace (INIT,
//! LOOKUP, GETATTR, SETATTR, OPEN, READDIR, STATFS, ...); `data` answers
//! `READ` and `WRITE`: misses, calibration reads and write-backs.

mod data;

pub(crate) use data::read_full;
#[cfg(test)]
mod tests;

use super::{owner, CALIB_NAME, CALIB_NODEID, MAX_READAHEAD, MAX_WRITE, POOL_NAME, POOL_NODEID};
use crate::metrics::PlaneMetrics;
use crate::pace::Compensation;
use crate::vm::VmResolver;
use crate::{PoolBackend, PAGE_SIZE};
use fuse_abi::{
    self as abi, encode_attr_out, encode_dirent, encode_open_out, fattr, init_flags, opcode, Attr,
    Cursor, EntryOut, InHeader, InitIn, InitOut, Kstatfs, OutHeader, ReadIn, SetattrIn,
};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Attribute / entry validity: the pool never changes, cache it forever.
const VALID_SECS: u64 = 365 * 24 * 3600;

/// Background requests (write-backs) the kernel keeps in flight, and its
/// congestion threshold too: the notifier starts the write-back of a whole
/// batch of evicted pages at once (`notifier.rs`), and a congested
/// connection skips a non-blocking write-back entirely, leaving each dirty
/// page to be laundered alone by its invalidation.
const MAX_BACKGROUND: u16 = 1024;

/// The request-answering part of a plane, independent of the transport
/// (tests feed it bytes).
pub(crate) struct Server {
    pub(crate) backend: Arc<dyn PoolBackend>,
    pub(crate) size: u64,
    pub(crate) metrics: PlaneMetrics,
    pub(crate) vms: VmResolver,
    mtime: u64,
    /// `(uid, gid)` the pool belongs to (the daemon's).
    owner: (u32, u32),
    /// Set on shutdown: a GETATTR of the root from `stop_tid` ends the
    /// request thread that answers it.
    pub(super) stop: AtomicBool,
    pub(super) stop_tid: AtomicU32,
    /// Request threads still running.
    pub(super) alive: AtomicUsize,
    /// Pages refused and not served since (`None`: readahead is served).
    pub(crate) readahead: Option<crate::readahead::ReadaheadRefusals>,
    /// This server refuses readahead READs itself (a split plane's helper
    /// refuses them before they are forwarded; the daemon's server only
    /// forgets invalidated pages in the shared map).
    pub(super) refuse_here: bool,
    /// The pool file, once open: the notifier starts the write-back of
    /// pages it is about to invalidate and reads retired pages ahead
    /// through it. Weak: the plane closes the file in its own order (a
    /// close asks the server, which must still be there to answer).
    pub(crate) pool_file: std::sync::OnceLock<std::sync::Weak<std::fs::File>>,
    /// The last calibration READ's stamps.
    pub(super) calib: CalibStamps,
    /// Each VMM thread's last miss release, for the floor's gap bound.
    miss_gaps: crate::pace::MissGaps,
    /// INIT offers FUSE over io_uring.
    offer_uring: bool,
    /// The kernel offered it too (INIT answered with it).
    pub(super) uring_granted: AtomicBool,
    /// INIT has been answered (set just before its reply is written).
    pub(super) init_answered: AtomicBool,
    /// A split plane's helper takes requests on a ring of this many
    /// queues (0: on `/dev/fuse`, or not heard from yet).
    pub(crate) helper_ring_queues: AtomicUsize,
    /// Evicted pages the notifier has not invalidated yet; misses wait
    /// while there are more than its bound.
    pub(crate) backlog: super::backlog::EvictionBacklog,
}

/// What the last `READ` of the calibration file saw (backend clock), and
/// how long recent misses were held.
#[derive(Debug, Default)]
pub(super) struct CalibStamps {
    /// Recent misses' holds (release − arrival, ns), smoothed (7/8 old):
    /// a probe's reply is held as long, because the path's cost depends on
    /// it (a toucher that sleeps longer wakes from a deeper idle state).
    hold_ns: AtomicU64,
    /// When the request reached the plane.
    pub(super) request_ns: AtomicU64,
    /// When its reply was about to be written.
    pub(super) reply_ns: AtomicU64,
    /// Calibration READs answered (stored after the stamps).
    pub(super) reads: AtomicU64,
}

/// What to do with a request once handled.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// No reply (FORGET, INTERRUPT, undecodable header).
    None,
    /// Write `out` now.
    Reply,
    /// Write `out` at this time (backend clock).
    ReplyAt(u64),
    /// Write `out` now, then end this request thread.
    ReplyAndExit,
}

/// Starts a reply: a placeholder header that [`finish`] fills in.
fn reply_header(out: &mut Vec<u8>) {
    out.clear();
    OutHeader::default().encode(out);
}

/// Fills in the header of a successful reply whose payload is already in
/// `out` (after the placeholder of [`reply_header`]). A reply too long for
/// the header's `u32` length (or without its placeholder) is an `EINVAL`.
fn finish(out: &mut [u8], unique: u64) -> Result<(), i32> {
    let payload = out.len().saturating_sub(abi::OUT_HEADER_LEN);
    let header = OutHeader::for_payload(unique, 0, payload).map_err(|_| libc::EINVAL)?;
    if header.write_over(out) {
        Ok(())
    } else {
        Err(libc::EINVAL)
    }
}

/// Replaces `out` with an error reply to request `unique`.
pub(crate) fn error_reply(out: &mut Vec<u8>, unique: u64, errno: i32) -> Outcome {
    out.clear();
    OutHeader::error_only(unique, errno).encode(out);
    Outcome::Reply
}

/// An argument that does not decode.
fn inval<E>(_: E) -> i32 {
    libc::EINVAL
}

impl Server {
    pub(crate) fn new(backend: Arc<dyn PoolBackend>, size: u64) -> Self {
        let mtime = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Server {
            backend,
            size,
            metrics: PlaneMetrics::new(size),
            vms: VmResolver::new(),
            mtime,
            owner: owner(),
            stop: AtomicBool::new(false),
            stop_tid: AtomicU32::new(0),
            alive: AtomicUsize::new(0),
            readahead: None,
            refuse_here: false,
            pool_file: std::sync::OnceLock::new(),
            calib: CalibStamps::default(),
            miss_gaps: crate::pace::MissGaps::default(),
            offer_uring: false,
            uring_granted: AtomicBool::new(false),
            init_answered: AtomicBool::new(false),
            helper_ring_queues: AtomicUsize::new(0),
            backlog: super::backlog::EvictionBacklog::default(),
        }
    }

    /// Holds misses while more than `pages` evicted pages wait for the
    /// notifier (see
    /// [`PlaneOptions::eviction_backlog_pages`](super::PlaneOptions::eviction_backlog_pages)).
    pub(crate) fn bounding_eviction_backlog(mut self, pages: Option<u64>) -> Self {
        self.backlog = super::backlog::EvictionBacklog::bounded(pages);
        self
    }

    /// Releases miss replies ahead of their modeled completion as `mode`
    /// says (see
    /// [`PlaneOptions::compensation`](super::PlaneOptions::compensation)).
    pub(crate) fn compensating(mut self, mode: Compensation) -> Self {
        self.metrics = PlaneMetrics::new(self.size).with_compensation(mode);
        self
    }

    /// Offers FUSE over io_uring in INIT.
    pub(crate) fn offering_uring(mut self) -> Self {
        self.offer_uring = true;
        self
    }

    /// Refuses readahead from now on (see
    /// [`PlaneOptions::refuse_readahead`](super::PlaneOptions::refuse_readahead));
    /// `here`: this server refuses (else a split plane's helper does, on
    /// the same map, and this server only forgets invalidated pages).
    pub(crate) fn refusing_readahead(mut self, here: bool) -> std::io::Result<Self> {
        self.readahead = Some(crate::readahead::ReadaheadRefusals::new(self.size)?);
        self.refuse_here = here;
        Ok(self)
    }

    fn attr(&self, nodeid: u64) -> Attr {
        // Owner-only: the pool holds every VM's file pages. The mount is
        // not `allow_other` and checks these bits (`default_permissions`),
        // so only the daemon's own user can open it; VMMs get the file as
        // a descriptor over vhost-user.
        let (mode, size, nlink) = match nodeid {
            abi::ROOT_ID => (libc::S_IFDIR | 0o700, 0, 2),
            CALIB_NODEID => (libc::S_IFREG | 0o400, PAGE_SIZE, 1),
            _ => (libc::S_IFREG | 0o600, self.size, 1),
        };
        Attr {
            ino: nodeid,
            size,
            blocks: size / 512,
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.mtime,
            mode,
            nlink,
            uid: self.owner.0,
            gid: self.owner.1,
            blksize: PAGE_SIZE as u32,
            ..Attr::default()
        }
    }

    fn known(nodeid: u64) -> bool {
        nodeid == abi::ROOT_ID || nodeid == POOL_NODEID || nodeid == CALIB_NODEID
    }

    /// Answers one request (`req`: what `read(2)` returned) into `out`.
    /// Never panics, whatever the bytes.
    pub(crate) fn handle(&self, req: &[u8], arrival_ns: u64, out: &mut Vec<u8>) -> Outcome {
        let mut c = Cursor::new(req);
        let Ok(h) = InHeader::parse(&mut c) else {
            tracing::warn!(len = req.len(), "undecodable FUSE request header");
            return Outcome::None;
        };
        if h.len as usize != req.len() {
            tracing::warn!(
                header = h.len,
                read = req.len(),
                "FUSE request length mismatch"
            );
            return error_reply(out, h.unique, libc::EINVAL);
        }
        match self.dispatch(&h, &mut c, arrival_ns, out) {
            Ok(o) => o,
            Err(errno) => error_reply(out, h.unique, errno),
        }
    }

    /// Answers one decoded request: the namespace here, `READ` and `WRITE`
    /// in `data`.
    fn dispatch(
        &self,
        h: &InHeader,
        args: &mut Cursor<'_>,
        arrival_ns: u64,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, i32> {
        reply_header(out);
        match h.opcode {
            opcode::INIT => self.init(args, out)?,
            opcode::LOOKUP => self.lookup(h, args, out)?,
            opcode::FORGET | opcode::BATCH_FORGET | opcode::INTERRUPT => return Ok(Outcome::None),
            opcode::GETATTR => return self.getattr(h, out),
            opcode::SETATTR => self.setattr(h, args, out)?,
            opcode::OPEN => match h.nodeid {
                POOL_NODEID | CALIB_NODEID => encode_open_out(0, abi::fopen::KEEP_CACHE, out),
                abi::ROOT_ID => return Err(libc::EISDIR),
                _ => return Err(libc::ENOENT),
            },
            opcode::OPENDIR => match h.nodeid {
                abi::ROOT_ID => encode_open_out(0, abi::fopen::CACHE_DIR, out),
                POOL_NODEID | CALIB_NODEID => return Err(libc::ENOTDIR),
                _ => return Err(libc::ENOENT),
            },
            opcode::READDIR => self.readdir(h, args, out)?,
            // ENOSYS makes the kernel stop sending FLUSH (`no_flush`): a
            // close() then never waits on this server (see exit_guard.rs).
            opcode::FLUSH => return Err(libc::ENOSYS),
            opcode::RELEASE
            | opcode::RELEASEDIR
            | opcode::FSYNC
            | opcode::FSYNCDIR
            | opcode::ACCESS
            | opcode::DESTROY => {}
            opcode::STATFS => self.statfs(out),
            opcode::READ => return self.read(h, args, arrival_ns, out),
            opcode::WRITE => return self.write(h, args, arrival_ns, out),
            _ => return Err(libc::ENOSYS),
        }
        finish(out, h.unique)?;
        Ok(Outcome::Reply)
    }

    /// `INIT`: the kernel's major version, or the connection's parameters
    /// (one-page readahead, explicit invalidation, the ring if offered).
    fn init(&self, args: &mut Cursor<'_>, out: &mut Vec<u8>) -> Result<(), i32> {
        let init = InitIn::parse(args).map_err(inval)?;
        if init.major != abi::KERNEL_VERSION {
            // Answer with our major only; the kernel retries or gives up.
            InitOut {
                major: abi::KERNEL_VERSION,
                minor: abi::KERNEL_MINOR_VERSION,
                ..InitOut::default()
            }
            .encode(out);
        } else {
            let mut want =
                init_flags::BIG_WRITES | init_flags::MAX_PAGES | init_flags::EXPLICIT_INVAL_DATA;
            if self.offer_uring && init.flags & init_flags::OVER_IO_URING != 0 {
                // flags2 is read only with INIT_EXT.
                want |= init_flags::OVER_IO_URING | init_flags::INIT_EXT;
                self.uring_granted.store(true, Ordering::Release);
            }
            let mut reply = InitOut {
                major: abi::KERNEL_VERSION,
                minor: abi::KERNEL_MINOR_VERSION,
                max_readahead: init.max_readahead.min(MAX_READAHEAD),
                max_background: MAX_BACKGROUND,
                congestion_threshold: MAX_BACKGROUND,
                max_write: MAX_WRITE,
                time_gran: 1,
                max_pages: (MAX_WRITE / PAGE_SIZE as u32) as u16,
                map_alignment: 0,
                ..InitOut::default()
            };
            reply.set_flags64(init.flags & want);
            reply.encode(out);
            self.init_answered.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// `LOOKUP` in the root: the pool or the calibration file.
    fn lookup(&self, h: &InHeader, args: &mut Cursor<'_>, out: &mut Vec<u8>) -> Result<(), i32> {
        let name = args.name().map_err(inval)?;
        if h.nodeid != abi::ROOT_ID {
            return Err(libc::ENOTDIR);
        }
        let nodeid = if name == POOL_NAME.as_bytes() {
            POOL_NODEID
        } else if name == CALIB_NAME.as_bytes() {
            CALIB_NODEID
        } else {
            return Err(libc::ENOENT);
        };
        EntryOut {
            nodeid,
            generation: 1,
            entry_valid: VALID_SECS,
            attr_valid: VALID_SECS,
            attr: self.attr(nodeid),
            ..EntryOut::default()
        }
        .encode(out);
        Ok(())
    }

    /// `GETATTR`, finished here: a GETATTR of the root from the stopping
    /// thread at shutdown also ends the request thread that answers it.
    fn getattr(&self, h: &InHeader, out: &mut Vec<u8>) -> Result<Outcome, i32> {
        if !Self::known(h.nodeid) {
            return Err(libc::ENOENT);
        }
        encode_attr_out(VALID_SECS, 0, &self.attr(h.nodeid), out);
        finish(out, h.unique)?;
        if h.nodeid == abi::ROOT_ID
            && self.stop.load(Ordering::Acquire)
            && h.pid == self.stop_tid.load(Ordering::Acquire)
        {
            return Ok(Outcome::ReplyAndExit);
        }
        Ok(Outcome::Reply)
    }

    /// `SETATTR`: nothing may change but the times, which are ignored.
    fn setattr(&self, h: &InHeader, args: &mut Cursor<'_>, out: &mut Vec<u8>) -> Result<(), i32> {
        let a: SetattrIn = args.read().map_err(inval)?;
        if !Self::known(h.nodeid) {
            return Err(libc::ENOENT);
        }
        let size_change = a.valid & fattr::SIZE != 0 && a.size != self.attr(h.nodeid).size;
        if size_change || a.valid & (fattr::MODE | fattr::UID | fattr::GID) != 0 {
            return Err(libc::EPERM);
        }
        // Times are ignored: the pool's mtime never changes.
        encode_attr_out(VALID_SECS, 0, &self.attr(h.nodeid), out);
        Ok(())
    }

    /// `READDIR` of the root: `.`, `..` and the pool, from `offset` on, as
    /// many as fit in `size`.
    fn readdir(&self, h: &InHeader, args: &mut Cursor<'_>, out: &mut Vec<u8>) -> Result<(), i32> {
        let r: ReadIn = args.read().map_err(inval)?;
        if h.nodeid != abi::ROOT_ID {
            return Err(libc::ENOTDIR);
        }
        // The calibration file is not listed: it is looked up by
        // name, by the plane itself only.
        let entries: [(u64, u32, &[u8]); 3] = [
            (abi::ROOT_ID, libc::DT_DIR.into(), b"."),
            (abi::ROOT_ID, libc::DT_DIR.into(), b".."),
            (POOL_NODEID, libc::DT_REG.into(), POOL_NAME.as_bytes()),
        ];
        let limit = abi::OUT_HEADER_LEN + r.size as usize;
        for (i, (ino, typ, name)) in entries.iter().enumerate().skip(r.offset as usize) {
            if out.len() + abi::dirent_size(name.len()) > limit {
                break;
            }
            encode_dirent(*ino, i as u64 + 1, *typ, name, out);
        }
        Ok(())
    }

    /// `STATFS`: one file system the size of the pool.
    fn statfs(&self, out: &mut Vec<u8>) {
        Kstatfs {
            blocks: self.size / PAGE_SIZE,
            files: 2,
            bsize: PAGE_SIZE as u32,
            namelen: 255,
            frsize: PAGE_SIZE as u32,
            ..Kstatfs::default()
        }
        .encode(out)
    }
}
