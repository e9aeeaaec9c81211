//! Cache control at run time: prefetch, pin, unpin, evict, set_policy,
//! set_prefetch, set_cxl_ratio, query_stats, reset_stats, get_config.
//!
//! Two ways in, one executor ([`Controller`]):
//! * the host: a Unix stream socket (`--control-socket`, mode 0600 by
//!   default), one JSON request per line, one JSON reply per line
//!   ([`ControlSocket`]; the protocol is `cxlfs_api::control`, described
//!   in `docs/control-api.md`);
//! * a guest: `CXLFS_IOC_HINT` on a file of the share, which the guest
//!   kernel forwards as `FUSE_IOCTL` ([`hint`]). A guest acts only on files
//!   it could open, pins under a per-VM quota, and changes the device
//!   (policy, prefetcher, placement, counters) only when the daemon allows
//!   it (`--guest-device-control`).
//!
//! File ranges map to device pages through the pool (extents are allocated
//! as needed), exactly like the data path, but only for the file's
//! allocated data and at most `max_range_bytes` of it, checked before any
//! work proportional to the range (`range`). The device lock is taken per
//! 2 MiB segment, so a large command never stalls the data path for long;
//! a guest's pins count against its quota and its prefetches against a
//! per-VM budget (bytes per second, `budget`).
//! With DAX on, prefetched or pinned pages are also stored into the
//! residency plane (no trap on the next guest access) and evicted pages are
//! dropped from it before the command returns.
//!
//! Layout: this module holds the [`Controller`], its options and errors;
//! [`executor`] runs a [`Request`]; `range` runs the range commands,
//! `pins` keeps who holds which pin; [`socket`] serves the host;
//! [`hint`] serves guests.

mod budget;
pub mod executor;
pub mod hint;
mod pins;
#[cfg(test)]
pub(crate) mod planes_rig;
mod range;
pub mod socket;
#[cfg(test)]
mod tests;

use crate::dax::DaxPlane;
use crate::device::SharedDevice;
use crate::ids::FileKey;
use crate::memory::MemoryRegions;
use crate::metrics::Metrics;
use cxlfs_api::control::{Counters, DaemonSummary, ErrorCode, SetCxlRatioResult};
use cxlfs_device_model::AccessError;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

pub use cxlfs_api::control::DEFAULT_SOCKET_MODE;
pub use range::{ResolvedFile, Target};
pub use socket::ControlSocket;

/// Default per-VM pin quota as a share of the device cache.
pub const DEFAULT_PIN_QUOTA_PERCENT: u64 = 25;
/// Default bound on the bytes one range command covers: the device cache
/// (pinning or prefetching more than the cache holds only churns it).
pub const DEFAULT_MAX_RANGE_CACHE_PERCENT: u64 = 100;

/// Who issued a command.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Principal {
    /// The host, through the control socket: no quota, every command.
    Host,
    /// A guest, through `FUSE_IOCTL` on the share.
    Vm(String),
}

impl Principal {
    fn label(&self) -> &str {
        match self {
            Principal::Host => "host",
            Principal::Vm(name) => name,
        }
    }
}

/// Why a control command failed. Every variant leaves the device as it was.
#[derive(Debug, thiserror::Error)]
pub enum ControlCommandError {
    /// Malformed or out-of-range arguments.
    #[error("{0}")]
    BadRequest(String),
    /// No such file or VM.
    #[error("{0}")]
    NotFound(String),
    /// Not allowed for this caller (a path leaving the share, a guest
    /// changing the device without `--guest-device-control`).
    #[error("{0}")]
    Forbidden(String),
    /// The pin would take the VM over its quota.
    #[error("pinning {requested_bytes} more bytes would exceed the pin quota of {vm}: {held_bytes} of {quota_bytes} bytes pinned")]
    QuotaExceeded {
        /// The VM.
        vm: String,
        /// Bytes the command would add.
        requested_bytes: u64,
        /// Bytes the VM holds pinned.
        held_bytes: u64,
        /// Its quota.
        quota_bytes: u64,
    },
    /// The VM used up its prefetch budget; it refills over a second.
    #[error(
        "{vm} has used its prefetch budget of {budget_bytes} bytes per second; try again later"
    )]
    Throttled {
        /// The VM.
        vm: String,
        /// Its budget.
        budget_bytes: u64,
    },
    /// The device model refused it.
    #[error("device: {0}")]
    Device(#[from] AccessError),
    /// An I/O error on the host file.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: io::Error,
    },
}

