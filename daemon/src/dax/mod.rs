//! The DAX window: guests map the shared pool through the virtio-fs cache
//! window, backed by a residency plane (any [`ResidencyPlane`]; the daemon
//! mounts `residency::FusePoolPlane`).
//!
//! * [`DaxPlane`] (one per daemon; here: the struct, start, shutdown, the
//!   plane's ownership) owns the plane and:
//!   - is its [`PoolBackend`] ([`backend`]): a trap at pool offset X finds
//!     the file extent that owns X, charges the device model at the trap's
//!     arrival and answers with the host file's bytes (zeros past EOF); a
//!     write-back goes to the host file (clamped to its size) and is
//!     charged as NAND programs;
//!   - subscribes to the device's events ([`DeviceObserver`], [`observer`]):
//!     evicted pages leave the plane ([`fill_evict`]), prefetched pages are
//!     pushed into it ([`filler`]), a deleted file's extents are dropped
//!     before reuse, pages moved to the CXL tier are evicted;
//!   - keeps the pool coherent with host files for the timing layer
//!     ([`Coherence`](crate::timing::Coherence), [`coherence`]), holding
//!     the write-backs of ranges being discarded ([`discards`]);
//!   - knows the window-mapped extents and their host files ([`windows`]),
//!     the VMs that use it ([`vms`]), writes dirty pages back every few
//!     seconds ([`writeback`]) and hands its figures to the metrics
//!     ([`figures`]).
//! * [`DaxSession`] (one per VM connection, [`session`]): the slot table of
//!   that VM's window, the server's [`crate::server::DaxMapper`].

mod backend;
mod coherence;
mod discards;
mod figures;
mod fill_evict;
mod filler;
mod host_space;
mod observer;
pub mod session;
#[cfg(test)]
pub(crate) mod tests;
mod vms;
mod windows;
mod writeback;

pub use session::DaxSession;

use crate::device::{DeviceObserver, PrefetchedPages, SharedDevice, EXTENT_SIZE};
use crate::ids::{FileKey, VmId};
use crate::sync::lock;
use crate::timing::FileLocks;
use backend::DaemonPoolBackend;
use discards::Discards;
use residency::{PoolBackend, ResidencyPlane};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use vms::VmTable;

