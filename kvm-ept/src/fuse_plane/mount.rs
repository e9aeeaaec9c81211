//! Mounting a plane: [`FusePoolPlane::mount`] and
//! [`FusePoolPlane::mount_split`], and the steps of a mount in their
//! order — the transport plan, `/dev/fuse` and `mount(2)`, the server, the
//! pacer and notifier, the request threads (or a split plane's helper and
//! its receivers), the ring, the exit guard, the pool file, the
//! calibrator, and the detach.

use super::calibrate::start_calibrator;
use super::mounted::{Mounted, ReaderSpawner};
use super::notifier::{notifier, Notice};
use super::server::Server;
use super::workers::{forwarded, pacer, Held};
use super::{
    lock, owner, transport, FusePoolPlane, MountPlaneError, PlaneOptions, ReaderMode, Transport,
    CALIB_NAME, POOL_NAME,
};
use crate::helper_link::HelperCommand;
use crate::pace::Compensation;
use crate::{MapTarget, PoolBackend, PAGE_SIZE};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

impl FusePoolPlane {
    /// Mounts a pool of `size` bytes at `mountpoint` (an existing directory)
    /// served by `backend`. Needs `CAP_SYS_ADMIN` and `/dev/fuse`.
    pub fn mount(
        mountpoint: &Path,
        size: u64,
        backend: Arc<dyn PoolBackend>,
        options: PlaneOptions,
    ) -> Result<Self, MountPlaneError> {
        match Self::start(mountpoint, size, backend.clone(), options, None) {
            // The kernel granted the ring but it could not be started: that
            // connection would hold every request, so it was closed; a
            // `/dev/fuse` mount takes its place.
            Err(MountPlaneError::Ring(e)) if options.transport == Transport::Auto => {
                tracing::warn!(error = %e, "FUSE over io_uring did not start; the pool is mounted on /dev/fuse");
                let options = PlaneOptions {
                    transport: Transport::DevFuse,
                    ..options
                };
                Self::start(mountpoint, size, backend, options, None)
            }
            r => r,
        }
    }

    /// Mounts a pool whose requests a helper process reads (see
    /// the module `split`): for a pool this process maps itself. Write-backs
    /// are stored in `store` by the helper (and charged here afterwards
    /// through [`PoolBackend::on_stored_writeback`]); misses come back here
    /// and are answered as in [`FusePoolPlane::mount`]. `options.readers`
    /// and `options.mode` are not used.
    pub fn mount_split(
        mountpoint: &Path,
        size: u64,
        backend: Arc<dyn PoolBackend>,
        options: PlaneOptions,
        store: &File,
        helper: &HelperCommand,
    ) -> Result<Self, MountPlaneError> {
        Self::start(mountpoint, size, backend, options, Some((store, helper)))
    }

    /// Mounts the pool and starts everything that serves it, step by step;
    /// `split`: the helper's store and command (see
    /// [`FusePoolPlane::mount_split`]).
    fn start(
        mountpoint: &Path,
        size: u64,
        backend: Arc<dyn PoolBackend>,
        options: PlaneOptions,
        split: Option<(&File, &HelperCommand)>,
    ) -> Result<Self, MountPlaneError> {
        if size == 0 || size % PAGE_SIZE != 0 {
            return Err(MountPlaneError::BadSize(size));
        }
        let plan_uring = transport::plan_uring(options.transport, split.is_some())?;
        let dev = open_device()?;
        mount_fuse(mountpoint, &dev)?;
        // A split plane's helper reads the same open file, blocking; its
        // own INIT offers the ring, and it starts the ring itself.
        let local_uring = plan_uring && split.is_none();
        if split.is_none() && (options.mode == ReaderMode::Spin || plan_uring) {
            // Spinning readers, or readers that poll beside a wake eventfd.
            set_nonblocking(&dev);
        }
        let server = Arc::new(new_server(
            backend,
            size,
            &options,
            local_uring,
            split.is_some(),
        )?);
        let wake = if local_uring {
            Some(Arc::new(
                crate::uring::new_eventfd().map_err(MountPlaneError::Spawn)?,
            ))
        } else {
            None
        };
        let mut m = Mounted::new(
            server.clone(),
            dev.clone(),
            mountpoint,
            options.mode,
            wake.clone(),
        );
        let (pace_tx, pace_rx) = mpsc::channel::<Held>();
        let (notify_tx, notify_rx) = mpsc::channel::<Notice>();
        m.notify_tx = Some(notify_tx);
        start_pacer_and_notifier(&mut m, &dev, pace_rx, notify_rx, options.notifier_poll)?;
        match split {
            Some((store, cmd)) => {
                start_receivers(&mut m, &dev, (store, cmd), size, plan_uring, pace_tx)?
            }
            None => start_readers(&m, &dev, pace_tx, &options, plan_uring, wake)?,
        }
        if local_uring {
            m.ring = transport::start_ring(&server, &dev, &options)?.map(std::sync::Mutex::new);
        }
        m.root = Some(open_root(mountpoint)?);
        // After the request threads are up: finding the connection stats the
        // mountpoint, which this server must answer.
        m._exit_guard = start_exit_guard(mountpoint);
        let path = mountpoint.join(POOL_NAME);
        let file = Arc::new(open_pool(&path)?);
        let _ = server.pool_file.set(Arc::downgrade(&file));
        if options.compensation == Compensation::Auto {
            m.calibrator = start_calibration(&m, mountpoint);
        }
        if options.detach {
            m.detach().map_err(|source| MountPlaneError::Detach {
                path: mountpoint.to_path_buf(),
                source,
            })?;
        }
        tracing::info!(
            mountpoint = %mountpoint.display(),
            size,
            detached = options.detach,
            compensation = %options.compensation,
            transport = ?m.ring.as_ref().map(|r| lock(r).config()),
            floor_ns = server.metrics.floor.current_ns(),
            "pool plane mounted"
        );
        Ok(FusePoolPlane {
            target: MapTarget { path, file, size },
            m,
        })
    }
}

