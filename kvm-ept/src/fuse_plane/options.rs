//! How a plane is set up ([`PlaneOptions`], [`ReaderMode`], [`Transport`]),
//! what it runs on once mounted ([`ActiveTransport`]), and why a mount can
//! fail ([`MountPlaneError`]).

use crate::pace::Compensation;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// How request threads wait for requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderMode {
    /// Sleep in `read(2)` until a request comes (no CPU when idle; a miss
    /// pays the wake-up of the request thread).
    Block,
    /// Poll `/dev/fuse` without sleeping (one core per request thread, busy
    /// even when idle; saves the wake-up on every miss).
    Spin,
}

/// How requests travel between the host kernel and the plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// FUSE over io_uring when the host kernel offers it
    /// (`/sys/module/fuse/parameters/enable_uring`), else `/dev/fuse`.
    #[default]
    Auto,
    /// `read(2)` / `write(2)` on `/dev/fuse` only.
    DevFuse,
    /// FUSE over io_uring, or no mount.
    IoUring,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Auto => "auto",
            Transport::DevFuse => "dev-fuse",
            Transport::IoUring => "io-uring",
        })
    }
}

/// Why a [`Transport`] could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plane transport `{0}`: expected auto, dev-fuse or io-uring")]
pub struct ParseTransportError(pub String);

impl std::str::FromStr for Transport {
    type Err = ParseTransportError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(Transport::Auto),
            "dev-fuse" | "devfuse" => Ok(Transport::DevFuse),
            "io-uring" | "io_uring" | "uring" => Ok(Transport::IoUring),
            _ => Err(ParseTransportError(s.to_string())),
        }
    }
}

/// The transport a mounted plane runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveTransport {
    /// `/dev/fuse` request threads.
    DevFuse,
    /// FUSE over io_uring.
    IoUring {
        /// The kernel's queues (one per possible CPU).
        queues: usize,
        /// Worker threads (each owns the entries of some queues).
        workers: usize,
        /// Workers poll their completion queues.
        poll: bool,
    },
}

/// [`PlaneOptions::notifier_poll`] for a plane whose misses evict pages as
/// they come (the DAX plane, memory regions): a sleeping notifier is woken
/// on another CPU for each eviction, an IPI (a VM exit on a virtual host)
/// inside the trap's reply; polling this long after each batch that
/// evicted, the notifier is never asleep while evictions flow.
pub const EVICTING_NOTIFIER_POLL: Duration = Duration::from_micros(200);

/// Most request threads a plane grows to as VMs register.
pub const MAX_READERS: usize = 64;

/// How a plane is set up.
#[derive(Debug, Clone, Copy)]
pub struct PlaneOptions {
    /// Request threads at the start (at least 1). In [`ReaderMode::Block`]
    /// the plane adds one per VM registered beyond that (up to
    /// [`MAX_READERS`]): a reader does the host read of its miss itself.
    pub readers: usize,
    /// How they wait. With FUSE over io_uring, [`ReaderMode::Spin`] makes
    /// one ring worker poll its completion queue (instead of one sleeping
    /// worker per CPU queue).
    pub mode: ReaderMode,
    /// `/dev/fuse` or FUSE over io_uring (split planes: `/dev/fuse`).
    pub transport: Transport,
    /// Refuse the first `READ` of every page (the kernel's readahead on a
    /// `VM_HUGEPAGE` mapping: QEMU's guest RAM) and serve the fault's own
    /// read of the refused folio, so that a trap reads only the faulting
    /// folio (see `readahead.rs`).
    pub refuse_readahead: bool,
    /// Detach the mount once the pool file is open (`umount2(MNT_DETACH)`):
    /// the plane lives on through its descriptors, and nobody — no host
    /// user, no other process of the same user — can reach the pool by
    /// path any more. VMMs get it as a descriptor over vhost-user.
    pub detach: bool,
    /// Release each miss reply ahead of its modeled completion by the trap
    /// path's own cost (see [`Compensation`]; `Auto` measures it with a
    /// calibration thread).
    pub compensation: Compensation,
    /// How long the notifier polls its queue (yielding the CPU) after a
    /// batch that evicted pages, before it sleeps. A plane whose misses
    /// evict pages saves a cross-CPU wake-up per miss
    /// ([`EVICTING_NOTIFIER_POLL`]); elsewhere it is CPU spent for nothing
    /// (`Duration::ZERO`, the default: sleep at once).
    pub notifier_poll: Duration,
    /// Most evicted pages a miss may leave waiting for their invalidation:
    /// a miss is not answered while more are queued (for at most 20 ms),
    /// so the pages the host still maps stay within this many of what the
    /// backend holds. `None` (the default): misses never wait; `Some(0)`:
    /// each miss waits until every eviction before it is written. For a
    /// plane whose misses evict the pages guests wrote (the DAX plane); see
    /// `backlog.rs`.
    pub eviction_backlog_pages: Option<u64>,
}

impl Default for PlaneOptions {
    fn default() -> Self {
        PlaneOptions {
            readers: 2,
            mode: ReaderMode::Block,
            transport: Transport::Auto,
            refuse_readahead: false,
            detach: false,
            compensation: Compensation::Off,
            notifier_poll: Duration::ZERO,
            eviction_backlog_pages: None,
        }
    }
}

/// Why a plane could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountPlaneError {
    /// The pool size is zero or not a multiple of the page size.
    #[error("pool size {0:#x} is zero or not a multiple of 4096")]
    BadSize(u64),
    /// `/dev/fuse` cannot be opened (no FUSE, or no permission).
    #[error("cannot open /dev/fuse")]
    OpenDevice(#[source] io::Error),
    /// `mount(2)` failed.
    #[error("cannot mount the pool at {path}")]
    Mount {
        /// The mountpoint.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A thread could not be started.
    #[error("cannot start a plane thread")]
    Spawn(#[source] io::Error),
    /// The pool file cannot be opened on the new mount.
    #[error("cannot open the pool file {path}")]
    OpenPool {
        /// The pool file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The helper process of a split plane could not be started.
    #[error("cannot start the plane's helper process")]
    Helper(#[from] crate::helper_link::SpawnHelperError),
    /// FUSE over io_uring was required but the host kernel does not offer
    /// it (no `enable_uring`, or a kernel before 6.14).
    #[error("FUSE over io_uring was asked for, but {0}")]
    NoUring(&'static str),
    /// FUSE over io_uring was required and could not be started.
    #[error("cannot start FUSE over io_uring")]
    Ring(#[source] crate::uring::StartRingError),
    /// The readahead map (shared with a split plane's helper) could not be
    /// made.
    #[error("cannot create the plane's readahead map")]
    ReadaheadMap(#[source] io::Error),
    /// The mount could not be detached once the pool was open.
    #[error("cannot detach the pool mount at {path}")]
    Detach {
        /// The mountpoint.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}
