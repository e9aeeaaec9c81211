//! The helper's requests over FUSE over io_uring: one worker per CPU
//! queue, pinned to its CPU, with [`RING_DEPTH`] entries. A miss is
//! forwarded to the daemon on the queue's socket and its entry waits
//! ([`Due::Deferred`]); the daemon's [`Verdict`] brings the reply and when
//! it is due, and the worker commits it then. A READ arriving while all
//! but one of the worker's entries wait is answered here from the store
//! and the daemon told ([`ForwardKind::ReadServed`]): the helper never
//! waits for the daemon, so a write-back always finds an entry.

use super::{MissStarts, ReadAction, ToDaemon, QUEUE};
use crate::fuse_plane::{error_reply, Outcome, Server, CALIB_NODEID, POOL_NODEID};
use crate::helper_link::{
    monotonic_ns, Forward, ForwardKind, Verdict, FORWARD_LEN, MAX_FORWARD, MAX_VERDICT, VERDICT_LEN,
};
use crate::uring::{Deferred, Due, RingConfig, RingServer, RingSet, StartRingError};
use fuse_abi::zerocopy::{FromBytes, IntoBytes};
use fuse_abi::{opcode, Cursor, InHeader, OutHeader, ReadIn};
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

/// Entries per queue: misses in flight per CPU (one more never waits).
/// A miss holds its entry for its modeled time, and each faulting thread
/// has one miss at a time.
pub const RING_DEPTH: usize = 16;

/// Why the helper's ring did not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartHelperRingError {
    /// The kernel granted the ring, and this host has more queues than
    /// the helper has sockets.
    #[error("the ring has {queues} queues and the helper {sockets} sockets")]
    TooManyQueues {
        /// The kernel's queues.
        queues: usize,
        /// The helper's sockets.
        sockets: usize,
    },
    /// The ring's workers did not start.
    #[error("cannot start the helper's ring")]
    Ring(#[from] StartRingError),
}

/// What answers the helper's ring requests.
pub(crate) struct HelperRing {
    pub(crate) server: Arc<Server>,
    pub(crate) to_daemon: ToDaemon,
    pub(crate) misses: Arc<MissStarts>,
    pub(crate) store: Arc<File>,
    pub(crate) size: u64,
}

/// Waits for INIT; if the kernel granted the ring, starts its workers
/// (`None`: the helper stays on `/dev/fuse`).
pub(crate) fn start(
    server: &Server,
    dev: &Arc<File>,
    ring: HelperRing,
) -> Result<Option<RingSet>, StartHelperRingError> {
    if !crate::fuse_plane::init_granted_ring(server) {
        return Ok(None);
    }
    let queues = crate::uring::possible_cpus();
    let sockets = ring.to_daemon.sockets();
    if queues > sockets {
        return Err(StartHelperRingError::TooManyQueues { queues, sockets });
    }
    let config = RingConfig {
        queues,
        per_queue: RING_DEPTH,
        payload_len: crate::fuse_plane::ring_payload_len(),
        poll: false,
        deferring: true,
    };
    Ok(Some(RingSet::start(dev, Arc::new(ring), config)?))
}

impl HelperRing {
    /// Forwards a miss to the daemon: answered later (`ReadRing`), or
    /// already answered here (`ReadServed`). False once the daemon is gone.
    fn forward(&self, kind: ForwardKind, (arrival, start): (u64, u64), req: &[u8]) -> bool {
        let f = Forward {
            kind: kind as u32,
            mono_ns: arrival,
            lead_ns: arrival.saturating_sub(start),
            ..Forward::default()
        };
        let mut msg = Vec::with_capacity(FORWARD_LEN + req.len());
        msg.extend_from_slice(f.as_bytes());
        msg.extend_from_slice(req);
        self.to_daemon.send(msg)
    }

