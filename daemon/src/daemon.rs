//! The daemon: one shared device, one listener thread per VM, reconnects,
//! and a clean shutdown.
//!
//! Per VM, a serving thread loops: wait for a connection on the VM's
//! socket (polling, so shutdown is noticed), build a fresh session (a new
//! [`PassthroughFs`] + [`FuseServer`] + [`FsBackend`] and a new
//! `VhostUserDaemon` with its vring workers), serve it until the front-end
//! goes away, tear it down, and listen again. Nothing is shared between VMs
//! except the [`SharedDevice`] (device model + pool, each behind its own
//! mutex) and the metrics registry, so one VM dying never disturbs another.

use crate::backend::{FsBackend, GuestMem, QueueOptions};
use crate::config::VmSpec;
use crate::dax::{DaxPlane, DaxSession};
use crate::fs::{CacheMode, PassthroughFs};
use crate::fuse::{FuseServer, ServerOptions};
use crate::metrics::Metrics;
use crate::pool::SharedDevice;
use rustix::event::{PollFd, PollFlags};
use std::collections::HashSet;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
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
}

/// State shared by the VM threads and the shutdown path.
pub struct DaemonState {
    /// The device and the pool.
    pub shared: Arc<SharedDevice>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// Session settings.
    pub opts: SessionOptions,
    dax: OnceLock<Arc<DaxPlane>>,
    control: OnceLock<Arc<crate::control::Controller>>,
    shutdown: AtomicBool,
    live: Mutex<Vec<(String, ShutdownHandle)>>,
    sessions: Mutex<Vec<(String, Arc<FsBackend>)>>,
}

