//! The cxlfs residency plane.
//!
//! All VMs map one *pool*: the emulated CXL-SSD's address space. A pool page
//! that is resident (in the device's DRAM cache) must be reached by every
//! guest that maps it at memory speed, with no exit; a page that is not must
//! trap into the daemon, whose device model charges NAND time before the page
//! is filled. This crate hides the mechanism that gives those two behaviours
//! behind [`ResidencyPlane`] (what the daemon drives) and [`PoolBackend`]
//! (what the daemon implements: it is called on every trap and write-back).
//!
//! The mechanism built here is [`FusePoolPlane`]: the pool is one regular
//! file on a host FUSE mount that this crate serves itself over `/dev/fuse`.
//! A VMM maps slots of that file into a guest (the virtio-fs DAX window), so
//! a resident page is a host page-cache page mapped straight into the guest
//! (through EPT/NPT under KVM, the softmmu TLB under TCG), and a missing page
//! is a host page fault that becomes a `FUSE_READ`, answered after the modeled
//! delay. Fills push pages with `FUSE_NOTIFY_STORE`; evictions drop them with
//! `FUSE_NOTIFY_INVAL_INODE`, which makes the kernel write dirty pages back
//! first (`FUSE_WRITE`, charged as NAND programs) and zap every mapping.
//!
//! Other mechanisms fit behind the same traits:
//! * **userfaultfd** on the daemon's own mappings (a VMM that maps memory the
//!   daemon shares with it, e.g. a memfd): `map_target` is the memfd, a
//!   trap is a `UFFD_EVENT_PAGEFAULT` answered with `UFFDIO_COPY` after the
//!   modeled delay ([`PoolBackend::on_miss`] unchanged), `fill` is
//!   `UFFDIO_COPY` without a fault, `evict` is `MADV_DONTNEED` / hole punch
//!   after reading dirty data back ([`PoolBackend::on_writeback`]). It only
//!   sees faults in mappings registered with the uffd, so every VMM must hand
//!   its mapping over; pid attribution comes from `UFFD_FEATURE_THREAD_ID`.
//! * **KVM memslots** in a VMM of the project's own: the pool is guest memory
//!   of a memslot; a miss is an EPT violation on a page not yet populated
//!   (userfaultfd under the memslot, or a private memslot with
//!   `KVM_EXIT_MEMORY_FAULT`), `fill` pre-faults (`KVM_PRE_FAULT_MEMORY`),
//!   `evict` zaps through the MMU notifiers as here.
//!
//! Pacing (sleeping, then spinning the last ~50 µs until a reply's modeled
//! completion) happens here and in the daemon, never in the device model.
//!
//! Module map: [`fuse_plane`] ([`FusePoolPlane`]), [`pace`], [`wakeup_probe`]
//! (the virtio-fs path's floor), [`vm`] (pid →
//! VM attribution), [`metrics`], [`exit_guard`]. The FUSE wire format it
//! speaks is the `cxlfs-fuse-abi` crate ([`fuse_abi`]), shared with `cxlfsd`.

pub mod exit_guard;
pub mod fuse_plane;
pub mod helper_link;
pub mod helper_seccomp;
pub mod metrics;
pub mod pace;
mod readahead;
pub mod split;
pub mod uring;
pub mod vm;
pub mod wakeup_probe;

pub use fuse_plane::{
    ActiveTransport, FusePoolPlane, MountPlaneError, PlaneOptions, ReaderMode, Transport,
    EVICTING_NOTIFIER_POLL,
};
pub use helper_seccomp::SeccompMode;
pub use metrics::{PlaneMetrics, PlaneMetricsSnapshot};
pub use split::{helper_main_if_requested, HelperCommand};
pub use vm::{VmId, VmResolver};

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Size of a pool page: the unit of residency, traps and fills.
pub const PAGE_SIZE: u64 = 4096;

/// What a VMM maps to reach the pool.
#[derive(Debug, Clone)]
pub struct MapTarget {
    /// The pool file's path (on the plane's mount).
    pub path: PathBuf,
    /// The pool file, open read-write: the fd to pass to a VMM
    /// (`VHOST_USER_BACKEND_SHMEM_MAP`), mapped `MAP_SHARED` at pool offsets.
    pub file: Arc<File>,
    /// The pool's size in bytes (fixed for the plane's lifetime).
    pub size: u64,
}

/// One trap: a pool range that a thread touched while it was not resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Miss {
    /// First pool byte requested (page aligned).
    pub pool_offset: u64,
    /// Bytes requested (a page unless the kernel asked for more).
    pub len: u32,
    /// The faulting thread (its id in the plane's pid namespace; 0: unknown).
    pub pid: u32,
    /// The VM the thread belongs to, if it is one of the registered VMMs.
    pub vm: Option<VmId>,
    /// When the trap reached the plane, on [`PoolBackend::now_ns`]'s clock.
    pub arrival_ns: u64,
}

