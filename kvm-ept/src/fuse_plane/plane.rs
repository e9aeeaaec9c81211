//! [`FusePoolPlane`]: what a mounted plane is, what it tells about itself,
//! and the [`ResidencyPlane`] the daemon drives (fills, evictions and
//! syncs queued to the notifier; VMs registered for attribution).

use super::mounted::Mounted;
use super::notifier::{Notice, NoticeKind};
use super::workers::on_request_thread;
use super::{lock, ActiveTransport, ReaderMode, MAX_READERS};
use crate::metrics::PlaneMetrics;
use crate::vm::VmId;
use crate::{
    MapTarget, NotifyTicket, PlaneMetricsSnapshot, ResidencyPlane, SendNotifyError, PAGE_SIZE,
};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

/// The residency plane over a FUSE pool file. See the module docs.
pub struct FusePoolPlane {
    pub(super) target: MapTarget,
    pub(super) m: Mounted,
}

impl std::fmt::Debug for FusePoolPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusePoolPlane")
            .field("mountpoint", &self.m.mountpoint)
            .field("size", &self.target.size)
            .finish_non_exhaustive()
    }
}

impl FusePoolPlane {
    /// The mountpoint.
    pub fn mountpoint(&self) -> &Path {
        &self.m.mountpoint
    }

    /// A split plane's helper process (`None`: requests are read here).
    pub fn helper_pid(&self) -> Option<u32> {
        self.m.helper.as_ref().map(|h| h.child.id())
    }

    /// What carries the requests: `/dev/fuse`, or FUSE over io_uring.
    pub fn transport(&self) -> ActiveTransport {
        match &self.m.ring {
            Some(r) => {
                let r = lock(r);
                let c = r.config();
                ActiveTransport::IoUring {
                    queues: c.queues,
                    workers: r.workers(),
                    poll: c.poll,
                }
            }
            None => match self.m.server.helper_ring_queues.load(Ordering::Acquire) {
                0 => ActiveTransport::DevFuse,
                // A split plane's helper: one pinned worker per queue.
                queues => ActiveTransport::IoUring {
                    queues,
                    workers: queues,
                    poll: false,
                },
            },
        }
    }

    /// Requests answered through the io_uring so far (0 on `/dev/fuse`).
    pub fn ring_requests(&self) -> u64 {
        self.m.server.metrics.snapshot().ring_requests
    }

    /// Request threads started so far.
    pub fn readers(&self) -> usize {
        lock(&self.m.threads.readers).len()
    }