/// log2 of the window's map alignment and slot size (2 MiB), advertised in
/// FUSE_INIT (`map_alignment`).
pub const MAP_ALIGNMENT_SHIFT: u16 = 21;
/// Bytes of one window slot (= one pool extent).
pub const SLOT_SIZE: u64 = EXTENT_SIZE;
/// The fewest slots a window may have. One guest access can need two
/// slots at once (a store or load across a 2 MiB boundary of a mapped
/// file); the guest's fault maps one range at a time, and the access
/// completes only when both are mapped together. A one-slot window can
/// never hold both: the access faults forever and the guest hangs. Two
/// slots need the guest kernel's reclaim to leave both mapped while the
/// access retries (guest-kernel-patches/fuse-dax-reclaim-on-demand.patch;
/// docs/dax-window.md).
pub const MIN_WINDOW_SLOTS: u64 = 2;
/// Default size of the window reported by `GET_SHMEM_CONFIG`.
pub const DEFAULT_WINDOW_BYTES: u64 = 1 << 30;
/// How long a back-end channel request (SHMEM_MAP / SHMEM_UNMAP) waits for
/// the front-end's reply-ack before the connection is dropped. QEMU maps a
/// slot in well under a millisecond; this is for front-ends that hang.
pub const DEFAULT_REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often dirty pool pages (guest stores through DAX windows) are
/// written back to the host files: a daemon crash loses at most this much
/// of them (the kernel's own flusher writes them back after ~30 s).
pub const DEFAULT_WRITEBACK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Why the DAX window could not be set up (the daemon then serves without it).
#[derive(Debug, thiserror::Error)]
pub enum StartDaxError {
    /// The mountpoint could not be created.
    #[error("cannot create the pool mountpoint {path}")]
    CreateDir {
        /// The directory.
        path: std::path::PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The plane could not be mounted (no /dev/fuse, no permission, ...).
    #[error("cannot mount the residency plane")]
    Mount(#[from] residency::MountPlaneError),
    /// The window size is not a positive multiple of 2 MiB.
    #[error("DAX window size {0:#x} is not a positive multiple of 2 MiB")]
    BadWindow(u64),
    /// The prefetch filler thread could not be started.
    #[error("cannot start the pool-prefetch thread")]
    SpawnFiller(#[source] std::io::Error),
    /// The periodic write-back thread could not be started.
    #[error("cannot start the pool-writeback thread")]
    SpawnWriteback(#[source] std::io::Error),
}

/// Extents mapped into some DAX window (their pages may be resident in the
/// plane) and the host files behind them, kept open for traps and
/// write-backs.
#[derive(Debug, Default)]
struct WindowExtents {
    extents: HashSet<u64>,
    files: HashMap<FileKey, Arc<File>>,
}

/// The residency plane of the daemon and the VMs that use it.
pub struct DaxPlane {
    plane: Mutex<Option<Arc<dyn ResidencyPlane>>>,
    shared: Arc<SharedDevice>,
    window: u64,
    /// State shared with the plane's backend (its threads answer traps).
    state: Arc<PlaneState>,
    /// Every VM session's window, for the pages mapped by several VMs.
    sessions: Mutex<Vec<std::sync::Weak<DaxSession>>>,
    /// Prefetched pages pushed into the plane (no trap when first touched).
    prefetch_pushed: AtomicU64,
    /// Serializes pushing a file's bytes into the plane (NOTIFY_STORE)
    /// against every change of those bytes behind it: FUSE WRITE,
    /// truncation, a VM mapping an extent writable. One lock per file, so
    /// one VM's slow WRITE holds up nothing of other files. See
    /// [`Coherence::change_guard`](crate::timing::Coherence::change_guard).
    plane_fill: FileLocks,
    /// How long a back-end channel request waits for the front-end's ack.
    reply_timeout_ms: AtomicU64,
    /// Period of the `pool-writeback` thread (0: off).
    writeback_ms: AtomicU64,
    /// Where prefetched pages go to be pushed into the plane.
    prefetch_tx: Mutex<Option<Sender<PrefetchedPages>>>,
    /// Serializes pool reclaims that hold every slot table
    /// ([`DeviceObserver::with_mapped`]).
    reclaiming: Mutex<()>,
}

/// What the plane's backend and the daemon side share.
#[derive(Debug, Default)]
struct PlaneState {
    vms: VmTable,
    /// The VMM pid of each VM (write-backs come with the writer's pid).
    vmm_pids: Mutex<Vec<(u32, VmId)>>,
    windows: Mutex<WindowExtents>,
    /// Pool ranges being discarded
    /// ([`Coherence::discard_file_range`](crate::timing::Coherence::discard_file_range)):
    /// their write-backs are held, not stored (see [`backend`]).
    discards: Mutex<Discards>,
}

impl std::fmt::Debug for DaxPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaxPlane")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

/// A fresh mountpoint name under `/run/cxlfsd` for this process.
pub fn default_pool_dir() -> std::path::PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    if n == 0 {
        std::path::PathBuf::from(format!("/run/cxlfsd/pool-{pid}"))
    } else {
        std::path::PathBuf::from(format!("/run/cxlfsd/pool-{pid}-{n}"))
    }
}

impl DaxPlane {
    /// Starts the DAX window over `shared`'s pool for windows of `window`
    /// bytes: `mount` mounts a residency plane of `size` bytes served by
    /// the given backend (the daemon passes `FusePoolPlane::mount`). The
    /// plane then follows the device's events.
    pub fn start<E>(
        shared: Arc<SharedDevice>,
        window: u64,
        mount: impl FnOnce(u64, Arc<dyn PoolBackend>) -> Result<Arc<dyn ResidencyPlane>, E>,
    ) -> Result<Arc<Self>, StartDaxError>
    where
        StartDaxError: From<E>,
    {
        if window == 0 || window % SLOT_SIZE != 0 {
            return Err(StartDaxError::BadWindow(window));
        }
        let size = shared.read(|p, _| p.capacity_extents()) * EXTENT_SIZE;
        let state = Arc::new(PlaneState::default());
        let backend = Arc::new(DaemonPoolBackend {
            shared: shared.clone(),
            state: state.clone(),
        });
        let plane = mount(size, backend)?;
        let (fill_tx, fill_rx) = std::sync::mpsc::channel::<Vec<(u64, u64)>>();
        let dax = Arc::new(DaxPlane {
            plane: Mutex::new(Some(plane)),
            shared: shared.clone(),
            window,
            state,
            sessions: Mutex::new(Vec::new()),
            prefetch_pushed: AtomicU64::new(0),
            plane_fill: FileLocks::default(),
            reply_timeout_ms: AtomicU64::new(DEFAULT_REPLY_TIMEOUT.as_millis() as u64),
            writeback_ms: AtomicU64::new(DEFAULT_WRITEBACK_INTERVAL.as_millis() as u64),
            prefetch_tx: Mutex::new(Some(fill_tx)),
            reclaiming: Mutex::new(()),
        });
        let weak = Arc::downgrade(&dax);
        std::thread::Builder::new()
            .name("pool-prefetch".into())
            .spawn(move || filler::run(&weak, &fill_rx))
            .map_err(StartDaxError::SpawnFiller)?;
        let weak = Arc::downgrade(&dax);
        std::thread::Builder::new()
            .name("pool-writeback".into())
            .spawn(move || writeback::run_writeback(&weak))
            .map_err(StartDaxError::SpawnWriteback)?;
        let observer: Arc<dyn DeviceObserver> = dax.clone();
        shared.subscribe(Arc::downgrade(&observer));
        Ok(dax)
    }

    /// How long a back-end channel request waits for the front-end's ack.
    pub fn reply_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.reply_timeout_ms.load(Ordering::Relaxed))
    }

    /// Sets [`DaxPlane::reply_timeout`] (at least 1 ms).
    pub fn set_reply_timeout(&self, t: std::time::Duration) {
        let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1);
        self.reply_timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// The residency plane (`None` after [`DaxPlane::shutdown`]).
    pub fn plane(&self) -> Option<Arc<dyn ResidencyPlane>> {
        lock(&self.plane).clone()
    }

    /// Unmounts the plane now, whoever still holds this `DaxPlane` (it must
    /// happen before the process exits: a process that still has the pool
    /// file open when its own FUSE server threads die hangs in the kernel
    /// at exit, closing that file). Mappings of the pool that are still
    /// alive get `SIGBUS`. Idempotent.
    pub fn shutdown(&self) {
        lock(&self.prefetch_tx).take();
        let plane = lock(&self.plane).take();
        if let Some(p) = plane {
            if Arc::strong_count(&p) > 1 {
                tracing::warn!(
                    "the residency plane is still referenced; it unmounts when the last user goes"
                );
            }
            drop(p);
        }
    }

    /// The window size each VM gets.
    pub fn window(&self) -> u64 {
        self.window
    }
}

impl Drop for DaxPlane {
    fn drop(&mut self) {
        // Unmounts (and joins the plane's threads) when the last user goes.
        self.shutdown();
    }
}