/// Where a trap's data comes from.
#[derive(Debug, Clone)]
pub enum MissData {
    /// The backend wrote the data into the buffer it was handed (the first
    /// `len` bytes; the rest of the request reads as zeros).
    InPlace {
        /// Bytes written.
        len: usize,
    },
    /// These bytes (the rest of the request reads as zeros).
    Bytes(Vec<u8>),
    /// `pread` from this file at this offset (a short read leaves zeros).
    File {
        /// The file holding the data (e.g. the host file behind a pool extent).
        file: Arc<File>,
        /// Offset in `file` of the first requested byte.
        offset: u64,
    },
    /// All zeros.
    Zeros,
}

/// The answer to a trap: the data and when the modeled access completes.
#[derive(Debug, Clone)]
pub struct MissReply {
    /// The page data.
    pub data: MissData,
    /// Modeled completion on [`PoolBackend::now_ns`]'s clock: the trap is
    /// answered (and the page mapped) no earlier than this.
    pub completes_at_ns: u64,
}

/// Why the backend could not serve a trap (the faulting access gets `SIGBUS`).
#[derive(Debug, thiserror::Error)]
pub enum ServeMissError {
    /// Reading the page data failed.
    #[error("reading the pool page data failed")]
    Io(#[from] io::Error),
    /// The device model refused the access.
    #[error("the device model refused the access: {0}")]
    Device(String),
    /// A fill read (not a guest's) of pages the device no longer holds:
    /// refused so that they trap again; not an error of the plane.
    #[error("the device no longer holds the page")]
    NotHeld,
}

/// Why the backend could not take a write-back (the kernel keeps the error
/// for `msync` / `fsync` callers).
#[derive(Debug, thiserror::Error)]
pub enum WritebackError {
    /// Storing the data failed.
    #[error("storing written-back pool data failed")]
    Io(#[from] io::Error),
    /// The device model refused the access.
    #[error("the device model refused the access: {0}")]
    Device(String),
}

/// The errno a failed write-back leaves its writers (`fsync`, `msync`):
/// a full or over-quota file system stays itself (ENOSPC, EDQUOT, EFBIG:
/// the writer can do something about it), every other failure is EIO.
pub fn writeback_errno(e: &io::Error) -> i32 {
    e.raw_os_error()
        .filter(|c| [libc::ENOSPC, libc::EDQUOT, libc::EFBIG].contains(c))
        .unwrap_or(libc::EIO)
}

impl WritebackError {
    /// The errno the kernel keeps for the page's `fsync` / `msync` callers
    /// ([`writeback_errno`]; a device refusal is EIO).
    pub fn errno(&self) -> i32 {
        match self {
            WritebackError::Io(e) => writeback_errno(e),
            WritebackError::Device(_) => libc::EIO,
        }
    }
}

/// What the daemon implements: it charges the device model and moves data.
///
/// Called on the plane's request threads. Implementations must not block
/// on the plane ([`NotifyTicket::wait`] refuses there) nor touch the pool
/// mapping: the kernel is waiting for the answer with the page locked.
pub trait PoolBackend: Send + Sync + 'static {
    /// The clock of `arrival_ns` / `completes_at_ns` (monotonic ns).
    fn now_ns(&self) -> u64;

    /// A trap on `miss`: charge the model (a read at `miss.arrival_ns`) and
    /// say where the data is. `dst` (`miss.len` bytes) may be filled in
    /// place ([`MissData::InPlace`]).
    fn on_miss(&self, miss: &Miss, dst: &mut [u8]) -> Result<MissReply, ServeMissError>;

    /// The kernel writes dirty pool bytes back (before an eviction, on
    /// `msync`, `munmap` or memory pressure): store them and charge NAND
    /// programs. Returns the modeled completion; the write is acknowledged
    /// no earlier.
    fn on_writeback(
        &self,
        pool_offset: u64,
        data: &[u8],
        pid: u32,
        arrival_ns: u64,
    ) -> Result<u64, WritebackError>;

