//! The daemon: one shared device, one listener thread per VM, reconnects,
//! and a clean shutdown.
//!
//! This is the one module (with `main.rs`) that knows every type: it wires
//! the layers together. Per VM, a serving thread loops: wait for a
//! connection on the VM's socket (polling, so shutdown is noticed), build a
//! fresh session — a [`PassthroughFs`] wrapped by the timing layer
//! ([`TimedFs`]) under a [`Server`], with the VM's [`DaxSession`] as its DAX
//! mapper and the controller's hint handler as its ioctl seam, behind an
//! [`FsBackend`] and a new `VhostUserDaemon` with its vring workers — serve
//! it until the front-end goes away, tear it down, and listen again.
//! Nothing is shared between VMs except the [`SharedDevice`] (device model
//! and pool, each behind its own mutex), the DAX plane and the metrics
//! registry, so one VM dying never disturbs another.

use crate::backend::{CacheWindow, FsBackend, GuestMem, QueueOptions};
use crate::config::{DaemonConfig, VmSpec};
use crate::control::{
    ControlOptions, ControlSocket, Controller, DevicePlacement, StartControlError,
    DEFAULT_MAX_RANGE_CACHE_PERCENT, DEFAULT_PIN_QUOTA_PERCENT,
};
use crate::dax::{DaxPlane, DaxSession, StartDaxError};
use crate::device::SharedDevice;
use crate::ids::FileKey;
use crate::memory::MemoryRegions;
use crate::metrics::{Metrics, PlaneSource, VmMetrics};
use crate::passthrough::{CacheMode, GuestIds, InodeObserver, OpenSharedDirError, PassthroughFs};
use crate::server::{DaxMapper, IoctlHandler, Server, ServerOptions};
use crate::sync::lock;
use crate::timing::{Coherence, OpenFiles, TimedFs};
use cxlfs_api::control::{DaemonSummary, VmEndpoint};
use residency::{FusePoolPlane, PlaneOptions, PoolBackend, ResidencyPlane};
use rustix::event::{PollFd, PollFlags};
use std::collections::HashSet;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;
use vhost::vhost_user::Listener;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

/// Settings every VM session shares.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Shared directory.
    pub shared_dir: PathBuf,
    /// Cache mode.
    pub cache: CacheMode,
    /// Queue geometry.
    pub queues: QueueOptions,
    /// FUSE server options.
    pub server: ServerOptions,
    /// Guest uid/gid translation and set-id stripping.
    pub guest_ids: GuestIds,
    /// Inodes + open handles one VM may hold (each a host fd).
    pub max_open_files: u64,
}

/// What each VM session's FUSE server serves: the share, timed by the device.
pub type VmFs = TimedFs<PassthroughFs>;
/// One VM session's FUSE server.
pub type VmServer = Server<VmFs>;

/// The pool's references follow the sessions' inodes.
#[derive(Debug)]
struct PoolRefs(Arc<SharedDevice>);

impl InodeObserver for PoolRefs {
    fn inode_added(&self, key: FileKey) {
        self.0.acquire_file(key);
    }

    fn inode_dropped(&self, key: FileKey, deleted: bool) {
        self.0.release_file(key, deleted);
    }
}

/// A mountpoint the daemon created: removed when dropped (once the plane
/// mounted on it is detached, or failed to mount).
struct CreatedDir(Option<PathBuf>);

