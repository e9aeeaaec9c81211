//! A pool plane whose FUSE requests are read by a helper *process*: for a
//! pool that the serving process itself maps (memory mode: a VMM hands its
//! CXL node's memory to the vhost-user back-end in `SET_MEM_TABLE`).
//!
//! Why a process and not threads: unmapping a shared FUSE file waits in the
//! kernel for its dirty pages' write-back (`munmap` → `fuse_vma_close` →
//! `write_inode_now`), holding the unmapping process's `mmap_lock`. If the
//! thread that must answer that `FUSE_WRITE` lives in the same process, it
//! can itself be waiting for the same `mmap_lock` (a page fault, heap growth
//! in `mprotect`): both wait forever, uninterruptibly, and the VMM's exit
//! waits behind them. The helper has its own `mm`, maps no guest memory and
//! never waits for the daemon:
//!
//! * it reads every request from `/dev/fuse` and answers all but `READ`
//!   itself (the protocol of one fixed-size file, as [`crate::FusePoolPlane`]);
//! * a write-back (`FUSE_WRITE`) is stored in the backing store (an fd the
//!   daemon created: a memfd or a sparse file, never a share) and answered
//!   at once; the daemon hears of it afterwards (to charge NAND programs);
//! * a miss (`READ`) is forwarded to the daemon through a queue and a socket
//!   without waiting for anything — the socket of the CPU the helper's
//!   thread runs on, whose daemon receiver is pinned to that CPU: waking it
//!   is a switch on this CPU, not a wake-up of another (idle) one; the daemon charges the device model and
//!   writes the reply to its own descriptor of the same `/dev/fuse`
//!   connection when the modeled access completes (data from the store);
//! * where the plane refuses readahead (`readahead.rs`), the helper refuses
//!   it itself, on a map shared with the daemon (whose notifier forgets
//!   invalidated pages there): a refused `READ` costs no trip to the daemon.
//!   The miss forwarded next by the same thread says how long before it
//!   its first refused `READ` came, so the refusal's round trip lies
//!   inside the modeled time, not on top of it. The hop to the daemon does
//!   not: a miss arrives when the daemon gets it (that hop is trap-path
//!   cost, taken off by compensation like the fault's own).
//!
//! * where the kernel offers FUSE over io_uring, the helper takes requests
//!   on a ring instead (`ring.rs`): one worker per CPU queue, pinned there,
//!   so a fault wakes a thread on its own CPU. A miss is forwarded on that
//!   CPU's socket and its entry waits; the daemon answers with the reply
//!   and when it is due (a verdict), and the worker commits it then. The
//!   worker never waits for a verdict: it keeps taking requests on its
//!   other entries, and one entry never waits at all — a READ that would
//!   take it is answered from the store at once (and the daemon told, to
//!   charge it). So write-backs are answered here too.
//!
//! So whatever the daemon's threads wait for, write-backs are answered, and
//! every `munmap` — the daemon's, the VMM's, an exiting process's — ends.
//! Notifications (`NOTIFY_STORE` / `NOTIFY_INVAL_INODE`) stay with the
//! daemon's notifier thread as in [`crate::FusePoolPlane`].
//!
//! The helper is the program given by [`HelperCommand`] (by default the
//! daemon's own executable), run with [`HELPER_ENV`] set; its `main` must
//! call [`helper_main_if_requested`] before anything else. It dies when the
//! daemon closes its end of the socket (or exits).

mod ring;
mod to_daemon;

pub use ring::RING_DEPTH;

use crate::fuse_plane::{Outcome, Server};
use crate::helper_link::{monotonic_ns, Forward, ForwardKind, FORWARD_LEN, MAX_FORWARD};
pub use crate::helper_link::{HelperCommand, SpawnHelperError, HELPER_ENV};
use crate::helper_seccomp::SeccompMode;
use crate::readahead::ReadaheadRefusals;
use crate::{Miss, MissReply, PoolBackend, ServeMissError, WritebackError};
use fuse_abi::zerocopy::IntoBytes;
use fuse_abi::{opcode, Cursor, InHeader, ReadIn};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::thread;
use to_daemon::{ToDaemon, QUEUE};

/// Request threads of a helper: each only reads, forwards or stores, never
/// waits on the daemon, so a few are enough for any number of vCPUs.
const HELPER_READERS: usize = 4;

/// The helper's backend: stores write-backs, never serves a miss (the
/// reader forwards every READ before it reaches the server).
struct StoreBackend {
    store: Arc<File>,
    to_daemon: ToDaemon,
}

