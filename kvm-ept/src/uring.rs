//! FUSE over io_uring for the pool plane (Linux ≥ 6.14, while the `fuse`
//! module's `enable_uring` parameter is set).
//!
//! Over `/dev/fuse` a miss costs the server a `read(2)` wake-up and a
//! `write(2)`; over io_uring the server keeps ring entries registered with
//! the kernel, a request lands in an entry's buffers and completes its
//! command, and the reply is committed together with the fetch of the
//! entry's next request: one `io_uring_enter` per reply, none per request
//! when the worker polls its completion queue ([`RingConfig::poll`]).
//!
//! The kernel keeps one queue per possible CPU and puts a request on the
//! queue of the CPU its thread runs on; it switches a connection to the
//! ring only once every queue has an entry. Each worker thread owns an
//! io_uring and some entries:
//! * sleeping workers ([`RingConfig::poll`] off): [`RingConfig::per_queue`]
//!   workers per queue, each with one entry of that queue and pinned to its
//!   CPU, so the faulting thread and the thread that answers it share a
//!   core (no cross-CPU wake-up), and a worker stuck in a slow host read
//!   holds only its own entry: the queue's other workers take the other
//!   misses, as `/dev/fuse` request threads do. The plane grows them with
//!   the VMs it sees ([`RingSet::grow_to`]).
//! * one polling worker: [`POLL_QUEUE_DEPTH`] entries of every queue, and
//!   its completion queue polled without sleeping.
//!
//! Replies are paced in the worker itself: a reply due later is committed
//! when due (sleeping in `io_uring_enter` until [`pace::SPIN_NS`] before,
//! then polling), while a polling worker goes on taking requests on its
//! other entries; the commit and the wait for the next request are one
//! `io_uring_enter`.
//!
//! What stays on `/dev/fuse` (the kernel's rule): INIT and anything before
//! the ring is ready, FORGET, INTERRUPT, and the plane's notifications.
//!
//! The io-uring crate builds and submits the SQEs; it cannot set an
//! `IORING_OP_URING_CMD`'s `len`, which FUSE's REGISTER needs (the iovec
//! count), so that one field is set through rustix's typed `io_uring_sqe`
//! ([`with_iovec_count`]).

use crate::pace;
use fuse_abi::zerocopy::FromBytes;
use fuse_abi::{
    self as abi, uring_cmd, InHeader, OutHeader, UringCmdReq, UringReqHeader, URING_IOV_SEGS,
};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// The kernel's switch for FUSE over io_uring.
pub const ENABLE_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Entries per queue of a polling worker: replies held for their modeled
/// time keep an entry each, so this many misses per CPU can be in flight
/// at once (more wait in the kernel's queue).
pub const POLL_QUEUE_DEPTH: usize = 8;

/// Most sleeping workers per queue a ring grows to.
pub const MAX_PER_QUEUE: usize = 16;

/// Most sleeping workers in all (a host with many CPUs gets fewer per
/// queue): each is a thread with a 128 KiB entry.
pub const MAX_WORKERS: usize = 512;

/// Sleeping workers per queue allowed for `queues` queues.
fn per_queue_cap(queues: usize) -> usize {
    MAX_PER_QUEUE.min(MAX_WORKERS / queues.max(1)).max(1)
}

/// `user_data` of the stop eventfd's poll.
const STOP_TAG: u64 = u64::MAX;

/// `user_data` of the poll for deferred replies.
const DEFER_TAG: u64 = u64::MAX - 1;

/// Longest a deferred request waits for its reply. Past it the worker has
/// the server answer it at once (`may_defer` false), so a reply lost on
/// its way (or a server that stopped answering) costs the faulting thread
/// this long, never forever. Well above any modeled access and above the
/// soak's 5-second SIGSTOP of the daemon.
pub const DEFERRED_DEADLINE_NS: u64 = 10_000_000_000;

/// Whether the host kernel offers FUSE over io_uring to a new connection.
pub fn kernel_offers() -> bool {
    std::fs::read_to_string(ENABLE_PARAM)
        .map(|s| matches!(s.trim(), "Y" | "y" | "1"))
        .unwrap_or(false)
}

/// The kernel's queue count: one per possible CPU (`num_possible_cpus()`).
pub fn possible_cpus() -> usize {
    let listed = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| parse_cpu_list_end(s.trim()));
    listed.unwrap_or_else(|| {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        usize::try_from(n).unwrap_or(1).max(1)
    })
}

/// `"0-3,5"` → 6: one past the highest CPU listed.
fn parse_cpu_list_end(list: &str) -> Option<usize> {
    list.split(',')
        .filter_map(|part| part.rsplit('-').next()?.trim().parse::<usize>().ok())
        .max()
        .and_then(|m| m.checked_add(1))
}

/// When a request's reply is to be committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// At once.
    Now,
    /// At this time (the server's clock).
    At(u64),
    /// Not known yet: the server handed the request on, and its reply
    /// comes back through [`RingServer::take_deferred`] (a deferring ring,
    /// [`RingConfig::deferring`]). The entry waits for it.
    Deferred,
}