impl Drop for CreatedDir {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A VM's vhost-user socket, bound and listening, not yet served.
pub struct ListeningVm {
    vm: VmSpec,
    listener: Listener,
}

/// Binds VM `vm`'s socket, owner-only (see `crate::sandbox::bind_owner_only`).
pub fn listen(vm: VmSpec) -> Result<ListeningVm, ServeVmError> {
    let listener =
        crate::sandbox::bind_owner_only(&vm.socket).map_err(|source| ServeVmError::Listen {
            path: vm.socket.display().to_string(),
            source,
        })?;
    tracing::info!(vm = %vm.name, socket = %vm.socket.display(), "listening");
    Ok(ListeningVm {
        vm,
        listener: Listener::from(listener),
    })
}

/// Mounts the residency plane at `dir` (`None`: a fresh directory under
/// `/run/cxlfsd`), created if missing.
fn mount_plane(
    dir: Option<&Path>,
    size: u64,
    backend: Arc<dyn PoolBackend>,
    options: PlaneOptions,
) -> Result<Arc<dyn ResidencyPlane>, StartDaxError> {
    let dir = dir.map_or_else(crate::dax::default_pool_dir, Path::to_path_buf);
    let created = CreatedDir((!dir.exists()).then(|| dir.clone()));
    // Owner-only whatever the umask (`/run/cxlfsd` too, when we create it).
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|source| StartDaxError::CreateDir {
            path: dir.clone(),
            source,
        })?;
    // Detached once open: the pool is reachable only through descriptors
    // (the plane's, and the ones VMMs get over vhost-user), never by path.
    let options = PlaneOptions {
        detach: true,
        ..options
    };
    let plane = FusePoolPlane::mount(&dir, size, backend, options)?;
    // Nothing is mounted on it any more.
    drop(created);
    Ok(Arc::new(plane))
}

/// The vhost-user protocol side of one connection.
type VuDaemon = VhostUserDaemon<Arc<FsBackend>>;

/// One VM connection's parts.
struct Session {
    server: Arc<VmServer>,
    backend: Arc<FsBackend>,
    dax: Option<Arc<DaxSession>>,
}

/// State shared by the VM threads and the shutdown path.
pub struct DaemonState {
    /// The device and the pool.
    pub shared: Arc<SharedDevice>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// Session settings.
    pub opts: SessionOptions,
    dax: Option<Arc<DaxPlane>>,
    control: Option<Arc<Controller>>,
    memory: Option<Arc<MemoryRegions>>,
    /// The virtio-fs path's floor, shared by every VM's back-end.
    fuse_floor: Arc<residency::pace::Floor>,
    shutdown: AtomicBool,
    live: Mutex<Vec<(String, ShutdownHandle)>>,
    sessions: Mutex<Vec<(String, Arc<VmServer>)>>,
}

impl Drop for DaemonState {
    fn drop(&mut self) {
        self.stop_dax();
    }
}