impl PoolBackend for StoreBackend {
    fn now_ns(&self) -> u64 {
        monotonic_ns()
    }

    fn on_miss(&self, _: &Miss, _: &mut [u8]) -> Result<MissReply, ServeMissError> {
        Err(ServeMissError::Device(
            "a plane helper forwards misses to the daemon".into(),
        ))
    }

    fn on_writeback(
        &self,
        pool_offset: u64,
        data: &[u8],
        pid: u32,
        arrival_ns: u64,
    ) -> Result<u64, WritebackError> {
        self.store.write_all_at(data, pool_offset)?;
        let f = Forward {
            kind: ForwardKind::Stored as u32,
            pid,
            mono_ns: arrival_ns,
            offset: pool_offset,
            len: data.len() as u64,
            ..Forward::default()
        };
        // The daemon gone: the write is stored all the same.
        let _ = self.to_daemon.send(f.as_bytes().to_vec());
        Ok(arrival_ns)
    }
}

/// Parsed [`HELPER_ENV`].
struct HelperSpec {
    dev: RawFd,
    /// One socket per CPU.
    socks: Vec<RawFd>,
    store: RawFd,
    /// The readahead map (-1: readahead is not refused).
    ra: RawFd,
    size: u64,
    seccomp: SeccompMode,
    /// INIT may offer FUSE over io_uring.
    ring: bool,
}

fn parse_spec(s: &str) -> Option<HelperSpec> {
    let mut spec = HelperSpec {
        dev: -1,
        socks: Vec::new(),
        store: -1,
        ra: -1,
        size: 0,
        seccomp: SeccompMode::Kill,
        ring: false,
    };
    for part in s.split_whitespace() {
        let (k, v) = part.split_once('=')?;
        match k {
            "dev" => spec.dev = v.parse().ok()?,
            "sock" => {
                spec.socks = v
                    .split(',')
                    .map(|f| f.parse().ok().filter(|&fd: &RawFd| fd >= 0))
                    .collect::<Option<_>>()?
            }
            "store" => spec.store = v.parse().ok()?,
            "ra" => spec.ra = v.parse().ok()?,
            "size" => spec.size = v.parse().ok()?,
            "seccomp" => spec.seccomp = v.parse().ok()?,
            "ring" => spec.ring = v == "1",
            _ => return None,
        }
    }
    let ok = spec.dev >= 0
        && !spec.socks.is_empty()
        && spec.socks.len() <= crate::helper_link::MAX_SOCKETS
        && spec.store >= 0
        && spec.size > 0;
    ok.then_some(spec)
}

/// If this process was started as a plane helper ([`HELPER_ENV`] set),
/// serves until the daemon goes away and exits; otherwise returns at once.
/// Call it first thing in `main`, before any thread starts.
pub fn helper_main_if_requested() {
    let Some(spec) = std::env::var_os(HELPER_ENV) else {
        return;
    };
    let code = match spec.to_str().and_then(parse_spec) {
        Some(spec) => {
            run_helper(spec);
            0
        }
        None => {
            eprintln!("cxlfs plane helper: malformed {HELPER_ENV}");
            2
        }
    };
    std::process::exit(code);
}