/// What [`RingServer::take_deferred`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deferred {
    /// The reply to request `unique` (in the caller's buffer), due at
    /// `due_ns` (the server's clock).
    Reply {
        /// The request's `unique` (its entry's commit id).
        unique: u64,
        /// When to commit it.
        due_ns: u64,
    },
    /// Nothing more ready now.
    Empty,
    /// The way replies come back is gone: no more will.
    Closed,
}

/// What answers the requests that arrive through the ring.
pub(crate) trait RingServer: Send + Sync + 'static {
    /// The clock replies are paced by.
    fn now_ns(&self) -> u64;
    /// Answers `request` (a whole FUSE request: in-header, then arguments)
    /// into `out` (out-header, then the reply). Every ring request gets a
    /// reply: an entry is reused only once its reply is committed. The
    /// server may return [`Due::Deferred`] only where `may_defer` is set
    /// (a deferring worker keeps one entry that never waits).
    fn answer(&self, request: &[u8], arrival_ns: u64, out: &mut Vec<u8>, may_defer: bool) -> Due;
    /// Called first on each worker thread (marks it as one that answers
    /// requests and so must never wait for a notification); `queue`: the
    /// one queue a pinned worker serves.
    fn enter_worker(&self, queue: Option<u16>);
    /// Where replies to requests of `queue` deferred by this server become
    /// readable (polled by that queue's worker); `None`: nothing is
    /// deferred.
    fn deferred_fd(&self, _queue: u16) -> Option<RawFd> {
        None
    }
    /// The next reply to a deferred request of `queue`, into `out`
    /// (out-header, then the reply); never blocks.
    fn take_deferred(&self, _queue: u16, _out: &mut Vec<u8>) -> Deferred {
        Deferred::Closed
    }
}

/// How the ring is laid out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingConfig {
    /// Queues (the kernel's: [`possible_cpus`]).
    pub queues: usize,
    /// Sleeping workers per queue (one entry each), or a polling
    /// worker's entries per queue.
    pub per_queue: usize,
    /// Payload buffer per entry: at least the connection's largest
    /// request or reply argument (`max_write`, `max_pages` pages).
    pub payload_len: usize,
    /// One worker polls its completion queue instead of sleeping ones.
    pub poll: bool,
    /// One sleeping worker per queue, pinned to its CPU, with `per_queue`
    /// entries: for a server that defers requests ([`Due::Deferred`]), so
    /// the worker must never wait for one reply while its other entries
    /// take requests. At most all but one of its entries wait at once.
    pub deferring: bool,
}