/// Why a VM could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeVmError {
    /// The VM's shared directory is not a directory.
    #[error("shared directory {dir} of VM {vm} is not a directory")]
    NoShare {
        /// VM name.
        vm: String,
        /// The directory.
        dir: String,
    },
    /// The socket could not be created.
    #[error("cannot listen on {path}")]
    Listen {
        /// Socket path.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The serving thread could not be spawned.
    #[error("cannot spawn the thread for VM {vm}")]
    Spawn {
        /// VM name.
        vm: String,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
}

/// What the daemon runs besides the VM sessions, chosen at start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Features<'a> {
    /// The DAX window: the residency plane's mountpoint (`None`: a fresh
    /// directory under `/run/cxlfsd`) and each VM's window size. If the
    /// plane cannot be mounted, the daemon logs why and serves without it.
    pub dax: Option<(Option<&'a Path>, u64)>,
    /// Cache control (guest hints, and the socket when the config names
    /// one), set up from the daemon's configuration.
    pub control: Option<&'a DaemonConfig>,
    /// Memory mode: the VMs' CXL memory regions (already started).
    pub memory: Option<&'a Arc<MemoryRegions>>,
}

impl DaemonState {
    /// Daemon state over a device, without DAX or cache control.
    pub fn new(shared: Arc<SharedDevice>, opts: SessionOptions) -> Arc<Self> {
        let metrics = Arc::new(Metrics::new(shared.clone(), None));
        Self::assemble(shared, opts, metrics, None, None, None)
    }

    /// Daemon state over a device with `features`, all set up before any VM
    /// is served; returns the control socket when one was asked for.
    pub fn start(
        shared: Arc<SharedDevice>,
        opts: SessionOptions,
        features: Features<'_>,
    ) -> Result<(Arc<Self>, Option<ControlSocket>), StartControlError> {
        if let Err(e) = crate::sandbox::raise_file_limit() {
            tracing::warn!(error = %e, "cannot raise RLIMIT_NOFILE");
        }
        let dax = features
            .dax
            .and_then(|(dir, window)| start_dax(&shared, dir, window, &opts.queues));
        let plane = dax.clone().map(|d| d as Arc<dyn PlaneSource>);
        let mut metrics = Metrics::new(shared.clone(), plane);
        if let Some(m) = features.memory {
            metrics = metrics.with_memory(m.clone());
        }
        let metrics = Arc::new(metrics);
        let (control, socket) = match features.control {
            Some(cfg) => {
                let c = new_controller(cfg, &shared, &metrics, dax.as_ref(), features.memory)?;
                let socket = match &cfg.control.socket {
                    Some(path) => Some(ControlSocket::start(
                        path,
                        cfg.control.socket_mode,
                        c.clone(),
                    )?),
                    None => None,
                };
                (Some(c), socket)
            }
            None => (None, None),
        };
        let memory = features.memory.cloned();
        let me = Self::assemble(shared, opts, metrics, dax, control, memory);
        Ok((me, socket))
    }

    fn assemble(
        shared: Arc<SharedDevice>,
        opts: SessionOptions,
        metrics: Arc<Metrics>,
        dax: Option<Arc<DaxPlane>>,
        control: Option<Arc<Controller>>,
        memory: Option<Arc<MemoryRegions>>,
    ) -> Arc<Self> {
        // Measured now (auto: a few ms), before any VM is served.
        let fuse_floor = crate::backend::fuse_floor::start(opts.queues.compensation, &metrics);
        Arc::new(DaemonState {
            metrics,
            shared,
            opts,
            dax,
            control,
            memory,
            fuse_floor,
            shutdown: AtomicBool::new(false),
            live: Mutex::new(Vec::new()),
            sessions: Mutex::new(Vec::new()),
        })
    }

    /// The cache-control executor, once set.
    pub fn control(&self) -> Option<&Arc<Controller>> {
        self.control.as_ref()
    }

    /// The DAX window's plane, when DAX is on.
    pub fn dax(&self) -> Option<&Arc<DaxPlane>> {
        self.dax.as_ref()
    }

    /// Unmounts the DAX window's residency plane; call after every VM
    /// thread has ended and before the process exits. Idempotent.
    pub fn stop_dax(&self) {
        if let Some(d) = &self.dax {
            d.shutdown();
        }
    }

    /// Changes the share of file pages on the CXL-SSD tier (0..=100 %) at
    /// run time; see [`SharedDevice::set_cxl_ratio`] for how pages move.
    /// Never call it from a residency-plane thread.
    pub fn set_cxl_ratio(
        &self,
        cxl_ratio: u8,
    ) -> Result<crate::device::RatioChange, crate::device::placement::SetCxlRatioError> {
        self.shared.set_cxl_ratio(cxl_ratio)
    }

    /// The ratio in force.
    pub fn cxl_ratio(&self) -> u8 {
        self.shared.cxl_ratio()
    }

    /// Whether VM `vm`'s front-end is connected now.
    pub fn is_connected(&self, vm: &str) -> bool {
        lock(&self.live).iter().any(|(n, _)| n == vm)
    }

    /// Whether shutdown was requested.
    pub fn shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Stops accepting and disconnects every VM; serving threads then finish
    /// their in-flight requests and return.
    pub fn request_shutdown(&self) {
        self.shutdown.store(true, Ordering::Release);
        for (vm, h) in lock(&self.live).iter() {
            tracing::info!(vm = %vm, "disconnecting for shutdown");
            h.shutdown();
        }
    }

    /// Writes back every dirty page: the pool's (stores made through DAX
    /// windows) into the host files, fsync of those and of open files,
    /// syncfs of the share, and a flush of the device model's dirty cache
    /// pages. Call it before [`DaemonState::stop_dax`].
    pub fn flush_all(&self) {
        if let Some(d) = &self.dax {
            match d.write_back_all() {
                Ok(()) => tracing::info!("pool write-back complete"),
                Err(e) => {
                    tracing::error!(error = %e, "pool write-back failed: window stores may be lost")
                }
            }
        }
        // Each live session fsyncs its open files and syncfs-es its own
        // share (a VM's directory or the common one); sessions that ended
        // did the same at their disconnect.
        for (_, s) in lock(&self.sessions).iter() {
            s.fs().inner().sync_all();
        }
        match self.shared.flush() {
            Ok(done) => tracing::info!(durable_at_ns = done, "device write-back complete"),
            Err(e) => tracing::error!(error = %e, "device flush failed"),
        }
    }

    /// Starts the serving thread of one VM.
    pub fn spawn_vm(self: &Arc<Self>, vm: VmSpec) -> Result<JoinHandle<()>, ServeVmError> {
        self.spawn_listening(listen(vm)?)
    }

    /// Starts the serving thread of a VM whose socket is already bound
    /// (bound before the sandbox, served after).
    pub fn spawn_listening(
        self: &Arc<Self>,
        bound: ListeningVm,
    ) -> Result<JoinHandle<()>, ServeVmError> {
        let ListeningVm { vm, listener } = bound;
        let share = vm.share(&self.opts.shared_dir);
        if !share.is_dir() {
            return Err(ServeVmError::NoShare {
                vm: vm.name.clone(),
                dir: share.display().to_string(),
            });
        }
        tracing::info!(vm = %vm.name, share = %share.display(), "serving");
        let state = self.clone();
        let name = vm.name.clone();
        thread::Builder::new()
            .name(format!("vm-{name}"))
            .spawn(move || state.serve_vm(vm, listener))
            .map_err(|source| ServeVmError::Spawn { vm: name, source })
    }

    /// Waits until the listener is readable; false on shutdown.
    fn wait_for_connection(&self, listener: &Listener) -> bool {
        // SAFETY: the listener owns this fd and outlives the borrow, which
        // ends with this function.
        let fd = unsafe { BorrowedFd::borrow_raw(listener.as_raw_fd()) };
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        while !self.shutting_down() {
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(n) if n > 0 => return true,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    tracing::error!(error = %e, "poll on the vhost-user socket failed");
                    thread::sleep(Duration::from_millis(200));
                }
            }
        }
        false
    }

    fn serve_vm(self: Arc<Self>, vm: VmSpec, mut listener: Listener) {
        let metrics = self.metrics.vm(&vm.name);
        while self.wait_for_connection(&listener) {
            let fds_before = socket_fds();
            let session = match self.new_session(&vm) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(vm = %vm.name, error = %e, "cannot set up a session");
                    thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            let (session, mut daemon) = session;
            let Session {
                server,
                backend,
                dax,
            } = session;
            if let Err(e) = daemon.start(&mut listener) {
                tracing::warn!(vm = %vm.name, error = %e, "connection failed");
                backend.close();
                continue;
            }
            metrics.connections.fetch_add(1, Ordering::Relaxed);
            let peer = peer_pid(&fds_before, listener.as_raw_fd());
            tracing::info!(vm = %vm.name, vmm_pid = ?peer, "front-end connected");
            if let (Some(d), Some(pid)) = (&dax, peer) {
                d.plane().register_vmm(d.vm(), pid);
            }
            if let Some(m) = &self.memory {
                m.vm_connected(&vm.name, peer);
            }
            if let Some(h) = daemon.shutdown_handle() {
                if let Some(d) = &dax {
                    // A front-end that stops answering the back-end channel
                    // loses its connection (and only it).
                    let h = h.clone();
                    d.set_disconnect(Box::new(move || h.shutdown()));
                }
                lock(&self.live).push((vm.name.clone(), h.clone()));
                if self.shutting_down() {
                    h.shutdown();
                }
            }
            lock(&self.sessions).push((vm.name.clone(), server.clone()));
            match daemon.wait() {
                Ok(()) => tracing::info!(vm = %vm.name, "front-end disconnected"),
                // A guest that powers off closes its socket, possibly mid-message:
                // the normal end of a session (as vhost-user-backend's `serve` treats it).
                Err(vhost_user_backend::Error::HandleRequest(
                    vhost::vhost_user::Error::Disconnected
                    | vhost::vhost_user::Error::PartialMessage,
                )) => tracing::info!(vm = %vm.name, "front-end disconnected"),
                Err(e) => tracing::warn!(vm = %vm.name, error = %e, "session ended with an error"),
            }
            for h in daemon.get_epoll_handlers() {
                h.send_exit_event();
            }
            lock(&self.live).retain(|(n, _)| n != &vm.name);
            if let Some(d) = &dax {
                d.plane().unregister_vmm(d.vm());
                // Stores made through the window live in pool pages: write
                // them back while the files still own their extents.
                d.write_back();
                // The front-end drops its maps when the back-end goes.
                d.forget_all();
            }
            // Release held replies and stop the pacer before the session goes.
            backend.close();
            server.fs().inner().sync_all();
            lock(&self.sessions).retain(|(n, _)| n != &vm.name);
            // The session's inodes hold pool references (and host fds):
            // return them now, so deleted files' extents and disk space come
            // back (other files' extents become reclaimable), then reclaim
            // deleted files' extents the window kept mapped until now.
            server.fs().inner().reset();
            let reclaimed = self.shared.reclaim_deleted_idle();
            tracing::info!(vm = %vm.name, reclaimed_extents = reclaimed, "session released its files");
            // Unmaps the guest's memory here (a CXL node's region too: its
            // write-backs are answered by the region's helper process).
            drop(daemon);
            if let Some(m) = &self.memory {
                m.vm_disconnected(&vm.name);
            }
        }
        tracing::info!(vm = %vm.name, "stopped listening");
    }

    /// A FUSE server for VM `vm_metrics.name` over the share: the
    /// passthrough filesystem (its inodes hold pool references), timed by
    /// the device (coherent with the DAX plane when DAX is on), with `dax`
    /// as its DAX mapper and the controller's hint handler as its ioctl seam.
    pub fn vm_server(
        &self,
        vm_metrics: Arc<VmMetrics>,
        dax: Option<Arc<DaxSession>>,
    ) -> Result<VmServer, OpenSharedDirError> {
        self.vm_server_at(&self.opts.shared_dir, vm_metrics, dax)
    }

    /// [`DaemonState::vm_server`] over directory `share` (the VM's own).
    pub fn vm_server_at(
        &self,
        share: &Path,
        vm_metrics: Arc<VmMetrics>,
        dax: Option<Arc<DaxSession>>,
    ) -> Result<VmServer, OpenSharedDirError> {
        let refs: Arc<dyn InodeObserver> = Arc::new(PoolRefs(self.shared.clone()));
        let fs = PassthroughFs::new(share, self.opts.cache)?
            .with_inode_observer(Some(refs))
            .with_guest_ids(self.opts.guest_ids.clone());
        let coherence = self.dax.as_ref().map(|d| d.clone() as Arc<dyn Coherence>);
        let open_files: OpenFiles<PassthroughFs> = Box::new(|fs: &PassthroughFs| {
            let (inodes, handles) = fs.counts();
            (inodes + handles) as u64
        });
        let timed = TimedFs::new(fs, self.shared.clone(), vm_metrics.clone(), coherence)
            .with_open_files_cap(self.opts.max_open_files, open_files);
        let ioctl = self.control.as_ref().map(|c| {
            Arc::new(crate::control::hint::HintHandler::new(
                c.clone(),
                &vm_metrics.name,
            )) as Arc<dyn IoctlHandler>
        });
        Ok(Server::new(timed, vm_metrics, self.opts.server)
            .with_dax(dax.map(|d| d as Arc<dyn DaxMapper>))
            .with_ioctl(ioctl))
    }

    fn new_session(&self, vm: &VmSpec) -> Result<(Session, VuDaemon), Box<dyn std::error::Error>> {
        let vm_metrics = self.metrics.vm(&vm.name);
        let dax = self.dax.as_ref().map(|d| {
            let session = Arc::new(DaxSession::new(d.clone(), vm_metrics.clone()));
            d.register_session(&session);
            session
        });
        let share = vm.share(&self.opts.shared_dir);
        let server = Arc::new(self.vm_server_at(share, vm_metrics.clone(), dax.clone())?);
        let mem: GuestMem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let backend = Arc::new(FsBackend::new(
            server.clone(),
            vm_metrics,
            dax.clone().map(|d| d as Arc<dyn CacheWindow>),
            *self.shared.clock(),
            mem.clone(),
            self.opts.queues,
            self.fuse_floor.clone(),
        )?);
        let daemon = VhostUserDaemon::new(format!("cxlfsd-{}", vm.name), backend.clone(), mem)
            .map_err(|e| format!("vhost-user daemon: {e}"))?;
        Ok((
            Session {
                server,
                backend,
                dax,
            },
            daemon,
        ))
    }
}

