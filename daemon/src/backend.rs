//! The vhost-user virtio-fs back-end of one VM connection.
//!
//! Threads of one connection:
//! * the vhost-user protocol thread (owned by `vhost_user_backend::VhostUserDaemon`);
//! * one vring worker per queue (queue 0 = hiprio, 1.. = request queues):
//!   it pops descriptor chains, stamps their arrival time, copies the
//!   request out of guest memory, runs it through [`FuseServer::handle`]
//!   (real I/O + device charge), writes the reply into the chain, and
//!   either completes it at once or hands it to the pacer;
//! * the pacer: a deadline heap of held replies; it sleeps until ~50 µs
//!   before the earliest deadline, spins the rest, then puts the chain on
//!   the used ring and signals the guest. Requests therefore overlap in
//!   real time exactly as they overlap in the device model (a queue
//!   worker never sleeps), and the pacing error (actual − modeled release)
//!   goes to the VM's histogram.

use crate::fuse::{FuseServer, MAX_REQUEST};
use crate::pool::SharedDevice;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::num::NonZeroU64;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
use virtio_queue::{DescriptorChain, QueueOwnedT, Reader, Writer};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

/// Guest memory as the back-end sees it.
pub type GuestMem = GuestMemoryAtomic<GuestMemoryMmap>;
type Vring = VringRwLock<GuestMem>;

/// Replies due within this much are spun for instead of slept for.
pub const SPIN_NS: u64 = 50_000;

/// Queue geometry.
#[derive(Debug, Clone, Copy)]
pub struct QueueOptions {
    /// Request queues (the hiprio queue comes on top).
    pub request_queues: usize,
    /// Largest queue size offered.
    pub queue_size: usize,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            request_queues: 1,
            queue_size: 1024,
        }
    }
}

struct Held {
    deadline_ns: u64,
    arrival_ns: u64,
    seq: u64,
    vring: Vring,
    queue: u16,
    head: u16,
    len: u32,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.deadline_ns, self.seq) == (o.deadline_ns, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.deadline_ns, self.seq).cmp(&(o.deadline_ns, o.seq))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The virtio-fs back-end of one connection.
pub struct FsBackend {
    server: Arc<FuseServer>,
    shared: Arc<SharedDevice>,
    mem: GuestMem,
    queues: QueueOptions,
    pacer_tx: Mutex<Option<Sender<Held>>>,
    pacer: Mutex<Option<JoinHandle<()>>>,
    seq: std::sync::atomic::AtomicU64,
}

/// Why a back-end could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateBackendError {
    /// The pacer thread could not be spawned.
    #[error("cannot spawn the pacer thread")]
    SpawnPacer(#[source] io::Error),
}