impl Drop for DaemonState {
    fn drop(&mut self) {
        self.stop_dax();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a VM could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeVmError {
    /// The socket could not be created.
    #[error("cannot listen on {path}")]
    Listen {
        /// Socket path.
        path: String,
        /// The vhost error.
        #[source]
        source: vhost::vhost_user::Error,
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

impl DaemonState {
    /// Daemon state over a device.
    pub fn new(shared: Arc<SharedDevice>, opts: SessionOptions) -> Arc<Self> {
        Arc::new(DaemonState {
            metrics: Arc::new(Metrics::new(shared.clone())),
            shared,
            opts,
            dax: OnceLock::new(),
            control: OnceLock::new(),
            shutdown: AtomicBool::new(false),
            live: Mutex::new(Vec::new()),
            sessions: Mutex::new(Vec::new()),
        })
    }

    /// Turns the DAX window on: mounts the residency plane at `pool_dir`
    /// (`None`: a fresh directory under `/run/cxlfsd`) for windows of
    /// `window` bytes. Call before [`DaemonState::spawn_vm`]. On failure
    /// (no `/dev/fuse`, no permission to mount, ...) it logs why and the
    /// daemon serves without DAX; returns whether DAX is on.
    pub fn enable_dax(&self, pool_dir: Option<&Path>, window: u64) -> bool {
        if self.dax.get().is_some() {
            return true;
        }
        match DaxPlane::start(pool_dir, self.shared.clone(), window) {
            Ok(d) => {
                tracing::info!(window, plane = ?d, "DAX window on: guests may mount with -o dax");
                self.metrics.attach_plane(d.clone());
                let _ = self.dax.set(d);
                true
            }
            Err(e) => {
                let mut msg = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg.push_str(&format!(": {s}"));
                    src = s.source();
                }
                tracing::warn!(error = %msg, "DAX disabled: the residency plane cannot be mounted; serving without a DAX window");
                false
            }
        }
    }

    /// Lets sessions started from now on take guest cache hints
    /// (`FUSE_IOCTL`) through `control`. Once only.
    pub fn set_control(&self, control: Arc<crate::control::Controller>) {
        let _ = self.control.set(control);
    }

    /// The cache-control executor, once set.
    pub fn control(&self) -> Option<&Arc<crate::control::Controller>> {
        self.control.get()
    }

    /// The DAX window's plane, when DAX is on.
    pub fn dax(&self) -> Option<&Arc<DaxPlane>> {
        self.dax.get()
    }

    /// Unmounts the DAX window's residency plane; call after every VM
    /// thread has ended and before the process exits. Idempotent.
    pub fn stop_dax(&self) {
        if let Some(d) = self.dax.get() {
            d.shutdown();
        }
    }

    /// Changes the share of file pages on the CXL-SSD tier (0..=100 %) at
    /// run time; see [`SharedDevice::set_cxl_ratio`] for how pages move.
    /// Never call it from a residency-plane thread.
    pub fn set_cxl_ratio(
        &self,
        cxl_ratio: u8,
    ) -> Result<crate::pool::RatioChange, crate::placement::SetCxlRatioError> {
        self.shared.set_cxl_ratio(cxl_ratio)
    }

    /// The ratio in force.
    pub fn cxl_ratio(&self) -> u8 {
        self.shared.cxl_ratio()
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

    /// Writes back every dirty page: fsync of open files, syncfs of the share,
    /// and a flush of the device model's dirty cache pages.
    pub fn flush_all(&self) {
        for (_, b) in lock(&self.sessions).iter() {
            b.server().fs().sync_all();
        }
        match rustix::fs::open(
            &self.opts.shared_dir,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .and_then(|fd| rustix::fs::syncfs(&fd))
        {
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %e, "syncfs of the shared directory failed"),
        }
        match self.shared.flush() {
            Ok(done) => tracing::info!(durable_at_ns = done, "device write-back complete"),
            Err(e) => tracing::error!(error = %e, "device flush failed"),
        }
    }

    /// Starts the serving thread of one VM.
    pub fn spawn_vm(self: &Arc<Self>, vm: VmSpec) -> Result<JoinHandle<()>, ServeVmError> {
        let listener = Listener::new(&vm.socket, true).map_err(|source| ServeVmError::Listen {
            path: vm.socket.display().to_string(),
            source,
        })?;
        tracing::info!(vm = %vm.name, socket = %vm.socket.display(), "listening");
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
            let (backend, mut daemon) = session;
            if let Err(e) = daemon.start(&mut listener) {
                tracing::warn!(vm = %vm.name, error = %e, "connection failed");
                backend.close();
                continue;
            }
            metrics.connections.fetch_add(1, Ordering::Relaxed);
            let peer = peer_pid(&fds_before, &vm.socket);
            tracing::info!(vm = %vm.name, vmm_pid = ?peer, "front-end connected");
            let dax_vm = backend.server().dax().map(|d| (d.plane().clone(), d.vm()));
            if let (Some((plane, id)), Some(pid)) = (&dax_vm, peer) {
                plane.register_vmm(*id, pid);
            }
            if let Some(h) = daemon.shutdown_handle() {
                lock(&self.live).push((vm.name.clone(), h.clone()));
                if self.shutting_down() {
                    h.shutdown();
                }
            }
            lock(&self.sessions).push((vm.name.clone(), backend.clone()));
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
            if let Some((plane, id)) = &dax_vm {
                plane.unregister_vmm(*id);
            }
            if let Some(d) = backend.server().dax() {
                // The front-end drops its maps when the back-end goes.
                d.forget_all();
            }
            // Release held replies and stop the pacer before the session goes.
            backend.close();
            backend.server().fs().sync_all();
            lock(&self.sessions).retain(|(n, _)| n != &vm.name);
            drop(daemon);
        }
        tracing::info!(vm = %vm.name, "stopped listening");
    }

    #[allow(clippy::type_complexity)]
    fn new_session(
        &self,
        vm: &VmSpec,
    ) -> Result<(Arc<FsBackend>, VhostUserDaemon<Arc<FsBackend>>), Box<dyn std::error::Error>> {
        let fs = PassthroughFs::new(&self.opts.shared_dir, self.opts.cache, self.shared.clone())?;
        let vm_metrics = self.metrics.vm(&vm.name);
        let dax = self.dax.get().map(|d| {
            let session = Arc::new(DaxSession::new(d.clone(), vm_metrics.clone()));
            d.register_session(&session);
            session
        });
        let server = Arc::new(
            FuseServer::new(fs, self.shared.clone(), vm_metrics, self.opts.server)
                .with_dax(dax)
                .with_control(self.control.get().cloned()),
        );
        let mem: GuestMem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let backend = Arc::new(FsBackend::new(
            server,
            self.shared.clone(),
            mem.clone(),
            self.opts.queues,
        )?);
        let daemon = VhostUserDaemon::new(format!("cxlfsd-{}", vm.name), backend.clone(), mem)
            .map_err(|e| format!("vhost-user daemon: {e}"))?;
        Ok((backend, daemon))
    }
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

/// The pid of the process at the other end of the connection just
/// accepted on `socket` (`SO_PEERCRED`): vhost-user-backend accepts
/// internally, so the new connection is found among the socket fds that
/// were not open before, as the one bound to `socket` with a peer.
fn peer_pid(before: &HashSet<i32>, socket: &Path) -> Option<u32> {
    use std::os::unix::ffi::OsStrExt;
    let want = socket.as_os_str().as_bytes();
    let mut found = None;
    for fd in socket_fds().difference(before) {
        // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        // SAFETY: `addr`/`len` are valid for writes of `len` bytes; a stale
        // fd number only makes the call fail.
        let rc = unsafe { libc::getsockname(*fd, std::ptr::addr_of_mut!(addr).cast(), &mut len) };
        if rc != 0 || i32::from(addr.sun_family) != libc::AF_UNIX {
            continue;
        }
        let path_len = (len as usize)
            .saturating_sub(std::mem::size_of::<libc::sa_family_t>())
            .min(addr.sun_path.len());
        let path: Vec<u8> = addr.sun_path[..path_len]
            .iter()
            .map(|&c| c as u8)
            .take_while(|&c| c != 0)
            .collect();
        if path != want {
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