/// Request threads (ring entries per CPU queue) of the DAX plane at the
/// start. Each eviction of a page the guest wrote through its window is a
/// write-back (`FUSE_WRITE`) on the queue of the notifier's CPU, which
/// starts a whole batch of them at once: with this many entries they are
/// answered back to back instead of one round trip after another, and a
/// trap on that CPU still finds a free entry. With two, evictions trailed
/// the traps that caused them by up to 300 ms (`cxlfs_pool_eviction_lag_*`),
/// and guests reached pages the device had dropped without a trap.
const DAX_RING_ENTRIES: usize = 8;

/// Evicted pages a DAX miss may leave waiting for the plane's notifier
/// (`PlaneOptions::eviction_backlog_pages`; `--dax-eviction-backlog`, by
/// default 1/32 of the device cache, within 32..=512 pages). Past it,
/// misses wait for the evictions (at most 20 ms each), so that the pages
/// the guests still map without a trap are never more than this beyond
/// what the device holds. Unbounded, a lap over freshly written pages
/// outran the write-backs of its evictions by a whole lap on a loaded
/// 2-CPU host, and trapped on 6 of its 4 096 loads.
fn dax_eviction_backlog(
    shared: &SharedDevice,
    queues: &crate::backend::QueueOptions,
) -> Option<u64> {
    let cache_pages = shared.read(|_, dev| dev.config().cache.size_bytes) / crate::device::PAGE;
    queues.dax_eviction_backlog.pages(cache_pages)
}

