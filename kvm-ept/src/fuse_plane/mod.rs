//! [`FusePoolPlane`]: the pool as one file on a host FUSE mount served here.
//!
//! The mount holds one regular file, `pool`, of a fixed size (its size and
//! mtime never change). A VMM maps it `MAP_SHARED`; the host kernel turns a
//! touch of a page that is not in its page cache into a `FUSE_READ`, which
//! [`PoolBackend::on_miss`](crate::PoolBackend::on_miss) times; the reply is
//! written when the modeled access completes and the page becomes an
//! ordinary page-cache page, mapped into every VM that touches it from then
//! on, with no further trap.
//!
//! Threads:
//! * request threads ([`PlaneOptions::readers`], and in
//!   [`ReaderMode::Block`] one more than the VMs registered, so that one
//!   VM's misses stuck in slow host reads leave a thread for the others)
//!   read `/dev/fuse`, answer each request, and spin for replies due within
//!   [`pace::INLINE_SPIN_NS`](crate::pace::INLINE_SPIN_NS); replies due
//!   later go to
//! * the pacer, a deadline heap that sleeps, spins the last
//!   [`pace::SPIN_NS`](crate::pace::SPIN_NS), then writes the reply;
//! * the notifier, the only thread that writes `NOTIFY_STORE` /
//!   `NOTIFY_INVAL_INODE`: a notification may wait for a page whose
//!   `FUSE_READ` is still unanswered, or for a write-back (`FUSE_WRITE`) it
//!   triggers, so it must never be sent by a thread that answers requests —
//!   the kernel would deadlock, uninterruptibly.
//!
//! * with [`Compensation::Auto`](crate::pace::Compensation::Auto), the
//!   calibrator: it measures the trap path's own cost (fault → request,
//!   reply → mapped) on the mount's second file, `calibration` (one page,
//!   answered at once, never seen by the backend), at start and a few times
//!   a second, and keeps the floor that miss replies are released ahead of
//!   their modeled completion by ([`crate::pace::Floor`]; DESIGN.md,
//!   "Latency compensation").
//!
//! Rules (DESIGN.md, "Rules learned the hard way"): the pool is opened with
//! `FOPEN_KEEP_CACHE` (else a second `open()` empties its page cache);
//! `max_readahead` ≤ 4096 so every page miss is its own `FUSE_READ`
//! (prefetch is the model's decision, done with `NOTIFY_STORE`);
//! `FUSE_EXPLICIT_INVAL_DATA` so only the plane drops pages; no thread of
//! the plane ever touches the pool mapping.
//!
//! Submodules, each depending only on those listed before it:
//! * `options`: [`PlaneOptions`], [`ReaderMode`], [`Transport`],
//!   [`ActiveTransport`], [`MountPlaneError`];
//! * `backlog`: the evicted pages queued for the notifier, and the bound
//!   misses wait under;
//! * `server`: the FUSE server (request decoding, one handler per opcode,
//!   misses and write-backs), independent of the transport;
//! * `transport`: the steps of a mount that decide between `/dev/fuse` and
//!   FUSE over io_uring, and start the ring;
//! * `workers`: the thread bodies (request readers, forwarded misses of a
//!   split plane, the pacer, the notifier) and the ring's entry point;
//! * `calibrate`: the calibration thread and its mapping of the
//!   calibration file;
//! * `mounted`: the live mount and its threads, and their shutdown;
//! * `plane`: [`FusePoolPlane`], its accessors and its
//!   [`ResidencyPlane`](crate::ResidencyPlane) impl;
//! * `mount`: [`FusePoolPlane::mount`] and the steps of a mount.

mod backlog;
mod calibrate;
mod mount;
mod mounted;
mod notifier;
mod notifier_cpus;
mod options;
mod plane;
mod server;
mod transport;
mod workers;

pub use options::{
    ActiveTransport, MountPlaneError, ParseTransportError, PlaneOptions, ReaderMode, Transport,
    EVICTING_NOTIFIER_POLL, MAX_READERS,
};
pub use plane::FusePoolPlane;
pub(crate) use server::{error_reply, read_full, Outcome, Server};
pub(crate) use transport::{init_granted_ring, ring_payload_len};
pub use workers::on_request_thread;
pub(crate) use workers::write_reply;

/// The pool file's node id.
pub const POOL_NODEID: u64 = 2;
/// The pool file's name in the mount.
pub const POOL_NAME: &str = "pool";
/// The calibration file's node id (see [`CALIB_NAME`]).
pub const CALIB_NODEID: u64 = 3;
/// The mount's second file: one page of zeros, answered at once without the
/// backend, that the calibrator drops and touches to measure the trap
/// path's own cost. Owner-read-only, not listed (found by name); a VMM
/// never maps it, and the pool file (its size, its pages, its counters)
/// does not change.
pub const CALIB_NAME: &str = "calibration";

/// `max_readahead` advertised: one page, so every miss is its own READ.
pub const MAX_READAHEAD: u32 = 4096;
/// Largest WRITE (write-back) accepted.
pub const MAX_WRITE: u32 = 128 * 1024;

// A split plane's verdicts carry a whole READ reply.
const _: () = assert!(
    crate::helper_link::VERDICT_LEN + fuse_abi::OUT_HEADER_LEN + MAX_WRITE as usize
        <= crate::helper_link::MAX_VERDICT
);

/// Locks `m`, whether or not a thread panicked while holding it.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The daemon's effective uid and gid: the pool's only user.
fn owner() -> (u32, u32) {
    // SAFETY: geteuid/getegid have no preconditions and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}
