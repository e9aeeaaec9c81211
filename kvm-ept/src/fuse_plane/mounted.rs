//! The live mount and its threads ([`Mounted`]): what a plane holds while
//! it is up, the way one more request thread is started, and the shutdown
//! that stops every thread in an order the kernel cannot deadlock on.

use super::notifier::Notice;
use super::server::Server;
use super::workers::{reader, Held};
use super::{lock, MountPlaneError, ReaderMode};
use crate::vm::VmId;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

/// The plane's threads that shutdown joins.
pub(super) struct Threads {
    /// Request threads (or a split plane's receivers of forwarded misses).
    pub(super) readers: std::sync::Mutex<Vec<JoinHandle<()>>>,
    pub(super) pacer: Option<JoinHandle<()>>,
    pub(super) notifier: Option<JoinHandle<()>>,
}

/// What it takes to start one more request thread (gone at shutdown).
pub(super) struct ReaderSpawner {
    pub(super) server: Arc<Server>,
    pub(super) dev: Arc<File>,
    pub(super) pacer: Sender<Held>,
    pub(super) mode: ReaderMode,
    /// With FUSE over io_uring: readers poll `/dev/fuse` and this eventfd,
    /// which ends them (nothing else reaches a reader once the ring takes
    /// the requests).
    pub(super) wake: Option<Arc<File>>,
    /// Threads to keep at least.
    pub(super) base: usize,
    /// VMs ever registered.
    pub(super) vms: std::collections::HashSet<VmId>,
}

impl ReaderSpawner {
    /// Starts request thread `i`.
    pub(super) fn spawn(&self, i: usize) -> Result<JoinHandle<()>, MountPlaneError> {
        let (s, d, tx) = (self.server.clone(), self.dev.clone(), self.pacer.clone());
        let mode = self.mode;
        let wake = self.wake.clone();
        self.server.alive.fetch_add(1, Ordering::AcqRel);
        thread::Builder::new()
            .name(format!("pool-req{i}"))
            .spawn(move || reader(&s, &d, tx, mode, wake.as_deref()))
            .map_err(|e| {
                self.server.alive.fetch_sub(1, Ordering::AcqRel);
                MountPlaneError::Spawn(e)
            })
    }
}

/// The mount and its threads; dropping it unmounts and joins them.
pub(super) struct Mounted {
    pub(super) server: Arc<Server>,
    /// Keeps `/dev/fuse` open until the threads are gone (closing it aborts
    /// the connection).
    _dev: Arc<File>,
    pub(super) mountpoint: PathBuf,
    mode: ReaderMode,
    pub(super) notify_tx: Option<Sender<Notice>>,
    pub(super) threads: Threads,
    pub(super) spawner: std::sync::Mutex<Option<ReaderSpawner>>,
    /// The mount's root (`O_PATH`): reaches the connection after a lazy
    /// unmount, to wake request threads at shutdown.
    pub(super) root: Option<File>,
    mounted: bool,
    /// Aborts the connection if this process dies without unmounting;
    /// dropped last, after a clean unmount.
    pub(super) _exit_guard: Option<crate::exit_guard::ExitGuard>,
    /// Split planes: the helper process that reads the requests.
    pub(super) helper: Option<crate::helper_link::Helper>,
    /// Compensation `auto`: the calibration thread and the way to stop it.
    pub(super) calibrator: Option<(Sender<()>, JoinHandle<()>)>,
    /// FUSE over io_uring: the eventfd that ends the `/dev/fuse` readers.
    wake: Option<Arc<File>>,
    /// FUSE over io_uring: the ring workers. Last, so that their buffers
    /// are freed only after `/dev/fuse` is closed.
    pub(super) ring: Option<std::sync::Mutex<crate::uring::RingSet>>,
}

/// The calling thread's id.
fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

