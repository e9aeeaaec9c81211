//! The calibrator: a thread that measures the trap path's own cost (fault
//! → request, reply → mapped) on the calibration file's one page, at start
//! and a few times a second, and records it in the plane's floor.

use super::notifier::{Notice, NoticeKind};
use super::server::Server;
use crate::PAGE_SIZE;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Probes at start (after [`CALIB_WARMUP`] discarded ones).
const CALIB_START_PROBES: usize = 64;
/// Probes discarded at start (cold caches, first thread wake-ups).
const CALIB_WARMUP: usize = 8;
/// Probes every [`CALIB_PERIOD`] afterwards: sixteen a second, each a
/// trap's worth of work on two threads and 20 µs of spinning (well under
/// 0.1 % of a core), so the estimate follows the host's load within
/// seconds.
const CALIB_PERIODIC_PROBES: usize = 4;
/// How often the periodic probes run.
const CALIB_PERIOD: Duration = Duration::from_millis(250);
/// How long a probe runs before it touches the page.
const CALIB_RUN_NS: u64 = 20_000;
/// How long a mount waits for the first estimate.
const CALIB_START_TIMEOUT: Duration = Duration::from_secs(2);

/// Starts the calibration thread on `file` (the calibration file, open),
/// which drops the page through `notify` (the notifier's queue), and waits
/// for its first estimate (at most [`CALIB_START_TIMEOUT`]). `None`
/// (logged) if it cannot start: misses are then not compensated.
pub(super) fn start_calibrator(
    server: &Arc<Server>,
    notify: Sender<Notice>,
    file: File,
) -> Option<(Sender<()>, JoinHandle<()>)> {
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::sync_channel::<()>(1);
    let s = server.clone();
    let h = thread::Builder::new()
        .name("pool-calibrate".into())
        .spawn(move || calibrator(&s, &file, &notify, &stop_rx, &ready_tx));
    match h {
        Ok(h) => {
            if ready_rx.recv_timeout(CALIB_START_TIMEOUT).is_err() {
                tracing::warn!(
                    "no trap-path floor measured in time; misses are compensated once it is"
                );
            }
            Some((stop_tx, h))
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the calibration thread: misses are not compensated");
            None
        }
    }
}

/// A read-only shared mapping of the calibration file's page.
struct CalibMap(*const u8);

impl CalibMap {
    fn new(file: &File) -> io::Result<Self> {
        // SAFETY: a fresh read-only shared mapping of one page of an open
        // file; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE_SIZE as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(CalibMap(p.cast()))
    }

    /// Touches the page (a trap when it was dropped).
    fn touch(&self) -> u8 {
        // SAFETY: the first byte of a live one-page mapping; the file is a
        // page long, so the read is never past its end.
        unsafe { self.0.read_volatile() }
    }
}

impl Drop for CalibMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the page `new` mapped.
        unsafe { libc::munmap(self.0.cast_mut().cast(), PAGE_SIZE as usize) };
    }
}

/// One probe: drops the calibration page (the plane's own invalidation,
/// through the notifier), touches it, and returns the trap path's floor
/// `(request - touch) + (mapped - reply)`, or `None` if the touch did not
/// trap exactly once or the notifier is gone.
fn probe(server: &Server, map: &CalibMap, notify: &Sender<Notice>) -> Option<u64> {
    let (done, rx) = mpsc::sync_channel(1);
    notify
        .send(Notice::new(NoticeKind::InvalCalib, done))
        .ok()?;
    rx.recv().ok()?.ok()?;
    // Run a little first, as a toucher (a vCPU) is running when it
    // faults: the wake-up from the notifier's answer is not part of a trap.
    let warm = server.backend.now_ns() + CALIB_RUN_NS;
    while server.backend.now_ns() < warm {
        std::hint::spin_loop();
    }
    let before = server.calib.reads.load(Ordering::Acquire);
    let t0 = server.backend.now_ns();
    std::hint::black_box(map.touch());
    let t1 = server.backend.now_ns();
    if server.calib.reads.load(Ordering::Acquire) != before + 1 {
        return None;
    }
    let req = server.calib.request_ns.load(Ordering::Relaxed);
    let rep = server.calib.reply_ns.load(Ordering::Relaxed);
    (t0 <= req && req <= rep && rep <= t1).then(|| (req - t0) + (t1 - rep))
}

/// The calibration thread: [`CALIB_START_PROBES`] probes at start (then
/// `ready`), then [`CALIB_PERIODIC_PROBES`] every [`CALIB_PERIOD`] until
/// `stop` closes; each batch goes into the plane's floor.
fn calibrator(
    server: &Server,
    file: &File,
    notify: &Sender<Notice>,
    stop: &Receiver<()>,
    ready: &SyncSender<()>,
) {
    let map = match CalibMap::new(file) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "cannot map the calibration file: misses are not compensated");
            return;
        }
    };
    let mut batch = Vec::with_capacity(CALIB_START_PROBES);
    for i in 0..CALIB_WARMUP + CALIB_START_PROBES {
        if let Some(ns) = probe(server, &map, notify) {
            if i >= CALIB_WARMUP {
                batch.push(ns);
            }
        }
    }
    server.metrics.floor.record(&batch);
    tracing::info!(
        floor_ns = server.metrics.floor.current_ns(),
        probes = batch.len(),
        "trap-path floor calibrated"
    );
    let _ = ready.try_send(());
    loop {
        match stop.recv_timeout(CALIB_PERIOD) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        batch.clear();
        for _ in 0..CALIB_PERIODIC_PROBES {
            if let Some(ns) = probe(server, &map, notify) {
                batch.push(ns);
            }
        }
        server.metrics.floor.record(&batch);
    }
}