    /// A VM registered: in [`ReaderMode::Block`], keeps one request thread
    /// more than the VMs seen (each reader does its miss's host read
    /// itself, blocking; spinning readers each burn a core and do not grow).
    fn grow_readers(&self, vm: VmId) {
        let mut g = lock(&self.m.spawner);
        let Some(sp) = g.as_mut() else { return };
        sp.vms.insert(vm);
        let want = sp.base.max(sp.vms.len() + 1).min(MAX_READERS);
        if let Some(r) = &self.m.ring {
            // Per queue, as many sleeping ring workers.
            if let Err(e) = lock(r).grow_to(want) {
                tracing::warn!(error = %e, "cannot start more ring workers");
            }
            return;
        }
        // Spinning readers do not grow.
        if sp.mode != ReaderMode::Block {
            return;
        }
        let mut readers = lock(&self.m.threads.readers);
        while readers.len() < want {
            match sp.spawn(readers.len()) {
                Ok(h) => readers.push(h),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start another pool request thread");
                    return;
                }
            }
        }
    }

    /// The floor miss replies are released ahead of their modeled
    /// completion by now (ns; 0: none).
    pub fn compensation_ns(&self) -> u64 {
        self.m.server.metrics.floor.current_ns()
    }

    /// The live counters.
    pub fn live_metrics(&self) -> &PlaneMetrics {
        &self.m.server.metrics
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), SendNotifyError> {
        let ok = offset % PAGE_SIZE == 0
            && len % PAGE_SIZE == 0
            && len > 0
            && offset
                .checked_add(len)
                .is_some_and(|e| e <= self.target.size);
        if ok {
            Ok(())
        } else {
            Err(SendNotifyError::BadRange { offset, len })
        }
    }

    /// Drops `[pool_offset, pool_offset + len)` as [`ResidencyPlane::evict`]
    /// does and, on a plane that refuses readahead, has the kernel read the
    /// pages ahead at once (refused): they stay in the page cache as
    /// tombstones, not up to date, so the next touch of one reads just its
    /// folio — no readahead window and no refused READ on the fault's path.
    /// Elsewhere the same as `evict`.
    pub fn evict_to_tombstones(
        &self,
        pool_offset: u64,
        len: u64,
    ) -> Result<NotifyTicket, SendNotifyError> {
        self.check_range(pool_offset, len)?;
        if self.m.server.readahead.is_none() {
            return self.evict(pool_offset, len);
        }
        self.queue(NoticeKind::Retire {
            offset: pool_offset,
            len,
        })
    }

    fn queue(&self, kind: NoticeKind) -> Result<NotifyTicket, SendNotifyError> {
        let (done, rx) = mpsc::sync_channel(1);
        let evicted = kind.evicted_pages();
        let tx = self.m.notify_tx.as_ref().ok_or(SendNotifyError::Closed)?;
        // Counted before it can be taken: the notifier's `done` never
        // comes first.
        self.m.server.backlog.queued(evicted);
        if tx.send(Notice::new(kind, done)).is_err() {
            self.m.server.backlog.done(evicted);
            return Err(SendNotifyError::Closed);
        }
        Ok(NotifyTicket::new(rx))
    }
}

impl ResidencyPlane for FusePoolPlane {
    fn map_target(&self) -> &MapTarget {
        &self.target
    }

    fn fill(&self, pool_offset: u64, data: Vec<u8>) -> Result<NotifyTicket, SendNotifyError> {
        self.check_range(pool_offset, data.len() as u64)?;
        if data.len() > u32::MAX as usize {
            return Err(SendNotifyError::BadRange {
                offset: pool_offset,
                len: data.len() as u64,
            });
        }
        self.queue(NoticeKind::Store {
            offset: pool_offset,
            data,
        })
    }

    fn evict(&self, pool_offset: u64, len: u64) -> Result<NotifyTicket, SendNotifyError> {
        self.check_range(pool_offset, len)?;
        self.queue(NoticeKind::Inval {
            offset: pool_offset,
            len,
        })
    }

    fn sync(&self, pool_offset: u64, len: u64) -> Result<(), SendNotifyError> {
        self.check_range(pool_offset, len)?;
        if on_request_thread() {
            return Err(SendNotifyError::WouldDeadlock);
        }
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: a plain system call on an fd this plane owns.
        let rc = unsafe {
            libc::sync_file_range(
                self.target.file.as_raw_fd(),
                pool_offset as libc::off64_t,
                len as libc::off64_t,
                flags,
            )
        };
        if rc != 0 {
            return Err(SendNotifyError::Kernel(io::Error::last_os_error()));
        }
        Ok(())
    }

    fn register_vmm(&self, vm: VmId, pid: u32) {
        self.m.server.vms.register(vm, pid);
        self.grow_readers(vm);
    }

    fn unregister_vmm(&self, vm: VmId) {
        self.m.server.vms.unregister(vm);
    }

    fn metrics(&self) -> PlaneMetricsSnapshot {
        let mut s = self.m.server.metrics.snapshot();
        s.readahead_refused = self
            .m
            .server
            .readahead
            .as_ref()
            .map_or(0, |r| r.refused_count());
        let backlog = self.m.server.backlog.figures();
        s.backlog_waits = backlog.waits;
        s.backlog_wait_ns = backlog.wait_ns;
        s.backlog_overruns = backlog.overruns;
        s
    }
}
