//! The vhost-user virtio-fs back-end of one VM connection.
//!
//! Threads of one connection:
//! * the vhost-user protocol thread (owned by `vhost_user_backend::VhostUserDaemon`);
//! * one vring worker per queue (queue 0 = hiprio, 1.. = request queues):
//!   it pops descriptor chains, stamps their arrival time, copies the
//!   request out of guest memory, runs it through the FUSE server
//!   (real I/O + device charge), writes the reply into the chain, and
//!   either completes it at once or hands it to the pacer;
//! * the pacer: a deadline heap of held replies; it sleeps until ~50 µs
//!   before the earliest deadline, spins the rest, then puts the chain on
//!   the used ring and signals the guest. Requests therefore overlap in
//!   real time exactly as they overlap in the device model (a queue
//!   worker never sleeps), and the pacing error (actual − modeled release)
//!   goes to the VM's histogram.
//!
//! With latency compensation ([`QueueOptions::compensation`]) a reply is
//! released at `max(arrival, deadline − floor)`: the floor is what the
//! request and its reply cost outside the daemon (the guest's kick to the
//! worker's pop, the used ring to the guest's wake-up), which the daemon
//! cannot see; `auto` takes one measured host thread wake-up, a lower
//! bound, re-measured every few seconds ([`fuse_floor`]; DESIGN.md,
//! "Latency compensation"). The pacing error
//! is then the estimated guest-visible one, `release + floor − deadline`.

pub mod chain;
pub mod fuse_floor;

use crate::abi::{self, InHeader};
use crate::device::Clock;
use crate::metrics::VmMetrics;
use crate::server::{Deferred, FuseHandler, Incoming, MAX_REQUEST, WRITE_PAYLOAD_AT};
use crate::sync::lock;
use chain::ChainBufs;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use vhost::vhost_user::message::{
    VhostUserProtocolFeatures, VhostUserShMemConfig, VhostUserVirtioFeatures,
};
use vhost::vhost_user::Backend;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{DescriptorChain, QueueOwnedT};
use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard,
    GuestMemoryMmap,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

/// Guest memory as the back-end sees it.
pub type GuestMem = GuestMemoryAtomic<GuestMemoryMmap>;
type Vring = VringRwLock<GuestMem>;

// A reply due within INLINE_SPIN_NS is kept by the queue worker, which
// spins for it while polling its ring, instead of going to the pacer.
use residency::pace;

/// Queue geometry.
#[derive(Debug, Clone, Copy)]
pub struct QueueOptions {
    /// Request queues (the hiprio queue comes on top).
    pub request_queues: usize,
    /// Largest queue size offered.
    pub queue_size: usize,
    /// SCHED_FIFO priority for the queue workers and the pacer (`None`:
    /// normal scheduling). On a busy host this keeps other threads from
    /// preempting a worker or pacer while it spins for a deadline.
    pub realtime_priority: Option<u8>,
    /// The virtio-fs tag in the device config space.
    pub tag: FsTag,
    /// Latency compensation of held READ / WRITE replies.
    pub compensation: pace::Compensation,
    /// Latency compensation of the residency plane's misses (DAX traps;
    /// the daemon mounts the plane with it).
    pub dax_compensation: pace::Compensation,
    /// How the residency plane talks to the host kernel.
    pub plane_transport: residency::Transport,
    /// One polling plane thread (`ReaderMode::Spin`) instead of sleeping ones.
    pub plane_poll: bool,
    /// Evicted pool pages a DAX miss may leave awaiting invalidation.
    pub dax_eviction_backlog: cxlfs_api::dax::EvictionBacklogSetting,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            request_queues: 1,
            queue_size: 1024,
            realtime_priority: None,
            tag: FsTag::default(),
            compensation: pace::Compensation::Off,
            dax_compensation: pace::Compensation::Off,
            plane_transport: residency::Transport::Auto,
            plane_poll: false,
            dax_eviction_backlog: cxlfs_api::dax::EvictionBacklogSetting::Auto,
        }
    }
}