/// Why the ring could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartRingError {
    /// The io_uring instance could not be created (old kernel, seccomp,
    /// `io_uring_disabled`).
    #[error("cannot create an io_uring")]
    Setup(#[source] io::Error),
    /// The stop eventfd could not be created.
    #[error("cannot create the ring's stop eventfd")]
    EventFd(#[source] io::Error),
    /// A worker thread could not be started.
    #[error("cannot start a ring worker")]
    Spawn(#[source] io::Error),
    /// The kernel refused to register an entry.
    #[error("the kernel refused FUSE ring entry registration (queue {qid})")]
    Register {
        /// The queue.
        qid: u16,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// A worker ended before it said whether its entries were registered.
    #[error("a ring worker ended during registration")]
    WorkerGone,
}

/// One entry: the buffers the kernel reads and writes. Boxed, so their
/// addresses stay put once registered.
struct Entry {
    qid: u16,
    header: Box<UringReqHeader>,
    payload: Box<[u8]>,
    /// The request being answered (its commit id), 0 while none.
    commit_id: u64,
    /// Whether the entry has been registered (REGISTER completed with a
    /// request at least once), for resubmitting after `EAGAIN`.
    registered: bool,
    /// Gone: the kernel cancelled it (teardown).
    dead: bool,
}

impl Entry {
    fn new(qid: u16, payload_len: usize) -> Self {
        Entry {
            qid,
            header: Box::default(),
            payload: vec![0u8; payload_len].into_boxed_slice(),
            commit_id: 0,
            registered: false,
            dead: false,
        }
    }
}

/// An SQE128 as the kernel lays it out: the 64-byte SQE (typed by rustix)
/// and the second half of the 80-byte command area.
#[repr(C)]
#[derive(Clone, Copy)]
struct Sqe128 {
    sqe: rustix::io_uring::io_uring_sqe,
    command_tail: [u8; 64],
}

const _: () = assert!(std::mem::size_of::<Sqe128>() == 128);
const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);

/// Sets the SQE's `len` (a REGISTER's iovec count), which the io-uring
/// crate's `UringCmd80` leaves 0.
fn with_iovec_count(entry: squeue::Entry128, count: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `#[repr(C)]` and is the kernel's 128-byte
    // SQE128 (the SQE, then 64 more command bytes), as is `Sqe128`; both
    // hold only integers, integer arrays and unions of them, so every bit
    // pattern is valid for either, and the sizes are asserted equal above.
    let mut raw: Sqe128 = unsafe { std::mem::transmute::<squeue::Entry128, Sqe128>(entry) };
    raw.sqe.len.len = count;
    // SAFETY: as above, in the other direction.
    unsafe { std::mem::transmute::<Sqe128, squeue::Entry128>(raw) }
}

/// The REGISTER of entry `idx`: its two buffers as an iovec pair. The
/// kernel copies the iovecs while the SQE is submitted.
fn register_sqe(
    dev: RawFd,
    idx: usize,
    e: &mut Entry,
    iov: &mut [libc::iovec; 2],
) -> squeue::Entry128 {
    *iov = [
        libc::iovec {
            iov_base: std::ptr::from_mut::<UringReqHeader>(&mut e.header).cast(),
            iov_len: std::mem::size_of::<UringReqHeader>(),
        },
        libc::iovec {
            iov_base: e.payload.as_mut_ptr().cast(),
            iov_len: e.payload.len(),
        },
    ];
    let cmd = UringCmdReq {
        qid: e.qid,
        ..UringCmdReq::default()
    };
    let sqe = opcode::UringCmd80::new(types::Fd(dev), uring_cmd::REGISTER)
        .cmd(cmd.command_area())
        .addr(Some(iov.as_ptr() as u64))
        .build()
        .user_data(idx as u64);
    with_iovec_count(sqe, URING_IOV_SEGS)
}

/// The COMMIT_AND_FETCH of entry `idx`'s reply.
fn commit_sqe(dev: RawFd, idx: usize, e: &Entry) -> squeue::Entry128 {
    let cmd = UringCmdReq {
        commit_id: e.commit_id,
        qid: e.qid,
        ..UringCmdReq::default()
    };
    opcode::UringCmd80::new(types::Fd(dev), uring_cmd::COMMIT_AND_FETCH)
        .cmd(cmd.command_area())
        .build()
        .user_data(idx as u64)
}

/// Rebuilds the whole request of an entry into `req`: the in-header, the
/// fixed argument (its length is what the header's `len` leaves after the
/// payload), then the payload. `None` if the header does not add up.
fn gather_request(e: &Entry, req: &mut Vec<u8>) -> Option<InHeader> {
    let (h, _) = InHeader::read_from_prefix(&e.header.in_out).ok()?;
    let payload = e.header.ring_ent_in_out.payload_sz as usize;
    let payload = e.payload.get(..payload)?;
    let op_len = (h.len as usize)
        .checked_sub(abi::IN_HEADER_LEN)?
        .checked_sub(payload.len())?;
    let op = e.header.op_in.get(..op_len)?;
    req.clear();
    req.extend_from_slice(&e.header.in_out[..abi::IN_HEADER_LEN]);
    req.extend_from_slice(op);
    req.extend_from_slice(payload);
    Some(h)
}

/// Puts a reply (`out`: out-header, then the reply's arguments) into the
/// entry: the header into `in_out`, the rest into the payload. A reply
/// that does not fit becomes an `EIO` for the request.
fn scatter_reply(e: &mut Entry, out: &[u8], unique: u64) {
    let body = out.get(abi::OUT_HEADER_LEN..).unwrap_or(&[]);
    let header = OutHeader::read_from_prefix(out).ok().map(|(h, _)| h);
    let (header, body) = match header {
        Some(h) if body.len() <= e.payload.len() && h.unique == unique => (h, body),
        _ => {
            tracing::warn!(len = out.len(), unique, "ring reply does not fit its entry");
            (OutHeader::error_only(unique, libc::EIO), &[][..])
        }
    };
    e.payload[..body.len()].copy_from_slice(body);
    let bytes = fuse_abi::zerocopy::IntoBytes::as_bytes(&header);
    e.header.in_out[..bytes.len()].copy_from_slice(bytes);
    e.header.ring_ent_in_out.payload_sz = body.len() as u32;
}

/// Pins the calling thread to `cpu` (best effort).
pub(crate) fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes
    // inside it (cpu is checked against its size); sched_setaffinity reads
    // it for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return;
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::debug!(cpu, error = %io::Error::last_os_error(), "cannot pin a ring worker");
        }
    }
}

/// The ring workers of one plane. Dropping it stops them; the entries'
/// buffers are kept until then (see [`RingSet::stop`]).
pub(crate) struct RingSet {
    dev: Arc<File>,
    server: Arc<dyn RingServer>,
    stop: File,
    workers: Vec<JoinHandle<Vec<Entry>>>,
    /// Buffers of stopped workers: the kernel may still hold their
    /// addresses until the connection ends, so they are freed only with
    /// the plane (after `/dev/fuse` is closed).
    retired: Vec<Vec<Entry>>,
    config: RingConfig,
}