    /// A split plane's helper already stored `len` written-back bytes at
    /// `pool_offset` (see [`split`]): charge them only. Returns the modeled
    /// completion (the helper acknowledged the write at once). The default
    /// charges nothing.
    fn on_stored_writeback(
        &self,
        pool_offset: u64,
        len: u64,
        pid: u32,
        arrival_ns: u64,
    ) -> Result<u64, WritebackError> {
        let _ = (pool_offset, len, pid);
        Ok(arrival_ns)
    }
}

/// Why a notification (fill / evict) failed.
#[derive(Debug, thiserror::Error)]
pub enum SendNotifyError {
    /// The range is not page aligned or runs past the pool.
    #[error("pool range {offset:#x}+{len:#x} is misaligned or out of the pool")]
    BadRange {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
    },
    /// The kernel refused it (e.g. `ENOENT`: the pool inode is not loaded).
    #[error("the kernel refused the notification")]
    Kernel(#[source] io::Error),
    /// The plane is shutting down.
    #[error("the residency plane is shut down")]
    Closed,
    /// Waiting from a plane request thread would deadlock the kernel.
    #[error("waiting for a notification from a plane request thread would deadlock")]
    WouldDeadlock,
}

/// A queued notification; [`NotifyTicket::wait`] blocks until the kernel
/// has taken it.
#[derive(Debug)]
pub struct NotifyTicket {
    rx: std::sync::mpsc::Receiver<Result<Duration, io::Error>>,
}

impl NotifyTicket {
    pub(crate) fn new(rx: std::sync::mpsc::Receiver<Result<Duration, io::Error>>) -> Self {
        NotifyTicket { rx }
    }

    /// Waits until the notifier has written it; returns how long the write
    /// took (the kernel's cost of the store / invalidation, including the
    /// write-back it waited for). Never call it from a [`PoolBackend`]
    /// callback.
    pub fn wait(self) -> Result<Duration, SendNotifyError> {
        if fuse_plane::on_request_thread() {
            return Err(SendNotifyError::WouldDeadlock);
        }
        match self.rx.recv() {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => Err(SendNotifyError::Kernel(e)),
            Err(_) => Err(SendNotifyError::Closed),
        }
    }
}

/// What the daemon drives: the mechanism that makes pool pages resident and
/// mapped, or not.
pub trait ResidencyPlane: Send + Sync {
    /// What a VMM maps.
    fn map_target(&self) -> &MapTarget;

    /// Makes `[pool_offset, pool_offset + data.len())` resident with this
    /// data without a trap (fill after a miss elsewhere, prefetch, promotion:
    /// the model's decision). Page aligned. Asynchronous: the returned ticket
    /// says when it is done.
    fn fill(&self, pool_offset: u64, data: Vec<u8>) -> Result<NotifyTicket, SendNotifyError>;

    /// Drops `[pool_offset, pool_offset + len)` (page aligned) from residency:
    /// dirty pages are written back first ([`PoolBackend::on_writeback`]),
    /// then every mapping of them, in every VM, is zapped; the next touch
    /// traps. Asynchronous like [`ResidencyPlane::fill`].
    fn evict(&self, pool_offset: u64, len: u64) -> Result<NotifyTicket, SendNotifyError>;

    /// Writes the dirty pages of `[pool_offset, pool_offset + len)` back
    /// ([`PoolBackend::on_writeback`]) and waits; they stay resident (an
    /// fsync of a file whose pages the guests store to through the window).
    /// Synchronous: never call it from a plane request thread.
    fn sync(&self, pool_offset: u64, len: u64) -> Result<(), SendNotifyError>;

    /// Declares that `pid` is the VMM process of `vm`: traps by any of its
    /// threads are attributed to `vm` (the daemon gets the pid from the
    /// vhost-user socket's `SO_PEERCRED`).
    fn register_vmm(&self, vm: VmId, pid: u32);

    /// Forgets a VMM (its connection ended).
    fn unregister_vmm(&self, vm: VmId);

    /// Counters.
    fn metrics(&self) -> PlaneMetricsSnapshot;
}

/// Evicts byte ranges `(pool_offset, len)` with `evict` (a plane's
/// [`ResidencyPlane::evict`] or a variant of it); with `wait`, returns once
/// the kernel has dropped them all (never call it so on a plane thread). A
/// range that cannot be evicted is logged with `what` and skipped. Returns
/// the ranges that failed.
pub fn evict_ranges(
    evict: impl Fn(u64, u64) -> Result<NotifyTicket, SendNotifyError>,
    ranges: impl IntoIterator<Item = (u64, u64)>,
    wait: bool,
    what: &str,
) -> usize {
    let mut failed = 0;
    let mut tickets = Vec::new();
    for (offset, len) in ranges {
        match evict(offset, len) {
            Ok(t) if wait => tickets.push(t),
            // Dropped: the notifier goes on without a waiter.
            Ok(_) => {}
            Err(e) => {
                failed += 1;
                tracing::warn!(error = %e, offset, len, "cannot evict {what}");
            }
        }
    }
    for t in tickets {
        if let Err(e) = t.wait() {
            failed += 1;
            tracing::warn!(error = %e, "eviction of {what} failed");
        }
    }
    failed
}
