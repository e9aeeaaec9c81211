//! Transport negotiation at mount: whether INIT offers FUSE over io_uring
//! ([`plan_uring`]), and once the kernel's INIT is answered, the ring that
//! takes its requests ([`start_ring`]).

use super::server::Server;
use super::{MountPlaneError, PlaneOptions, ReaderMode, Transport, MAX_WRITE};
use crate::uring::{RingConfig, RingServer, RingSet, StartRingError};
use fuse_abi as abi;
use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// How long a mount waits for the kernel's INIT before it gives up on the
/// ring (the INIT is sent at mount, so it normally comes at once).
const INIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether INIT is to offer FUSE over io_uring, before the mount: the
/// transport asked for, what the host kernel offers, and whether a ring can
/// be created here at all. A `split` plane's helper takes the ring (one
/// socket per queue: at most [`MAX_SOCKETS`](crate::helper_link::MAX_SOCKETS)
/// queues). Fails when [`Transport::IoUring`] was asked for and cannot be
/// had.
pub(super) fn plan_uring(transport: Transport, split: bool) -> Result<bool, MountPlaneError> {
    let offered = crate::uring::kernel_offers();
    let sockets_enough = crate::uring::possible_cpus() <= crate::helper_link::socket_count();
    if transport == Transport::IoUring {
        if split && !sockets_enough {
            return Err(MountPlaneError::NoUring(
                "a split plane's helper has one socket per CPU queue, and this host has more queues",
            ));
        }
        if !offered {
            return Err(MountPlaneError::NoUring(
                "the host kernel does not offer it (/sys/module/fuse/parameters/enable_uring is not Y)",
            ));
        }
    }
    // A ring that cannot even be created (io_uring_disabled, seccomp,
    // memory) must be known before INIT offers it.
    let wanted = (!split || sockets_enough) && transport != Transport::DevFuse && offered;
    match (wanted, wanted.then(crate::uring::probe)) {
        (true, Some(Err(e))) if transport == Transport::IoUring => {
            Err(MountPlaneError::Ring(StartRingError::Setup(e)))
        }
        (true, Some(Err(e))) => {
            tracing::info!(error = %e, "no io_uring here; the pool uses /dev/fuse");
            Ok(false)
        }
        (wanted, _) => Ok(wanted),
    }
}

/// Waits for the kernel's INIT (at most [`INIT_TIMEOUT`]); whether its
/// answer granted FUSE over io_uring.
pub(crate) fn init_granted_ring(server: &Server) -> bool {
    let waited = Instant::now();
    while !server.init_answered.load(Ordering::Acquire) && waited.elapsed() < INIT_TIMEOUT {
        thread::sleep(Duration::from_micros(200));
    }
    server.uring_granted.load(Ordering::Acquire)
}

/// A ring entry's payload buffer: the connection's largest argument.
pub(crate) fn ring_payload_len() -> usize {
    (MAX_WRITE as usize).max(abi::MIN_READ_BUFFER)
}

/// After a mount whose INIT offered the ring: waits for the kernel's INIT
/// (at most [`INIT_TIMEOUT`]) and, if it granted the ring, starts the ring
/// workers before the first request. `None`: the kernel did not grant it
/// and the pool stays on `/dev/fuse` (an error with [`Transport::IoUring`]).
/// A ring granted but not started is an error: the kernel then holds every
/// request until each queue has an entry, so the mount can only be closed.
pub(super) fn start_ring(
    server: &Arc<Server>,
    dev: &Arc<File>,
    options: &PlaneOptions,
) -> Result<Option<RingSet>, MountPlaneError> {
    // Once INIT grants the ring, the kernel holds every request
    // until each queue has an entry: start the ring before the
    // first request (no path may be touched before).
    let started = if init_granted_ring(server) {
        let queues = crate::uring::possible_cpus();
        let poll = options.mode == ReaderMode::Spin;
        let config = RingConfig {
            queues,
            per_queue: if poll {
                crate::uring::POLL_QUEUE_DEPTH
            } else {
                options.readers.max(1)
            },
            payload_len: ring_payload_len(),
            poll,
            deferring: false,
        };
        let ring_server: Arc<dyn RingServer> = server.clone();
        RingSet::start(dev, ring_server, config).map(Some)
    } else {
        Ok(None)
    };
    match (started, options.transport) {
        (Ok(Some(r)), _) => Ok(Some(r)),
        (Ok(None), Transport::IoUring) => Err(MountPlaneError::NoUring(
            "the kernel's INIT did not offer it",
        )),
        // Granted but not started: the kernel now holds every
        // request until each queue has an entry, so this mount can
        // only be closed (dropping the mount detaches it and closes
        // `/dev/fuse` without a request). `mount` retries `Auto`
        // on `/dev/fuse`.
        (Err(e), _) => Err(MountPlaneError::Ring(e)),
        (Ok(None), _) => {
            tracing::info!(
                "the kernel's INIT did not offer FUSE over io_uring; the pool stays on /dev/fuse"
            );
            Ok(None)
        }
    }
}