fn run_helper(spec: HelperSpec) {
    // SAFETY: a plain prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    // SAFETY: the daemon handed these fds to this process alone
    // (HELPER_ENV names them); each is wrapped exactly once.
    let (dev, socks, store) = unsafe {
        (
            Arc::new(File::from_raw_fd(spec.dev)),
            Arc::new(
                spec.socks
                    .iter()
                    .map(|&fd| File::from_raw_fd(fd))
                    .collect::<Vec<_>>(),
            ),
            Arc::new(File::from_raw_fd(spec.store)),
        )
    };
    let refusals = if spec.ra >= 0 {
        // SAFETY: handed to this process alone, wrapped once (as above).
        let file = unsafe { File::from_raw_fd(spec.ra) };
        match ReadaheadRefusals::attach(file, spec.size) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("cxlfs plane helper: cannot map the readahead map: {e}");
                return;
            }
        }
    } else {
        None
    };
    let to_daemon = match ToDaemon::start(socks.clone()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cxlfs plane helper: cannot start the forwarder: {e}");
            return;
        }
    };
    let misses = Arc::new(MissStarts {
        refusals,
        size: spec.size,
        first_refusal: Mutex::new(HashMap::new()),
    });
    let mut server = Server::new(
        Arc::new(StoreBackend {
            store: store.clone(),
            to_daemon: to_daemon.clone(),
        }),
        spec.size,
    );
    if spec.ring {
        server = server.offering_uring();
    }
    let server = Arc::new(server);
    for i in 0..HELPER_READERS {
        let (server, dev, to) = (server.clone(), dev.clone(), to_daemon.clone());
        let misses = misses.clone();
        let _ = thread::Builder::new()
            .name(format!("plane-req{i}"))
            .spawn(move || helper_reader(&server, &dev, &to, &misses));
    }
    // A ring the kernel granted must be up before anything else is asked
    // (the kernel holds every request until each queue has an entry).
    let ring = if spec.ring {
        let helper_ring = ring::HelperRing {
            server: server.clone(),
            to_daemon: to_daemon.clone(),
            misses: misses.clone(),
            store,
            size: spec.size,
        };
        match ring::start(&server, &dev, helper_ring) {
            Ok(r) => r,
            Err(e) => {
                // The daemon sees this process end and aborts the mount.
                eprintln!("cxlfs plane helper: {e}");
                return;
            }
        }
    } else {
        None
    };
    let queues = ring.as_ref().map_or(0, |r| r.config().queues);
    let hello = Forward {
        kind: ForwardKind::Hello as u32,
        queues: queues as u64,
        ..Forward::default()
    };
    let _ = to_daemon.send(hello.as_bytes().to_vec());
    drop(to_daemon);
    // Serving from here on: nothing but the calls on the helper's list.
    if let Err(e) = crate::helper_seccomp::install(spec.seccomp) {
        eprintln!("cxlfs plane helper: {e}");
        return;
    }
    // Its end closing (or its exit) ends us; what the daemon sends on the
    // sockets is for the ring workers.
    wait_for_hangup(&socks[0]);
    // The process ends now: its workers need no stopping (a stop would
    // also close descriptors through calls outside the allow-list).
    std::mem::forget(ring);
}