impl std::fmt::Debug for RingSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingSet")
            .field("config", &self.config)
            .field("workers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

/// Which entries one worker owns.
#[derive(Debug, Clone)]
struct WorkerSpec {
    queues: Vec<u16>,
    entries_per_queue: usize,
    pin: Option<usize>,
}

/// A close-on-exec eventfd that wakes (or stops) a thread sleeping in
/// poll(2) or a ring wait beside it.
pub(crate) fn new_eventfd() -> io::Result<File> {
    rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
        .map(File::from)
        .map_err(io::Error::from)
}

impl RingSet {
    /// Starts the workers `config` asks for and registers their entries on
    /// `dev` (a connection whose INIT reply offered
    /// [`abi::init_flags::OVER_IO_URING`]). Returns once every entry is
    /// submitted: the kernel sends requests through the ring as soon as
    /// each queue has one.
    pub(crate) fn start(
        dev: &Arc<File>,
        server: Arc<dyn RingServer>,
        config: RingConfig,
    ) -> Result<Self, StartRingError> {
        let stop = new_eventfd().map_err(StartRingError::EventFd)?;
        let config = RingConfig {
            queues: config.queues.clamp(1, usize::from(u16::MAX)),
            per_queue: config.per_queue.clamp(1, per_queue_cap(config.queues)),
            ..config
        };
        let mut set = RingSet {
            dev: dev.clone(),
            server,
            stop,
            workers: Vec::new(),
            retired: Vec::new(),
            config: RingConfig {
                per_queue: 0,
                ..config
            },
        };
        let specs = if config.deferring {
            (0..config.queues)
                .filter_map(|q| {
                    Some(WorkerSpec {
                        queues: vec![u16::try_from(q).ok()?],
                        entries_per_queue: config.per_queue,
                        pin: Some(q),
                    })
                })
                .collect()
        } else if config.poll {
            vec![WorkerSpec {
                queues: (0..config.queues)
                    .filter_map(|q| u16::try_from(q).ok())
                    .collect(),
                entries_per_queue: config.per_queue,
                pin: None,
            }]
        } else {
            set.sleeping_specs(config.per_queue)
        };
        if let Err(e) = set.spawn(specs) {
            set.abandon();
            return Err(e);
        }
        set.config.per_queue = config.per_queue;
        Ok(set)
    }

    /// One sleeping worker per queue and step from the current count up
    /// to `per_queue`.
    fn sleeping_specs(&self, per_queue: usize) -> Vec<WorkerSpec> {
        (self.config.per_queue..per_queue)
            .flat_map(|_| 0..self.config.queues)
            .filter_map(|q| {
                Some(WorkerSpec {
                    queues: vec![u16::try_from(q).ok()?],
                    entries_per_queue: 1,
                    pin: Some(q),
                })
            })
            .collect()
    }

    /// Starts workers and waits until each has submitted its entries.
    fn spawn(&mut self, specs: Vec<WorkerSpec>) -> Result<(), StartRingError> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let n = specs.len();
        for spec in specs {
            let w = self.workers.len();
            let ctx = WorkerCtx {
                dev: self.dev.clone(),
                server: self.server.clone(),
                payload_len: self.config.payload_len,
                poll: self.config.poll,
                spec,
                index: w,
                stop: self.stop.as_raw_fd(),
            };
            let ready = ready_tx.clone();
            let h = thread::Builder::new()
                .name(format!("pool-ring{w}"))
                .spawn(move || ctx.run(&ready))
                .map_err(StartRingError::Spawn)?;
            self.workers.push(h);
        }
        drop(ready_tx);
        for _ in 0..n {
            ready_rx.recv().unwrap_or(Err(StartRingError::WorkerGone))?;
        }
        Ok(())
    }

    /// Grows sleeping workers to `per_queue` per queue (at most
    /// [`MAX_PER_QUEUE`], and [`MAX_WORKERS`] in all; a polling ring does
    /// not grow).
    pub(crate) fn grow_to(&mut self, per_queue: usize) -> Result<(), StartRingError> {
        let want = per_queue.min(per_queue_cap(self.config.queues));
        if self.config.poll || self.config.deferring || want <= self.config.per_queue {
            return Ok(());
        }
        let specs = self.sleeping_specs(want);
        self.spawn(specs)?;
        self.config.per_queue = want;
        Ok(())
    }

    /// The layout the ring runs with now.
    pub(crate) fn config(&self) -> RingConfig {
        self.config
    }

    /// Worker threads running.
    pub(crate) fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Stops and joins the workers, keeping their buffers.
    pub(crate) fn stop(&mut self) {
        if self.workers.is_empty() {
            return;
        }
        let one = 1u64.to_ne_bytes();
        if let Err(e) = io::Write::write(&mut &self.stop, &one) {
            tracing::warn!(error = %e, "cannot wake the ring workers");
        }
        for h in self.workers.drain(..) {
            match h.join() {
                Ok(entries) => self.retired.push(entries),
                Err(_) => tracing::error!("a ring worker panicked"),
            }
        }
    }

    /// A failed start: stops what was started and never frees the
    /// buffers, since a partly registered ring may still name them.
    fn abandon(&mut self) {
        self.stop();
        std::mem::forget(std::mem::take(&mut self.retired));
    }
}

