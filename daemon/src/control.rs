//! Cache control at run time: prefetch, pin, unpin, evict, set_policy,
//! set_prefetch, set_cxl_ratio, query_stats, reset_stats, get_config.
//!
//! Two ways in, one executor ([`Controller`]):
//! * the host: a Unix stream socket (`--control-socket`, mode 0600 by
//!   default), one JSON request per line, one JSON reply per line
//!   ([`ControlSocket`], protocol in `docs/control-api.md`);
//! * a guest: `CXLFS_IOC_HINT` on a file of the share, which the guest
//!   kernel forwards as `FUSE_IOCTL` ([`crate::hint_ioctl`]). A guest acts
//!   only on files it could open, pins under a per-VM quota, and changes
//!   the device (policy, prefetcher, placement, counters) only when the
//!   daemon allows it (`--guest-device-control`).
//!
//! File ranges map to device pages through the pool (extents are allocated
//! as needed), exactly like the data path. The device lock is taken per
//! 2 MiB segment, so a large command never stalls the data path for long.
//! With DAX on, prefetched or pinned pages are also stored into the
//! residency plane (no trap on the next guest access) and evicted pages are
//! dropped from it before the command returns.

use crate::dax::DaxPlane;
use crate::fs::check_name;
use crate::metrics::Metrics;
use crate::pool::{FileKey, SharedDevice, EXTENT_SIZE};
use cxlfs_device_model::config::PolicyParams;
use cxlfs_device_model::{AccessError, PolicyKind, PAGE_SIZE};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Version of the socket protocol (`"v"` in every request and reply).
pub const PROTOCOL_VERSION: u64 = 1;
/// Longest request line accepted (bytes, newline excluded).
pub const MAX_REQUEST_LINE: usize = 64 * 1024;
/// Concurrent socket connections; more are answered with an error and closed.
pub const MAX_CONNECTIONS: usize = 16;
/// Default socket mode: owner only.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;
/// Default per-VM pin quota as a share of the device cache.
pub const DEFAULT_PIN_QUOTA_PERCENT: u64 = 25;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

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
    pub fn code(&self) -> &'static str {
        match self {
            ControlCommandError::BadRequest(_) => "bad_request",
            ControlCommandError::NotFound(_) => "not_found",
            ControlCommandError::Forbidden(_) => "forbidden",
            ControlCommandError::QuotaExceeded { .. } => "quota_exceeded",
            ControlCommandError::Device(AccessError::SetFullyPinned { .. }) => "cache_fully_pinned",
            ControlCommandError::Device(_) => "device_error",
            ControlCommandError::Io { .. } => "io_error",
        }
    }

    /// The errno a guest sees.
    pub fn errno(&self) -> Errno {
        match self {
            ControlCommandError::BadRequest(_) => Errno::INVAL,
            ControlCommandError::NotFound(_) => Errno::NOENT,
            ControlCommandError::Forbidden(_) => Errno::PERM,
            ControlCommandError::QuotaExceeded { .. } => Errno::DQUOT,
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
    fn set_cxl_ratio(&self, percent: u32) -> Result<Value, SetCxlRatioError>;
    /// The ratio in force.
    fn cxl_ratio(&self) -> Option<u32>;
}

/// The shared device's placement (`SharedDevice::set_cxl_ratio`): pages
/// that move to DRAM leave the device cache, pages that move to the
/// CXL-SSD leave the residency plane (their next access traps).
#[derive(Debug)]
pub struct DevicePlacement(pub Arc<SharedDevice>);

impl PlacementControl for DevicePlacement {
    fn set_cxl_ratio(&self, percent: u32) -> Result<Value, SetCxlRatioError> {
        let ratio = crate::placement::check_ratio(u64::from(percent))
            .map_err(|e| SetCxlRatioError::Invalid(e.to_string()))?;
        let c = self
            .0
            .set_cxl_ratio(ratio)
            .map_err(|e| SetCxlRatioError::Invalid(e.to_string()))?;
        tracing::info!(old = c.old, new = c.new, "cxl_ratio changed");
        Ok(json!({
            "old_cxl_ratio": c.old,
            "cxl_ratio": c.new,
            "discarded_device_pages": c.discarded_device_pages,
            "plane_evicted_pages": c.plane_evicted_pages,
        }))
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
    /// Guests may run the device-wide commands (set_policy, set_prefetch,
    /// set_cxl_ratio, reset_stats).
    pub guest_device_control: bool,
}

/// What a range command acts on.
#[derive(Debug, Clone)]
pub enum Target {
    /// Bytes of a host file.
    File {
        /// The file's pool key.
        key: FileKey,
        /// The file, open for the residency plane (DAX fill); `None`
        /// without DAX.
        file: Option<Arc<File>>,
        /// Its size in bytes.
        size: u64,
        /// First byte.
        offset: u64,
        /// Bytes; 0 = to the end of the file.
        len: u64,
    },
    /// A range of the pool (device address space); host only.
    Pool {
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

/// The four range commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOp {
    /// Bring into the device cache.
    Prefetch,
    /// Bring in and keep.
    Pin,
    /// Release pins.
    Unpin,
    /// Drop from the cache.
    Evict,
}

impl RangeOp {
    fn name(self) -> &'static str {
        match self {
            RangeOp::Prefetch => "prefetch",
            RangeOp::Pin => "pin",
            RangeOp::Unpin => "unpin",
            RangeOp::Evict => "evict",
        }
    }
}

/// What a range command did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeResult {
    /// Pages in the range.
    pub pages: u64,
    /// Pages filled from NAND (prefetch, pin), pinned by this caller (pin),
    /// released (unpin) or evicted (evict).
    pub changed: u64,
    /// Pages left alone: already pinned by this caller (pin), pinned pages
    /// an evict skipped, pages pinned by others an unpin left pinned.
    pub skipped: u64,
    /// Dirty pages an evict wrote back.
    pub written_back: u64,
    /// Pages stored into the residency plane (DAX on).
    pub plane_filled: u64,
    /// Pages dropped from the residency plane (DAX on).
    pub plane_evicted: u64,
    /// Device time (ns since daemon start) when the command is done.
    pub completes_at_ns: u64,
    /// Device time when it started.
    pub started_at_ns: u64,
}

/// One command, as parsed from either way in.
#[derive(Debug, Clone)]
pub enum Command {
    /// A range command.
    Range(RangeOp, Target),
    /// Switch the eviction policy.
    SetPolicy {
        /// Policy name.
        name: String,
        /// Parameters to change (keys of `cache.params`).
        params: Map<String, Value>,
    },
    /// Change the prefetcher.
    SetPrefetch {
        /// Pages prefetched after a miss (0 = off).
        degree: u32,
        /// Stride in pages (`None`: keep).
        stride: Option<u32>,
    },
    /// Change the DRAM/CXL ratio.
    SetCxlRatio {
        /// Percent.
        percent: u32,
    },
    /// Counters.
    QueryStats {
        /// One VM (`None`: all).
        vm: Option<String>,
    },
    /// Zero the counters.
    ResetStats,
    /// The effective configuration.
    GetConfig,
}

impl Command {
    /// Changes the whole device (not only a file range).
    fn is_device_wide(&self) -> bool {
        matches!(
            self,
            Command::SetPolicy { .. }
                | Command::SetPrefetch { .. }
                | Command::SetCxlRatio { .. }
                | Command::ResetStats
        )
    }
}

/// Pins held per device page: who holds them. A page stays pinned on the
/// device while anyone holds it; each VM's share counts against its quota.
#[derive(Debug, Default)]
struct PinTable {
    holders: BTreeMap<u64, BTreeSet<Principal>>,
}

impl PinTable {
    fn held_by(&self, who: &Principal) -> u64 {
        self.holders.values().filter(|h| h.contains(who)).count() as u64
    }
}

/// Per-VM statistics of `query_stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmStats {
    /// Device page hits caused by the VM.
    pub hits: u64,
    /// Device page misses caused by the VM.
    pub misses: u64,
    /// DAX pool traps attributed to the VM.
    pub traps: u64,
    /// Bytes the VM holds pinned.
    pub pinned_bytes: u64,
}

