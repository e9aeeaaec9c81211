//! The plane's request-side thread bodies: `/dev/fuse` request readers, a
//! split plane's receivers of forwarded misses, and the pacer that writes
//! held replies when due; also the ring workers' entry into the server, and
//! the mark that tells a request thread (which must never wait for a
//! notification). The notifier is in `notifier.rs`.

use super::server::{error_reply, Outcome, Server};
use super::{ReaderMode, MAX_WRITE};
use crate::pace;
use fuse_abi::{self as abi, Cursor, InHeader};
use std::cell::Cell;
use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender};

thread_local! {
    static REQUEST_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread answers FUSE requests for a plane (it must
/// never wait for a notification).
pub fn on_request_thread() -> bool {
    REQUEST_THREAD.with(Cell::get)
}

/// Ring workers answer through the same server as `/dev/fuse` readers and
/// are request threads too.
impl crate::uring::RingServer for Server {
    fn now_ns(&self) -> u64 {
        self.backend.now_ns()
    }

    fn answer(
        &self,
        request: &[u8],
        arrival_ns: u64,
        out: &mut Vec<u8>,
        _may_defer: bool,
    ) -> crate::uring::Due {
        use crate::uring::Due;
        self.metrics.ring_request();
        match self.handle(request, arrival_ns, out) {
            // A stop GETATTR is for `/dev/fuse` readers; a ring worker
            // just answers it.
            Outcome::Reply | Outcome::ReplyAndExit => Due::Now,
            Outcome::ReplyAt(t) => Due::At(t),
            // FORGET and INTERRUPT never come through the ring; anything
            // else without a reply still needs one to free its entry.
            Outcome::None => {
                let unique = InHeader::parse(&mut Cursor::new(request)).map_or(0, |h| h.unique);
                error_reply(out, unique, libc::EIO);
                Due::Now
            }
        }
    }

    fn enter_worker(&self, _queue: Option<u16>) {
        REQUEST_THREAD.with(|c| c.set(true));
    }
}

/// A reply held until its modeled completion.
pub(super) struct Held {
    deadline_ns: u64,
    reply: Vec<u8>,
}

impl pace::Deadline for Held {
    fn deadline_ns(&self) -> u64 {
        self.deadline_ns
    }
}

/// Writes one whole message to `/dev/fuse`; `ENOENT` (the request was
/// interrupted and is gone) is not an error.
pub(crate) fn write_reply(dev: &File, reply: &[u8]) {
    match (&*dev).write(reply) {
        Ok(n) if n == reply.len() => {}
        Ok(n) => tracing::warn!(n, len = reply.len(), "short FUSE reply write"),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => tracing::warn!(error = %e, "cannot write a FUSE reply"),
    }
}

/// Waits until `dev` has a request (`true`) or `wake` fires (`false`).
fn wait_for_request(dev: &File, wake: &File) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: dev.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfds for the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return false;
        }
        if fds[1].revents != 0 {
            return false;
        }
        // POLLERR / POLLHUP on the device: the read says what happened.
        return true;
    }
}

/// A request thread on `/dev/fuse`: reads, answers and delivers requests
/// until the connection ends, its stop GETATTR comes, or (spinning, or
/// beside a ring with `wake`) the plane stops.
pub(super) fn reader(
    server: &Server,
    dev: &File,
    pacer: Sender<Held>,
    mode: ReaderMode,
    wake: Option<&File>,
) {
    REQUEST_THREAD.with(|c| c.set(true));
    let mut buf = vec![0u8; (MAX_WRITE as usize + 4096).max(abi::MIN_READ_BUFFER)];
    let mut out: Vec<u8> = Vec::with_capacity(abi::OUT_HEADER_LEN + MAX_WRITE as usize);
    loop {
        if let Some(w) = wake {
            if !wait_for_request(dev, w) {
                break;
            }
        }
        let n = match (&*dev).read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                Some(libc::EAGAIN) => {
                    if server.stop.load(Ordering::Acquire) {
                        break;
                    }
                    if wake.is_none() {
                        std::hint::spin_loop();
                    }
                    continue;
                }
                // Interrupted, or a request that went away before we read it.
                Some(libc::EINTR) | Some(libc::ENOENT) => continue,
                // The connection ended (unmounted, aborted).
                Some(libc::ENODEV) => break,
                _ => {
                    tracing::warn!(error = %e, "reading /dev/fuse failed; request thread ends");
                    break;
                }
            },
        };
        let arrival = server.backend.now_ns();
        let outcome = server.handle(&buf[..n], arrival, &mut out);
        if outcome == Outcome::ReplyAndExit {
            // Counted out before the reply: whoever waits on it sees it.
            server.alive.fetch_sub(1, Ordering::AcqRel);
            write_reply(dev, &out);
            return;
        }
        deliver(server, dev, &pacer, &mut out, outcome);
        if mode == ReaderMode::Spin && server.stop.load(Ordering::Acquire) {
            break;
        }
    }
    server.alive.fetch_sub(1, Ordering::AcqRel);
}

/// Writes a handled request's reply now, or when it is due: spun for here
/// if due within [`INLINE_SPIN_NS`](pace::INLINE_SPIN_NS), else handed to the pacer.
fn deliver(server: &Server, dev: &File, pacer: &Sender<Held>, out: &mut Vec<u8>, outcome: Outcome) {
    match outcome {
        Outcome::None => {}
        Outcome::Reply | Outcome::ReplyAndExit => write_reply(dev, out),
        Outcome::ReplyAt(deadline) => {
            let now = server.backend.now_ns();
            if pace::keep_inline(now, deadline) {
                pace::wait_until(|| server.backend.now_ns(), deadline);
                write_reply(dev, out);
            } else {
                let reply = std::mem::replace(
                    out,
                    Vec::with_capacity(abi::OUT_HEADER_LEN + MAX_WRITE as usize),
                );
                let held = Held {
                    deadline_ns: deadline,
                    reply,
                };
                if let Err(mpsc::SendError(h)) = pacer.send(held) {
                    pace::wait_until(|| server.backend.now_ns(), h.deadline_ns);
                    write_reply(dev, &h.reply);
                }
            }
        }
    }
}