impl FsBackend {
    /// A back-end serving `server` over guest memory `mem`.
    pub fn new(
        server: Arc<FuseServer>,
        shared: Arc<SharedDevice>,
        mem: GuestMem,
        queues: QueueOptions,
    ) -> Result<Self, CreateBackendError> {
        let (tx, rx) = mpsc::channel();
        let vm = server.metrics().clone();
        let clock = shared.clone();
        let pacer = thread::Builder::new()
            .name(format!("pacer-{}", vm.name))
            .spawn(move || run_pacer(rx, clock, vm))
            .map_err(CreateBackendError::SpawnPacer)?;
        Ok(FsBackend {
            server,
            shared,
            mem,
            queues,
            pacer_tx: Mutex::new(Some(tx)),
            pacer: Mutex::new(Some(pacer)),
            seq: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The FUSE server.
    pub fn server(&self) -> &Arc<FuseServer> {
        &self.server
    }

    /// Stops taking held replies, releases those still held at their
    /// deadlines, and waits for the pacer to finish.
    pub fn close(&self) {
        lock(&self.pacer_tx).take();
        if let Some(h) = lock(&self.pacer).take() {
            if h.join().is_err() {
                tracing::error!("pacer thread panicked");
            }
        }
    }

    fn process_queue(&self, queue: u16, vring: &Vring) -> io::Result<()> {
        let mem = self.mem.memory();
        let chains: Vec<DescriptorChain<GuestMemoryLoadGuard<GuestMemoryMmap>>> = {
            let mut state = vring.get_mut();
            match state.get_queue_mut().iter(mem.clone()) {
                Ok(it) => it.collect(),
                Err(e) => {
                    // A broken ring (bad avail index, unmapped ring): serve nothing
                    // more on it, but keep the daemon and the other queues alive.
                    tracing::warn!(vm = %self.server.metrics().name, error = %e, "cannot walk the available ring");
                    return Ok(());
                }
            }
        };
        let mut completed_now = false;
        for chain in chains {
            completed_now |= self.process_chain(queue, vring, &mem, chain);
        }
        if completed_now {
            vring.signal_used_queue()?;
        }
        Ok(())
    }

    /// Serves one chain; true if it was put on the used ring right away.
    fn process_chain(
        &self,
        queue: u16,
        vring: &Vring,
        mem: &GuestMemoryMmap,
        chain: DescriptorChain<GuestMemoryLoadGuard<GuestMemoryMmap>>,
    ) -> bool {
        let arrival = self.shared.now_ns();
        let head = chain.head_index();
        let metrics = self.server.metrics();
        let rw = Reader::<()>::new(mem, chain.clone())
            .and_then(|r| Writer::<()>::new(mem, chain).map(|w| (r, w)));
        let (mut reader, mut writer) = match rw {
            Ok(rw) => rw,
            Err(e) => {
                // Descriptors outside guest memory (or overflowing): return the
                // chain unused; the request cannot even be answered.
                metrics.bad_chains.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(vm = %metrics.name, head, error = %e, "dropping a bad descriptor chain");
                return self.complete(vring, head, 0);
            }
        };
        let want = reader.available_bytes().min(MAX_REQUEST);
        let mut req = vec![0u8; want];
        if let Err(e) = reader.read_exact(&mut req) {
            metrics.bad_chains.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(vm = %metrics.name, head, error = %e, "cannot read a request");
            return self.complete(vring, head, 0);
        }
        let handled = self.server.handle(arrival, &req, writer.available_bytes());
        let len = match handled.reply {
            Some(reply) => match writer.write_all(&reply) {
                Ok(()) => reply.len() as u32,
                Err(e) => {
                    metrics.bad_chains.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(vm = %metrics.name, head, error = %e, "cannot write a reply");
                    0
                }
            },
            None => 0,
        };
        let Some(deadline) = handled.completes_at_ns else {
            return self.complete(vring, head, len);
        };
        let now = self.shared.now_ns();
        if now >= deadline {
            let done = self.complete(vring, head, len);
            metrics.record_pacing_error(
                self.shared.now_ns() as i64 - deadline as i64,
                deadline.saturating_sub(arrival),
            );
            return done;
        }
        let held = Held {
            deadline_ns: deadline,
            arrival_ns: arrival,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            vring: vring.clone(),
            queue,
            head,
            len,
        };
        match lock(&self.pacer_tx).as_ref().map(|tx| tx.send(held)) {
            Some(Ok(())) => false,
            // Closing down: release it now.
            Some(Err(mpsc::SendError(held))) => self.complete(vring, held.head, held.len),
            None => self.complete(vring, head, len),
        }
    }

    fn complete(&self, vring: &Vring, head: u16, len: u32) -> bool {
        if let Err(e) = vring.add_used(head, len) {
            tracing::warn!(vm = %self.server.metrics().name, head, error = %e, "cannot add to the used ring");
            return false;
        }
        true
    }
}

fn run_pacer(rx: Receiver<Held>, clock: Arc<SharedDevice>, vm: Arc<crate::metrics::VmMetrics>) {
    // Sleep precision matters: ask for no timer slack on this thread.
    if let Err(e) = rustix::thread::set_current_timer_slack(NonZeroU64::new(1)) {
        tracing::debug!(error = %e, "cannot set timer slack");
    }
    let mut heap: BinaryHeap<Reverse<Held>> = BinaryHeap::new();
    let mut open = true;
    loop {
        let Some(next) = heap.peek().map(|h| h.0.deadline_ns) else {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(h) => heap.push(Reverse(h)),
                Err(_) => open = false,
            }
            continue;
        };
        let now = clock.now_ns();
        if now + SPIN_NS < next {
            let wait = Duration::from_nanos(next - now - SPIN_NS);
            if open {
                match rx.recv_timeout(wait) {
                    Ok(h) => heap.push(Reverse(h)),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
            } else {
                thread::sleep(wait);
            }
            continue;
        }
        if now < next {
            // Take in new arrivals while spinning (they may be due earlier).
            if open {
                match rx.try_recv() {
                    Ok(h) => heap.push(Reverse(h)),
                    Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
                    Err(mpsc::TryRecvError::Disconnected) => open = false,
                }
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        // Release everything due, then signal each ring once.
        let mut due: Vec<Held> = Vec::new();
        while heap.peek().is_some_and(|h| h.0.deadline_ns <= now) {
            if let Some(Reverse(h)) = heap.pop() {
                due.push(h);
            }
        }
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
            if let Err(e) = r.signal_used_queue() {
                tracing::debug!(vm = %vm.name, error = %e, "cannot signal the guest");
            }
        }
        let done = clock.now_ns() as i64;
        for h in &due {
            vm.record_pacing_error(
                done - h.deadline_ns as i64,
                h.deadline_ns.saturating_sub(h.arrival_ns),
            );
        }
    }
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
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // TODO(issue-4): BACKEND_REQ | BACKEND_SEND_FD | SHMEM for the DAX window.
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, _enabled: bool) {
        // EVENT_IDX is not offered: every completion is signalled.
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
        _thread_id: usize,
    ) -> io::Result<()> {
        let _ = evset;
        if usize::from(device_event) >= self.num_queues() {
            return Ok(());
        }
        // One queue per thread: this thread's slice holds exactly that vring.
        for vring in vrings {
            if let Err(e) = self.process_queue(device_event, vring) {
                // Never let a guest error end the worker: log it and go on.
                tracing::warn!(vm = %self.server.metrics().name, error = %e, "queue processing failed");
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