impl Drop for RingSet {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What one worker thread needs.
struct WorkerCtx {
    dev: Arc<File>,
    server: Arc<dyn RingServer>,
    payload_len: usize,
    poll: bool,
    spec: WorkerSpec,
    index: usize,
    stop: RawFd,
}

/// Why a worker's loop ended.
enum LoopEnd {
    Stopped,
    AllCancelled,
    Failed(io::Error),
}

impl WorkerCtx {
    /// Registers this worker's entries, reports on `ready`, then serves
    /// until stopped. Returns the entries (their buffers outlive the ring).
    fn run(self, ready: &mpsc::Sender<Result<(), StartRingError>>) -> Vec<Entry> {
        let queue = match self.spec.queues.as_slice() {
            [q] if self.spec.pin.is_some() => Some(*q),
            _ => None,
        };
        self.server.enter_worker(queue);
        if let Some(cpu) = self.spec.pin {
            pin_to(cpu);
        }
        crate::pace::precise_timer_slack();
        let per = self.spec.entries_per_queue;
        let mut entries: Vec<Entry> = self
            .spec
            .queues
            .iter()
            .flat_map(|&q| (0..per).map(move |_| q))
            .map(|q| Entry::new(q, self.payload_len))
            .collect();
        let slots = u32::try_from(entries.len() + 2).unwrap_or(u32::MAX);
        let mut ring = match restricted_ring(slots) {
            Ok(r) => r,
            Err(e) => {
                let _ = ready.send(Err(StartRingError::Setup(e)));
                return entries;
            }
        };
        let end = self.serve(&mut ring, &mut entries, ready);
        match end {
            LoopEnd::Stopped => {}
            LoopEnd::AllCancelled => tracing::info!(worker = self.index, "ring entries cancelled"),
            LoopEnd::Failed(e) => {
                tracing::error!(worker = self.index, error = %e, "ring worker failed")
            }
        }
        // The ring goes first: closing it cancels the entries' commands.
        drop(ring);
        entries
    }

    fn serve(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        entries: &mut [Entry],
        ready: &mpsc::Sender<Result<(), StartRingError>>,
    ) -> LoopEnd {
        let dev = self.dev.as_raw_fd();
        let mut iovs = vec![
            [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0
            }; 2];
            entries.len()
        ];
        for (idx, (e, iov)) in entries.iter_mut().zip(iovs.iter_mut()).enumerate() {
            let sqe = register_sqe(dev, idx, e, iov);
            // SAFETY: the SQE names the entry's boxed buffers (kept until
            // after the ring is gone) and `iovs`, alive until the submit
            // below, where the kernel copies them.
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                return LoopEnd::Failed(io::Error::other("submission queue too small"));
            }
        }
        let poll = opcode::PollAdd::new(types::Fd(self.stop), libc::POLLIN as u32)
            .build()
            .user_data(STOP_TAG);
        // SAFETY: the eventfd outlives this worker (RingSet joins first).
        if unsafe { ring.submission().push(&poll.into()) }.is_err() {
            return LoopEnd::Failed(io::Error::other("submission queue too small"));
        }
        if let Err(e) = ring.submit() {
            let _ = ready.send(Err(StartRingError::Setup(e)));
            return LoopEnd::Failed(io::Error::other("registration not submitted"));
        }
        drop(iovs);
        let mut cqes: Vec<(u64, i32)> = Vec::with_capacity(entries.len() + 1);
        // Registration errors come back at once; a request may too.
        cqes.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        let refused = cqes.iter().find(|&&(tag, res)| {
            tag < DEFER_TAG && res < 0 && res != -libc::EAGAIN && res != -libc::EINTR
        });
        if let Some(&(tag, res)) = refused {
            let qid = entries.get(tag as usize).map_or(0, |e| e.qid);
            let _ = ready.send(Err(StartRingError::Register {
                qid,
                source: io::Error::from_raw_os_error(-res),
            }));
            return LoopEnd::Failed(io::Error::from_raw_os_error(-res));
        }
        let defer_queue = match self.spec.queues.as_slice() {
            [q] if self.server.deferred_fd(*q).is_some() => Some(*q),
            _ => None,
        };
        if let Some(q) = defer_queue {
            if let Err(e) = self.poll_deferred(ring, q) {
                let _ = ready.send(Err(StartRingError::Setup(e)));
                return LoopEnd::Failed(io::Error::other("deferred poll not queued"));
            }
        }
        let _ = ready.send(Ok(()));
        self.event_loop(ring, entries, cqes, defer_queue)
    }
}

/// An entry whose request the server deferred.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    /// The request's `unique`.
    unique: u64,
    /// The entry.
    idx: usize,
    /// When the request arrived.
    arrival_ns: u64,
}

impl Waiting {
    /// When the worker stops waiting for the server's reply.
    fn deadline_ns(&self) -> u64 {
        self.arrival_ns.saturating_add(DEFERRED_DEADLINE_NS)
    }
}

/// A worker's state between completions.
struct LoopState {
    /// Replies waiting for their time: (due, entry).
    held: BinaryHeap<Reverse<(u64, usize)>>,
    /// Entries whose request the server deferred.
    deferred: Vec<Waiting>,
    /// Entries the kernel has not cancelled.
    alive: usize,
    /// The queue whose deferred replies this worker polls for, while
    /// they can still come.
    defer_queue: Option<u16>,
    req: Vec<u8>,
    out: Vec<u8>,
}