/// Daemon threads of a split plane: misses and stored write-backs that
/// the helper forwards. A miss is answered exactly as a local reader
/// would (same server, same pacing); the reply goes to this process's
/// descriptor of the connection, or, for a miss from the helper's ring,
/// back to the helper on `sock` with when it is due. If the helper goes
/// away while the plane is up, nothing could answer write-backs any more:
/// the connection is aborted (every waiter gets an error) rather than left
/// to hang.
pub(super) fn forwarded(
    server: &Server,
    dev: &File,
    sock: &File,
    pacer: Sender<Held>,
    abort: Option<&Path>,
) {
    use crate::helper_link::{ForwardKind as K, FORWARD_LEN};
    REQUEST_THREAD.with(|c| c.set(true));
    let mut buf = vec![0u8; crate::helper_link::MAX_FORWARD];
    let mut out: Vec<u8> = Vec::with_capacity(abi::OUT_HEADER_LEN + MAX_WRITE as usize);
    while let Some((f, n)) = crate::helper_link::recv_forward(sock, &mut buf) {
        // A miss arrives when it reaches this process: the hop from the
        // helper is trap-path cost like the fault's own, outside the
        // modeled time (compensation takes both off). A fault that began
        // with a refused READ began that much earlier (`lead_ns`, at most the
        // helper's carry bound). A stored write-back arrived at the helper.
        let now = server.backend.now_ns();
        let arrival = if f.kind == K::Stored as u32 {
            let age = crate::helper_link::monotonic_ns().saturating_sub(f.mono_ns);
            now.saturating_sub(age)
        } else {
            now.saturating_sub(f.lead_ns.min(MAX_FAULT_LEAD_NS))
        };
        let req = &buf[FORWARD_LEN..n];
        match f.kind {
            k if k == K::Read as u32 => {
                let outcome = server.handle(req, arrival, &mut out);
                deliver(server, dev, &pacer, &mut out, outcome);
            }
            k if k == K::ReadRing as u32 => {
                server.metrics.ring_request();
                let outcome = server.handle(req, arrival, &mut out);
                send_verdict(server, sock, req, &out, outcome);
            }
            k if k == K::ReadServed as u32 => {
                // Answered by the helper already: charged only.
                let _ = server.handle(req, arrival, &mut out);
            }
            k if k == K::Stored as u32 => {
                match server
                    .backend
                    .on_stored_writeback(f.offset, f.len, f.pid, arrival)
                {
                    Ok(_) => server.metrics.writeback(f.len),
                    Err(e) => {
                        tracing::warn!(offset = f.offset, len = f.len, error = %e, "cannot charge a stored write-back")
                    }
                }
            }
            k if k == K::Hello as u32 => {
                let queues = usize::try_from(f.queues).unwrap_or(0);
                server.helper_ring_queues.store(queues, Ordering::Release);
                tracing::info!(ring_queues = queues, "the pool plane helper serves");
            }
            k => tracing::warn!(kind = k, "unknown message from the plane helper"),
        }
    }
    if server.stop.load(Ordering::Acquire) {
        return;
    }
    tracing::error!("the pool plane helper went away: aborting its connection");
    if let Some(p) = abort {
        if let Err(e) = std::fs::write(p, b"1") {
            tracing::error!(error = %e, path = %p.display(), "cannot abort the plane's connection");
        }
    }
}

/// Most a forwarded miss's start is moved back for the refused READs
/// before it (the helper carries at most 500 µs).
const MAX_FAULT_LEAD_NS: u64 = 1_000_000;

/// Sends the helper the reply to a miss from its ring (`out`, as
/// `outcome` says) and when to commit it, on the monotonic clock both
/// processes read. Blocking is fine here: the helper never waits for us.
fn send_verdict(server: &Server, sock: &File, req: &[u8], out: &[u8], outcome: Outcome) {
    use crate::helper_link::Verdict;
    use fuse_abi::zerocopy::IntoBytes;
    let now = server.backend.now_ns();
    let due = match outcome {
        Outcome::ReplyAt(t) => t,
        Outcome::Reply | Outcome::ReplyAndExit => now,
        Outcome::None => return,
    };
    let Ok(h) = InHeader::parse(&mut Cursor::new(req)) else {
        return;
    };
    let v = Verdict {
        unique: h.unique,
        due_mono_ns: crate::helper_link::monotonic_ns().saturating_add(due.saturating_sub(now)),
    };
    let want = v.as_bytes().len() + out.len();
    match (&*sock).write_vectored(&[IoSlice::new(v.as_bytes()), IoSlice::new(out)]) {
        Ok(n) if n == want => {}
        Ok(n) => tracing::warn!(n, want, "short verdict to the plane helper"),
        // The helper gone: its end of the socket tells the receiver.
        Err(e) => tracing::debug!(error = %e, "cannot send a verdict to the plane helper"),
    }
}

/// The pacer: writes each held reply when it is due.
pub(super) fn pacer(server: &Server, dev: &File, rx: Receiver<Held>) {
    REQUEST_THREAD.with(|c| c.set(true));
    pace::precise_timer_slack();
    pace::run_pacer(
        &rx,
        || server.backend.now_ns(),
        |due| {
            for h in due {
                write_reply(dev, &h.reply);
            }
        },
    );
}