impl ControlCommandError {
    /// The protocol's error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ControlCommandError::BadRequest(_) => ErrorCode::BadRequest,
            ControlCommandError::NotFound(_) => ErrorCode::NotFound,
            ControlCommandError::Forbidden(_) => ErrorCode::Forbidden,
            ControlCommandError::QuotaExceeded { .. } => ErrorCode::QuotaExceeded,
            ControlCommandError::Throttled { .. } => ErrorCode::Busy,
            ControlCommandError::Device(AccessError::SetFullyPinned { .. }) => {
                ErrorCode::CacheFullyPinned
            }
            ControlCommandError::Device(_) => ErrorCode::DeviceError,
            ControlCommandError::Io { .. } => ErrorCode::IoError,
        }
    }

    /// The errno a guest sees.
    pub fn errno(&self) -> Errno {
        match self {
            ControlCommandError::BadRequest(_) => Errno::INVAL,
            ControlCommandError::NotFound(_) => Errno::NOENT,
            ControlCommandError::Forbidden(_) => Errno::PERM,
            ControlCommandError::QuotaExceeded { .. } => Errno::DQUOT,
            ControlCommandError::Throttled { .. } => Errno::AGAIN,
            ControlCommandError::Device(AccessError::SetFullyPinned { .. }) => Errno::NOSPC,
            ControlCommandError::Device(_) | ControlCommandError::Io { .. } => Errno::IO,
        }
    }
}

fn bad(msg: impl Into<String>) -> ControlCommandError {
    ControlCommandError::BadRequest(msg.into())
}

/// Why the DRAM/CXL ratio could not be set.
#[derive(Debug, thiserror::Error)]
pub enum SetCxlRatioError {
    /// Out of range or refused by the placement code.
    #[error("{0}")]
    Invalid(String),
}

/// The DRAM/CXL placement behind `set_cxl_ratio` (a trait so that the
/// controller can be tested without a daemon).
pub trait PlacementControl: Send + Sync {
    /// Sets the share of file pages placed on the CXL-SSD, in percent;
    /// returns what to report.
    fn set_cxl_ratio(&self, percent: u32) -> Result<SetCxlRatioResult, SetCxlRatioError>;
    /// The ratio in force.
    fn cxl_ratio(&self) -> Option<u32>;
}

/// The shared device's placement (`SharedDevice::set_cxl_ratio`): pages
/// that move to DRAM leave the device cache, pages that move to the
/// CXL-SSD leave the residency plane (their next access traps).
#[derive(Debug)]
pub struct DevicePlacement(pub Arc<SharedDevice>);

impl PlacementControl for DevicePlacement {
    fn set_cxl_ratio(&self, percent: u32) -> Result<SetCxlRatioResult, SetCxlRatioError> {
        let ratio = crate::device::placement::check_ratio(u64::from(percent))
            .map_err(|e| SetCxlRatioError::Invalid(e.to_string()))?;
        let c = self
            .0
            .set_cxl_ratio(ratio)
            .map_err(|e| SetCxlRatioError::Invalid(e.to_string()))?;
        tracing::info!(old = c.old, new = c.new, "cxl_ratio changed");
        Ok(SetCxlRatioResult {
            old_cxl_ratio: u32::from(c.old),
            cxl_ratio: u32::from(c.new),
            discarded_device_pages: c.discarded_device_pages,
            plane_evicted_pages: c.plane_evicted_pages,
        })
    }
    fn cxl_ratio(&self) -> Option<u32> {
        Some(u32::from(self.0.cxl_ratio()))
    }
}

/// Controller settings.
#[derive(Debug, Clone)]
pub struct ControlOptions {
    /// Bytes one VM may hold pinned.
    pub pin_quota_bytes: u64,
    /// The most bytes of file data (or pool bytes) one pin or prefetch
    /// covers; a pin over it is refused, a prefetch cut to it.
    pub max_range_bytes: u64,
    /// Bytes one VM may prefetch per second (a token bucket of that size).
    pub prefetch_budget_bytes: u64,
    /// Guests may run the device-wide commands (set_policy, set_prefetch,
    /// set_cxl_ratio, reset_stats).
    pub guest_device_control: bool,
}