/// Waits until the daemon's end of `sock` is gone.
fn wait_for_hangup(sock: &File) {
    let mut fds = [libc::pollfd {
        fd: sock.as_raw_fd(),
        events: 0,
        revents: 0,
    }];
    loop {
        // SAFETY: `fds` is a valid array of one pollfd for the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 1, -1) };
        if rc > 0 && fds[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            return;
        }
        if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// Longest a refused READ's arrival is carried to the same thread's next
/// miss: a fault's refusals and its served read follow each other within
/// a few wake-ups; anything older belongs to no fault in flight.
const CARRY_MAX_NS: u64 = 500_000;

/// Most threads with a refusal in flight remembered at once (VMM threads:
/// vCPUs and a few more); beyond it the table starts again.
const MAX_CARRIED: usize = 4096;

/// The helper's part of the readahead refusal, and when each thread's
/// fault began.
pub(crate) struct MissStarts {
    /// The map shared with the daemon (`None`: readahead is served).
    refusals: Option<ReadaheadRefusals>,
    size: u64,
    /// Thread → arrival of its first READ refused since its last miss.
    first_refusal: Mutex<HashMap<u32, u64>>,
}

/// What the helper does with a READ.
pub(crate) enum ReadAction {
    /// Refused here (`EIO`): readahead of pages never refused before.
    Refuse,
    /// Forwarded with this arrival (the fault's first refusal, if recent).
    Forward(u64),
}

impl MissStarts {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u32, u64>> {
        self.first_refusal.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decides a READ of `req` (header `h`) that arrived at `arrival`.
    pub(crate) fn read(&self, h: &InHeader, req: &[u8], arrival: u64) -> ReadAction {
        let Some(refusals) = &self.refusals else {
            return ReadAction::Forward(arrival);
        };
        if h.nodeid != crate::fuse_plane::POOL_NODEID {
            return ReadAction::Forward(arrival);
        }
        let mut c = Cursor::new(req);
        let parsed = InHeader::parse(&mut c).and_then(|_| c.read::<ReadIn>());
        let Ok(r) = parsed else {
            return ReadAction::Forward(arrival);
        };
        let len = u64::from(r.size).min(self.size.saturating_sub(r.offset));
        if len > 0 && refusals.refuse(r.offset, len) {
            let mut t = self.table();
            if t.len() >= MAX_CARRIED {
                t.clear();
            }
            t.entry(h.pid).or_insert(arrival);
            return ReadAction::Refuse;
        }
        match self.table().remove(&h.pid) {
            Some(first) if arrival.saturating_sub(first) <= CARRY_MAX_NS => {
                ReadAction::Forward(first)
            }
            _ => ReadAction::Forward(arrival),
        }
    }
}

fn helper_reader(server: &Server, dev: &File, to_daemon: &ToDaemon, misses: &MissStarts) {
    let mut buf =
        vec![0u8; fuse_abi::MIN_READ_BUFFER.max(crate::fuse_plane::MAX_WRITE as usize + 4096)];
    let mut out = Vec::with_capacity(fuse_abi::OUT_HEADER_LEN + 4096);
    loop {
        let n = match (&*dev).read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::ENOENT) | Some(libc::EAGAIN) => continue,
                _ => return, // ENODEV: the connection ended
            },
        };
        let arrival = monotonic_ns();
        let req = &buf[..n];
        let header = InHeader::parse(&mut Cursor::new(req)).ok();
        if let Some(h) = header.filter(|h| h.opcode == opcode::READ) {
            if n + FORWARD_LEN <= MAX_FORWARD {
                let mono_ns = match misses.read(&h, req, arrival) {
                    ReadAction::Refuse => {
                        crate::fuse_plane::error_reply(&mut out, h.unique, libc::EIO);
                        crate::fuse_plane::write_reply(dev, &out);
                        continue;
                    }
                    ReadAction::Forward(t) => t,
                };
                let f = Forward {
                    kind: ForwardKind::Read as u32,
                    mono_ns: arrival,
                    lead_ns: arrival.saturating_sub(mono_ns),
                    ..Forward::default()
                };
                let mut msg = Vec::with_capacity(FORWARD_LEN + n);
                msg.extend_from_slice(f.as_bytes());
                msg.extend_from_slice(req);
                if !to_daemon.send(msg) {
                    return;
                }
                continue;
            }
        }
        match server.handle(req, arrival, &mut out) {
            Outcome::None => {}
            Outcome::Reply | Outcome::ReplyAt(_) | Outcome::ReplyAndExit => {
                crate::fuse_plane::write_reply(dev, &out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::helper_link::{recv_forward, seqpacket_pair};
    use std::io::Write;

    #[test]
    fn the_spec_round_trips_and_rejects_garbage() {
        let s = parse_spec("dev=3 sock=4 store=5 size=8192").expect("parses");
        assert_eq!((s.dev, s.store, s.ra, s.size), (3, 5, -1, 8192));
        assert_eq!(s.socks, [4]);
        let s = parse_spec("dev=3 sock=4,7,8 store=5 size=8192").expect("parses");
        assert_eq!(s.socks, [4, 7, 8]);
        assert!(parse_spec("dev=3 sock=4,,8 store=5 size=8192").is_none());
        let s = parse_spec("dev=3 sock=4 store=5 size=8192 ra=6 seccomp=log").expect("parses");
        assert_eq!((s.ra, s.seccomp), (6, SeccompMode::Log));
        assert!(parse_spec("dev=3 sock=4 store=5 size=8192 seccomp=allow").is_none());
        assert!(parse_spec("dev=3 sock=4 size=8192").is_none());
        assert!(parse_spec("dev=3 sock=4 store=5 size=0").is_none());
        assert!(parse_spec("dev=x sock=4 store=5 size=1").is_none());
        assert!(parse_spec("dev=3 sock=4 store=5 size=1 other=2").is_none());
    }

    #[test]
    fn a_forward_header_is_what_the_receiver_reads() {
        let f = Forward {
            kind: ForwardKind::Stored as u32,
            pid: 7,
            mono_ns: 11,
            offset: 4096,
            len: 8192,
            lead_ns: 3,
            queues: 2,
        };
        let (a, b) = seqpacket_pair().expect("socketpair");
        (&a).write_all(f.as_bytes()).expect("send");
        let mut buf = [0u8; MAX_FORWARD];
        let (g, n) = recv_forward(&b, &mut buf).expect("one record");
        assert_eq!(n, FORWARD_LEN);
        assert_eq!(
            (g.kind, g.pid, g.mono_ns, g.offset, g.len, g.lead_ns, g.queues),
            (2, 7, 11, 4096, 8192, 3, 2)
        );
        drop(a);
        assert!(
            recv_forward(&b, &mut buf).is_none(),
            "end of the peer = None"
        );
    }
}