/// Mounts the residency plane and starts the DAX window; `None` (logged)
/// where it cannot be mounted (no `/dev/fuse`, no permission, ...).
fn start_dax(
    shared: &Arc<SharedDevice>,
    dir: Option<&Path>,
    window: u64,
    queues: &crate::backend::QueueOptions,
) -> Option<Arc<DaxPlane>> {
    let options = PlaneOptions {
        readers: DAX_RING_ENTRIES,
        // Every miss past the cache evicts a page: a notifier that sleeps
        // is woken on the other CPU for each, inside the trap's reply.
        notifier_poll: residency::EVICTING_NOTIFIER_POLL,
        eviction_backlog_pages: dax_eviction_backlog(shared, queues),
        compensation: queues.dax_compensation,
        transport: queues.plane_transport,
        mode: if queues.plane_poll {
            residency::ReaderMode::Spin
        } else {
            residency::ReaderMode::Block
        },
        ..PlaneOptions::default()
    };
    let mount = |size, backend| mount_plane(dir, size, backend, options);
    match DaxPlane::start(shared.clone(), window, mount) {
        Ok(d) => {
            tracing::info!(window, plane = ?d, eviction_backlog = ?options.eviction_backlog_pages, "DAX window on: guests may mount with -o dax");
            Some(d)
        }
        Err(e) => {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            tracing::warn!(error = %msg, "DAX disabled: the residency plane cannot be mounted; serving without a DAX window");
            None
        }
    }
}