impl WorkerCtx {
    /// Serves requests until the stop eventfd fires or every entry is
    /// cancelled. `cqes` holds completions already reaped.
    fn event_loop(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        entries: &mut [Entry],
        mut cqes: Vec<(u64, i32)>,
        defer_queue: Option<u16>,
    ) -> LoopEnd {
        let mut st = LoopState {
            held: BinaryHeap::new(),
            deferred: Vec::new(),
            alive: entries.len(),
            defer_queue,
            req: Vec::with_capacity(abi::IN_HEADER_LEN + 128 + self.payload_len),
            out: Vec::with_capacity(abi::OUT_HEADER_LEN + self.payload_len),
        };
        loop {
            for (tag, res) in cqes.drain(..) {
                let step = match tag {
                    STOP_TAG => return LoopEnd::Stopped,
                    DEFER_TAG => self.on_deferred_ready(ring, entries, &mut st),
                    _ => self.on_entry(ring, entries, &mut st, tag as usize, res),
                };
                if let Err(err) = step {
                    return LoopEnd::Failed(err);
                }
            }
            if st.alive == 0 {
                return LoopEnd::AllCancelled;
            }
            self.expire_deferred(entries, &mut st);
            if let Err(err) = self.commit_due(ring, entries, &mut st) {
                return LoopEnd::Failed(err);
            }
            if let Err(err) = self.wait(ring, &st) {
                return LoopEnd::Failed(err);
            }
            let mut cq = ring.completion();
            if cq.is_empty() {
                std::hint::spin_loop();
            }
            cqes.extend(cq.by_ref().map(|c| (c.user_data(), c.result())));
        }
    }

    /// A completion of entry `idx`: a request to answer, or an error.
    fn on_entry(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        entries: &mut [Entry],
        st: &mut LoopState,
        idx: usize,
        res: i32,
    ) -> io::Result<()> {
        let dev = self.dev.as_raw_fd();
        let waiting = st.deferred.len();
        let Some(e) = entries.get_mut(idx) else {
            return Ok(());
        };
        if res < 0 {
            return on_entry_error(ring, dev, idx, e, res, &mut st.alive);
        }
        e.registered = true;
        let arrival = self.server.now_ns();
        e.commit_id = e.header.ring_ent_in_out.commit_id;
        // One entry never waits, for a deferred reply or for its time, so
        // whatever the server waits for, this worker keeps taking requests.
        let may_defer = st.defer_queue.is_some() && waiting + st.held.len() + 1 < st.alive;
        let due = match gather_request(e, &mut st.req) {
            Some(_) => self.server.answer(&st.req, arrival, &mut st.out, may_defer),
            None => {
                tracing::warn!(qid = e.qid, "undecodable ring request");
                st.out.clear();
                OutHeader::error_only(e.commit_id, libc::EINVAL).encode(&mut st.out);
                Due::Now
            }
        };
        let due = match due {
            Due::Deferred if may_defer => {
                st.deferred.push(Waiting {
                    unique: e.commit_id,
                    idx,
                    arrival_ns: arrival,
                });
                return Ok(());
            }
            Due::Deferred => {
                tracing::warn!(qid = e.qid, "a ring request deferred where it may not be");
                st.out.clear();
                OutHeader::error_only(e.commit_id, libc::EIO).encode(&mut st.out);
                Due::Now
            }
            d => d,
        };
        scatter_reply(e, &st.out, e.commit_id);
        match due {
            Due::At(t) => st.held.push(Reverse((t, idx))),
            _ => push(ring, &commit_sqe(dev, idx, e))?,
        }
        Ok(())
    }

    /// The deferred replies' descriptor is readable: takes every reply
    /// ready, holds each until due, and polls again.
    fn on_deferred_ready(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        entries: &mut [Entry],
        st: &mut LoopState,
    ) -> io::Result<()> {
        let Some(q) = st.defer_queue else {
            return Ok(());
        };
        loop {
            match self.server.take_deferred(q, &mut st.out) {
                Deferred::Reply { unique, due_ns } => {
                    let Some(pos) = st.deferred.iter().position(|w| w.unique == unique) else {
                        tracing::warn!(unique, "a deferred reply for no waiting entry");
                        continue;
                    };
                    let idx = st.deferred.swap_remove(pos).idx;
                    if let Some(e) = entries.get_mut(idx) {
                        scatter_reply(e, &st.out, unique);
                        st.held.push(Reverse((due_ns, idx)));
                    }
                }
                Deferred::Empty => break,
                Deferred::Closed => {
                    // Nothing will answer the waiting entries: each gets
                    // an error, and the descriptor is no longer polled.
                    for Waiting { unique, idx, .. } in st.deferred.drain(..) {
                        if let Some(e) = entries.get_mut(idx) {
                            st.out.clear();
                            OutHeader::error_only(unique, libc::EIO).encode(&mut st.out);
                            scatter_reply(e, &st.out, unique);
                            st.held.push(Reverse((0, idx)));
                        }
                    }
                    st.defer_queue = None;
                    return Ok(());
                }
            }
        }
        self.poll_deferred(ring, q)
    }

    /// Answers, at once, every deferred request past its deadline (its
    /// reply, should it come later, finds no waiting entry and is dropped).
    fn expire_deferred(&self, entries: &mut [Entry], st: &mut LoopState) {
        if st.deferred.is_empty() {
            return;
        }
        let now = self.server.now_ns();
        while let Some(pos) = st.deferred.iter().position(|w| w.deadline_ns() <= now) {
            let w = st.deferred.swap_remove(pos);
            let Some(e) = entries.get_mut(w.idx) else {
                continue;
            };
            tracing::warn!(
                qid = e.qid,
                unique = w.unique,
                "no reply to a deferred request in time: answered here"
            );
            let due = gather_request(e, &mut st.req).map(|_| {
                self.server
                    .answer(&st.req, w.arrival_ns, &mut st.out, false)
            });
            let at = match due {
                Some(Due::At(t)) => t,
                Some(Due::Now) => 0,
                Some(Due::Deferred) | None => {
                    st.out.clear();
                    OutHeader::error_only(w.unique, libc::EIO).encode(&mut st.out);
                    0
                }
            };
            scatter_reply(e, &st.out, w.unique);
            st.held.push(Reverse((at, w.idx)));
        }
    }

