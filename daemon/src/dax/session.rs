//! One VM's DAX window: its slot table, mapped through the front-end.
//!
//! SETUPMAPPING → `VHOST_USER_BACKEND_SHMEM_MAP` of the pool file at the
//! extent holding the file range; REMOVEMAPPING → `SHMEM_UNMAP`. Maps never
//! overlap; a read-only slot upgraded to writable is unmapped, then mapped
//! again.
//!
//! The back-end channel is driven by a thread of its own (`dax-chan-VM`):
//! a request thread hands it a message and waits for the front-end's
//! reply-ack at most [`DaxPlane::reply_timeout`], holding no lock. A
//! front-end that does not answer in time gets its connection dropped
//! (only its VM stalls, and only until then); the daemon serves the others.
//!
//! A request for a slot whose mapping or removal is still in flight (on
//! another queue's thread) waits for it to settle, at most as long as that
//! operation may itself take (two channel round trips), holding no lock
//! meanwhile; it is refused only if the slot never settles (the front-end
//! stopped answering) or if the guest names a range it does not hold.

use super::{DaxPlane, MAP_ALIGNMENT_SHIFT, SLOT_SIZE};
use crate::abi::{setupmapping_flags, RemoveMappingOne, SetupMappingIn};
use crate::backend::CacheWindow;
use crate::device::{EXTENT_SIZE, PAGE};
use crate::ids::{FileKey, VmId};
use crate::metrics::VmMetrics;
use crate::server::{DaxMapper, FileSystem};
use crate::sync::lock;
use crate::timing::Coherence;
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};

/// Where a slot stands with the front-end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// SHMEM_MAP sent, not acknowledged yet.
    Mapping,
    /// Mapped.
    Live,
    /// SHMEM_UNMAP sent, not acknowledged yet (the guest may still store).
    Unmapping,
}

/// One window slot. It is in the table from before its SHMEM_MAP is sent
/// until its SHMEM_UNMAP is acknowledged, so that a writable one keeps
/// plane fills off its extent the whole time the guest could store there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) key: FileKey,
    pub(super) foffset: u64,
    pub(super) len: u64,
    pub(super) writable: bool,
    pub(super) extent: u64,
    state: SlotState,
    /// Tells a slot from a later one at the same offset.
    id: u64,
}

/// Why a message on the back-end channel failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendChannelError {
    /// The front-end never handed over a back-end channel.
    #[error("the front-end offered no back-end channel")]
    NotOffered,
    /// The channel was given up (an earlier timeout, or the session ended).
    #[error("the back-end channel is closed")]
    Closed,
    /// No reply-ack within the timeout: the connection is being dropped.
    #[error("no reply from the front-end within {0:?}")]
    Timeout(Duration),
    /// The front-end answered with an error (or the socket failed).
    #[error("the front-end refused the request")]
    Frontend(#[source] std::io::Error),
}

/// One message for the channel thread.
enum ChannelMsg {
    Map(VhostUserMMap, Arc<File>),
    Unmap(VhostUserMMap),
}

struct ChannelJob {
    msg: ChannelMsg,
    done: SyncSender<std::io::Result<()>>,
}

/// Runs on `dax-chan-VM`: sends each message and waits for its ack. A
/// front-end that never answers parks this thread (and only it) until its
/// end of the socket closes; nobody waits on it longer than the timeout.
fn run_channel(backend: &Backend, jobs: &mpsc::Receiver<ChannelJob>) {
    for job in jobs {
        let r = match &job.msg {
            ChannelMsg::Map(req, file) => backend.shmem_map(req, &**file),
            ChannelMsg::Unmap(req) => backend.shmem_unmap(req),
        };
        // The waiter may have timed out and gone.
        let _ = job.done.send(r.map(|_| ()));
    }
}

/// How often a SETUPMAPPING waits for its slot to settle before it is
/// refused (each wait is bounded; only a guest racing itself on one slot
/// needs more than one).
const MAX_SETTLE_TRIES: u32 = 8;

/// Called once when the front-end stops answering: drops its connection.
pub type DisconnectHook = Box<dyn Fn() + Send + Sync>;