    /// Answers a READ from the store (the calibration file reads zeros).
    fn serve_here(&self, h: &InHeader, req: &[u8], out: &mut Vec<u8>) {
        out.clear();
        let mut c = Cursor::new(req);
        let parsed = InHeader::parse(&mut c).and_then(|_| c.read::<ReadIn>());
        let Ok(r) = parsed else {
            error_reply(out, h.unique, libc::EINVAL);
            return;
        };
        let limit = match h.nodeid {
            POOL_NODEID => self.size,
            CALIB_NODEID => crate::PAGE_SIZE,
            _ => {
                error_reply(out, h.unique, libc::ENOENT);
                return;
            }
        };
        let len = u64::from(r.size).min(limit.saturating_sub(r.offset)) as usize;
        let Ok(head) = OutHeader::for_payload(h.unique, 0, len) else {
            error_reply(out, h.unique, libc::EIO);
            return;
        };
        head.encode(out);
        let start = out.len();
        out.resize(start + len, 0);
        if h.nodeid == POOL_NODEID {
            if let Err(e) = crate::fuse_plane::read_full(&self.store, &mut out[start..], r.offset) {
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                error_reply(out, h.unique, errno);
            }
        }
    }

    /// A READ: refused, forwarded (deferred), or served here.
    fn read(
        &self,
        h: &InHeader,
        req: &[u8],
        arrival: u64,
        out: &mut Vec<u8>,
        may_defer: bool,
    ) -> Due {
        let start = match self.misses.read(h, req, arrival) {
            ReadAction::Refuse => {
                error_reply(out, h.unique, libc::EIO);
                return Due::Now;
            }
            ReadAction::Forward(t) => t,
        };
        if may_defer {
            if self.forward(ForwardKind::ReadRing, (arrival, start), req) {
                return Due::Deferred;
            }
            error_reply(out, h.unique, libc::EIO);
            return Due::Now;
        }
        self.serve_here(h, req, out);
        // Charged by the daemon all the same (the daemon gone: served).
        let _ = self.forward(ForwardKind::ReadServed, (arrival, start), req);
        Due::Now
    }
}

impl RingServer for HelperRing {
    fn now_ns(&self) -> u64 {
        monotonic_ns()
    }

    fn answer(&self, req: &[u8], arrival_ns: u64, out: &mut Vec<u8>, may_defer: bool) -> Due {
        let header = InHeader::parse(&mut Cursor::new(req)).ok();
        if let Some(h) = header.filter(|h| h.opcode == opcode::READ) {
            if req.len() + FORWARD_LEN <= MAX_FORWARD {
                return self.read(&h, req, arrival_ns, out, may_defer);
            }
        }
        match self.server.handle(req, arrival_ns, out) {
            Outcome::Reply | Outcome::ReplyAndExit => Due::Now,
            Outcome::ReplyAt(t) => Due::At(t),
            Outcome::None => {
                let unique = header.map_or(0, |h| h.unique);
                error_reply(out, unique, libc::EIO);
                Due::Now
            }
        }
    }

    fn enter_worker(&self, queue: Option<u16>) {
        QUEUE.with(|c| c.set(queue.map(usize::from)));
    }

    fn deferred_fd(&self, queue: u16) -> Option<RawFd> {
        self.to_daemon
            .socket(usize::from(queue))
            .map(|s| s.as_raw_fd())
    }

    fn take_deferred(&self, queue: u16, out: &mut Vec<u8>) -> Deferred {
        let Some(sock) = self.to_daemon.socket(usize::from(queue)) else {
            return Deferred::Closed;
        };
        out.resize(MAX_VERDICT, 0);
        let n = match super::to_daemon::recv_now(sock, out) {
            Ok(0) => return Deferred::Closed,
            Ok(n) => n,
            Err(e) => {
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => Deferred::Empty,
                    _ => Deferred::Closed,
                }
            }
        };
        let Ok((v, _)) = Verdict::read_from_prefix(&out[..n]) else {
            tracing::warn!(n, "a short verdict from the daemon");
            return Deferred::Empty;
        };
        out.copy_within(VERDICT_LEN..n, 0);
        out.truncate(n - VERDICT_LEN);
        Deferred::Reply {
            unique: v.unique,
            due_ns: v.due_mono_ns,
        }
    }
}