/// A virtio-fs tag: 1 to 36 bytes, no NUL (`struct virtio_fs_config.tag`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsTag {
    bytes: [u8; FS_TAG_LEN],
    len: usize,
}

/// `sizeof(virtio_fs_config.tag)`.
pub const FS_TAG_LEN: usize = 36;

/// Why a tag was refused.
#[derive(Debug, thiserror::Error)]
#[error("virtio-fs tag `{0}` must be 1 to 36 bytes with no NUL")]
pub struct ParseFsTagError(String);

impl std::str::FromStr for FsTag {
    type Err = ParseFsTagError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() || s.len() > FS_TAG_LEN || s.contains('\0') {
            return Err(ParseFsTagError(s.to_string()));
        }
        let mut bytes = [0u8; FS_TAG_LEN];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Ok(FsTag {
            bytes,
            len: s.len(),
        })
    }
}

impl Default for FsTag {
    /// `cxlfs`, the tag the guest images mount.
    fn default() -> Self {
        let mut bytes = [0u8; FS_TAG_LEN];
        bytes[..5].copy_from_slice(b"cxlfs");
        FsTag { bytes, len: 5 }
    }
}

impl FsTag {
    /// The tag text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }
}

/// `struct virtio_fs_config`: the tag (NUL padded) and the number of
/// request queues (little endian). Front-ends that take the config space
/// from the back-end (`VHOST_USER_GET_CONFIG`, e.g. QEMU >= 11.1's
/// `vhost-user-test-device-pci,virtio-id=26`) show this to the guest;
/// `vhost-user-fs-pci` builds its own from its `tag=` property.
pub fn virtio_fs_config(tag: &FsTag, request_queues: usize) -> [u8; FS_TAG_LEN + 4] {
    let mut c = [0u8; FS_TAG_LEN + 4];
    c[..FS_TAG_LEN].copy_from_slice(&tag.bytes);
    c[FS_TAG_LEN..].copy_from_slice(&(request_queues as u32).to_le_bytes());
    c
}

struct Held {
    /// When it is released: the modeled completion less the floor.
    deadline_ns: u64,
    /// The modeled completion.
    modeled_ns: u64,
    /// The floor it was held with (the pacing error is estimated with it).
    floor_ns: u64,
    arrival_ns: u64,
    vring: Vring,
    queue: u16,
    head: u16,
    len: u32,
}

impl pace::Deadline for Held {
    fn deadline_ns(&self) -> u64 {
        self.deadline_ns
    }
}