/// The daemon's cache-control executor, configured from `cfg`.
fn new_controller(
    cfg: &DaemonConfig,
    shared: &Arc<SharedDevice>,
    metrics: &Arc<Metrics>,
    dax: Option<&Arc<DaxPlane>>,
    memory: Option<&Arc<MemoryRegions>>,
) -> Result<Arc<Controller>, StartControlError> {
    let quota = cfg
        .control
        .pin_quota_bytes
        .unwrap_or(cfg.device.cache.size_bytes * DEFAULT_PIN_QUOTA_PERCENT / 100);
    let about = DaemonSummary {
        shared_dir: cfg.shared_dir.display().to_string(),
        vms: cfg
            .vms
            .iter()
            .map(|v| VmEndpoint {
                name: v.name.clone(),
                socket: v.socket.display().to_string(),
            })
            .collect(),
        cache: format!("{:?}", cfg.cache).to_lowercase(),
        dax_window: cfg.dax.window,
        metrics_addr: cfg.metrics_addr.map(|a| a.to_string()),
        control_socket: cfg.control.socket.as_ref().map(|p| p.display().to_string()),
        control_socket_mode: format!("{:04o}", cfg.control.socket_mode),
        device_origin: cfg.device_origin.clone(),
    };
    let controller = Controller::new(
        shared.clone(),
        metrics.clone(),
        crate::control::Planes {
            dax: dax.cloned(),
            memory: memory.cloned(),
        },
        Arc::new(DevicePlacement(shared.clone())),
        &cfg.shared_dir,
        ControlOptions {
            pin_quota_bytes: quota,
            max_range_bytes: cfg
                .control
                .max_range_bytes
                .unwrap_or(cfg.device.cache.size_bytes * DEFAULT_MAX_RANGE_CACHE_PERCENT / 100),
            prefetch_budget_bytes: cfg
                .control
                .prefetch_budget_bytes
                .unwrap_or(cfg.device.cache.size_bytes),
            guest_device_control: cfg.control.guest_device_control,
        },
        about,
    )?;
    tracing::info!(
        pin_quota_bytes = quota,
        guest_device_control = cfg.control.guest_device_control,
        "guest cache hints on (FUSE_IOCTL)"
    );
    Ok(controller)
}

