//! The notifier: the one thread that writes a plane's `NOTIFY_STORE` and
//! `NOTIFY_INVAL_INODE` messages, in the order they were queued.
//!
//! It takes what is queued in batches. Before it invalidates any range of
//! a batch it starts the write-back of every range the batch invalidates
//! (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): the kernel sends their
//! dirty pages as background `FUSE_WRITE`s that the request threads answer
//! side by side, and each invalidation then waits only for its own pages'
//! write-back, already under way. Invalidated one by one, a dirty page is
//! laundered synchronously instead — one whole `FUSE_WRITE` round trip per
//! evicted page, on this one thread — and evictions fall behind the traps
//! that cause them: the device model has dropped pages the guest still
//! reaches without a trap (a hit the model never sees), and a guest that
//! touches a page while it is being laundered waits for the launder.

use super::notifier_cpus::{current_cpu, NotifierCpus};
use super::server::Server;
use super::{CALIB_NODEID, POOL_NODEID};
use crate::PAGE_SIZE;
use fuse_abi as abi;
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::os::fd::AsRawFd;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::time::{Duration, Instant};

/// A notification the notifier writes.
pub(super) enum NoticeKind {
    Store {
        offset: u64,
        data: Vec<u8>,
    },
    Inval {
        offset: u64,
        len: u64,
    },
    /// Invalidate, then read the range ahead so the plane refuses it: the
    /// pages stay as tombstones (see `readahead.rs`).
    Retire {
        offset: u64,
        len: u64,
    },
    /// Drop the calibration file's page (and its mappings).
    InvalCalib,
}

impl NoticeKind {
    /// The pool range it drops (an eviction: `Inval`, `Retire`); `None`
    /// for a store or a calibration probe.
    fn evicted_range(&self) -> Option<(u64, u64)> {
        match *self {
            NoticeKind::Inval { offset, len } | NoticeKind::Retire { offset, len } => {
                Some((offset, len))
            }
            NoticeKind::Store { .. } | NoticeKind::InvalCalib => None,
        }
    }

    /// The pool pages it drops (0 for a store or a calibration probe):
    /// what it adds to the eviction backlog while queued.
    pub(super) fn evicted_pages(&self) -> u64 {
        self.evicted_range()
            .map_or(0, |(_, len)| len.div_ceil(PAGE_SIZE))
    }
}

/// A notification queued for the notifier, and where its result goes
/// (how long the write took, or why the kernel refused it).
pub(super) struct Notice {
    pub(super) kind: NoticeKind,
    pub(super) done: SyncSender<Result<Duration, io::Error>>,
    /// When it was queued.
    pub(super) queued: Instant,
    /// The CPU it was queued on (a polling notifier keeps off it).
    pub(super) cpu: Option<usize>,
}

impl Notice {
    /// `kind`, queued now; its result goes to `done`.
    pub(super) fn new(kind: NoticeKind, done: SyncSender<Result<Duration, io::Error>>) -> Self {
        Notice {
            kind,
            done,
            queued: Instant::now(),
            cpu: current_cpu(),
        }
    }
}

/// Most notifications taken in one batch (their write-backs are started
/// together).
const MAX_BATCH: usize = 256;

/// The notifier: writes each queued notification, counts it, and reports
/// its result; after a batch with an eviction, polls its queue for `poll`
/// (yielding the CPU) before it sleeps, on CPUs other than those the
/// batch's evictions came from ([`NotifierCpus`]); ends when every sender
/// is gone.
pub(super) fn notifier(server: &Server, dev: &File, rx: Receiver<Notice>, poll: Duration) {
    let mut head = Vec::with_capacity(64);
    let mut batch = Vec::with_capacity(MAX_BATCH);
    // Poll only while evictions flow: after a batch of stores or
    // calibration probes alone, the next notice is not due soon, and
    // polling would only take the CPU from the rest of the daemon.
    let mut evicting = false;
    let mut cpus = NotifierCpus::of_this_thread();
    let mut senders = Vec::new();
    while next_batch(
        &rx,
        if evicting { poll } else { Duration::ZERO },
        &mut batch,
    ) {
        evicting = batch.iter().any(|n| n.kind.evicted_range().is_some());
        if !poll.is_zero() {
            senders.extend(
                batch
                    .iter()
                    .filter(|n| n.kind.evicted_range().is_some())
                    .filter_map(|n| n.cpu),
            );
            cpus.place(evicting, &mut senders);
            senders.clear();
        }
        start_write_back(server, &batch);
        for n in batch.drain(..) {
            let res = write_notice(server, dev, &mut head, &n);
            server.backlog.done(n.kind.evicted_pages());
            let _ = n.done.send(res);
        }
    }
}

