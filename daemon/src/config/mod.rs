//! Command line and `daemon.toml`: flags override the file.
//!
//! Both give a [`Settings`] (every field optional; `settings.rs`: the
//! file, `cli.rs`: the flags); the flags' settings are layered over the file's
//! field by field ([`Settings::over`]), and `DaemonConfig::try_from` is the
//! one step that applies defaults and validates ([`DaemonConfig::load`]).
//!
//! ```toml
//! shared_dir = "/srv/share"
//! cache = "auto"                 # never | auto | always
//! metrics_addr = "127.0.0.1:9640"
//! device = "cylon"               # a preset name ...
//! # ... or an inline device-model config (may name a `preset` to start from):
//! # [device]
//! # preset = "cylon"
//! # cache.size_bytes = "64MiB"
//!
//! dax = "off"                   # DAX window (default on); dax_window, pool_dir,
//!                               # dax_writeback_interval = "5s", dax_reply_timeout = "10s"
//! control_socket = "/run/cxlfsd/control.sock"  # cache control (docs/control-api.md)
//! # control_socket_mode = "0600", pin_quota_bytes = "16MiB", guest_device_control = false
//! cxl_ratio = 50                # % of file pages on the CXL-SSD (default 100)
//! metrics_file = "/tmp/m.jsonl" # JSON-lines time series; metrics_interval = "1s"
//!
//! [[vm]]
//! name = "vm0"
//! socket = "/tmp/cxlfs-vm0.sock"
//! ```
//!
//! Device settings: the file's `device` (default preset `cylon`), replaced
//! by `--preset NAME` if given, then every `--set key=value` in order —
//! exactly like `cxlfs replay`.

mod cli;
mod settings;

pub use cli::Cli;
pub use settings::{FileConfig, Settings};

use crate::backend::QueueOptions;
use crate::passthrough::{CacheMode, GuestIds, IdMap};
use cxlfs_device_model::presets::preset;
use cxlfs_device_model::{DeviceConfig, LoadConfigError};
use residency::pace::Compensation;
use serde::Deserialize;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The preset used when neither the file nor `--preset` names a device.
pub const DEFAULT_PRESET: &str = "cylon";

/// Control socket and cache-hint settings (see [`crate::control`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlConfig {
    /// Socket path (`None`: no control socket; guest hints still work).
    pub socket: Option<PathBuf>,
    /// Socket permissions.
    pub socket_mode: u32,
    /// Per-VM pin quota in bytes (`None`: 25 % of the device cache).
    pub pin_quota_bytes: Option<u64>,
    /// Most bytes one pin / prefetch covers (`None`: the device cache).
    pub max_range_bytes: Option<u64>,
    /// Bytes one VM may prefetch per second (`None`: the device cache).
    pub prefetch_budget_bytes: Option<u64>,
    /// Guests may run device-wide commands.
    pub guest_device_control: bool,
}

/// A switch (`on` / `off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// DAX window settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaxOptions {
    /// Try to enable DAX.
    pub enabled: bool,
    /// Window size reported to the front-end.
    pub window: u64,
    /// Pool mountpoint (`None`: under /run/cxlfsd).
    pub pool_dir: Option<PathBuf>,
    /// Period of the pool's background write-back (zero: off).
    pub writeback_interval: std::time::Duration,
    /// How long a back-end channel request waits for the VMM's ack.
    pub reply_timeout: std::time::Duration,
}

/// One VM in `daemon.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    /// Name (metrics label).
    pub name: String,
    /// vhost-user socket path (the daemon listens; QEMU connects).
    pub socket: PathBuf,
    /// The VM's own shared directory (`None`: the daemon's `shared_dir`).
    /// VMs see each other's files only where they share a directory.
    #[serde(default)]
    pub dir: Option<PathBuf>,
}

impl VmSpec {
    /// The directory this VM is served: its own, or the daemon's.
    pub fn share<'a>(&'a self, shared_dir: &'a std::path::Path) -> &'a std::path::Path {
        self.dir.as_deref().unwrap_or(shared_dir)
    }
}

/// Default cap on the inodes and open handles one VM holds (each is a host
/// fd): enough to list a tree of tens of thousands of files.
pub const DEFAULT_MAX_OPEN_FILES: u64 = 65_536;

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Device model configuration.
    pub device: DeviceConfig,
    /// Where the device configuration came from (for logs).
    pub device_origin: String,
    /// Shared directory.
    pub shared_dir: PathBuf,
    /// VMs.
    pub vms: Vec<VmSpec>,
    /// Cache mode.
    pub cache: CacheMode,
    /// Inodes + open handles one VM may hold (host fds).
    pub max_open_files: u64,
    /// Metrics address.
    pub metrics_addr: Option<SocketAddr>,
    /// Allow non-loopback metrics.
    pub metrics_allow_remote: bool,
    /// Queue geometry.
    pub queues: QueueOptions,
    /// Readahead cap.
    pub max_readahead: Option<u32>,
    /// DAX window.
    pub dax: DaxOptions,
    /// Control socket and cache hints.
    pub control: ControlConfig,
    /// Percent of file pages on the CXL tier.
    pub cxl_ratio: u8,
    /// JSON-lines metrics file.
    pub metrics_file: Option<PathBuf>,
    /// Its sampling interval.
    pub metrics_interval: std::time::Duration,
    // --- guest credentials (issue 11 item 3) ---
    /// uid/gid translation and set-id stripping.
    pub guest_ids: GuestIds,
    /// Memory mode: a CXL memory region per named VM.
    pub memory_regions: Vec<MemoryRegionSpec>,
    /// Access sampling: resident pages armed per second (`None`: off).
    pub access_sampling: Option<u32>,
    /// Accessed bits from the VMMs that offer them.
    pub access_bits: AccessBits,
    /// How often they are read (and re-armed).
    pub access_bits_period: std::time::Duration,
}