/// The DAX window of one VM connection.
pub struct DaxSession {
    dax: Arc<DaxPlane>,
    pub(super) vm: VmId,
    metrics: Arc<VmMetrics>,
    /// Jobs for the channel thread (`None` until the channel is offered).
    channel: Mutex<Option<Sender<ChannelJob>>>,
    /// Set on the first reply-ack timeout: nothing more is sent.
    dead: AtomicBool,
    disconnect: Mutex<Option<DisconnectHook>>,
    next_id: AtomicU64,
    pub(super) slots: Mutex<BTreeMap<u64, Slot>>,
    /// Signalled whenever a slot settles (see [`DaxSession::settle`]).
    settled: Condvar,
    /// The file range each window offset held last (for window pressure:
    /// a slot mapped again for another range was taken from that one).
    last_held: Mutex<BTreeMap<u64, (FileKey, u64)>>,
    /// Pool extents this session ever mapped writable (its guest's stores
    /// may sit there): written back when the VM goes.
    stored: Mutex<std::collections::BTreeSet<u64>>,
}

impl std::fmt::Debug for DaxSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaxSession")
            .field("vm", &self.metrics.name)
            .field("slots", &lock(&self.slots).len())
            .finish_non_exhaustive()
    }
}

impl DaxSession {
    /// A session of VM `metrics.name` over the daemon's plane.
    pub fn new(dax: Arc<DaxPlane>, metrics: Arc<VmMetrics>) -> Self {
        let vm = dax.vm_id(&metrics);
        DaxSession {
            dax,
            vm,
            metrics,
            channel: Mutex::new(None),
            dead: AtomicBool::new(false),
            disconnect: Mutex::new(None),
            next_id: AtomicU64::new(0),
            slots: Mutex::new(BTreeMap::new()),
            settled: Condvar::new(),
            last_held: Mutex::new(BTreeMap::new()),
            stored: Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// What to do when the front-end stops answering the back-end channel
    /// (the daemon drops the connection).
    pub fn set_disconnect(&self, hook: DisconnectHook) {
        *lock(&self.disconnect) = Some(hook);
    }

    /// The daemon's plane.
    pub fn plane(&self) -> &Arc<DaxPlane> {
        &self.dax
    }

    /// This VM's id in the plane.
    pub fn vm(&self) -> VmId {
        self.vm
    }

    /// The front-end handed over its back-end request channel: a thread
    /// of its own drives it. A second channel replaces the first (whose
    /// thread ends once its queue is drained).
    pub fn set_backend(&self, backend: Backend) {
        let (tx, rx) = mpsc::channel::<ChannelJob>();
        let spawned = std::thread::Builder::new()
            .name(format!("dax-chan-{}", self.metrics.name))
            .spawn(move || run_channel(&backend, &rx));
        match spawned {
            Ok(_) => *lock(&self.channel) = Some(tx),
            Err(e) => {
                tracing::error!(vm = %self.metrics.name, error = %e, "cannot start the back-end channel thread; no DAX window for this VM");
            }
        }
    }

    /// Whether the front-end can take SHMEM_MAP requests (it gave us the
    /// back-end channel, and has not stopped answering it).
    pub fn window_offered(&self) -> bool {
        lock(&self.channel).is_some() && !self.dead.load(Ordering::Acquire)
    }

    /// Whether the front-end stopped answering the back-end channel.
    pub fn channel_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Sends `msg` on the back-end channel and waits for its ack, at most
    /// the plane's reply timeout; holds no lock meanwhile.
    fn send(&self, msg: ChannelMsg) -> Result<(), BackendChannelError> {
        if self.dead.load(Ordering::Acquire) {
            return Err(BackendChannelError::Closed);
        }
        let tx = lock(&self.channel)
            .clone()
            .ok_or(BackendChannelError::NotOffered)?;
        let (done, wait) = mpsc::sync_channel(1);
        tx.send(ChannelJob { msg, done })
            .map_err(|_| BackendChannelError::Closed)?;
        let timeout = self.dax.reply_timeout();
        match wait.recv_timeout(timeout) {
            Ok(r) => r.map_err(BackendChannelError::Frontend),
            Err(RecvTimeoutError::Disconnected) => Err(BackendChannelError::Closed),
            Err(RecvTimeoutError::Timeout) => {
                self.give_up(timeout);
                Err(BackendChannelError::Timeout(timeout))
            }
        }
    }

    /// The front-end did not answer in time: nothing more is sent to it and
    /// its connection is dropped (once).
    fn give_up(&self, after: Duration) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        self.metrics
            .backend_timeouts
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(vm = %self.metrics.name, timeout = ?after, "front-end did not acknowledge a back-end channel request in time; dropping its connection");
        lock(&self.channel).take();
        if let Some(hook) = lock(&self.disconnect).take() {
            hook();
        }
    }

    /// The pool pages behind `window_pages` (window offset / 4 KiB) that a
    /// slot maps now, appended to `out`, under one look at the table.
    pub(super) fn pool_pages(&self, window_pages: &[u64], out: &mut Vec<u64>) {
        let slots = lock(&self.slots);
        for &w in window_pages {
            let Some(at) = w.checked_mul(PAGE) else {
                continue;
            };
            let Some((&moffset, slot)) = slots.range(..=at).next_back() else {
                continue;
            };
            let inside = at - moffset;
            if inside < slot.len && slot.state != SlotState::Mapping {
                out.push((slot.extent * EXTENT_SIZE + inside) / PAGE);
            }
        }
    }

    /// Live slots.
    pub fn slot_count(&self) -> usize {
        lock(&self.slots).len()
    }

    /// FUSE_SETUPMAPPING of node `nodeid`. The kernel sends `fh` = -1 and
    /// names the file by its node id; a real `fh` is also accepted.
    pub fn setup_mapping(
        &self,
        fs: &dyn FileSystem,
        nodeid: u64,
        m: &SetupMappingIn,
    ) -> Result<(), Errno> {
        let window = self.dax.window;
        let plane = self.dax.plane().ok_or(Errno::NOSYS)?;
        if !self.window_offered() {
            return Err(Errno::NOSYS);
        }
        let fh = (m.fh != u64::MAX).then_some(m.fh);
        let key = self.check_mapping(fs, nodeid, fh, m, window)?;
        let writable = m.flags & setupmapping_flags::WRITE != 0;
        let chunk = m.foffset / SLOT_SIZE;
        // Host I/O (the first open of the file for the pool), under no lock.
        let open = || {
            fs.host_file(nodeid, fh, true)?
                .pool_file
                .ok_or(Errno::INVAL)
        };
        let extent = self.dax.window_extent(key, chunk, open)?.ok_or_else(|| {
            tracing::warn!(vm = %self.metrics.name, "pool full: no extent of its own for a DAX slot");
            Errno::NOMEM
        })?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Slot {
            key,
            foffset: m.foffset,
            len: m.len,
            writable,
            extent,
            state: SlotState::Mapping,
            id,
        };
        let replaced = self.claim_slot(m, slot)?;
        if writable {
            lock(&self.stored).insert(extent);
        }
        // The same range again (e.g. read-only upgraded to writable):
        // unmap, then map.
        if let Some(old) = replaced {
            if let Err(e) = self.unmap(m.moffset, old.len) {
                self.settle(m.moffset, id, Some(old));
                return Err(e);
            }
            self.metrics.dax_unmaps.fetch_add(1, Ordering::Relaxed);
        }
        let req = VhostUserMMap {
            shmid: 0,
            padding: [0; 7],
            fd_offset: extent * EXTENT_SIZE,
            shm_offset: m.moffset,
            len: m.len,
            flags: if writable {
                VhostUserMMapFlags::WRITABLE.bits()
            } else {
                0
            },
        };
        let target = plane.map_target().file.clone();
        drop(plane);
        if let Err(e) = self.send(ChannelMsg::Map(req, target)) {
            tracing::warn!(vm = %self.metrics.name, error = %e, moffset = m.moffset, "SHMEM_MAP failed");
            self.settle(m.moffset, id, None);
            return Err(Errno::IO);
        }
        self.settle(
            m.moffset,
            id,
            Some(Slot {
                state: SlotState::Live,
                ..slot
            }),
        );
        self.metrics.dax_maps.fetch_add(1, Ordering::Relaxed);
        let before = lock(&self.last_held).insert(m.moffset, (key, m.foffset));
        if before.is_some_and(|b| b != (key, m.foffset)) {
            self.metrics.dax_slot_reuses.fetch_add(1, Ordering::Relaxed);
        }
        tracing::trace!(vm = %self.metrics.name, moffset = m.moffset, foffset = m.foffset, extent, writable, "DAX slot mapped");
        Ok(())
    }

    /// Counts and logs a refused FUSE_SETUPMAPPING of `m`: `EINVAL`.
    fn refuse(&self, m: &SetupMappingIn, why: &str) -> Errno {
        self.metrics
            .dax_map_refusals
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(vm = %self.metrics.name, ?m, why, "SETUPMAPPING refused");
        Errno::INVAL
    }

    /// Counts, logs (WARN) and refuses a FUSE_SETUPMAPPING of `m` past the
    /// end of the `window`-byte window: the VMM's window is larger than
    /// ours. The WARN is given on the 1st, 2nd, 4th, 8th, ... of the VM's.
    fn refuse_overrun(&self, m: &SetupMappingIn, window: u64) -> Errno {
        let n = self
            .metrics
            .dax_window_overruns
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if n.is_power_of_two() {
            tracing::warn!(
                vm = %self.metrics.name,
                moffset = m.moffset,
                len = m.len,
                window,
                overruns = n,
                "SETUPMAPPING refused: the range lies past the end of the DAX window \
                 (--dax-window {window} bytes); the VMM's window is larger \
                 (QEMU cache-size must equal --dax-window)"
            );
        }
        self.refuse(m, "outside the window")
    }

    /// Checks FUSE_SETUPMAPPING `m` of node `nodeid` against a window of
    /// `window` bytes, the file and the live slots; returns the file's key.
    fn check_mapping(
        &self,
        fs: &dyn FileSystem,
        nodeid: u64,
        fh: Option<u64>,
        m: &SetupMappingIn,
        window: u64,
    ) -> Result<FileKey, Errno> {
        let bad = |why: &str| self.refuse(m, why);
        if m.moffset % SLOT_SIZE != 0 || m.foffset % SLOT_SIZE != 0 {
            return Err(bad("misaligned"));
        }
        if m.len == 0 || m.len > SLOT_SIZE || m.len % PAGE != 0 {
            return Err(bad("bad length"));
        }
        if !m
            .moffset
            .checked_add(m.len)
            .is_some_and(|end| end <= window)
        {
            return Err(self.refuse_overrun(m, window));
        }
        let file = fs.host_file(nodeid, fh, false)?;
        if file.is_dir {
            return Err(bad("not a regular file"));
        }
        let limit = file.size.div_ceil(SLOT_SIZE).saturating_mul(SLOT_SIZE);
        if !m.foffset.checked_add(m.len).is_some_and(|end| end <= limit) {
            return Err(bad("past the end of the file"));
        }
        let key = file.key;
        if let Some(old) = lock(&self.slots).get(&m.moffset).copied() {
            // (One in flight is judged once it settles, by `claim_slot`.)
            if old.state == SlotState::Live
                && (old.key, old.foffset, old.len) != (key, m.foffset, m.len)
            {
                return Err(bad("overlaps a live slot"));
            }
        }
        Ok(key)
    }

    /// Enters `slot` (in flight) at `m.moffset` in the table; returns the
    /// live slot it replaces (the same range, mapped again).
    fn claim_slot(&self, m: &SetupMappingIn, slot: Slot) -> Result<Option<Slot>, Errno> {
        // Claim the slot before the front-end hears of it. A writable one
        // lets the guest store into pool pages: it is entered under the fill
        // guard, so every plane fill of the extent either finished before or
        // sees it and stays off (see `DaxPlane::fill_from_file`). Neither
        // the guard nor the table is held while the front-end answers.
        // A slot still in flight on another queue's thread is waited for
        // first, holding nothing; if another claim slips in before the
        // guard is taken, it is waited for again (a bounded number of times).
        let (key, writable) = (slot.key, slot.writable);
        let bad = |why: &str| self.refuse(m, why);
        let mut tries = 0u32;
        let replaced = loop {
            drop(self.settled_slots(m.moffset)?);
            let _fill_guard = writable.then(|| self.dax.change_guard(key));
            // Host blocks under a writable range, reserved under the guard
            // a truncation holds too: the file's size cannot move between
            // the reservation and the slot entering the table (a truncate
            // up after that reserves for the slot itself).
            if writable {
                self.dax
                    .reserve_for_stores(key, m.foffset, m.len)
                    .inspect_err(|e| {
                        tracing::debug!(vm = %self.metrics.name, error = %e, foffset = m.foffset, "no host space for a writable DAX slot");
                    })?;
            }
            let mut slots = lock(&self.slots);
            let old = slots.get(&m.moffset).copied();
            match old {
                Some(o) if o.state != SlotState::Live => {
                    tries += 1;
                    if tries < MAX_SETTLE_TRIES {
                        continue;
                    }
                    return Err(self.refuse_in_flight(m.moffset));
                }
                Some(o) if (o.key, o.foffset, o.len) != (key, m.foffset, m.len) => {
                    return Err(bad("overlaps a live slot"));
                }
                _ => {}
            }
            // Upgraded read-only → writable: the old mapping stays writable
            // in the table until it is replaced.
            let writable = writable || old.is_some_and(|o| o.writable);
            slots.insert(m.moffset, Slot { writable, ..slot });
            break old;
        };
        Ok(replaced)
    }

    /// Replaces slot `id` at `moffset` by `to` (`None`: removes it), unless
    /// the table moved on meanwhile (a reset forgot it).
    fn settle(&self, moffset: u64, id: u64, to: Option<Slot>) {
        let mut slots = lock(&self.slots);
        if slots.get(&moffset).is_some_and(|s| s.id == id) {
            match to {
                Some(s) => {
                    slots.insert(moffset, s);
                }
                None => {
                    slots.remove(&moffset);
                }
            }
        }
        drop(slots);
        self.settled.notify_all();
    }

    /// Locks the slot table once the slot at `moffset` is not in flight
    /// (absent or live). A mapping or removal of it still running on
    /// another queue's thread is waited for, at most as long as it may
    /// take itself (two channel round trips: an upgrade unmaps, then maps).
    /// A slot still in flight after that is refused with EIO: its
    /// front-end stopped answering, and its connection is being dropped.
    fn settled_slots(&self, moffset: u64) -> Result<MutexGuard<'_, BTreeMap<u64, Slot>>, Errno> {
        let in_flight =
            |t: &BTreeMap<u64, Slot>| t.get(&moffset).is_some_and(|s| s.state != SlotState::Live);
        let mut slots = lock(&self.slots);
        if !in_flight(&slots) {
            return Ok(slots);
        }
        self.metrics.dax_map_waits.fetch_add(1, Ordering::Relaxed);
        let bound = self.dax.reply_timeout().saturating_mul(2);
        let deadline = Instant::now().checked_add(bound);
        while in_flight(&slots) {
            let left = deadline.map_or(bound, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                drop(slots);
                return Err(self.refuse_in_flight(moffset));
            }
            slots = match self.settled.wait_timeout(slots, left) {
                Ok((g, _)) => g,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        Ok(slots)
    }

    /// A request for a slot that never settled: counted, logged, EIO.
    fn refuse_in_flight(&self, moffset: u64) -> Errno {
        self.metrics
            .dax_map_refusals
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(vm = %self.metrics.name, moffset, "a DAX window slot stayed in flight; request refused");
        Errno::IO
    }

    /// SHMEM_UNMAP of `(moffset, len)`, acknowledged.
    fn unmap(&self, moffset: u64, len: u64) -> Result<(), Errno> {
        let req = VhostUserMMap {
            shmid: 0,
            padding: [0; 7],
            fd_offset: 0,
            shm_offset: moffset,
            len,
            flags: 0,
        };
        self.send(ChannelMsg::Unmap(req)).map_err(|e| {
            tracing::warn!(vm = %self.metrics.name, error = %e, moffset, len, "SHMEM_UNMAP failed");
            match e {
                BackendChannelError::NotOffered => Errno::NOSYS,
                _ => Errno::IO,
            }
        })
    }

    /// FUSE_REMOVEMAPPING of `(moffset, len)` ranges: each must be a live
    /// slot exactly. All are tried; the first error is returned.
    pub fn remove_mappings(&self, ranges: &[RemoveMappingOne]) -> Result<(), Errno> {
        if !self.window_offered() {
            return Err(Errno::NOSYS);
        }
        let mut result = Ok(());
        for r in ranges {
            let (moffset, len) = (r.moffset, r.len);
            // Marked, not removed, until the front-end acknowledges: a
            // writable slot keeps plane fills off its extent until then.
            // A slot whose mapping is still in flight (on another queue's
            // thread) is waited for, like in SETUPMAPPING.
            let claimed = self
                .settled_slots(moffset)
                .and_then(|mut slots| match slots.get_mut(&moffset) {
                    Some(s) if s.len == len => {
                        s.state = SlotState::Unmapping;
                        Ok(*s)
                    }
                    _ => {
                        self.metrics
                            .dax_map_refusals
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(vm = %self.metrics.name, moffset, len, "REMOVEMAPPING of no slot");
                        Err(Errno::INVAL)
                    }
                });
            let r = claimed.and_then(|s| match self.unmap(moffset, len) {
                Ok(()) => {
                    self.settle(moffset, s.id, None);
                    self.metrics.dax_unmaps.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
                Err(e) => {
                    // Still mapped as far as we know.
                    self.settle(moffset, s.id, Some(s_live(s)));
                    Err(e)
                }
            });
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// The guest's FUSE session ended (DESTROY) or restarted (INIT): asks
    /// the front-end to unmap every live slot (best effort), then forgets them.
    pub fn unmap_all(&self) {
        let slots: Vec<(u64, Slot)> = {
            let mut t = lock(&self.slots);
            for s in t.values_mut() {
                s.state = SlotState::Unmapping;
            }
            t.iter().map(|(&o, &s)| (o, s)).collect()
        };
        for (moffset, s) in slots {
            if self.unmap(moffset, s.len).is_ok() {
                self.metrics.dax_unmaps.fetch_add(1, Ordering::Relaxed);
            }
            self.settle(moffset, s.id, None);
        }
    }

    /// Writes back the pool extents this VM ever mapped writable (its
    /// guest's stores, including those made after an unmap was asked for)
    /// to the host files; called when the VM disconnects, before its slots
    /// are forgotten and its files' references dropped. Never call it from
    /// a plane thread.
    pub fn write_back(&self) {
        let Some(plane) = self.dax.plane() else {
            return;
        };
        let extents = std::mem::take(&mut *lock(&self.stored));
        for extent in extents {
            if let Err(e) = plane.sync(extent * EXTENT_SIZE, EXTENT_SIZE) {
                tracing::warn!(vm = %self.metrics.name, error = %e, extent, "cannot write back a window extent");
            }
        }
    }

    /// The front-end dropped its maps (device reset, disconnect): forget
    /// the slots without a message.
    pub fn forget_all(&self) {
        lock(&self.slots).clear();
        self.settled.notify_all();
    }

    /// Writable slots (for tests and logs).
    pub fn writable_slots(&self) -> usize {
        lock(&self.slots).values().filter(|s| s.writable).count()
    }
}

fn s_live(s: Slot) -> Slot {
    Slot {
        state: SlotState::Live,
        ..s
    }
}

impl DaxMapper for DaxSession {
    fn window_offered(&self) -> bool {
        DaxSession::window_offered(self)
    }

    fn map_alignment_shift(&self) -> u16 {
        MAP_ALIGNMENT_SHIFT
    }

    fn setup_mapping(
        &self,
        fs: &dyn FileSystem,
        nodeid: u64,
        m: &SetupMappingIn,
    ) -> Result<(), Errno> {
        DaxSession::setup_mapping(self, fs, nodeid, m)
    }

    fn remove_mappings(&self, ranges: &[RemoveMappingOne]) -> Result<(), Errno> {
        DaxSession::remove_mappings(self, ranges)
    }

    fn unmap_all(&self) {
        DaxSession::unmap_all(self);
    }
}

impl CacheWindow for DaxSession {
    fn set_backend(&self, backend: Backend) {
        DaxSession::set_backend(self, backend);
    }

    fn window_bytes(&self) -> u64 {
        self.dax.window()
    }

    fn forget_all(&self) {
        DaxSession::forget_all(self);
    }
}

#[cfg(test)]
impl DaxSession {
    /// Enters a live writable slot of `key`'s chunk 0 on `extent`, as a
    /// SETUPMAPPING would (the plane tests map the pool file themselves).
    pub(super) fn enter_writable_slot(&self, key: FileKey, extent: u64) {
        let slot = Slot {
            key,
            foffset: 0,
            len: SLOT_SIZE,
            writable: true,
            extent,
            state: SlotState::Live,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
        };
        lock(&self.slots).insert(0, slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot of `key` 1 at window offset 0, in `state`.
    fn slot(id: u64, state: SlotState) -> Slot {
        Slot {
            key: FileKey { dev: 1, ino: 1 },
            foffset: 0,
            len: SLOT_SIZE,
            writable: false,
            extent: 0,
            state,
            id,
        }
    }

    /// A request for a slot in flight on another thread waits until that
    /// thread settles it, then goes on; one that never settles is refused
    /// with EIO after two reply timeouts. Both are counted.
    #[test]
    fn a_slot_in_flight_is_waited_for_and_refused_only_if_it_never_settles() {
        let Some(rig) = super::super::tests::rig() else {
            return;
        };
        rig.dax.set_reply_timeout(Duration::from_millis(150));
        let metrics = Arc::new(VmMetrics::new("w"));
        let s = Arc::new(DaxSession::new(rig.dax.clone(), metrics.clone()));
        lock(&s.slots).insert(0, slot(7, SlotState::Mapping));
        let other = {
            let s = s.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                s.settle(0, 7, Some(slot(7, SlotState::Live)));
            })
        };
        let t = Instant::now();
        let live = s.settled_slots(0).map(|t| t.get(&0).map(|s| s.state));
        let waited = t.elapsed();
        other.join().unwrap();
        assert_eq!(live, Ok(Some(SlotState::Live)));
        assert!(waited >= Duration::from_millis(90), "waited {waited:?}");
        assert_eq!(metrics.dax_map_waits.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.dax_map_refusals.load(Ordering::Relaxed), 0);

        // Never settled: refused after two reply timeouts.
        lock(&s.slots).insert(0, slot(8, SlotState::Unmapping));
        let t = Instant::now();
        let r = s.settled_slots(0).map(|_| ());
        let waited = t.elapsed();
        assert_eq!(r, Err(Errno::IO));
        assert!(
            waited >= Duration::from_millis(290) && waited < Duration::from_secs(5),
            "refused after {waited:?}"
        );
        assert_eq!(metrics.dax_map_waits.load(Ordering::Relaxed), 2);
        assert_eq!(metrics.dax_map_refusals.load(Ordering::Relaxed), 1);
        // A live or absent slot is not waited for.
        lock(&s.slots).clear();
        assert!(s.settled_slots(0).is_ok());
        assert_eq!(metrics.dax_map_waits.load(Ordering::Relaxed), 2);
    }

    /// A SETUPMAPPING past the end of the window (the VMM's window is
    /// larger) is refused with EINVAL and counted twice: an overrun and a
    /// refusal. One inside the window is no overrun.
    #[test]
    fn a_mapping_past_the_window_is_an_overrun() {
        let Some(rig) = super::super::tests::rig() else {
            return;
        };
        let metrics = Arc::new(VmMetrics::new("w"));
        let s = DaxSession::new(rig.dax.clone(), metrics.clone());
        let window = 2 * SLOT_SIZE;
        let at = |moffset| SetupMappingIn {
            fh: u64::MAX,
            foffset: 0,
            len: SLOT_SIZE,
            flags: 0,
            moffset,
        };
        for moffset in [window, window + SLOT_SIZE, u64::MAX - (SLOT_SIZE - 1)] {
            let r = s.check_mapping(&rig.fs, 1, None, &at(moffset), window);
            assert_eq!(r.err(), Some(Errno::INVAL), "moffset {moffset:#x}");
        }
        assert_eq!(metrics.dax_window_overruns.load(Ordering::Relaxed), 3);
        assert_eq!(metrics.dax_map_refusals.load(Ordering::Relaxed), 3);
        // Inside the window: judged on (here, the root directory is no
        // regular file), not an overrun.
        let r = s.check_mapping(&rig.fs, 1, None, &at(SLOT_SIZE), window);
        assert_eq!(r.err(), Some(Errno::INVAL));
        assert_eq!(metrics.dax_window_overruns.load(Ordering::Relaxed), 3);
        assert_eq!(metrics.dax_map_refusals.load(Ordering::Relaxed), 4);
    }
}