/// The process's open socket fds.
fn socket_fds() -> HashSet<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return HashSet::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let fd: i32 = e.file_name().to_str()?.parse().ok()?;
        let target = std::fs::read_link(e.path()).ok()?;
        target
            .to_str()
            .is_some_and(|t| t.starts_with("socket:"))
            .then_some(fd)
    })
    .collect()
}

/// The path a Unix socket is bound to (`getsockname`), as bytes.
fn bound_path(fd: i32) -> Option<Vec<u8>> {
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr`/`len` are valid for writes of `len` bytes; a stale
    // fd number only makes the call fail.
    let rc = unsafe { libc::getsockname(fd, std::ptr::addr_of_mut!(addr).cast(), &mut len) };
    if rc != 0 || i32::from(addr.sun_family) != libc::AF_UNIX {
        return None;
    }
    let path_len = (len as usize)
        .saturating_sub(std::mem::size_of::<libc::sa_family_t>())
        .min(addr.sun_path.len());
    Some(
        addr.sun_path[..path_len]
            .iter()
            .map(|&c| c as u8)
            .take_while(|&c| c != 0)
            .collect(),
    )
}

/// The pid of the process at the other end of the connection just
/// accepted on `listener` (`SO_PEERCRED`): vhost-user-backend accepts
/// internally, so the new connection is found among the socket fds that
/// were not open before, as the one with the listener's address and a
/// peer. (The address is the one bound, not the socket's public path: see
/// [`crate::sandbox::bind_owner_only`].)
fn peer_pid(before: &HashSet<i32>, listener: i32) -> Option<u32> {
    let want = bound_path(listener)?;
    let mut found = None;
    for fd in socket_fds().difference(before) {
        if bound_path(*fd).as_deref() != Some(want.as_slice()) {
            continue;
        }
        // SAFETY: ucred is plain data; all-zero is a valid value.
        let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
        let mut clen = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `cred`/`clen` are valid for writes of `clen` bytes.
        let rc = unsafe {
            libc::getsockopt(
                *fd,
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                std::ptr::addr_of_mut!(cred).cast(),
                &mut clen,
            )
        };
        // The listener itself has no peer (pid 0 or ENOTCONN).
        if rc == 0 && cred.pid > 0 {
            found = Some(cred.pid as u32);
        }
    }
    found
}