impl Mounted {
    /// A mount at `mountpoint` served by `server` on `dev`, with no thread
    /// started yet.
    pub(super) fn new(
        server: Arc<Server>,
        dev: Arc<File>,
        mountpoint: &Path,
        mode: ReaderMode,
        wake: Option<Arc<File>>,
    ) -> Self {
        Mounted {
            server,
            _dev: dev,
            mountpoint: mountpoint.to_path_buf(),
            mode,
            notify_tx: None,
            threads: Threads {
                readers: std::sync::Mutex::new(Vec::new()),
                pacer: None,
                notifier: None,
            },
            spawner: std::sync::Mutex::new(None),
            root: None,
            mounted: true,
            _exit_guard: None,
            helper: None,
            calibrator: None,
            wake,
            ring: None,
        }
    }

    /// Lazily unmounts the pool (once): path lookups end, the descriptors
    /// keep the connection.
    pub(super) fn detach(&mut self) -> io::Result<()> {
        if !self.mounted {
            return Ok(());
        }
        let p = CString::new(self.mountpoint.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) } != 0 {
            return Err(io::Error::last_os_error());
        }
        self.mounted = false;
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // 0. The calibrator first: it touches a file of this mount and
        //    queues notifications.
        if let Some((stop, h)) = self.calibrator.take() {
            drop(stop);
            let _ = h.join();
        }
        // 0b. No new request threads; the pacer ends once the readers have.
        lock(&self.spawner).take();
        // 1. No more notifications; let queued ones finish (they may wait
        //    for write-backs the request threads answer).
        self.notify_tx = None;
        if let Some(h) = self.threads.notifier.take() {
            let _ = h.join();
        }
        // 2. Lazy unmount: no new path lookups; the root fd keeps the
        //    connection reachable.
        if let Err(e) = self.detach() {
            tracing::warn!(error = %e, "cannot unmount the pool");
        }
        // 2b. A split plane: end the helper (it answered the write-backs
        //     of step 1); the threads that take its messages then end.
        if let Some(h) = self.helper.as_mut() {
            self.server.stop.store(true, Ordering::Release);
            h.stop();
        }
        // 3. Stop the request threads: a GETATTR of the root from this
        //    thread ends the one that answers it (blocking readers have no
        //    other way to leave read(2)); spinning ones see the flag.
        self.server.stop_tid.store(gettid(), Ordering::Release);
        self.server.stop.store(true, Ordering::Release);
        // The ring's workers stop on their eventfd; its buffers stay until
        // the connection is closed (the `ring` field drops last).
        if let Some(r) = &self.ring {
            lock(r).stop();
        }
        if let Some(w) = &self.wake {
            if let Err(e) = (&**w).write(&1u64.to_ne_bytes()) {
                tracing::warn!(error = %e, "cannot wake the pool's /dev/fuse readers");
            }
        } else if self.mode == ReaderMode::Block {
            if let Some(root) = &self.root {
                while self.server.alive.load(Ordering::Acquire) > 0 {
                    // SAFETY: `st` is a valid out buffer; the path is a valid empty C string.
                    let rc = unsafe {
                        let mut st: libc::statx = std::mem::zeroed();
                        libc::statx(
                            root.as_raw_fd(),
                            c"".as_ptr(),
                            libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
                            libc::STATX_BASIC_STATS,
                            &mut st,
                        )
                    };
                    if rc != 0 {
                        break;
                    }
                }
            }
        }
        self.root = None;
        let readers = std::mem::take(&mut *lock(&self.threads.readers));
        if self.server.alive.load(Ordering::Acquire) > 0 {
            // Could not reach them (connection already gone?): they end on
            // ENODEV; don't block on them.
            tracing::warn!("pool request threads still running at shutdown; detaching them");
        } else {
            for h in readers {
                let _ = h.join();
            }
        }
        if let Some(h) = self.threads.pacer.take() {
            let _ = h.join();
        }
        tracing::info!(mountpoint = %self.mountpoint.display(), "pool plane unmounted");
    }
}