    /// Polls (once) the descriptor of `queue`'s deferred replies.
    fn poll_deferred(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        queue: u16,
    ) -> io::Result<()> {
        let Some(fd) = self.server.deferred_fd(queue) else {
            return Ok(());
        };
        let poll = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(DEFER_TAG);
        push(ring, &poll.into())
    }

    /// Commits the held replies that are due.
    fn commit_due(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        entries: &[Entry],
        st: &mut LoopState,
    ) -> io::Result<()> {
        let now = self.server.now_ns();
        while let Some(&Reverse((t, idx))) = st.held.peek() {
            if t > now {
                break;
            }
            st.held.pop();
            if let Some(e) = entries.get(idx) {
                push(ring, &commit_sqe(self.dev.as_raw_fd(), idx, e))?;
            }
        }
        Ok(())
    }

    /// Submits what is queued and waits for the next completion: not at
    /// all when polling, until [`pace::SPIN_NS`] before the next held
    /// reply is due, or (nothing held) until something completes.
    fn wait(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        st: &LoopState,
    ) -> io::Result<()> {
        let now = self.server.now_ns();
        let held = st.held.peek().map(|&Reverse((t, _))| t);
        let deadline = st.deferred.iter().map(Waiting::deadline_ns).min();
        let next = match (held, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .map(|t| t.saturating_sub(now));
        let res = match (self.poll, next) {
            // Poll: submit what is queued, never sleep.
            (true, _) => submit_queued(ring),
            (false, None) => ring.submit_and_wait(1).map(drop),
            (false, Some(left)) if left > pace::SPIN_NS => {
                let ts = types::Timespec::from(Duration::from_nanos(left - pace::SPIN_NS));
                let args = types::SubmitArgs::new().timespec(&ts);
                ring.submitter().submit_with_args(1, &args).map(drop)
            }
            // A reply is due within the spin window: keep polling.
            (false, Some(_)) => submit_queued(ring),
        };
        match res {
            Err(e)
                if !matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) =>
            {
                Err(e)
            }
            _ => Ok(()),
        }
    }
}

/// An entry's command failed: `EAGAIN` / `EINTR` (not initialized yet,
/// or interrupted) resubmits it; anything else (the connection ending)
/// marks it dead.
fn on_entry_error(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    dev: RawFd,
    idx: usize,
    e: &mut Entry,
    res: i32,
    alive: &mut usize,
) -> io::Result<()> {
    if res == -libc::EAGAIN || res == -libc::EINTR {
        if e.registered {
            return push(ring, &commit_sqe(dev, idx, e));
        }
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let sqe = register_sqe(dev, idx, e, &mut iov);
        // The iovecs must live until submitted.
        return push_and_submit(ring, &sqe);
    }
    if !e.dead && res != -libc::ENOTCONN && res != -libc::ECANCELED {
        tracing::warn!(qid = e.qid, error = %io::Error::from_raw_os_error(-res), "ring entry failed");
    }
    if !e.dead {
        e.dead = true;
        *alive -= 1;
    }
    Ok(())
}

/// A ring of `slots` SQE128s that can carry only FUSE ring commands and
/// polls (`IORING_REGISTER_RESTRICTIONS`, set while the ring is still
/// disabled): the daemon's seccomp filter does not see what an io_uring
/// does, so this one is kept from doing anything else.
fn restricted_ring(slots: u32) -> io::Result<IoUring<squeue::Entry128, cqueue::Entry>> {
    let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .setup_cqsize(slots.saturating_mul(2))
        .setup_r_disabled()
        .build(slots.next_power_of_two())?;
    let mut allowed = [
        io_uring::register::Restriction::sqe_op(opcode::UringCmd80::CODE),
        io_uring::register::Restriction::sqe_op(opcode::PollAdd::CODE),
    ];
    ring.submitter().register_restrictions(&mut allowed)?;
    ring.submitter().register_enable_rings()?;
    Ok(ring)
}

/// Whether a plane's ring can be created here (checked before INIT offers
/// the ring: once the kernel grants it, a ring that cannot start leaves the
/// connection holding every request).
pub(crate) fn probe() -> io::Result<()> {
    restricted_ring(2).map(drop)
}

/// Queues one SQE (submitting first if the queue is full).
fn push(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    sqe: &squeue::Entry128,
) -> io::Result<()> {
    for _ in 0..2 {
        // SAFETY: the SQEs built here name only an entry's boxed buffers
        // (alive until after the ring) or nothing.
        if unsafe { ring.submission().push(sqe) }.is_ok() {
            return Ok(());
        }
        ring.submit()?;
    }
    Err(io::Error::other("ring submission queue full"))
}

/// Queues one SQE and submits at once (its iovecs live only until then).
fn push_and_submit(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    sqe: &squeue::Entry128,
) -> io::Result<()> {
    push(ring, sqe)?;
    ring.submit().map(drop)
}