/// The executor of control commands.
pub struct Controller {
    shared: Arc<SharedDevice>,
    metrics: Arc<Metrics>,
    dax: Option<Arc<DaxPlane>>,
    placement: Arc<dyn PlacementControl>,
    opts: ControlOptions,
    root: OwnedFd,
    proc_self_fd: OwnedFd,
    pins: Mutex<PinTable>,
    config: Value,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
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
    /// `config` is what `get_config` reports about the daemon besides the
    /// device (shared dir, VMs, ...).
    pub fn new(
        shared: Arc<SharedDevice>,
        metrics: Arc<Metrics>,
        dax: Option<Arc<DaxPlane>>,
        placement: Arc<dyn PlacementControl>,
        shared_dir: &Path,
        opts: ControlOptions,
        config: Value,
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
            dax,
            placement,
            opts,
            pins: Mutex::new(PinTable::default()),
            config,
        }))
    }

    /// The settings.
    pub fn options(&self) -> &ControlOptions {
        &self.opts
    }

    /// The eviction policy and prefetcher (degree, stride) in force.
    pub fn policy_and_prefetch(&self) -> (String, u32, u32) {
        let dev = self.shared.device();
        let c = dev.config();
        (
            c.cache.policy.name().to_string(),
            c.prefetch.degree,
            c.prefetch.stride_pages,
        )
    }

    /// The host file the pool keeps open for the plane, if any.
    pub fn shared_pool_file(&self, key: FileKey) -> Option<Arc<File>> {
        self.shared.pool().dax_file(key)
    }

    /// Whether range commands also drive the residency plane.
    pub fn dax_on(&self) -> bool {
        self.dax.is_some() && self.shared.plane().is_some()
    }

    /// Resolves `path` (relative to the shared directory) to a regular file
    /// with the passthrough rules: one component at a time, `O_NOFOLLOW`,
    /// no `.`/`..`/empty components, no symlinks anywhere.
    pub fn resolve_file(&self, path: &str) -> Result<Target, ControlCommandError> {
        if path.is_empty() {
            return Err(bad("empty file path"));
        }
        if path.starts_with('/') {
            return Err(ControlCommandError::Forbidden(format!(
                "file path `{path}` must be relative to the shared directory"
            )));
        }
        let parts: Vec<&str> = path.split('/').collect();
        let mut dir = rustix::io::dup(&self.root).map_err(|e| ControlCommandError::Io {
            what: "dup the shared directory".into(),
            source: e.into(),
        })?;
        for (i, part) in parts.iter().enumerate() {
            if check_name(part.as_bytes()).is_err() {
                return Err(ControlCommandError::Forbidden(format!(
                    "file path `{path}`: component `{part}` is not allowed (no empty, `.`, `..` or over-long components)"
                )));
            }
            let last = i + 1 == parts.len();
            let fd = rustix::fs::openat(
                &dir,
                *part,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| match e {
                Errno::NOENT => ControlCommandError::NotFound(format!(
                    "`{path}`: no such file in the shared directory"
                )),
                e => ControlCommandError::Io {
                    what: format!("open `{path}`"),
                    source: e.into(),
                },
            })?;
            let st = rustix::fs::fstat(&fd).map_err(|e| ControlCommandError::Io {
                what: format!("stat `{path}`"),
                source: e.into(),
            })?;
            let kind = st.st_mode & libc::S_IFMT;
            if kind == libc::S_IFLNK {
                return Err(ControlCommandError::Forbidden(format!(
                    "`{path}`: `{part}` is a symlink; symlinks are not followed"
                )));
            }
            if !last {
                if kind != libc::S_IFDIR {
                    return Err(ControlCommandError::NotFound(format!(
                        "`{path}`: `{part}` is not a directory"
                    )));
                }
                dir = fd;
                continue;
            }
            if kind != libc::S_IFREG {
                return Err(bad(format!("`{path}` is not a regular file")));
            }
            let key = FileKey {
                dev: st.st_dev,
                ino: st.st_ino,
            };
            let file = if self.dax_on() {
                Some(self.pool_file(key, &fd)?)
            } else {
                None
            };
            return Ok(Target::File {
                key,
                file,
                size: st.st_size as u64,
                offset: 0,
                len: 0,
            });
        }
        Err(bad("empty file path"))
    }

    /// The host file kept open for the residency plane: the pool's, or a
    /// fresh read-write open through `/proc/self/fd` (never a path lookup).
    fn pool_file(&self, key: FileKey, opath: &OwnedFd) -> Result<Arc<File>, ControlCommandError> {
        if let Some(f) = self.shared.pool().dax_file(key) {
            return Ok(f);
        }
        let name = opath_name(opath);
        let fd = rustix::fs::openat(
            &self.proc_self_fd,
            name.as_str(),
            OFlags::RDWR | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .or_else(|_| {
            rustix::fs::openat(
                &self.proc_self_fd,
                name.as_str(),
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
        })
        .map_err(|e| ControlCommandError::Io {
            what: "reopen the file for the residency plane".into(),
            source: e.into(),
        })?;
        Ok(Arc::new(File::from(fd)))
    }

    /// Runs one command for `who`.
    pub fn execute(&self, who: &Principal, cmd: Command) -> Result<Value, ControlCommandError> {
        if matches!(who, Principal::Vm(_))
            && cmd.is_device_wide()
            && !self.opts.guest_device_control
        {
            return Err(ControlCommandError::Forbidden(
                "guests may not change the device (cxlfsd --guest-device-control is off)".into(),
            ));
        }
        let span = tracing::info_span!("control", who = who.label());
        let _g = span.enter();
        match cmd {
            Command::Range(op, target) => {
                let r = self.range(who, op, target)?;
                tracing::info!(
                    op = op.name(),
                    pages = r.pages,
                    changed = r.changed,
                    "range command"
                );
                Ok(self.range_json(who, &r))
            }
            Command::SetPolicy { name, params } => self.set_policy(&name, params),
            Command::SetPrefetch { degree, stride } => self.set_prefetch(degree, stride),
            Command::SetCxlRatio { percent } => self
                .placement
                .set_cxl_ratio(percent)
                .map_err(|SetCxlRatioError::Invalid(m)| bad(m)),
            Command::QueryStats { vm } => self.query_stats(vm.as_deref()),
            Command::ResetStats => {
                self.shared.device().reset_stats();
                self.metrics.reset_device_counters();
                tracing::info!("statistics reset");
                Ok(json!({"reset": true}))
            }
            Command::GetConfig => Ok(self.get_config()),
        }
    }

    fn range_json(&self, who: &Principal, r: &RangeResult) -> Value {
        let mut v = json!({
            "pages": r.pages,
            "changed": r.changed,
            "skipped": r.skipped,
            "written_back": r.written_back,
            "plane_filled": r.plane_filled,
            "plane_evicted": r.plane_evicted,
            "latency_ns": r.completes_at_ns.saturating_sub(r.started_at_ns),
            "completes_at_ns": r.completes_at_ns,
        });
        if let Principal::Vm(_) = who {
            v["pinned_bytes"] = json!(lock(&self.pins).held_by(who) * PAGE_SIZE);
            v["pin_quota_bytes"] = json!(self.opts.pin_quota_bytes);
        }
        v
    }

    /// Device segments of a target, checked.
    fn segments(
        &self,
        who: &Principal,
        target: &Target,
    ) -> Result<Vec<(u64, u64)>, ControlCommandError> {
        match *target {
            Target::File {
                key,
                size,
                offset,
                len,
                ..
            } => {
                let (offset, end) = file_span(target).ok_or_else(|| {
                    bad(format!(
                        "range {offset}+{len} is not inside the file ({size} bytes)"
                    ))
                })?;
                Ok(self
                    .shared
                    .pool()
                    .segments(key, offset, end - offset)
                    .into_iter()
                    .map(|s| (s.addr, u64::from(s.len)))
                    .collect())
            }
            Target::Pool { offset, len } => {
                if *who != Principal::Host {
                    return Err(ControlCommandError::Forbidden(
                        "guests may only name file ranges".into(),
                    ));
                }
                let cap = self.shared.pool().capacity_extents() * EXTENT_SIZE;
                if len == 0 || offset.checked_add(len).map_or(true, |e| e > cap) {
                    return Err(bad(format!(
                        "pool range {offset:#x}+{len:#x} is empty or beyond the pool ({cap:#x} bytes)"
                    )));
                }
                let mut out = Vec::new();
                let mut pos = offset;
                while pos < offset + len {
                    let n = (EXTENT_SIZE - pos % EXTENT_SIZE).min(offset + len - pos);
                    out.push((pos, n));
                    pos += n;
                }
                Ok(out)
            }
        }
    }

    /// Runs a range command.
    pub fn range(
        &self,
        who: &Principal,
        op: RangeOp,
        target: Target,
    ) -> Result<RangeResult, ControlCommandError> {
        let segs = self.segments(who, &target)?;
        let now = self.shared.now_ns();
        let mut r = RangeResult {
            completes_at_ns: now,
            started_at_ns: now,
            ..RangeResult::default()
        };
        match op {
            RangeOp::Prefetch => {
                let mut fresh = Vec::new();
                for &(addr, len) in &segs {
                    let mut dev = self.shared.device();
                    let before: Vec<u64> = pages_of(addr, len)
                        .filter(|&p| !dev.is_resident(p * PAGE_SIZE))
                        .collect();
                    let o = dev.prefetch(now, addr, len)?;
                    fresh.extend(
                        before
                            .into_iter()
                            .filter(|&p| dev.is_resident(p * PAGE_SIZE)),
                    );
                    let evicted = dev.drain_evictions();
                    drop(dev);
                    self.mirror(evicted, false);
                    r.pages += o.pages;
                    r.changed += o.filled;
                    r.completes_at_ns = r.completes_at_ns.max(o.completes_at_ns);
                }
                r.plane_filled = self.fill_plane(&target, &fresh);
            }
            RangeOp::Pin => self.pin(who, &target, &segs, now, &mut r)?,
            RangeOp::Unpin => {
                let mut pins = lock(&self.pins);
                for &(addr, len) in &segs {
                    let mut dev = self.shared.device();
                    for p in pages_of(addr, len) {
                        r.pages += 1;
                        let release = match pins.holders.get_mut(&p) {
                            Some(h) if *who == Principal::Host => {
                                h.clear();
                                true
                            }
                            Some(h) => {
                                if h.remove(who) {
                                    r.changed += 1;
                                } else {
                                    r.skipped += 1;
                                }
                                h.is_empty()
                            }
                            None => *who == Principal::Host,
                        };
                        if release {
                            pins.holders.remove(&p);
                            let was = dev.unpin(p * PAGE_SIZE, PAGE_SIZE)?;
                            if *who == Principal::Host {
                                r.changed += was;
                            }
                        }
                    }
                }
            }
            RangeOp::Evict => {
                let mut evicted = Vec::new();
                for &(addr, len) in &segs {
                    let mut dev = self.shared.device();
                    let o = dev.evict(now, addr, len)?;
                    evicted.extend(dev.drain_evictions());
                    drop(dev);
                    r.pages += pages_of(addr, len).count() as u64;
                    r.changed += o.evicted;
                    r.skipped += o.skipped_pinned;
                    r.written_back += o.written_back;
                    r.completes_at_ns = r.completes_at_ns.max(o.completes_at_ns);
                }
                r.plane_evicted = self.mirror(evicted, true);
            }
        }
        Ok(r)
    }

    fn pin(
        &self,
        who: &Principal,
        target: &Target,
        segs: &[(u64, u64)],
        now: u64,
        r: &mut RangeResult,
    ) -> Result<(), ControlCommandError> {
        let mut pins = lock(&self.pins);
        self.prune(&mut pins);
        let pages: Vec<u64> = segs.iter().flat_map(|&(a, l)| pages_of(a, l)).collect();
        let new: Vec<u64> = pages
            .iter()
            .copied()
            .filter(|p| !pins.holders.get(p).is_some_and(|h| h.contains(who)))
            .collect();
        if let Principal::Vm(vm) = who {
            let held = pins.held_by(who) * PAGE_SIZE;
            let want = new.len() as u64 * PAGE_SIZE;
            if held + want > self.opts.pin_quota_bytes {
                return Err(ControlCommandError::QuotaExceeded {
                    vm: vm.clone(),
                    requested_bytes: want,
                    held_bytes: held,
                    quota_bytes: self.opts.pin_quota_bytes,
                });
            }
        }
        // Pin page by page so that a refusal can be rolled back exactly.
        let mut newly_pinned = Vec::new();
        let mut fresh = Vec::new();
        let mut failure = None;
        let mut evicted = Vec::new();
        {
            let mut dev = self.shared.device();
            for &p in &new {
                let addr = p * PAGE_SIZE;
                if dev.is_pinned(addr) {
                    continue;
                }
                let resident = dev.is_resident(addr);
                match dev.pin(now, addr, PAGE_SIZE) {
                    Ok(o) => {
                        newly_pinned.push(p);
                        if !resident {
                            fresh.push(p);
                        }
                        r.completes_at_ns = r.completes_at_ns.max(o.completes_at_ns);
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            if failure.is_some() {
                for &p in &newly_pinned {
                    let _ = dev.unpin(p * PAGE_SIZE, PAGE_SIZE);
                }
            }
            evicted.extend(dev.drain_evictions());
        }
        self.mirror(evicted, false);
        if let Some(e) = failure {
            return Err(e.into());
        }
        for &p in &new {
            pins.holders.entry(p).or_default().insert(who.clone());
        }
        r.pages = pages.len() as u64;
        r.changed = new.len() as u64;
        r.skipped = r.pages - r.changed;
        drop(pins);
        r.plane_filled = self.fill_plane(target, &fresh);
        Ok(())
    }

    /// Drops pin records of pages the device no longer holds pinned (their
    /// file was deleted and its pages discarded).
    fn prune(&self, pins: &mut PinTable) {
        let dev = self.shared.device();
        pins.holders.retain(|&p, _| dev.is_pinned(p * PAGE_SIZE));
    }

    /// Drops evicted pages (of DAX-mapped extents) from the residency
    /// plane; `wait`: until the kernel has done it (dirty pages written
    /// back). Returns the pages handed over.
    fn mirror(&self, evicted: Vec<u64>, wait: bool) -> u64 {
        let Some(plane) = self.shared.plane() else {
            return 0;
        };
        let mut pages: Vec<u64> = {
            let pool = self.shared.pool();
            evicted
                .into_iter()
                .filter(|p| pool.is_dax_extent(p * PAGE_SIZE / EXTENT_SIZE))
                .collect()
        };
        pages.sort_unstable();
        pages.dedup();
        let n = pages.len() as u64;
        for (first, count) in runs(&pages) {
            match plane.evict(first * PAGE_SIZE, count * PAGE_SIZE) {
                Ok(t) if wait => {
                    if let Err(e) = t.wait() {
                        tracing::warn!(error = %e, "plane eviction failed");
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot evict pool pages from the plane"),
            }
        }
        n
    }

    /// DAX on: stores `pages` (device pages a prefetch or pin just brought
    /// into the device cache) into the residency plane with the host file's
    /// bytes, so that the guest's next access does not trap. Only pages of
    /// file targets; each chunk gets its DAX extent first (as SETUPMAPPING
    /// would), so later device evictions reach the plane too.
    fn fill_plane(&self, target: &Target, pages: &[u64]) -> u64 {
        let (
            Target::File {
                key,
                file: Some(file),
                ..
            },
            Some(dax),
        ) = (target, self.dax.as_ref())
        else {
            return 0;
        };
        if pages.is_empty() {
            return 0;
        }
        // Device page -> file offset, through the extents the pool gave the
        // file's chunks (each chunk gets its DAX extent, as SETUPMAPPING would).
        let Some((start, end)) = file_span(target) else {
            return 0;
        };
        let mut by_extent: BTreeMap<u64, u64> = BTreeMap::new(); // extent -> chunk
        {
            let mut pool = self.shared.pool();
            for c in start / EXTENT_SIZE..end.div_ceil(EXTENT_SIZE) {
                if let Some(e) = pool.dax_extent(*key, c, file) {
                    by_extent.insert(e, c);
                }
            }
        }
        // Runs of consecutive pages, cut at extent ends, in extents the
        // file owns; the plane stores them only where that cannot race a
        // guest store (`DaxPlane::fill_from_file`).
        let mut sorted = pages.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let per_extent = EXTENT_SIZE / PAGE_SIZE;
        let mut filled = 0u64;
        for (first, count) in runs(&sorted) {
            let mut p = first;
            while p < first + count {
                let n = (first + count).min((p / per_extent + 1) * per_extent) - p;
                if by_extent.contains_key(&(p / per_extent)) {
                    filled += dax.fill_from_file(p, n);
                }
                p += n;
            }
        }
        filled
    }

    fn set_policy(
        &self,
        name: &str,
        params: Map<String, Value>,
    ) -> Result<Value, ControlCommandError> {
        let kind: PolicyKind = name.parse().map_err(bad)?;
        let mut dev = self.shared.device();
        let previous = dev.config().cache.policy;
        let mut merged =
            serde_json::to_value(&dev.config().cache.params).map_err(|e| bad(e.to_string()))?;
        for (k, v) in params {
            let slot = merged
                .get_mut(&k)
                .ok_or_else(|| bad(format!("unknown policy parameter `{k}`")))?;
            *slot = v;
        }
        let params: PolicyParams =
            serde_json::from_value(merged).map_err(|e| bad(format!("policy parameters: {e}")))?;
        dev.set_policy_with_params(kind, params.clone())
            .map_err(|e| bad(e.to_string()))?;
        drop(dev);
        tracing::info!(from = %previous, to = %kind, "eviction policy switched");
        Ok(json!({
            "policy": kind.name(),
            "previous": previous.name(),
            "params": params,
        }))
    }

    fn set_prefetch(&self, degree: u32, stride: Option<u32>) -> Result<Value, ControlCommandError> {
        let mut dev = self.shared.device();
        let stride = stride.unwrap_or(dev.config().prefetch.stride_pages);
        let mut cfg = dev.config().clone();
        cfg.prefetch.degree = degree;
        cfg.prefetch.stride_pages = stride;
        if stride == 0 {
            return Err(bad("stride must be at least 1 page"));
        }
        cfg.validate().map_err(|e| bad(e.to_string()))?;
        dev.set_prefetch(degree, stride);
        drop(dev);
        tracing::info!(degree, stride, "prefetcher changed");
        Ok(json!({"degree": degree, "stride": stride}))
    }

    /// Statistics of one VM (the same counters as the Prometheus endpoint).
    pub fn vm_stats(&self, vm: &str) -> VmStats {
        let v = self.metrics.vm_if_known(vm);
        let pinned = lock(&self.pins).held_by(&Principal::Vm(vm.to_string())) * PAGE_SIZE;
        VmStats {
            hits: v
                .as_ref()
                .map_or(0, |v| v.device_hits.load(Ordering::Relaxed)),
            misses: v
                .as_ref()
                .map_or(0, |v| v.device_misses.load(Ordering::Relaxed)),
            traps: self.metrics.traps_of(vm),
            pinned_bytes: pinned,
        }
    }

    fn query_stats(&self, vm: Option<&str>) -> Result<Value, ControlCommandError> {
        {
            let mut pins = lock(&self.pins);
            self.prune(&mut pins);
        }
        let names: Vec<String> = match vm {
            Some(name) => {
                if self.metrics.vm_if_known(name).is_none() {
                    return Err(ControlCommandError::NotFound(format!(
                        "no VM named `{name}`"
                    )));
                }
                vec![name.to_string()]
            }
            None => self.metrics.vm_names(),
        };
        let st = self.shared.stats();
        let cfg = self.shared.device().config().prefetch.clone();
        let mut vms = Map::new();
        for n in &names {
            let s = self.vm_stats(n);
            vms.insert(
                n.clone(),
                json!({"hits": s.hits, "misses": s.misses, "traps": s.traps, "pinned_bytes": s.pinned_bytes,
                       "pin_quota_bytes": self.opts.pin_quota_bytes}),
            );
        }
        Ok(json!({
            "policy": st.policy,
            "prefetch": {"degree": cfg.degree, "stride": cfg.stride_pages},
            "cxl_ratio": self.placement.cxl_ratio(),
            "vms": vms,
            "total": {
                "hits": st.hits,
                "misses": st.misses,
                "traps": self.metrics.traps_total(),
                "pinned_bytes": st.pinned_pages * PAGE_SIZE,
            },
            "device": st,
        }))
    }

    fn get_config(&self) -> Value {
        let dev = self.shared.device();
        let mut v = self.config.clone();
        if let Value::Object(m) = &mut v {
            m.insert("protocol_version".into(), json!(PROTOCOL_VERSION));
            m.insert(
                "device".into(),
                serde_json::to_value(dev.config()).unwrap_or(Value::Null),
            );
            m.insert("device_toml".into(), json!(dev.config().to_toml_string()));
            m.insert("pin_quota_bytes".into(), json!(self.opts.pin_quota_bytes));
            m.insert(
                "guest_device_control".into(),
                json!(self.opts.guest_device_control),
            );
            m.insert("dax".into(), json!(self.dax_on()));
            m.insert("cxl_ratio".into(), json!(self.placement.cxl_ratio()));
        }
        v
    }
}

/// The byte span `[start, end)` a file target covers: only the file's own
/// pages (up to its last page); `len` 0 = to the end. `None` when empty,
/// past the end, or overflowing.
fn file_span(target: &Target) -> Option<(u64, u64)> {
    let Target::File {
        size, offset, len, ..
    } = *target
    else {
        return None;
    };
    let limit = size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
    if offset >= limit {
        return None;
    }
    let end = if len == 0 {
        limit
    } else {
        offset.checked_add(len)?.min(limit)
    };
    Some((offset, end))
}

/// `/proc/self/fd` entry name of an fd.
fn opath_name(fd: &OwnedFd) -> String {
    use std::os::fd::AsRawFd;
    fd.as_fd().as_raw_fd().to_string()
}

/// Device page numbers of `[addr, addr + len)`.
fn pages_of(addr: u64, len: u64) -> impl Iterator<Item = u64> {
    let first = addr / PAGE_SIZE;
    let end = (addr + len).div_ceil(PAGE_SIZE);
    first..end
}

/// `(first, count)` runs of consecutive numbers in a sorted slice.
fn runs(sorted: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &p in sorted {
        match out.last_mut() {
            Some((first, count)) if *first + *count == p => *count += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

// ------------------------------------------------------------------ protocol

/// A range in a request: a file of the share or a pool range.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RangeArgs {
    file: Option<String>,
    pool_offset: Option<u64>,
    offset: Option<u64>,
    len: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
enum Wire {
    Prefetch(RangeArgs),
    Pin(RangeArgs),
    Unpin(RangeArgs),
    Evict(RangeArgs),
    SetPolicy {
        name: String,
        #[serde(default)]
        params: Map<String, Value>,
    },
    SetPrefetch {
        degree: u32,
        stride: Option<u32>,
    },
    SetCxlRatio {
        percent: u32,
    },
    QueryStats {
        vm: Option<String>,
    },
    ResetStats {},
    GetConfig {},
}

/// A reply line: `{"v":1,"id":..,"ok":true,"result":..}` or
/// `{"v":1,"id":..,"ok":false,"error":{"code":..,"message":..}}`.
pub fn reply_line(id: &Value, result: Result<Value, (&str, String)>) -> String {
    let v = match result {
        Ok(r) => json!({"v": PROTOCOL_VERSION, "id": id, "ok": true, "result": r}),
        Err((code, message)) => json!({"v": PROTOCOL_VERSION, "id": id, "ok": false,
                                        "error": {"code": code, "message": message}}),
    };
    let mut s = v.to_string();
    s.push('\n');
    s
}

impl Controller {
    fn wire_to_command(&self, w: Wire) -> Result<Command, ControlCommandError> {
        let range = |op: RangeOp, a: RangeArgs| -> Result<Command, ControlCommandError> {
            let target = match (a.file, a.pool_offset) {
                (Some(path), None) => match self.resolve_file(&path)? {
                    Target::File {
                        key, file, size, ..
                    } => Target::File {
                        key,
                        file,
                        size,
                        offset: a.offset.unwrap_or(0),
                        len: a.len.unwrap_or(0),
                    },
                    t @ Target::Pool { .. } => t,
                },
                (None, Some(off)) => {
                    if a.offset.is_some() {
                        return Err(bad(
                            "a pool range takes `pool_offset` and `len`, not `offset`",
                        ));
                    }
                    Target::Pool {
                        offset: off,
                        len: a.len.ok_or_else(|| bad("a pool range needs `len`"))?,
                    }
                }
                _ => return Err(bad("give exactly one of `file` and `pool_offset`")),
            };
            Ok(Command::Range(op, target))
        };
        Ok(match w {
            Wire::Prefetch(a) => range(RangeOp::Prefetch, a)?,
            Wire::Pin(a) => range(RangeOp::Pin, a)?,
            Wire::Unpin(a) => range(RangeOp::Unpin, a)?,
            Wire::Evict(a) => range(RangeOp::Evict, a)?,
            Wire::SetPolicy { name, params } => Command::SetPolicy { name, params },
            Wire::SetPrefetch { degree, stride } => Command::SetPrefetch { degree, stride },
            Wire::SetCxlRatio { percent } => Command::SetCxlRatio { percent },
            Wire::QueryStats { vm } => Command::QueryStats { vm },
            Wire::ResetStats {} => Command::ResetStats,
            Wire::GetConfig {} => Command::GetConfig,
        })
    }

    /// Handles one request line from the host; returns the reply line and
    /// the device time to hold it until (the command's modeled completion).
    pub fn handle_line(&self, line: &[u8]) -> (String, u64) {
        let now = self.shared.now_ns();
        let parsed: Value = match serde_json::from_slice(line) {
            Ok(v) => v,
            Err(e) => {
                return (
                    reply_line(&Value::Null, Err(("parse_error", format!("not JSON: {e}")))),
                    now,
                )
            }
        };
        let Value::Object(mut obj) = parsed else {
            return (
                reply_line(
                    &Value::Null,
                    Err(("bad_request", "a request is a JSON object".into())),
                ),
                now,
            );
        };
        let id = obj.remove("id").unwrap_or(Value::Null);
        if matches!(id, Value::Object(_) | Value::Array(_)) {
            return (
                reply_line(
                    &Value::Null,
                    Err((
                        "bad_request",
                        "`id` must be a string, number or null".into(),
                    )),
                ),
                now,
            );
        }
        match obj.remove("v") {
            Some(Value::Number(n)) if n.as_u64() == Some(PROTOCOL_VERSION) => {}
            Some(other) => {
                return (
                    reply_line(
                        &id,
                        Err((
                            "unsupported_version",
                            format!("protocol version {other} is not supported (this daemon speaks {PROTOCOL_VERSION})"),
                        )),
                    ),
                    now,
                )
            }
            None => {
                return (
                    reply_line(
                        &id,
                        Err(("bad_request", format!("missing protocol version `v` (use {PROTOCOL_VERSION})"))),
                    ),
                    now,
                )
            }
        }
        let known = [
            "prefetch",
            "pin",
            "unpin",
            "evict",
            "set_policy",
            "set_prefetch",
            "set_cxl_ratio",
            "query_stats",
            "reset_stats",
            "get_config",
        ];
        match obj.get("cmd") {
            Some(Value::String(c)) if known.contains(&c.as_str()) => {}
            Some(c) => {
                return (
                    reply_line(
                        &id,
                        Err((
                            "unknown_command",
                            format!("unknown command {c} (known: {})", known.join(", ")),
                        )),
                    ),
                    now,
                )
            }
            None => {
                return (
                    reply_line(&id, Err(("bad_request", "missing `cmd`".into()))),
                    now,
                )
            }
        }
        let wire: Wire = match serde_json::from_value(Value::Object(obj)) {
            Ok(w) => w,
            Err(e) => return (reply_line(&id, Err(("bad_request", e.to_string()))), now),
        };
        let result = self
            .wire_to_command(wire)
            .and_then(|c| self.execute(&Principal::Host, c));
        match result {
            Ok(v) => {
                let until = v
                    .get("completes_at_ns")
                    .and_then(Value::as_u64)
                    .unwrap_or(now);
                (reply_line(&id, Ok(v)), until)
            }
            Err(e) => {
                tracing::info!(code = e.code(), error = %e, "control command refused");
                (reply_line(&id, Err((e.code(), e.to_string()))), now)
            }
        }
    }

    /// Sleeps until device time `until_ns` (a reply is not released before
    /// the modeled completion of its command).
    fn wait_until(&self, until_ns: u64) {
        loop {
            let now = self.shared.now_ns();
            if now >= until_ns {
                return;
            }
            thread::sleep(Duration::from_nanos(until_ns - now));
        }
    }
}

// ------------------------------------------------------------------- socket

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

/// Builds the daemon's [`Controller`] (guest hints go through it from now
/// on) and, if `--control-socket` is set, starts the socket.
pub fn start(
    cfg: &crate::config::DaemonConfig,
    state: &Arc<crate::daemon::DaemonState>,
) -> Result<Option<ControlSocket>, StartControlError> {
    let quota = cfg
        .control
        .pin_quota_bytes
        .unwrap_or(cfg.device.cache.size_bytes * DEFAULT_PIN_QUOTA_PERCENT / 100);
    let about = json!({
        "shared_dir": cfg.shared_dir.display().to_string(),
        "vms": cfg.vms.iter().map(|v| json!({"name": v.name, "socket": v.socket.display().to_string()})).collect::<Vec<_>>(),
        "cache": format!("{:?}", cfg.cache).to_lowercase(),
        "dax_window": cfg.dax.window,
        "metrics_addr": cfg.metrics_addr.map(|a| a.to_string()),
        "control_socket": cfg.control.socket.as_ref().map(|p| p.display().to_string()),
        "control_socket_mode": format!("{:04o}", cfg.control.socket_mode),
        "device_origin": cfg.device_origin,
    });
    let controller = Controller::new(
        state.shared.clone(),
        state.metrics.clone(),
        state.dax().cloned(),
        Arc::new(DevicePlacement(state.shared.clone())),
        &cfg.shared_dir,
        ControlOptions {
            pin_quota_bytes: quota,
            guest_device_control: cfg.control.guest_device_control,
        },
        about,
    )?;
    state.set_control(controller.clone());
    tracing::info!(
        pin_quota_bytes = quota,
        guest_device_control = cfg.control.guest_device_control,
        "guest cache hints on (FUSE_IOCTL)"
    );
    match &cfg.control.socket {
        Some(path) => ControlSocket::start(path, cfg.control.socket_mode, controller).map(Some),
        None => Ok(None),
    }
}

/// The listening control socket; removed on [`ControlSocket::shutdown`].
#[derive(Debug)]
pub struct ControlSocket {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl ControlSocket {
    /// Listens on `path` (mode `mode`, e.g. 0o600) for host commands.
    pub fn start(
        path: &Path,
        mode: u32,
        controller: Arc<Controller>,
    ) -> Result<ControlSocket, StartControlError> {
        let shown = path.display().to_string();
        if let Ok(md) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !md.file_type().is_socket() {
                return Err(StartControlError::NotASocket(shown));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(StartControlError::InUse(shown));
            }
            // A stale socket of an earlier run.
            let _ = std::fs::remove_file(path);
        }
        // Created owner-only (umask), then set to `mode`: nobody else can
        // connect in between.
        // SAFETY: umask(2) only swaps the process's file-creation mask.
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(path);
        // SAFETY: as above, restoring the previous mask.
        unsafe { libc::umask(old) };
        let listener = bound.map_err(|source| StartControlError::Bind {
            path: shown.clone(),
            source,
        })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o777)).map_err(
            |source| StartControlError::Bind {
                path: shown.clone(),
                source,
            },
        )?;
        listener
            .set_nonblocking(true)
            .map_err(|source| StartControlError::Bind {
                path: shown.clone(),
                source,
            })?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = thread::Builder::new()
            .name("cxlfsd-control".into())
            .spawn(move || accept_loop(listener, controller, stop2))
            .map_err(StartControlError::Spawn)?;
        tracing::info!(path = %shown, mode = format_args!("{:o}", mode & 0o777), "control socket up");
        Ok(ControlSocket {
            path: path.to_path_buf(),
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting and removes the socket file. Idempotent.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: UnixListener, controller: Arc<Controller>, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        let fd = listener.as_fd();
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(Errno::INTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "poll on the control socket failed");
                thread::sleep(Duration::from_millis(200));
                continue;
            }
        }
        let (mut stream, _) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept on the control socket failed");
                continue;
            }
        };
        let _ = stream.set_nonblocking(false);
        let peer = peer_cred(&stream);
        if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            let _ = stream.write_all(
                reply_line(
                    &Value::Null,
                    Err((
                        "busy",
                        format!("too many control connections (at most {MAX_CONNECTIONS})"),
                    )),
                )
                .as_bytes(),
            );
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let c = controller.clone();
        let a = active.clone();
        let spawned = thread::Builder::new()
            .name("cxlfsd-ctl-conn".into())
            .spawn(move || {
                tracing::debug!(peer_uid = ?peer.map(|p| p.0), peer_pid = ?peer.map(|p| p.1), "control connection");
                serve_connection(stream, &c);
                a.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "cannot spawn a control connection thread");
        }
    }
}

/// `(uid, pid)` of the peer (`SO_PEERCRED`), for the logs.
fn peer_cred(stream: &UnixStream) -> Option<(u32, i32)> {
    use std::os::fd::AsRawFd;
    // SAFETY: ucred is plain data; all-zero is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred`/`len` are valid for writes of `len` bytes; the fd is
    // borrowed from `stream` for the call.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some((cred.uid, cred.pid))
}

/// One line of input, bounded.
enum Line {
    /// A complete line (newline stripped).
    Full(Vec<u8>),
    /// Longer than the limit: skipped up to its newline.
    TooLong,
    /// End of input.
    Eof,
}

fn read_line_bounded(r: &mut impl BufRead, max: usize) -> io::Result<Line> {
    let mut buf = Vec::new();
    let mut too_long = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(if too_long {
                Line::TooLong
            } else if buf.is_empty() {
                Line::Eof
            } else {
                Line::Full(buf)
            });
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > max {
                too_long = true;
                buf = Vec::new();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        r.consume(take + usize::from(done));
        if done {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Full(buf)
            });
        }
    }
}

fn serve_connection(stream: UnixStream, controller: &Controller) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot clone a control connection");
            return;
        }
    };
    let mut reader = BufReader::new(stream);
    loop {
        let reply = match read_line_bounded(&mut reader, MAX_REQUEST_LINE) {
            Ok(Line::Eof) => return,
            Ok(Line::TooLong) => reply_line(
                &Value::Null,
                Err((
                    "too_large",
                    format!("request line longer than {MAX_REQUEST_LINE} bytes; ignored"),
                )),
            ),
            Ok(Line::Full(line)) => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let (reply, until) = controller.handle_line(&line);
                controller.wait_until(until);
                reply
            }
            Err(e) => {
                tracing::debug!(error = %e, "control connection read failed");
                return;
            }
        };
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bounded_lines() {
        let data = b"short\n0123456789abcdef\nok\nlast";
        let mut r = BufReader::with_capacity(4, &data[..]);
        let mut got = Vec::new();
        loop {
            match read_line_bounded(&mut r, 8).unwrap() {
                Line::Full(l) => got.push(String::from_utf8(l).unwrap()),
                Line::TooLong => got.push("<too long>".into()),
                Line::Eof => break,
            }
        }
        assert_eq!(got, ["short", "<too long>", "ok", "last"]);
    }

    #[test]
    fn runs_coalesce() {
        assert_eq!(runs(&[1, 2, 3, 7, 9, 10]), [(1, 3), (7, 1), (9, 2)]);
        assert!(runs(&[]).is_empty());
        assert_eq!(pages_of(4095, 2).collect::<Vec<_>>(), [0, 1]);
    }
}