/// The executor of control commands.
pub struct Controller {
    shared: Arc<SharedDevice>,
    metrics: Arc<Metrics>,
    dax: Option<Arc<DaxPlane>>,
    memory: Option<Arc<MemoryRegions>>,
    placement: Arc<dyn PlacementControl>,
    opts: ControlOptions,
    root: OwnedFd,
    proc_self_fd: OwnedFd,
    pins: Mutex<pins::PinTable>,
    budgets: Mutex<budget::Budgets>,
    daemon: DaemonSummary,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// The residency planes a controller reaches: the DAX window's and
/// memory mode's regions (either may be off).
#[derive(Debug, Clone, Default)]
pub struct Planes {
    /// The DAX plane.
    pub dax: Option<Arc<DaxPlane>>,
    /// The CXL memory regions.
    pub memory: Option<Arc<MemoryRegions>>,
}

/// Why the controller could not be built.
#[derive(Debug, thiserror::Error)]
pub enum NewControllerError {
    /// The shared directory (or /proc/self/fd) cannot be opened.
    #[error("cannot open {path}")]
    Open {
        /// The directory.
        path: String,
        /// OS error.
        #[source]
        source: io::Error,
    },
}

impl Controller {
    /// A controller over the daemon's device, metrics and (if on) DAX plane.
    /// `daemon` is what `get_config` reports about the daemon besides the
    /// device (shared dir, VMs, ...).
    pub fn new(
        shared: Arc<SharedDevice>,
        metrics: Arc<Metrics>,
        planes: Planes,
        placement: Arc<dyn PlacementControl>,
        shared_dir: &Path,
        opts: ControlOptions,
        daemon: DaemonSummary,
    ) -> Result<Arc<Self>, NewControllerError> {
        let open = |p: &Path| {
            rustix::fs::open(
                p,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| NewControllerError::Open {
                path: p.display().to_string(),
                source: e.into(),
            })
        };
        Ok(Arc::new(Controller {
            root: open(shared_dir)?,
            proc_self_fd: open(Path::new("/proc/self/fd"))?,
            shared,
            metrics,
            dax: planes.dax,
            memory: planes.memory,
            placement,
            opts,
            pins: Mutex::new(pins::PinTable::default()),
            budgets: Mutex::new(budget::Budgets::new()),
            daemon,
        }))
    }

    /// The settings.
    pub fn options(&self) -> &ControlOptions {
        &self.opts
    }

    /// The eviction policy and prefetcher (degree, stride) in force.
    pub fn policy_and_prefetch(&self) -> (String, u32, u32) {
        self.shared.read(|_, dev| {
            let c = dev.config();
            (
                c.cache.policy.name().to_string(),
                c.prefetch.degree,
                c.prefetch.stride_pages,
            )
        })
    }

    /// The host file the pool keeps open for the plane, if any.
    pub fn shared_pool_file(&self, key: FileKey) -> Option<Arc<File>> {
        self.dax.as_ref().and_then(|d| d.window_file(key))
    }

    /// Whether range commands also drive the residency plane.
    pub fn dax_on(&self) -> bool {
        self.dax.as_ref().is_some_and(|d| d.plane().is_some())
    }

    /// Statistics of one VM (the same counters as the Prometheus endpoint),
    /// with its pin quota.
    pub fn vm_stats(&self, vm: &str) -> Counters {
        let v = self.metrics.vm_if_known(vm);
        let pinned = self.pinned_bytes(&Principal::Vm(vm.to_string()));
        Counters {
            hits: v
                .as_ref()
                .map_or(0, |v| v.device_hits.load(Ordering::Relaxed)),
            misses: v
                .as_ref()
                .map_or(0, |v| v.device_misses.load(Ordering::Relaxed)),
            traps: self.metrics.traps_of(vm),
            pinned_bytes: pinned,
            pin_quota_bytes: Some(self.opts.pin_quota_bytes),
        }
    }
}

/// Why the control socket could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartControlError {
    /// Something else is listening on the path.
    #[error("control socket {0} is in use by another process")]
    InUse(String),
    /// The path exists and is not a socket.
    #[error("{0} exists and is not a socket; not replacing it")]
    NotASocket(String),
    /// bind / chmod failed.
    #[error("cannot create the control socket {path}")]
    Bind {
        /// The path.
        path: String,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// The accept thread could not be spawned.
    #[error("cannot spawn the control thread")]
    Spawn(#[source] io::Error),
    /// The controller could not be built.
    #[error("cannot set up cache control")]
    Controller(#[from] NewControllerError),
}