pub use cxlfs_api::hits::AccessBits;

/// `access_sampling` (`cxlfs_api::hits::access_sampling_rate`); `None`: off.
fn access_sampling(s: &Settings) -> Result<Option<u32>, LoadDaemonConfigError> {
    s.access_sampling.as_ref().map_or(Ok(None), |v| {
        cxlfs_api::hits::access_sampling_rate(v.into())
            .map_err(|e| LoadDaemonConfigError::Invalid(format!("access_sampling: {e}")))
    })
}

/// `access_bits_period`: a duration, 1 ms to 10 s.
fn access_bits_period(s: &Settings) -> Result<std::time::Duration, LoadDaemonConfigError> {
    let ns = match &s.access_bits_period {
        None => cxlfs_api::hits::DEFAULT_ACCESS_BITS_PERIOD_NS,
        Some(t) => cxlfs_device_model::units::parse_duration_ns(t)
            .map_err(|e| e.to_string())
            .and_then(|ns| cxlfs_api::hits::access_bits_period(ns).map_err(|e| e.to_string()))
            .map_err(|e| {
                LoadDaemonConfigError::Invalid(format!("access_bits_period `{t}`: {e}"))
            })?,
    };
    Ok(std::time::Duration::from_nanos(ns))
}

/// `access_bits` (`cxlfs_api::hits::access_bits`); on when unset.
fn access_bits(s: &Settings) -> Result<AccessBits, LoadDaemonConfigError> {
    s.access_bits.as_ref().map_or(Ok(AccessBits::On), |v| {
        cxlfs_api::hits::access_bits(v.into())
            .map_err(|e| LoadDaemonConfigError::Invalid(format!("access_bits: {e}")))
    })
}

pub use crate::memory::MemoryRegionSpec;

/// `cxl_memory`: each `NAME=SIZE`, sizes in 2 MiB extents, names unique and
/// (when VMs are listed) among them.
fn memory_regions(
    s: &Settings,
    vms: &[VmSpec],
) -> Result<Vec<MemoryRegionSpec>, LoadDaemonConfigError> {
    let mut out: Vec<MemoryRegionSpec> = Vec::new();
    for item in s.cxl_memory.as_deref().unwrap_or_default() {
        let bad = |why: &str| LoadDaemonConfigError::Invalid(format!("cxl_memory `{item}`: {why}"));
        let (vm, text) = item.split_once('=').ok_or_else(|| bad("not NAME=SIZE"))?;
        if vm.is_empty()
            || !vm
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        {
            return Err(bad("the name must be [A-Za-z0-9_.-]+"));
        }
        let size = size("cxl_memory", text)?;
        if size == 0 || size % crate::device::EXTENT_SIZE != 0 {
            return Err(bad("the size must be a positive multiple of 2 MiB"));
        }
        if out.iter().any(|r| r.vm == vm) {
            return Err(bad("a second region for the same VM"));
        }
        if !vms.is_empty() && !vms.iter().any(|v| v.name == vm) {
            return Err(bad("no VM of that name"));
        }
        out.push(MemoryRegionSpec {
            vm: vm.to_string(),
            size,
        });
    }
    Ok(out)
}