/// Submits queued SQEs, if any, without waiting (no system call when the
/// submission queue is empty).
fn submit_queued(ring: &mut IoUring<squeue::Entry128, cqueue::Entry>) -> io::Result<()> {
    if ring.submission().is_empty() {
        Ok(())
    } else {
        ring.submit().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_carries_only_fuse_commands_and_polls() {
        let mut ring = match restricted_ring(4) {
            Ok(r) => r,
            Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
                eprintln!("SKIPPED: no io_uring here ({e})");
                return;
            }
            Err(e) => panic!("no io_uring here ({e}); CI=true, so this test may not be skipped"),
        };
        let nop: squeue::Entry128 = opcode::Nop::new().build().user_data(1).into();
        push(&mut ring, &nop).expect("queued");
        ring.submit_and_wait(1).expect("submitted");
        let res: Vec<i32> = ring.completion().map(|c| c.result()).collect();
        assert_eq!(
            res,
            [-libc::EACCES],
            "a NOP is not allowed on a plane's ring"
        );
    }

    #[test]
    fn many_cpus_get_fewer_workers_per_queue() {
        assert_eq!(per_queue_cap(2), MAX_PER_QUEUE);
        assert_eq!(per_queue_cap(64), 8);
        assert_eq!(per_queue_cap(1024), 1);
    }

    #[test]
    fn cpu_lists_give_the_queue_count() {
        assert_eq!(parse_cpu_list_end("0"), Some(1));
        assert_eq!(parse_cpu_list_end("0-1"), Some(2));
        assert_eq!(parse_cpu_list_end("0-3,5"), Some(6));
        assert_eq!(parse_cpu_list_end(""), None);
    }

    #[test]
    fn register_sqe_carries_the_iovec_pair_and_queue() {
        let mut e = Entry::new(5, 8192);
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let sqe = register_sqe(3, 7, &mut e, &mut iov);
        // SAFETY: as in `with_iovec_count`: same 128-byte repr(C) image.
        let raw: Sqe128 = unsafe { std::mem::transmute::<squeue::Entry128, Sqe128>(sqe) };
        // SAFETY: reading integer union fields.
        unsafe {
            assert_eq!(raw.sqe.len.len, 2);
            assert_eq!(
                raw.sqe.addr_or_splice_off_in.addr.ptr as usize,
                iov.as_ptr() as usize
            );
        }
        assert_eq!(raw.sqe.fd, 3);
        assert_eq!(raw.sqe.user_data.u64_(), 7);
        assert_eq!(iov[0].iov_len, UringReqHeader::SIZE);
        assert_eq!(iov[1].iov_len, 8192);
        // The command: qid sits at byte 16 of the 80-byte area, i.e. the
        // first bytes of the SQE's second half.
        assert_eq!(&raw.command_tail[..2], &5u16.to_ne_bytes());
    }

    #[test]
    fn a_request_is_rebuilt_and_a_reply_scattered() {
        let mut e = Entry::new(0, 8192);
        let h = InHeader {
            len: (abi::IN_HEADER_LEN + 40 + 3) as u32,
            opcode: abi::opcode::WRITE,
            unique: 42,
            nodeid: 2,
            ..InHeader::default()
        };
        let hb = fuse_abi::zerocopy::IntoBytes::as_bytes(&h);
        e.header.in_out[..hb.len()].copy_from_slice(hb);
        e.header.op_in[..40].fill(7);
        e.payload[..3].copy_from_slice(b"abc");
        e.header.ring_ent_in_out.payload_sz = 3;
        let mut req = Vec::new();
        let got = gather_request(&e, &mut req).expect("adds up");
        assert_eq!(got.unique, 42);
        assert_eq!(req.len(), h.len as usize);
        assert_eq!(
            &req[abi::IN_HEADER_LEN..abi::IN_HEADER_LEN + 40],
            &[7u8; 40]
        );
        assert_eq!(&req[abi::IN_HEADER_LEN + 40..], b"abc");
        // A header whose length is shorter than its payload is refused.
        e.header.ring_ent_in_out.payload_sz = 200;
        assert!(gather_request(&e, &mut req).is_none());

        let mut out = Vec::new();
        OutHeader {
            len: 20,
            error: 0,
            unique: 42,
        }
        .encode(&mut out);
        out.extend_from_slice(b"wxyz");
        scatter_reply(&mut e, &out, 42);
        assert_eq!(e.header.ring_ent_in_out.payload_sz, 4);
        assert_eq!(&e.payload[..4], b"wxyz");
        let (oh, _) = OutHeader::read_from_prefix(&e.header.in_out).expect("header");
        assert_eq!((oh.unique, oh.error), (42, 0));
        // Too big for the entry: EIO, no payload.
        let big = vec![0u8; abi::OUT_HEADER_LEN + 9000];
        let mut big = big;
        OutHeader {
            len: big.len() as u32,
            error: 0,
            unique: 42,
        }
        .write_over(&mut big);
        scatter_reply(&mut e, &big, 42);
        let (oh, _) = OutHeader::read_from_prefix(&e.header.in_out).expect("header");
        assert_eq!(oh.error, -libc::EIO);
        assert_eq!(e.header.ring_ent_in_out.payload_sz, 0);
    }
}