/// Opens `/dev/fuse`: a new connection.
fn open_device() -> Result<Arc<File>, MountPlaneError> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .map_err(MountPlaneError::OpenDevice)?;
    Ok(Arc::new(dev))
}

/// Mounts the connection `dev` at `mountpoint`, owned by this process's
/// user only.
fn mount_fuse(mountpoint: &Path, dev: &File) -> Result<(), MountPlaneError> {
    let mount_err = |source| MountPlaneError::Mount {
        path: mountpoint.to_path_buf(),
        source,
    };
    // No `allow_other`: no other host user may even look up the pool.
    // `default_permissions`: the kernel checks the owner-only modes.
    let (uid, gid) = owner();
    let data = format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid},default_permissions",
        dev.as_raw_fd()
    );
    let target = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|e| mount_err(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    let data = CString::new(data).map_err(|e| mount_err(io::Error::other(e)))?;
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"cxlfs-pool".as_ptr(),
            target.as_ptr(),
            c"fuse".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(mount_err(io::Error::last_os_error()));
    }
    Ok(())
}

/// Makes `dev` non-blocking (logged if it cannot be).
fn set_nonblocking(dev: &File) {
    // SAFETY: fcntl on an fd we own; no pointers.
    let rc = unsafe { libc::fcntl(dev.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    if rc != 0 {
        tracing::warn!(error = %io::Error::last_os_error(), "cannot make /dev/fuse non-blocking");
    }
}

/// The server for a pool of `size` bytes, set up as `options` say;
/// `offer_uring`: its INIT offers FUSE over io_uring; `split`: a helper
/// reads the requests (and refuses readahead on the shared map).
fn new_server(
    backend: Arc<dyn PoolBackend>,
    size: u64,
    options: &PlaneOptions,
    offer_uring: bool,
    split: bool,
) -> Result<Server, MountPlaneError> {
    let mut server = Server::new(backend, size)
        .compensating(options.compensation)
        .bounding_eviction_backlog(options.eviction_backlog_pages);
    if options.refuse_readahead {
        server = server
            .refusing_readahead(!split)
            .map_err(MountPlaneError::ReadaheadMap)?;
    }
    if offer_uring {
        server = server.offering_uring();
    }
    Ok(server)
}

/// Starts a named plane thread.
fn spawn_thread(
    name: String,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, MountPlaneError> {
    thread::Builder::new()
        .name(name)
        .spawn(f)
        .map_err(MountPlaneError::Spawn)
}

/// Starts the pacer (held replies from `pace_rx`) and the notifier
/// (notifications from `notify_rx`; `poll`: see
/// [`PlaneOptions::notifier_poll`]).
fn start_pacer_and_notifier(
    m: &mut Mounted,
    dev: &Arc<File>,
    pace_rx: Receiver<Held>,
    notify_rx: Receiver<Notice>,
    poll: std::time::Duration,
) -> Result<(), MountPlaneError> {
    {
        let (s, d) = (m.server.clone(), dev.clone());
        m.threads.pacer = Some(spawn_thread("pool-pacer".into(), move || {
            pacer(&s, &d, pace_rx)
        })?);
    }
    {
        let (s, d) = (m.server.clone(), dev.clone());
        m.threads.notifier = Some(spawn_thread("pool-notify".into(), move || {
            notifier(&s, &d, notify_rx, poll)
        })?);
    }
    Ok(())
}

/// A split plane: starts the helper process that reads `/dev/fuse` (its
/// write-backs go to `store`; `ring`: its INIT offers FUSE over io_uring),
/// and the threads that take the misses it forwards.
fn start_receivers(
    m: &mut Mounted,
    dev: &Arc<File>,
    (store, cmd): (&File, &HelperCommand),
    size: u64,
    ring: bool,
    pace_tx: Sender<Held>,
) -> Result<(), MountPlaneError> {
    let refusals = m.server.readahead.as_ref().map(|r| r.file());
    let helper = crate::helper_link::Helper::spawn(cmd, dev, store, refusals, size, ring)?;
    let socks = helper.socks.clone();
    m.helper = Some(helper);
    // From mountinfo: finding it asks the helper nothing (a helper that
    // died at its start cannot hang the mount).
    let abort = crate::exit_guard::fusectl_abort_path(&m.mountpoint).ok();
    // One receiver per socket, pinned to that socket's CPU (see `split`).
    for (cpu, k) in socks.into_iter().enumerate() {
        let (s, d, tx) = (m.server.clone(), dev.clone(), pace_tx.clone());
        let abort = abort.clone();
        let h = spawn_thread(format!("pool-fwd{cpu}"), move || {
            crate::uring::pin_to(cpu);
            forwarded(&s, &d, &k, tx, abort.as_deref())
        })?;
        lock(&m.threads.readers).push(h);
    }
    Ok(())
}

/// Starts the `/dev/fuse` request threads (beside a ring, one) and keeps
/// the way to start more as VMs register.
fn start_readers(
    m: &Mounted,
    dev: &Arc<File>,
    pace_tx: Sender<Held>,
    options: &PlaneOptions,
    plan_uring: bool,
    wake: Option<Arc<File>>,
) -> Result<(), MountPlaneError> {
    let spawner = ReaderSpawner {
        server: m.server.clone(),
        dev: dev.clone(),
        pacer: pace_tx,
        // Beside a ring, one reader that sleeps in poll(2): it
        // takes what comes before the ring is ready, then FORGET
        // and INTERRUPT.
        mode: if plan_uring {
            ReaderMode::Block
        } else {
            options.mode
        },
        wake,
        base: options.readers.max(1),
        vms: std::collections::HashSet::new(),
    };
    let initial = if plan_uring { 1 } else { spawner.base };
    for i in 0..initial {
        let h = spawner.spawn(i)?;
        lock(&m.threads.readers).push(h);
    }
    *lock(&m.spawner) = Some(spawner);
    Ok(())
}

/// The mount's root, `O_PATH`: reaches the connection after a lazy unmount.
fn open_root(mountpoint: &Path) -> Result<File, MountPlaneError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(mountpoint)
        .map_err(|source| MountPlaneError::OpenPool {
            path: mountpoint.to_path_buf(),
            source,
        })
}

/// The guard that aborts the connection if this process dies without
/// unmounting (`None`, logged, if it cannot start).
fn start_exit_guard(mountpoint: &Path) -> Option<crate::exit_guard::ExitGuard> {
    match crate::exit_guard::ExitGuard::start(mountpoint) {
        Ok(g) => Some(g),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "no exit guard for the pool: if this process is killed mid-eviction it may hang in the kernel"
            );
            None
        }
    }
}

/// Opens the pool file read-write: the descriptor VMMs map.
fn open_pool(path: &Path) -> Result<File, MountPlaneError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| MountPlaneError::OpenPool {
            path: path.to_path_buf(),
            source,
        })
}

/// Opens the calibration file and starts the calibrator on it (`None`,
/// logged: misses are not compensated).
fn start_calibration(m: &Mounted, mountpoint: &Path) -> Option<(Sender<()>, JoinHandle<()>)> {
    // Opened before a detach: afterwards no path reaches it.
    let calib = mountpoint.join(CALIB_NAME);
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&calib)
    {
        Ok(f) => m
            .notify_tx
            .clone()
            .and_then(|notify| start_calibrator(&m.server, notify, f)),
        Err(e) => {
            tracing::warn!(
                error = %e,
                path = %calib.display(),
                "cannot open the calibration file: misses are not compensated"
            );
            None
        }
    }
}