/// Why the daemon could not run under SCHED_FIFO.
#[derive(Debug, thiserror::Error)]
#[error("cannot run under SCHED_FIFO at priority {prio} (needs root or CAP_SYS_NICE)")]
pub struct MakeRealtimeError {
    /// The priority asked for.
    pub prio: u8,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

/// Puts the calling thread under SCHED_FIFO at `prio`; called before the
/// daemon's first thread, so that every thread it starts (and every helper
/// process a plane spawns) inherits the policy: a miss crosses several of
/// them (request thread, pacer, a split plane's helper and forwarder), and
/// each woken one that waits behind a busy vCPU adds its wait to the miss.
pub fn make_daemon_realtime(prio: u8) -> Result<(), MakeRealtimeError> {
    let param = libc::sched_param {
        sched_priority: i32::from(prio),
    };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0
    // is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        return Err(MakeRealtimeError {
            prio,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Puts the calling thread under SCHED_FIFO at `prio` (once per thread).
fn make_realtime(prio: Option<u8>) {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    let Some(prio) = prio else { return };
    if DONE.with(|d| d.replace(true)) {
        return;
    }
    if let Err(e) = make_daemon_realtime(prio) {
        tracing::warn!(prio, error = %e.source, "cannot switch to SCHED_FIFO");
    }
}

thread_local! {
    /// A queue worker's request buffer (one queue per worker thread).
    static REQUEST_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A VM's DAX cache window as the transport sees it: the front-end's
/// back-end request channel goes to it, it has a size, and a device reset
/// drops its maps.
pub trait CacheWindow: Send + Sync {
    /// The front-end handed over its back-end request channel.
    fn set_backend(&self, backend: Backend);
    /// The window's size (`GET_SHMEM_CONFIG`).
    fn window_bytes(&self) -> u64;
    /// The front-end dropped every map (reset, disconnect).
    fn forget_all(&self);
}

/// The virtio-fs back-end of one connection.
pub struct FsBackend {
    server: Arc<dyn FuseHandler>,
    metrics: Arc<VmMetrics>,
    window: Option<Arc<dyn CacheWindow>>,
    clock: Clock,
    mem: GuestMem,
    queues: QueueOptions,
    pacer_tx: Mutex<Option<Sender<Held>>>,
    pacer: Mutex<Option<JoinHandle<()>>>,
    event_idx: Arc<AtomicBool>,
    /// What held replies are released ahead of their modeled completion by
    /// (the daemon's, shared by every VM; 0: compensation off).
    floor: Arc<pace::Floor>,
}

/// Why a back-end could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateBackendError {
    /// The pacer thread could not be spawned.
    #[error("cannot spawn the pacer thread")]
    SpawnPacer(#[source] io::Error),
}

impl FsBackend {
    /// A back-end serving `server` (VM `metrics.name`, DAX `window`) over
    /// guest memory `mem`, stamping requests with `clock` and releasing
    /// held replies `floor` ahead of their modeled completion.
    pub fn new(
        server: Arc<dyn FuseHandler>,
        metrics: Arc<VmMetrics>,
        window: Option<Arc<dyn CacheWindow>>,
        clock: Clock,
        mem: GuestMem,
        queues: QueueOptions,
        floor: Arc<pace::Floor>,
    ) -> Result<Self, CreateBackendError> {
        let (tx, rx) = mpsc::channel();
        let vm = metrics.clone();
        let event_idx = Arc::new(AtomicBool::new(false));
        let pacer_event_idx = event_idx.clone();
        let prio = queues.realtime_priority;
        let pacer = thread::Builder::new()
            .name(format!("pacer-{}", vm.name))
            .spawn(move || {
                make_realtime(prio);
                run_pacer(rx, clock, vm, pacer_event_idx)
            })
            .map_err(CreateBackendError::SpawnPacer)?;
        Ok(FsBackend {
            server,
            metrics,
            window,
            clock,
            mem,
            queues,
            pacer_tx: Mutex::new(Some(tx)),
            pacer: Mutex::new(Some(pacer)),
            event_idx,
            floor,
        })
    }

    /// Stops taking held replies, releases those still held at their
    /// deadlines, and waits for the pacer to finish.
    pub fn close(&self) {
        // Lock waits end now (their replies go nowhere useful any more).
        self.server.close_waits();
        lock(&self.pacer_tx).take();
        if let Some(h) = lock(&self.pacer).take() {
            if h.join().is_err() {
                tracing::error!("pacer thread panicked");
            }
        }
    }

    /// Serves the queue until it is empty and no locally held reply is
    /// left. Chains are popped one at a time; a reply due within
    /// [`INLINE_SPIN_NS`](pace::INLINE_SPIN_NS) stays with this worker, which spins for it while
    /// polling the ring for new requests (no thread hand-off, no wake-up
    /// latency); later replies go to the pacer. With `VIRTIO_RING_F_EVENT_IDX`
    /// the guest's kicks are suppressed while the worker is busy, and the
    /// guest is only interrupted when it asked to be.
    fn process_queue(&self, queue: u16, vring: &Vring) -> io::Result<()> {
        let mem = self.mem.memory();
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        let mut local: Vec<Held> = Vec::new();
        loop {
            if event_idx {
                if let Err(e) = vring.disable_notification() {
                    tracing::debug!(error = %e, "cannot disable notifications");
                }
            }
            let mut pending = false;
            loop {
                let mut urgent = false;
                if !local.is_empty() {
                    let now = self.clock.now_ns();
                    if local.iter().any(|h| h.deadline_ns <= now) {
                        urgent = self.release_due(&mut local, now);
                        pending |= urgent;
                    }
                }
                let chain = {
                    let mut state = vring.get_mut();
                    match state.get_queue_mut().iter(mem.clone()) {
                        Ok(mut it) => it.next(),
                        Err(e) => {
                            // A broken ring (bad avail index, unmapped ring): serve nothing
                            // more on it, but keep the daemon and the other queues alive.
                            drop(state);
                            tracing::warn!(vm = %&self.metrics.name, error = %e, "cannot walk the available ring");
                            for h in local.drain(..) {
                                self.hand_to_pacer(vring, h);
                            }
                            if pending {
                                signal(vring, event_idx, &self.metrics.name);
                            }
                            return Ok(());
                        }
                    }
                };
                let idle = chain.is_none();
                if let Some(chain) = chain {
                    pending |= self.process_chain(queue, vring, &mem, chain, &mut local);
                }
                if pending && (idle || urgent) {
                    signal(vring, event_idx, &self.metrics.name);
                    pending = false;
                }
                if idle {
                    if local.is_empty() {
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
            if !event_idx {
                break;
            }
            match vring.enable_notification() {
                // More requests came in while notifications were off.
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot enable notifications");
                    break;
                }
            }
        }
        Ok(())
    }

    /// Puts every reply of `local` due at `now` on the used ring; true if any.
    fn release_due(&self, local: &mut Vec<Held>, now: u64) -> bool {
        let metrics = &self.metrics;
        let mut any = false;
        let mut i = 0;
        while i < local.len() {
            if local[i].deadline_ns <= now {
                let h = local.swap_remove(i);
                any |= self.complete(&h.vring, h.head, h.len);
                let done = self.clock.now_ns();
                metrics.record_reply_compensated(h.arrival_ns, h.modeled_ns, done, h.floor_ns);
            } else {
                i += 1;
            }
        }
        any
    }

    /// Hands a held reply to the pacer (or, when closing, completes it now).
    fn hand_to_pacer(&self, vring: &Vring, held: Held) -> bool {
        match lock(&self.pacer_tx).as_ref() {
            Some(tx) => match tx.send(held) {
                Ok(()) => false,
                // Closing down: release it now.
                Err(mpsc::SendError(held)) => self.complete(vring, held.head, held.len),
            },
            None => self.complete(vring, held.head, held.len),
        }
    }

    /// Serves one chain; true if it was put on the used ring right away.
    /// A reply due soon is pushed on `local` instead, for the caller to
    /// release at its deadline.
    fn process_chain(
        &self,
        queue: u16,
        vring: &Vring,
        mem: &GuestMemoryMmap,
        chain: DescriptorChain<GuestMemoryLoadGuard<GuestMemoryMmap>>,
        local: &mut Vec<Held>,
    ) -> bool {
        let arrival = self.clock.now_ns();
        let head = chain.head_index();
        let metrics = &self.metrics;
        // Kept to find the reply buffers again if the reply comes later.
        let later = chain.clone();
        let mut bufs = match ChainBufs::new(mem, chain) {
            Ok(b) => b,
            Err(e) => {
                // Descriptors outside guest memory (or overflowing): return the
                // chain unused; the request cannot even be answered.
                metrics.bad_chains.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(vm = %metrics.name, head, error = %e, "dropping a bad descriptor chain");
                return self.complete(vring, head, 0);
            }
        };
        // Copy the request out, except a WRITE's payload, which goes from
        // guest memory to the file directly.
        let total = bufs.readable_len();
        let mut hdr = [0u8; std::mem::size_of::<InHeader>()];
        let header = if bufs.copy_in(0, &mut hdr) == hdr.len() {
            abi::Cursor::new(&hdr).read::<InHeader>().ok()
        } else {
            None
        };
        // Only what the header claims is read (the server looks at nothing
        // past it): a chain padded to 1 MiB costs no 1 MiB copy.
        let want = match header {
            Some(h) if h.opcode == abi::opcode::WRITE => total.min(WRITE_PAYLOAD_AT),
            Some(h) => total.min(MAX_REQUEST).min((h.len as usize).max(hdr.len())),
            None => total.min(MAX_REQUEST),
        };
        // The worker's own buffer, grown to the largest request seen and
        // never zeroed again: `copy_in` overwrites what is used (a guest
        // padding its requests to 1 MiB no longer costs an allocation and a
        // 1 MiB memset each).
        let handled = REQUEST_BUF.with(|cell| {
            let mut req = cell.take();
            if req.len() < want {
                req.resize(want, 0);
            }
            let got = bufs.copy_in(0, &mut req[..want]);
            let out_cap = bufs.writable_len();
            let handled = self.server.handle_io(
                Incoming {
                    arrival_ns: arrival,
                    bytes: &req[..got],
                    total,
                    out_cap,
                },
                &mut bufs,
            );
            cell.set(req);
            handled
        });
        if let Some(deferred) = handled.deferred {
            drop(bufs);
            let writable = later.writable().map(|d| (d.addr(), d.len())).collect();
            self.defer(vring, head, writable, deferred);
            return false;
        }
        let len = match handled.reply {
            Some(reply) => {
                if bufs.copy_out(0, &reply) == reply.len() {
                    (reply.len() + handled.in_place) as u32
                } else {
                    metrics.bad_chains.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(vm = %metrics.name, head, "cannot write a reply");
                    0
                }
            }
            None => 0,
        };
        let Some(modeled) = handled.completes_at_ns else {
            let done = self.complete(vring, head, len);
            metrics.record_reply(arrival, None, self.clock.now_ns());
            return done;
        };
        // Ahead of the modeled completion by the floor (compensation off:
        // the modeled completion itself).
        let floor_ns = self.floor.current_ns();
        let deadline = pace::release_at(arrival, modeled, floor_ns);
        let now = self.clock.now_ns();
        if now >= deadline {
            // Already due (zero latency, or a hit): reply inline.
            let done = self.complete(vring, head, len);
            let t = self.clock.now_ns();
            metrics.record_reply_compensated(arrival, modeled, t, floor_ns);
            return done;
        }
        let held = Held {
            deadline_ns: deadline,
            modeled_ns: modeled,
            floor_ns,
            arrival_ns: arrival,
            vring: vring.clone(),
            queue,
            head,
            len,
        };
        if pace::keep_inline(now, deadline) {
            local.push(held);
            false
        } else {
            self.hand_to_pacer(vring, held)
        }
    }

    /// Runs a reply that comes later (a SETLKW waiting for a lock) on a
    /// thread of its own; when it is ready, writes it into the chain's
    /// writable descriptors, completes the chain and signals the guest.
    /// The server bounds how many wait at once.
    fn defer(&self, vring: &Vring, head: u16, writable: Vec<(GuestAddress, u32)>, d: Deferred) {
        let (mem, ring, event_idx) = (self.mem.clone(), vring.clone(), self.event_idx.clone());
        let vm = self.metrics.name.clone();
        let spawned = thread::Builder::new()
            .name(format!("lockwait-{vm}"))
            .spawn(move || {
                let reply = (d.0)();
                let guard = mem.memory();
                let mut done = 0usize;
                for (addr, len) in writable {
                    let n = (len as usize).min(reply.len() - done);
                    if n == 0 {
                        break;
                    }
                    if let Err(e) = guard.write_slice(&reply[done..done + n], addr) {
                        tracing::warn!(vm = %vm, head, error = %e, "cannot write a deferred reply");
                        break;
                    }
                    done += n;
                }
                // A reply that did not fit is not sent half: the chain
                // goes back empty, as for any reply that cannot be written.
                let len = if done == reply.len() { done as u32 } else { 0 };
                if let Err(e) = ring.add_used(head, len) {
                    tracing::warn!(vm = %vm, head, error = %e, "cannot add a deferred reply to the used ring");
                    return;
                }
                signal(&ring, event_idx.load(Ordering::Relaxed), &vm);
            });
        if let Err(e) = spawned {
            tracing::error!(vm = %self.metrics.name, head, error = %e, "cannot spawn a lock waiter; the request is dropped");
            if self.complete(vring, head, 0) {
                signal(
                    vring,
                    self.event_idx.load(Ordering::Relaxed),
                    &self.metrics.name,
                );
            }
        }
    }

    fn complete(&self, vring: &Vring, head: u16, len: u32) -> bool {
        if let Err(e) = vring.add_used(head, len) {
            tracing::warn!(vm = %&self.metrics.name, head, error = %e, "cannot add to the used ring");
            return false;
        }
        true
    }
}

/// Interrupts the guest for new used entries, unless EVENT_IDX says it
/// does not need one yet.
fn signal(vring: &Vring, event_idx: bool, vm: &str) {
    let needed = !event_idx || vring.needs_notification().unwrap_or(true);
    if needed {
        if let Err(e) = vring.signal_used_queue() {
            tracing::debug!(vm, error = %e, "cannot signal the guest");
        }
    }
}

fn run_pacer(rx: Receiver<Held>, clock: Clock, vm: Arc<VmMetrics>, event_idx: Arc<AtomicBool>) {
    pace::precise_timer_slack();
    pace::run_pacer(
        &rx,
        || clock.now_ns(),
        |due| {
            // Release everything due, then signal each ring once.
            let mut rings: Vec<(u16, Vring)> = Vec::new();
            for h in &due {
                if let Err(e) = h.vring.add_used(h.head, h.len) {
                    tracing::warn!(vm = %vm.name, error = %e, "cannot add a paced reply to the used ring");
                    continue;
                }
                if !rings.iter().any(|(q, _)| *q == h.queue) {
                    rings.push((h.queue, h.vring.clone()));
                }
            }
            for (_, r) in &rings {
                signal(r, event_idx.load(Ordering::Relaxed), &vm.name);
            }
            let done = clock.now_ns();
            for h in &due {
                vm.record_reply_compensated(h.arrival_ns, h.modeled_ns, done, h.floor_ns);
            }
        },
    );
}

impl VhostUserBackend for FsBackend {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        1 + self.queues.request_queues
    }

    fn max_queue_size(&self) -> usize {
        self.queues.queue_size
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let c = virtio_fs_config(&self.queues.tag, self.queues.request_queues);
        let (start, end) = (offset as usize, offset as usize + size as usize);
        if end > c.len() {
            // Out of range: an empty reply, which the front-end reports.
            tracing::debug!(
                offset,
                size,
                "GET_CONFIG outside the virtio-fs config space"
            );
            return Vec::new();
        }
        c[start..end].to_vec()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let base = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::CONFIG;
        if self.window.is_some() {
            // The DAX window: SHMEM_MAP / SHMEM_UNMAP on the back-end channel.
            base | VhostUserProtocolFeatures::BACKEND_REQ
                | VhostUserProtocolFeatures::BACKEND_SEND_FD
                | VhostUserProtocolFeatures::SHMEM
        } else {
            base
        }
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        match &self.window {
            Some(d) => {
                tracing::info!(vm = %self.metrics.name, "back-end channel up: DAX window can be mapped");
                d.set_backend(backend);
            }
            None => tracing::debug!("back-end channel offered without DAX; ignored"),
        }
    }

    fn get_shmem_config(&self) -> io::Result<VhostUserShMemConfig> {
        match &self.window {
            Some(d) => Ok(VhostUserShMemConfig::new(1, &[d.window_bytes()])),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no DAX window (cxlfsd runs without --dax)",
            )),
        }
    }

    fn reset_device(&self) {
        // The front-end drops every mapping of the window on reset.
        if let Some(d) = &self.window {
            d.forget_all();
        }
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn update_memory(&self, _mem: GuestMem) -> io::Result<()> {
        // `mem` is the same atomic handle we were built with; nothing to do.
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // One worker thread per queue.
        (0..self.num_queues()).map(|q| 1u64 << q).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC) {
            Ok(pair) => Some(pair),
            Err(e) => {
                tracing::error!(error = %e, "cannot create an exit event");
                None
            }
        }
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        let _ = evset;
        // `device_event` indexes this thread's own vrings (always 0 here);
        // with one queue per thread (`queues_per_thread`) the thread's
        // index is the queue's. The pacer tells rings apart by it.
        let Ok(queue) = u16::try_from(thread_id) else {
            return Ok(());
        };
        if usize::from(device_event) >= vrings.len() || usize::from(queue) >= self.num_queues() {
            return Ok(());
        }
        make_realtime(self.queues.realtime_priority);
        // One queue per thread: this thread's slice holds exactly that vring.
        for vring in vrings {
            if let Err(e) = self.process_queue(queue, vring) {
                // Never let a guest error end the worker: log it and go on.
                tracing::warn!(vm = %&self.metrics.name, error = %e, "queue processing failed");
            }
        }
        Ok(())
    }
}

impl Drop for FsBackend {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_runs_under_sched_fifo_or_says_why_not() {
        // On a thread of its own: the policy is per thread.
        std::thread::spawn(|| match make_daemon_realtime(1) {
            Ok(()) => {
                // SAFETY: plain syscall wrapper; pid 0 is this thread.
                let policy = unsafe { libc::sched_getscheduler(0) };
                assert_eq!(policy, libc::SCHED_FIFO);
                // A thread it starts inherits the policy.
                let inherited = std::thread::spawn(|| {
                    // SAFETY: as above.
                    unsafe { libc::sched_getscheduler(0) }
                })
                .join()
                .expect("thread");
                assert_eq!(inherited, libc::SCHED_FIFO);
            }
            Err(e) => {
                assert_eq!(e.source.raw_os_error(), Some(libc::EPERM), "{e}");
                assert!(e.to_string().contains("CAP_SYS_NICE"), "{e}");
            }
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn off_holds_to_the_modeled_completion_and_a_floor_releases_ahead() {
        // What `process_chain` holds a reply modeled to complete at 41 µs
        // (arrival 1 µs) until.
        let off = pace::Floor::new(pace::Compensation::Off).current_ns();
        assert_eq!(pace::release_at(1_000, 41_000, off), 41_000);
        assert_eq!(pace::release_at(1_000, 41_000, 7_000), 34_000);
        assert_eq!(pace::release_at(1_000, 5_000, 7_000), 1_000);
        // The pacing error is the estimated guest-visible one.
        let m = VmMetrics::new("vm");
        m.record_reply_compensated(1_000, 41_000, 34_500, 7_000);
        let (n, q) = m.pacing_summary(true);
        assert_eq!(n, 1);
        assert!((500..=501).contains(&q[0]), "{q:?}");
        // A floor of 0 records what `record_reply` does.
        let a = VmMetrics::new("a");
        let b = VmMetrics::new("b");
        a.record_reply_compensated(1_000, 41_000, 43_000, 0);
        b.record_reply(1_000, Some(41_000), 43_000);
        assert_eq!(a.pacing_summary(true), b.pacing_summary(true));
        assert_eq!(a.pacing_summary(false), b.pacing_summary(false));
    }
}