/// Fills `batch` with the next notification (polled for `poll`, yielding,
/// then waited for) and whatever else is queued, up to [`MAX_BATCH`];
/// `false` once every sender is gone.
fn next_batch(rx: &Receiver<Notice>, poll: Duration, batch: &mut Vec<Notice>) -> bool {
    let until = Instant::now() + poll;
    let first = loop {
        match rx.try_recv() {
            Ok(n) => break n,
            Err(mpsc::TryRecvError::Disconnected) => return false,
            Err(mpsc::TryRecvError::Empty) if Instant::now() < until => std::thread::yield_now(),
            Err(mpsc::TryRecvError::Empty) => match rx.recv() {
                Ok(n) => break n,
                Err(_) => return false,
            },
        }
    };
    batch.push(first);
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(n) => batch.push(n),
            Err(_) => break,
        }
    }
    true
}

/// Starts the write-back of every pool range `batch` invalidates, without
/// waiting for it. Clean ranges cost a lookup; a failure only leaves the
/// invalidation to launder its dirty pages itself.
fn start_write_back(server: &Server, batch: &[Notice]) {
    if !batch.iter().any(|n| n.kind.evicted_range().is_some()) {
        return;
    }
    let Some(file) = pool_file(server) else {
        return;
    };
    for (offset, len) in batch.iter().filter_map(|n| n.kind.evicted_range()) {
        let (Ok(off), Ok(n)) = (
            libc::off64_t::try_from(offset),
            libc::off64_t::try_from(len),
        ) else {
            continue;
        };
        // SAFETY: a plain system call on an fd the server holds; no pointers.
        let rc =
            unsafe { libc::sync_file_range(file.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE) };
        if rc != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), offset, len, "cannot start a write-back ahead of an invalidation");
        }
    }
}

/// Writes one notification and counts it; how long the kernel took, or
/// why it refused.
fn write_notice(
    server: &Server,
    dev: &File,
    head: &mut Vec<u8>,
    notice: &Notice,
) -> Result<Duration, io::Error> {
    let kind = &notice.kind;
    head.clear();
    let start = Instant::now();
    let res = match kind {
        NoticeKind::Store { offset, data } => send_store(dev, head, *offset, data),
        NoticeKind::Inval { offset, len } | NoticeKind::Retire { offset, len } => {
            abi::encode_notify_inval_inode(POOL_NODEID, *offset as i64, *len as i64, head);
            (&*dev).write(head).map(|_| ())
        }
        NoticeKind::InvalCalib => {
            abi::encode_notify_inval_inode(CALIB_NODEID, 0, PAGE_SIZE as i64, head);
            (&*dev).write(head).map(|_| ())
        }
    };
    let took = start.elapsed();
    if let Err(e) = res {
        server.metrics.notify_error();
        tracing::warn!(error = %e, "pool notification refused");
        return Err(e);
    }
    if let NoticeKind::Store { offset, data } = kind {
        server.metrics.store(*offset, data.len() as u64);
    }
    if let Some((offset, len)) = kind.evicted_range() {
        // The kernel dropped those folios: holes again.
        if let Some(r) = &server.readahead {
            r.forget(offset, len);
        }
        let lag_ns = u64::try_from(notice.queued.elapsed().as_nanos()).unwrap_or(u64::MAX);
        server.metrics.invalidation(offset, len, lag_ns);
        if matches!(kind, NoticeKind::Retire { .. }) {
            retire(server, offset, len);
        }
    }
    Ok(took)
}

/// Writes one `NOTIFY_STORE` of `data` at `offset` (header in `head`, data
/// as a second `writev` segment).
fn send_store(dev: &File, head: &mut Vec<u8>, offset: u64, data: &[u8]) -> io::Result<()> {
    let size = u32::try_from(data.len()).map_err(io::Error::other)?;
    abi::encode_notify_store(POOL_NODEID, offset, size, head).map_err(io::Error::other)?;
    let want = head.len() + data.len();
    let w = (&*dev).write_vectored(&[IoSlice::new(head), IoSlice::new(data)])?;
    if w == want {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "short notify write {w} of {want}"
        )))
    }
}

/// Has the kernel read `[offset, offset + len)` of the pool ahead, which
/// the plane refuses (the pages were just forgotten): they become
/// tombstones at once, off any fault's path, and the next touch of one
/// reads just its folio. Asynchronous in the kernel (the READs are
/// answered by request threads, never by this one); a failure only costs
/// the next fault a refused READ.
fn retire(server: &Server, offset: u64, len: u64) {
    let Some(file) = pool_file(server) else {
        return;
    };
    // SAFETY: a plain system call on an fd the server holds; no pointers.
    let rc = unsafe { libc::readahead(file.as_raw_fd(), offset as libc::off64_t, len as usize) };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), offset, len, "cannot read retired pages ahead");
    }
}

/// The pool file, while the plane holds it open.
fn pool_file(server: &Server) -> Option<std::sync::Arc<File>> {
    server.pool_file.get().and_then(std::sync::Weak::upgrade)
}