/// Why the configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LoadDaemonConfigError {
    /// The config file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// File.
        path: String,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// The config file is malformed.
    #[error("{path}: {message}")]
    Parse {
        /// File.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The device configuration is invalid.
    #[error("device configuration")]
    Device(#[from] LoadConfigError),
    /// `device` is neither a preset name nor a table.
    #[error("`device` must be a preset name or a table, got {0}")]
    DeviceType(String),
    /// A `--vm` flag is not `NAME=SOCKET_PATH[:DIR]`.
    #[error("--vm `{0}` is not of the form NAME=SOCKET_PATH or NAME=SOCKET_PATH:DIR")]
    BadVm(String),
    /// Two VMs with one name or one socket.
    #[error("VM name or socket `{0}` used twice")]
    DuplicateVm(String),
    /// A required setting is missing.
    #[error("missing {0} (flag or config file)")]
    Missing(&'static str),
    /// A setting is out of range.
    #[error("{0}")]
    Invalid(String),
    /// A `--translate-uid` / `--translate-gid` rule is malformed.
    #[error("{key}")]
    TranslateIds {
        /// `translate_uid` or `translate_gid`.
        key: &'static str,
        /// What is wrong with the rule.
        #[source]
        source: crate::passthrough::ParseIdMapError,
    },
}

/// `NAME=SOCKET` or `NAME=SOCKET:DIR` (the socket path must not contain
/// `:` when a directory follows; the first `:` splits them).
fn parse_vm(s: &str) -> Result<VmSpec, LoadDaemonConfigError> {
    let bad = || LoadDaemonConfigError::BadVm(s.to_string());
    let (name, rest) = s.split_once('=').ok_or_else(bad)?;
    let (socket, dir) = match rest.split_once(':') {
        Some((socket, "")) => (socket, None),
        Some((socket, dir)) => (socket, Some(PathBuf::from(dir))),
        None => (rest, None),
    };
    if name.is_empty() || socket.is_empty() {
        return Err(bad());
    }
    Ok(VmSpec {
        name: name.to_string(),
        socket: PathBuf::from(socket),
        dir,
    })
}

fn device_from_value(v: &toml::Value) -> Result<(DeviceConfig, String), LoadDaemonConfigError> {
    match v {
        toml::Value::String(name) => Ok((preset(name)?, format!("preset {name}"))),
        toml::Value::Table(t) => {
            let text = toml::to_string(t).map_err(|e| LoadDaemonConfigError::Parse {
                path: "device".into(),
                message: e.to_string(),
            })?;
            Ok((
                DeviceConfig::from_toml_str(&text)?,
                "inline device table".into(),
            ))
        }
        other => Err(LoadDaemonConfigError::DeviceType(
            other.type_str().to_string(),
        )),
    }
}

/// `text` as a size with units, or `Invalid("{key} `{text}`: {why}")`.
fn size(key: &str, text: &str) -> Result<u64, LoadDaemonConfigError> {
    cxlfs_device_model::units::parse_size(text)
        .map_err(|e| LoadDaemonConfigError::Invalid(format!("{key} `{text}`: {e}")))
}

/// `translate_uid`, `translate_gid`, `strip_setid`.
fn guest_ids(s: &Settings) -> Result<GuestIds, LoadDaemonConfigError> {
    let map = |key, rules: &Option<Vec<String>>| {
        IdMap::parse(rules.as_deref().unwrap_or_default())
            .map_err(|source| LoadDaemonConfigError::TranslateIds { key, source })
    };
    Ok(GuestIds {
        uids: map("translate_uid", &s.translate_uid)?,
        gids: map("translate_gid", &s.translate_gid)?,
        strip_setid: s.strip_setid.unwrap_or(false),
    })
}

fn control_config(s: &Settings) -> Result<ControlConfig, LoadDaemonConfigError> {
    let socket_mode = match &s.control_socket_mode {
        Some(t) => {
            let digits = t.trim_start_matches("0o");
            match u32::from_str_radix(digits, 8) {
                Ok(m) if m <= 0o777 && m & 0o600 == 0o600 => m,
                _ => {
                    return Err(LoadDaemonConfigError::Invalid(format!(
                        "control_socket_mode `{t}` must be octal permissions <= 0777 that keep the owner's rw (e.g. 0600, 0660)"
                    )))
                }
            }
        }
        None => crate::control::DEFAULT_SOCKET_MODE,
    };
    let pin_quota_bytes = match &s.pin_quota_bytes {
        Some(t) => Some(size("pin_quota_bytes", t)?),
        None => None,
    };
    let max_range_bytes = match &s.max_range_bytes {
        Some(t) => Some(size("max_range_bytes", t)?).filter(|&n| n > 0),
        None => None,
    };
    let prefetch_budget_bytes = match &s.prefetch_budget_bytes {
        Some(t) => Some(size("prefetch_budget_bytes", t)?),
        None => None,
    };
    Ok(ControlConfig {
        socket: s.control_socket.clone(),
        socket_mode,
        pin_quota_bytes,
        max_range_bytes,
        prefetch_budget_bytes,
        guest_device_control: s.guest_device_control.unwrap_or(false),
    })
}

fn queue_options(s: &Settings) -> Result<QueueOptions, LoadDaemonConfigError> {
    let defaults = QueueOptions::default();
    let compensation = latency_compensation(s)?;
    let queues = QueueOptions {
        request_queues: s.request_queues.unwrap_or(defaults.request_queues),
        queue_size: s.queue_size.unwrap_or(defaults.queue_size),
        realtime_priority: s.realtime_priority,
        compensation: compensation.fuse,
        dax_compensation: compensation.dax,
        plane_transport: match &s.plane_transport {
            Some(t) => t
                .parse()
                .map_err(|e: residency::fuse_plane::ParseTransportError| {
                    LoadDaemonConfigError::Invalid(e.to_string())
                })?,
            None => residency::Transport::Auto,
        },
        plane_poll: s.plane_poll.unwrap_or(false),
        dax_eviction_backlog: match &s.dax_eviction_backlog {
            Some(v) => cxlfs_api::dax::eviction_backlog(v.into())
                .map_err(|e| LoadDaemonConfigError::Invalid(e.to_string()))?,
            None => cxlfs_api::dax::EvictionBacklogSetting::Auto,
        },
        tag: match &s.tag {
            Some(t) => t.parse().map_err(|e: crate::backend::ParseFsTagError| {
                LoadDaemonConfigError::Invalid(e.to_string())
            })?,
            None => crate::backend::FsTag::default(),
        },
    };
    if queues.request_queues == 0 || queues.request_queues > 62 {
        return Err(LoadDaemonConfigError::Invalid(format!(
            "request_queues must be 1..=62, got {}",
            queues.request_queues
        )));
    }
    if queues
        .realtime_priority
        .is_some_and(|p| !(1..=99).contains(&p))
    {
        return Err(LoadDaemonConfigError::Invalid(format!(
            "realtime_priority must be 1..=99, got {:?}",
            queues.realtime_priority
        )));
    }
    if !queues.queue_size.is_power_of_two() || queues.queue_size > 32768 {
        return Err(LoadDaemonConfigError::Invalid(format!(
            "queue_size must be a power of two <= 32768, got {}",
            queues.queue_size
        )));
    }
    Ok(queues)
}

/// Latency compensation per path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PathCompensation {
    /// The residency plane's misses.
    dax: Compensation,
    /// Held READ / WRITE replies on the virtio-fs queues.
    fuse: Compensation,
}

/// `latency_compensation`: `SPEC` for both paths, or `dax=SPEC,fuse=SPEC`
/// (either may be left out: `auto`); a SPEC is `auto` (the default),
/// `off`, or a duration.
fn latency_compensation(s: &Settings) -> Result<PathCompensation, LoadDaemonConfigError> {
    let Some(text) = s.latency_compensation.as_deref() else {
        return Ok(PathCompensation {
            dax: Compensation::Auto,
            fuse: Compensation::Auto,
        });
    };
    let bad = |why: String| {
        LoadDaemonConfigError::Invalid(format!(
            "latency_compensation `{text}`: {why} (auto, off, a duration, or dax=…,fuse=…)"
        ))
    };
    let spec = |t: &str| match t.trim() {
        "auto" => Ok(Compensation::Auto),
        "off" => Ok(Compensation::Off),
        t => cxlfs_device_model::units::parse_duration_ns(t)
            .map(Compensation::Fixed)
            .map_err(|e| bad(e.to_string())),
    };
    if !text.contains('=') {
        let c = spec(text)?;
        return Ok(PathCompensation { dax: c, fuse: c });
    }
    let mut out = PathCompensation {
        dax: Compensation::Auto,
        fuse: Compensation::Auto,
    };
    for part in text.split(',') {
        match part.split_once('=').map(|(k, v)| (k.trim(), v)) {
            Some(("dax", v)) => out.dax = spec(v)?,
            Some(("fuse", v)) => out.fuse = spec(v)?,
            _ => return Err(bad(format!("`{part}` is not dax=SPEC or fuse=SPEC"))),
        }
    }
    Ok(out)
}

fn dax_options(s: &Settings) -> Result<DaxOptions, LoadDaemonConfigError> {
    let window = match &s.dax_window {
        Some(t) => size("dax_window", t)?,
        None => crate::dax::DEFAULT_WINDOW_BYTES,
    };
    if window == 0 || window % crate::dax::SLOT_SIZE != 0 {
        return Err(LoadDaemonConfigError::Invalid(format!(
            "dax_window must be a positive multiple of 2 MiB, got {window}"
        )));
    }
    let min = crate::dax::MIN_WINDOW_SLOTS * crate::dax::SLOT_SIZE;
    if window < min {
        return Err(LoadDaemonConfigError::Invalid(format!(
            "dax_window must be at least {} MiB ({} ranges of 2 MiB), got {window}: one guest \
             access can need two ranges at once (across a 2 MiB boundary of a file), and a \
             window that cannot map both hangs the guest",
            min >> 20,
            crate::dax::MIN_WINDOW_SLOTS
        )));
    }
    let duration = |name: &str, t: &Option<String>, default: std::time::Duration| {
        let Some(t) = t else { return Ok(default) };
        cxlfs_device_model::units::parse_duration_ns(t)
            .map(std::time::Duration::from_nanos)
            .map_err(|e| LoadDaemonConfigError::Invalid(format!("{name} `{t}`: {e}")))
    };
    let writeback_interval = duration(
        "dax_writeback_interval",
        &s.dax_writeback_interval,
        crate::dax::DEFAULT_WRITEBACK_INTERVAL,
    )?;
    let reply_timeout = duration(
        "dax_reply_timeout",
        &s.dax_reply_timeout,
        crate::dax::DEFAULT_REPLY_TIMEOUT,
    )?;
    if reply_timeout < std::time::Duration::from_millis(1) {
        return Err(LoadDaemonConfigError::Invalid(
            "dax_reply_timeout must be at least 1ms".into(),
        ));
    }
    Ok(DaxOptions {
        // On unless turned off; an abnormal exit cannot wedge the
        // process (kvm-ept's exit guard), and without FUSE it falls back.
        enabled: s.dax.unwrap_or(OnOff::On) == OnOff::On,
        window,
        pool_dir: s.pool_dir.clone(),
        writeback_interval,
        reply_timeout,
    })
}

fn metrics_interval(s: &Settings) -> Result<std::time::Duration, LoadDaemonConfigError> {
    let Some(t) = &s.metrics_interval else {
        return Ok(crate::metrics::file::DEFAULT_INTERVAL);
    };
    let ns = cxlfs_device_model::units::parse_duration_ns(t)
        .map_err(|e| LoadDaemonConfigError::Invalid(format!("metrics_interval `{t}`: {e}")))?;
    if ns < 1_000_000 {
        return Err(LoadDaemonConfigError::Invalid(format!(
            "metrics_interval must be at least 1ms, got `{t}`"
        )));
    }
    Ok(std::time::Duration::from_nanos(ns))
}

impl TryFrom<Settings> for DaemonConfig {
    type Error = LoadDaemonConfigError;

    /// The one validation step: defaults for what is unset, every value
    /// checked.
    fn try_from(s: Settings) -> Result<Self, Self::Error> {
        let control = control_config(&s)?;
        let (base, mut origin) = match &s.device {
            Some(v) => device_from_value(v)?,
            None => (preset(DEFAULT_PRESET)?, format!("preset {DEFAULT_PRESET}")),
        };
        let sets = s.sets.as_deref().unwrap_or_default();
        let mut device = base.with_overrides(sets)?;
        if !sets.is_empty() {
            origin.push_str(&format!(" | --set {}", sets.join(" ")));
        }
        let access_sampling = access_sampling(&s)?;
        let access_bits = access_bits(&s)?;
        let access_bits_period = access_bits_period(&s)?;
        if access_sampling.is_some() && !device.cache.hits_visible {
            // Sampled accesses are hits: a policy blind to hits would
            // throw them away.
            device.cache.hits_visible = true;
            origin.push_str(" | access sampling: cache.hits_visible=true");
        }
        let vms = s.vm.clone().unwrap_or_default();
        for (i, a) in vms.iter().enumerate() {
            if vms[..i]
                .iter()
                .any(|b| b.name == a.name || b.socket == a.socket)
            {
                return Err(LoadDaemonConfigError::DuplicateVm(a.name.clone()));
            }
        }
        let queues = queue_options(&s)?;
        let dax = dax_options(&s)?;
        let cxl_ratio = match s.cxl_ratio {
            Some(r) => crate::device::placement::check_ratio(r)
                .map_err(|e| LoadDaemonConfigError::Invalid(e.to_string()))?,
            None => crate::device::placement::DEFAULT_CXL_RATIO,
        };
        let metrics_interval = metrics_interval(&s)?;
        let guest_ids = guest_ids(&s)?;
        let memory_regions = memory_regions(&s, &vms)?;
        let max_open_files = s.max_open_files.unwrap_or(DEFAULT_MAX_OPEN_FILES);
        if max_open_files < 16 {
            return Err(LoadDaemonConfigError::Invalid(format!(
                "max_open_files must be at least 16, got {max_open_files}"
            )));
        }
        Ok(DaemonConfig {
            guest_ids,
            memory_regions,
            access_sampling,
            access_bits,
            access_bits_period,
            max_open_files,
            control,
            cxl_ratio,
            metrics_file: s.metrics_file,
            metrics_interval,
            dax,
            device,
            device_origin: origin,
            shared_dir: s
                .shared_dir
                .ok_or(LoadDaemonConfigError::Missing("shared_dir"))?,
            vms,
            cache: s.cache.unwrap_or_default(),
            metrics_addr: s.metrics_addr,
            metrics_allow_remote: s.metrics_allow_remote.unwrap_or(false),
            queues,
            max_readahead: s.max_readahead,
        })
    }
}

impl DaemonConfig {
    /// The file (`--config`, if any) under the flags, validated.
    pub fn load(cli: &Cli) -> Result<Self, LoadDaemonConfigError> {
        let file = match &cli.config {
            Some(path) => Settings::from_file(path)?,
            None => Settings::default(),
        };
        Self::merge(cli, file)
    }

    /// An already parsed file under the flags, validated.
    pub fn merge(cli: &Cli, file: FileConfig) -> Result<Self, LoadDaemonConfigError> {
        Self::try_from(Settings::try_from(cli)?.over(file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("cxlfsd").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn cxl_ratio_and_metrics_file() {
        let file: FileConfig = toml::from_str(
            r#"
            shared_dir = "/a"
            cxl_ratio = 30
            metrics_file = "/tmp/m.jsonl"
            metrics_interval = "250ms"
            "#,
        )
        .unwrap();
        let c = DaemonConfig::merge(&cli(&[]), file.clone()).unwrap();
        assert_eq!(c.cxl_ratio, 30);
        assert_eq!(c.metrics_file, Some(PathBuf::from("/tmp/m.jsonl")));
        assert_eq!(c.metrics_interval, std::time::Duration::from_millis(250));
        let c = DaemonConfig::merge(
            &cli(&["--cxl-ratio", "0", "--metrics-interval", "2s"]),
            file.clone(),
        )
        .unwrap();
        assert_eq!(c.cxl_ratio, 0);
        assert_eq!(c.metrics_interval, std::time::Duration::from_secs(2));
        let d = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), FileConfig::default()).unwrap();
        assert_eq!(d.cxl_ratio, 100);
        assert_eq!(d.metrics_file, None);
        assert_eq!(d.metrics_interval, std::time::Duration::from_secs(1));
        for bad in [
            &["--cxl-ratio", "101"][..],
            &["--metrics-interval", "10us"],
            &["--metrics-interval", "soon"],
        ] {
            let e = DaemonConfig::merge(&cli(bad), file.clone()).unwrap_err();
            assert!(
                matches!(e, LoadDaemonConfigError::Invalid(_)),
                "{bad:?}: {e}"
            );
        }
        let e = DaemonConfig::merge(
            &cli(&[]),
            toml::from_str("shared_dir = \"/a\"\ncxl_ratio = 250").unwrap(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("cxl_ratio must be 0..=100"), "{e}");
        assert!(Cli::try_parse_from(["cxlfsd", "--cxl-ratio", "-1"]).is_err());
    }

    #[test]
    fn dax_window_of_fewer_than_two_ranges_is_refused() {
        let file: FileConfig = toml::from_str("shared_dir = \"/a\"").unwrap();
        let window = |w: &str| DaemonConfig::merge(&cli(&["--dax-window", w]), file.clone());
        let e = window("2MiB").unwrap_err();
        assert!(
            e.to_string().contains("at least 4 MiB (2 ranges of 2 MiB)"),
            "{e}"
        );
        assert!(window("3MiB").is_err(), "not a multiple of 2 MiB");
        assert!(window("0").is_err());
        let c = window("4MiB").unwrap();
        assert_eq!(c.dax.window, 4 << 20);
    }

    #[test]
    fn flags_override_file() {
        let file: FileConfig = toml::from_str(
            r#"
            shared_dir = "/a"
            cache = "always"
            device = "femu"
            [[vm]]
            name = "vm0"
            socket = "/tmp/0.sock"
            "#,
        )
        .unwrap();
        let c = DaemonConfig::merge(&cli(&[]), file.clone()).unwrap();
        assert_eq!(c.shared_dir, PathBuf::from("/a"));
        assert_eq!(c.cache, CacheMode::Always);
        assert_eq!(c.device, preset("femu").unwrap());
        assert_eq!(c.vms.len(), 1);
        let c = DaemonConfig::merge(
            &cli(&[
                "--shared-dir",
                "/b",
                "--cache",
                "never",
                "--preset",
                "cylon",
                "--set",
                "nand.read_ns=20us",
                "--vm",
                "x=/tmp/x.sock",
                "--vm",
                "y=/tmp/y.sock",
            ]),
            file,
        )
        .unwrap();
        assert_eq!(c.shared_dir, PathBuf::from("/b"));
        assert_eq!(c.cache, CacheMode::Never);
        assert_eq!(c.device.nand.read_ns, 20_000);
        assert_eq!(
            c.vms.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
            ["x", "y"]
        );
    }

    #[test]
    fn plane_transport_from_file_and_flags() {
        use residency::Transport;
        let pick = |c: &DaemonConfig| (c.queues.plane_transport, c.queues.plane_poll);
        let c = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), FileConfig::default()).unwrap();
        assert_eq!(pick(&c), (Transport::Auto, false), "default");
        let file: FileConfig =
            toml::from_str("plane_transport = \"dev-fuse\"\nplane_poll = true").unwrap();
        let c = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), file.clone()).unwrap();
        assert_eq!(pick(&c), (Transport::DevFuse, true));
        let c = DaemonConfig::merge(
            &cli(&["--shared-dir", "/a", "--plane-transport", "io-uring"]),
            file,
        )
        .unwrap();
        assert_eq!(pick(&c), (Transport::IoUring, true), "the flag wins");
        assert!(DaemonConfig::merge(
            &cli(&["--shared-dir", "/a", "--plane-transport", "rdma"]),
            FileConfig::default(),
        )
        .is_err());
    }

    #[test]
    fn dax_eviction_backlog_from_file_and_flags() {
        use cxlfs_api::dax::EvictionBacklogSetting;
        let pick = |c: &DaemonConfig| c.queues.dax_eviction_backlog;
        let c = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), FileConfig::default()).unwrap();
        assert_eq!(pick(&c), EvictionBacklogSetting::Auto, "default");
        let file: FileConfig = toml::from_str("dax_eviction_backlog = 16").unwrap();
        let c = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), file.clone()).unwrap();
        assert_eq!(pick(&c), EvictionBacklogSetting::Pages(16));
        let c = DaemonConfig::merge(
            &cli(&["--shared-dir", "/a", "--dax-eviction-backlog", "off"]),
            file,
        )
        .unwrap();
        assert_eq!(pick(&c), EvictionBacklogSetting::Off, "the flag wins");
        let e = DaemonConfig::merge(
            &cli(&["--shared-dir", "/a", "--dax-eviction-backlog", "lots"]),
            FileConfig::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("dax_eviction_backlog") && e.contains("lots"),
            "{e}"
        );
    }

    #[test]
    fn access_sampling_from_file_and_flags() {
        let with = |flag: &str| {
            DaemonConfig::merge(
                &cli(&["--shared-dir", "/a", "--access-sampling", flag]),
                FileConfig::default(),
            )
            .map(|c| c.access_sampling)
        };
        let c = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), FileConfig::default()).unwrap();
        assert_eq!(c.access_sampling, None, "off by default");
        assert_eq!(with("off").unwrap(), None);
        assert_eq!(with("2000/s").unwrap(), Some(2000));
        // Sampled accesses are hits: a hit-blind preset's policy sees them.
        let c = DaemonConfig::merge(
            &cli(&[
                "--shared-dir",
                "/a",
                "--preset",
                "cylon",
                "--access-sampling",
                "5",
            ]),
            FileConfig::default(),
        )
        .unwrap();
        assert!(c.device.cache.hits_visible, "{}", c.device_origin);
        assert!(c.device_origin.contains("hits_visible=true"));
        let c = DaemonConfig::merge(
            &cli(&["--shared-dir", "/a", "--preset", "cylon"]),
            FileConfig::default(),
        )
        .unwrap();
        assert!(!c.device.cache.hits_visible, "off: the preset as it is");
        assert_eq!(
            with("1000000").unwrap(),
            Some(cxlfs_api::hits::MAX_ACCESS_SAMPLING)
        );
        for bad in ["0", "0/s", "1000001/s", "fast", "2000/min", ""] {
            let e = with(bad).unwrap_err().to_string();
            assert!(e.contains("access_sampling"), "{bad}: {e}");
        }
        let file: FileConfig = toml::from_str("access_sampling = 500").unwrap();
        let c = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), file.clone()).unwrap();
        assert_eq!(c.access_sampling, Some(500));
        let c = DaemonConfig::merge(
            &cli(&["--shared-dir", "/a", "--access-sampling", "off"]),
            file,
        )
        .unwrap();
        assert_eq!(c.access_sampling, None, "the flag wins");
    }

    #[test]
    fn access_bits_are_on_unless_turned_off() {
        let c = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), FileConfig::default()).unwrap();
        assert_eq!(c.access_bits, AccessBits::On);
        let file: FileConfig = toml::from_str("access_bits = false").unwrap();
        let c = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), file.clone()).unwrap();
        assert_eq!(c.access_bits, AccessBits::Off);
        let c = DaemonConfig::merge(&cli(&["--shared-dir", "/a", "--access-bits", "on"]), file)
            .unwrap();
        assert_eq!(c.access_bits, AccessBits::On, "the flag wins");
        assert_eq!(c.access_bits_period, std::time::Duration::from_millis(10));
        let c = DaemonConfig::merge(
            &cli(&["--shared-dir", "/a", "--access-bits-period", "50ms"]),
            FileConfig::default(),
        )
        .unwrap();
        assert_eq!(c.access_bits_period, std::time::Duration::from_millis(50));
        for bad in ["100us", "11s", "soon"] {
            let e = DaemonConfig::merge(
                &cli(&["--shared-dir", "/a", "--access-bits-period", bad]),
                FileConfig::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("access_bits_period"), "{bad}: {e}");
        }
        let e = DaemonConfig::merge(
            &cli(&["--shared-dir", "/a", "--access-bits", "maybe"]),
            FileConfig::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("access_bits") && e.contains("\"maybe\""), "{e}");
    }

    #[test]
    fn latency_compensation_from_file_and_flags() {
        let base = || cli(&["--shared-dir", "/a"]);
        let both = |c: &DaemonConfig| (c.queues.dax_compensation, c.queues.compensation);
        let c = DaemonConfig::merge(&base(), FileConfig::default()).unwrap();
        assert_eq!(
            both(&c),
            (Compensation::Auto, Compensation::Auto),
            "default"
        );
        let file: FileConfig = toml::from_str("latency_compensation = \"off\"").unwrap();
        let c = DaemonConfig::merge(&base(), file.clone()).unwrap();
        assert_eq!(both(&c), (Compensation::Off, Compensation::Off));
        let (auto, off) = (Compensation::Auto, Compensation::Off);
        for (flag, want) in [
            ("auto", (auto, auto)),
            (
                "12us",
                (Compensation::Fixed(12_000), Compensation::Fixed(12_000)),
            ),
            ("800", (Compensation::Fixed(800), Compensation::Fixed(800))),
            ("0", (Compensation::Fixed(0), Compensation::Fixed(0))),
            ("dax=auto,fuse=60us", (auto, Compensation::Fixed(60_000))),
            ("fuse=off", (auto, off)),
            ("fuse=off, dax=off", (off, off)),
            ("dax=5us", (Compensation::Fixed(5_000), auto)),
        ] {
            let c = DaemonConfig::merge(
                &cli(&["--shared-dir", "/a", "--latency-compensation", flag]),
                file.clone(),
            )
            .unwrap();
            assert_eq!(both(&c), want, "{flag}");
        }
        for bad in [
            "on",
            "3 fortnights",
            "fast",
            "dax=on",
            "memory=off",
            "dax=1us,",
        ] {
            assert!(
                DaemonConfig::merge(
                    &cli(&["--shared-dir", "/a", "--latency-compensation", bad]),
                    FileConfig::default(),
                )
                .is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn per_vm_directories_and_bounds() {
        let file: FileConfig = toml::from_str(
            r#"
            shared_dir = "/a"
            max_open_files = 100
            max_range_bytes = "8MiB"
            prefetch_budget_bytes = "1MiB"
            [[vm]]
            name = "vm0"
            socket = "/tmp/0.sock"
            dir = "/srv/vm0"
            [[vm]]
            name = "vm1"
            socket = "/tmp/1.sock"
            "#,
        )
        .unwrap();
        let c = DaemonConfig::merge(&cli(&[]), file.clone()).unwrap();
        let shared = std::path::Path::new("/a");
        assert_eq!(c.vms[0].share(shared), std::path::Path::new("/srv/vm0"));
        assert_eq!(c.vms[1].share(shared), shared);
        assert_eq!(c.max_open_files, 100);
        assert_eq!(c.control.max_range_bytes, Some(8 << 20));
        assert_eq!(c.control.prefetch_budget_bytes, Some(1 << 20));
        let c = DaemonConfig::merge(
            &cli(&[
                "--vm",
                "x=/tmp/x.sock:/srv/x",
                "--vm",
                "y=/tmp/y.sock",
                "--vm",
                "z=/tmp/z.sock:",
                "--max-open-files",
                "20",
            ]),
            file.clone(),
        )
        .unwrap();
        let dirs: Vec<_> = c.vms.iter().map(|v| v.dir.clone()).collect();
        assert_eq!(dirs, [Some(PathBuf::from("/srv/x")), None, None]);
        assert_eq!(c.vms[0].socket, PathBuf::from("/tmp/x.sock"));
        assert_eq!(c.max_open_files, 20);
        let d = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), FileConfig::default()).unwrap();
        assert_eq!(d.max_open_files, DEFAULT_MAX_OPEN_FILES);
        for bad in [
            &["--vm", "=/s:/d"][..],
            &["--vm", "a=:/d"],
            &["--max-open-files", "3"],
        ] {
            assert!(
                DaemonConfig::merge(&cli(bad), file.clone()).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn control_settings_from_file_and_flags() {
        let file: FileConfig = toml::from_str(
            r#"
            shared_dir = "/a"
            control_socket = "/run/c.sock"
            control_socket_mode = "0660"
            pin_quota_bytes = "16MiB"
            guest_device_control = true
            "#,
        )
        .unwrap();
        let c = DaemonConfig::merge(&cli(&[]), file.clone()).unwrap();
        assert_eq!(c.control.socket, Some(PathBuf::from("/run/c.sock")));
        assert_eq!(c.control.socket_mode, 0o660);
        assert_eq!(c.control.pin_quota_bytes, Some(16 << 20));
        assert!(c.control.guest_device_control);
        let c = DaemonConfig::merge(
            &cli(&["--control-socket-mode", "600", "--pin-quota-bytes", "4096"]),
            file,
        )
        .unwrap();
        assert_eq!(c.control.socket_mode, 0o600);
        assert_eq!(c.control.pin_quota_bytes, Some(4096));
        let d = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), FileConfig::default()).unwrap();
        assert_eq!(d.control.socket, None);
        assert_eq!(d.control.socket_mode, 0o600);
        assert!(!d.control.guest_device_control);
        for bad in ["0999", "0066", "1777", "rw"] {
            assert!(
                DaemonConfig::merge(
                    &cli(&["--shared-dir", "/a", "--control-socket-mode", bad]),
                    FileConfig::default()
                )
                .is_err(),
                "{bad}"
            );
        }
        assert!(DaemonConfig::merge(
            &cli(&["--shared-dir", "/a", "--pin-quota-bytes", "lots"]),
            FileConfig::default()
        )
        .is_err());
    }

    #[test]
    fn inline_device_table() {
        let file: FileConfig = toml::from_str(
            r#"
            shared_dir = "/a"
            [device]
            preset = "cylon"
            cache.size_bytes = "8MiB"
            "#,
        )
        .unwrap();
        let c = DaemonConfig::merge(&cli(&[]), file).unwrap();
        assert_eq!(c.device.cache.size_bytes, 8 << 20);
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(
            DaemonConfig::merge(
                &cli(&["--shared-dir", "/a", "--vm", "novalue"]),
                FileConfig::default()
            ),
            Err(LoadDaemonConfigError::BadVm(_))
        ));
        assert!(matches!(
            DaemonConfig::merge(
                &cli(&["--shared-dir", "/a", "--vm", "a=/s", "--vm", "a=/t"]),
                FileConfig::default()
            ),
            Err(LoadDaemonConfigError::DuplicateVm(_))
        ));
        assert!(matches!(
            DaemonConfig::merge(&cli(&[]), FileConfig::default()),
            Err(LoadDaemonConfigError::Missing("shared_dir"))
        ));
        assert!(DaemonConfig::merge(
            &cli(&["--shared-dir", "/a", "--set", "cache.nope=1"]),
            FileConfig::default()
        )
        .is_err());
        assert!(toml::from_str::<FileConfig>("bogus = 1").is_err());
    }

    #[test]
    fn flags_layer_over_the_file_field_by_field() {
        let file: FileConfig = toml::from_str(
            r#"
            shared_dir = "/a"
            cache = "always"
            metrics_allow_remote = true
            request_queues = 4
            [[vm]]
            name = "vm0"
            socket = "/tmp/0.sock"
            "#,
        )
        .unwrap();
        let flags = Settings::try_from(&cli(&[
            "--cache",
            "never",
            "--preset",
            "femu",
            "--queue-size",
            "64",
        ]))
        .unwrap();
        assert_eq!(
            flags.metrics_allow_remote, None,
            "an absent switch says nothing"
        );
        let s = flags.over(file);
        assert_eq!(s.shared_dir, Some(PathBuf::from("/a")));
        assert_eq!(s.cache, Some(CacheMode::Never));
        assert_eq!(s.device, Some(toml::Value::String("femu".into())));
        assert_eq!(s.metrics_allow_remote, Some(true));
        assert_eq!((s.request_queues, s.queue_size), (Some(4), Some(64)));
        assert_eq!(s.vm.as_ref().map(Vec::len), Some(1));
        assert_eq!(s.sets, None);
        let c = DaemonConfig::try_from(s).unwrap();
        assert!(c.metrics_allow_remote);
        assert_eq!(c.device_origin, "preset femu");
        assert_eq!((c.queues.request_queues, c.queues.queue_size), (4, 64));
        // An empty file and no flags: every default, bar the required shared_dir.
        assert!(matches!(
            DaemonConfig::try_from(Settings::default()),
            Err(LoadDaemonConfigError::Missing("shared_dir"))
        ));
    }

    #[test]
    fn every_file_key_is_also_a_flag() {
        // `device` is `--preset` (or a table), `vm` is `--vm`, `sets` is `--set`.
        let cmd = Cli::command();
        let longs: Vec<&str> = cmd.get_arguments().filter_map(|a| a.get_long()).collect();
        for key in Settings::KEYS {
            let flag = match *key {
                "device" => "preset",
                "sets" => "set",
                other => other,
            };
            let flag = flag.replace('_', "-");
            assert!(longs.contains(&flag.as_str()), "no --{flag} for `{key}`");
        }
        assert_eq!(Settings::KEYS.len(), 38);
        // ... and `sets` is not a file key.
        assert!(toml::from_str::<FileConfig>("sets = [\"a=1\"]").is_err());
    }

    #[test]
    fn guest_id_translation_from_flags_and_file() {
        let c = DaemonConfig::merge(
            &cli(&[
                "--shared-dir",
                "/a",
                "--translate-uid",
                "map:0:100000:65536",
                "--translate-uid",
                "forbid-guest:70000:10",
                "--translate-gid",
                "squash-guest:0:100000:4294967295",
                "--strip-setid",
            ]),
            FileConfig::default(),
        )
        .unwrap();
        assert_eq!(c.guest_ids.uids.to_host(0), Ok(100_000));
        assert!(c.guest_ids.uids.to_host(70_001).is_err());
        assert_eq!(c.guest_ids.gids.to_host(42), Ok(100_000));
        assert!(c.guest_ids.strip_setid);
        let file: FileConfig = toml::from_str(
            "shared_dir = \"/a\"\ntranslate_gid = [\"map:0:5000:10\"]\nstrip_setid = true",
        )
        .unwrap();
        let c = DaemonConfig::merge(&cli(&[]), file).unwrap();
        assert_eq!(c.guest_ids.gids.to_host(1), Ok(5001));
        assert!(c.guest_ids.uids.is_identity());
        assert!(c.guest_ids.strip_setid);
        // Default: virtiofsd's (identity, set-id bits kept).
        let c = DaemonConfig::merge(&cli(&["--shared-dir", "/a"]), FileConfig::default()).unwrap();
        assert_eq!(c.guest_ids, GuestIds::default());
        let e = DaemonConfig::merge(
            &cli(&["--shared-dir", "/a", "--translate-uid", "map:0:1"]),
            FileConfig::default(),
        )
        .unwrap_err();
        assert!(matches!(
            e,
            LoadDaemonConfigError::TranslateIds {
                key: "translate_uid",
                ..
            }
        ));
        let shown = std::error::Error::source(&e).unwrap().to_string();
        assert!(shown.contains("map:0:1"), "{shown}");
    }
}
