//! Command line and `daemon.toml`: flags override the file.
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
//! dax = "off"                   # DAX window (default on); dax_window, pool_dir
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

use crate::backend::QueueOptions;
use crate::fs::CacheMode;
use clap::Parser;
use cxlfs_device_model::presets::preset;
use cxlfs_device_model::{DeviceConfig, LoadConfigError};
use serde::Deserialize;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The preset used when neither the file nor `--preset` names a device.
pub const DEFAULT_PRESET: &str = "cylon";

/// `cxlfsd` command line.
#[derive(Debug, Clone, Parser, Default)]
#[command(
    name = "cxlfsd",
    version,
    about = "Multi-VM vhost-user virtio-fs daemon over an emulated CXL-SSD"
)]
pub struct Cli {
    /// Daemon config file (TOML): device, shared_dir, vm list, ...
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Host directory exported to every VM.
    #[arg(long, value_name = "DIR")]
    pub shared_dir: Option<PathBuf>,
    /// A VM: its name and its vhost-user socket (repeatable; replaces the file's list).
    #[arg(long = "vm", value_name = "NAME=SOCKET_PATH")]
    pub vms: Vec<String>,
    /// Start the device from a named preset (replaces the file's `device`).
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// Override one device config key, e.g. `--set nand.read_ns=20us` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Guest caching: never | auto | always (as in virtiofsd).
    #[arg(long, value_name = "MODE")]
    pub cache: Option<CacheMode>,
    /// Serve Prometheus metrics on this address (loopback only unless allowed).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Allow a non-loopback --metrics-addr.
    #[arg(long)]
    pub metrics_allow_remote: bool,
    /// Request queues per VM (the hiprio queue comes on top).
    #[arg(long, value_name = "N")]
    pub request_queues: Option<usize>,
    /// Largest virtqueue size offered.
    #[arg(long, value_name = "N")]
    pub queue_size: Option<usize>,
    /// Cap the guest's readahead (bytes).
    #[arg(long, value_name = "BYTES")]
    pub max_readahead: Option<u32>,
    /// Run the queue workers and pacers under SCHED_FIFO at this priority
    /// (1..=99; needs CAP_SYS_NICE): other work on a busy host cannot
    /// preempt a reply being paced.
    #[arg(long, value_name = "PRIO")]
    pub realtime_priority: Option<u8>,
    /// virtio-fs tag in the device config space (default `cxlfs`), for
    /// front-ends that read it from the back-end (VHOST_USER_GET_CONFIG,
    /// e.g. QEMU >= 11.1 `vhost-user-test-device-pci,virtio-id=26`);
    /// `vhost-user-fs-pci` uses its own `tag=`.
    #[arg(long, value_name = "TAG")]
    pub tag: Option<String>,
    /// DAX window: on | off (default on). On: the pool is mounted as a
    /// host FUSE file (needs /dev/fuse and CAP_SYS_ADMIN); if that fails the
    /// daemon logs why and serves without DAX.
    #[arg(long, value_name = "on|off")]
    pub dax: Option<OnOff>,
    /// Size of each VM's DAX window (as reported by GET_SHMEM_CONFIG; QEMU's
    /// `cache-size` decides the real one), e.g. `1GiB`. Multiple of 2 MiB.
    #[arg(long, value_name = "BYTES")]
    pub dax_window: Option<String>,
    /// Where to mount the pool (default: /run/cxlfsd/pool-PID).
    #[arg(long, value_name = "DIR")]
    pub pool_dir: Option<PathBuf>,
    /// Serve cache-control commands (JSON lines) on this Unix socket.
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,
    /// Permissions of the control socket, octal (default 0600: owner only).
    #[arg(long, value_name = "MODE")]
    pub control_socket_mode: Option<String>,
    /// Bytes each VM may pin in the device cache (default: 25 % of it).
    #[arg(long, value_name = "BYTES")]
    pub pin_quota_bytes: Option<String>,
    /// Let guests change the whole device (set_policy, set_prefetch,
    /// set_cxl_ratio, reset_stats) through cache hints.
    #[arg(long)]
    pub guest_device_control: bool,
    /// Share of file pages on the CXL-SSD tier, 0..=100 (default 100); the
    /// rest live in a DRAM tier: always resident, never charged.
    #[arg(long, value_name = "PERCENT")]
    pub cxl_ratio: Option<u64>,
    /// Append a JSON-lines metrics time series to this file (one object per
    /// VM and one with "vm":"all" per sample, and a final sample at shutdown).
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,
    /// Interval of --metrics-file samples, e.g. `1s`, `250ms` (default 1s).
    #[arg(long, value_name = "DURATION")]
    pub metrics_interval: Option<String>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// Control socket and cache-hint settings (see [`crate::control`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlConfig {
    /// Socket path (`None`: no control socket; guest hints still work).
    pub socket: Option<PathBuf>,
    /// Socket permissions.
    pub socket_mode: u32,
    /// Per-VM pin quota in bytes (`None`: 25 % of the device cache).
    pub pin_quota_bytes: Option<u64>,
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
}

/// One VM in `daemon.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    /// Name (metrics label).
    pub name: String,
    /// vhost-user socket path (the daemon listens; QEMU connects).
    pub socket: PathBuf,
}

/// `daemon.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// A preset name or an inline device-model table.
    pub device: Option<toml::Value>,
    /// Shared directory.
    pub shared_dir: Option<PathBuf>,
    /// Cache mode.
    pub cache: Option<CacheMode>,
    /// Metrics address.
    pub metrics_addr: Option<SocketAddr>,
    /// Allow non-loopback metrics.
    pub metrics_allow_remote: Option<bool>,
    /// Request queues per VM.
    pub request_queues: Option<usize>,
    /// Largest queue size.
    pub queue_size: Option<usize>,
    /// Readahead cap.
    pub max_readahead: Option<u32>,
    /// SCHED_FIFO priority of queue workers and pacers.
    pub realtime_priority: Option<u8>,
    /// virtio-fs tag of the device config space.
    pub tag: Option<String>,
    /// DAX window on / off.
    pub dax: Option<OnOff>,
    /// DAX window size (e.g. "1GiB").
    pub dax_window: Option<String>,
    /// Pool mountpoint.
    pub pool_dir: Option<PathBuf>,
    /// Control socket path.
    pub control_socket: Option<PathBuf>,
    /// Control socket permissions, octal text (e.g. "0660").
    pub control_socket_mode: Option<String>,
    /// Per-VM pin quota (e.g. "16MiB").
    pub pin_quota_bytes: Option<String>,
    /// Guests may change the whole device.
    pub guest_device_control: Option<bool>,
    /// Percent of file pages on the CXL tier (0..=100).
    pub cxl_ratio: Option<u64>,
    /// JSON-lines metrics file.
    pub metrics_file: Option<PathBuf>,
    /// Its sampling interval (e.g. "1s").
    pub metrics_interval: Option<String>,
    /// VMs.
    #[serde(default)]
    pub vm: Vec<VmSpec>,
}

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
    /// A `--vm` flag is not `NAME=SOCKET_PATH`.
    #[error("--vm `{0}` is not of the form NAME=SOCKET_PATH")]
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
}

fn parse_vm(s: &str) -> Result<VmSpec, LoadDaemonConfigError> {
    match s.split_once('=') {
        Some((name, socket)) if !name.is_empty() && !socket.is_empty() => Ok(VmSpec {
            name: name.to_string(),
            socket: PathBuf::from(socket),
        }),
        _ => Err(LoadDaemonConfigError::BadVm(s.to_string())),
    }
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

fn control_config(cli: &Cli, file: &FileConfig) -> Result<ControlConfig, LoadDaemonConfigError> {
    let mode_text = cli
        .control_socket_mode
        .clone()
        .or(file.control_socket_mode.clone());
    let socket_mode = match mode_text {
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
    let quota_text = cli.pin_quota_bytes.clone().or(file.pin_quota_bytes.clone());
    let pin_quota_bytes =
        match quota_text {
            Some(t) => Some(cxlfs_device_model::units::parse_size(&t).map_err(|e| {
                LoadDaemonConfigError::Invalid(format!("pin_quota_bytes `{t}`: {e}"))
            })?),
            None => None,
        };
    Ok(ControlConfig {
        socket: cli.control_socket.clone().or(file.control_socket.clone()),
        socket_mode,
        pin_quota_bytes,
        guest_device_control: cli.guest_device_control
            || file.guest_device_control.unwrap_or(false),
    })
}

impl DaemonConfig {
    /// File (if any), then flags.
    pub fn load(cli: &Cli) -> Result<Self, LoadDaemonConfigError> {
        let file = match &cli.config {
            Some(path) => {
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|source| {
                    LoadDaemonConfigError::Read {
                        path: shown.clone(),
                        source,
                    }
                })?;
                toml::from_str::<FileConfig>(&text).map_err(|e| LoadDaemonConfigError::Parse {
                    path: shown,
                    message: e.to_string(),
                })?
            }
            None => FileConfig::default(),
        };
        Self::merge(cli, file)
    }

    /// Merges an already parsed file with the flags.
    pub fn merge(cli: &Cli, file: FileConfig) -> Result<Self, LoadDaemonConfigError> {
        let control = control_config(cli, &file)?;
        let (base, mut origin) = match (&cli.preset, &file.device) {
            (Some(name), _) => (preset(name)?, format!("preset {name}")),
            (None, Some(v)) => device_from_value(v)?,
            (None, None) => (preset(DEFAULT_PRESET)?, format!("preset {DEFAULT_PRESET}")),
        };
        let device = base.with_overrides(&cli.sets)?;
        if !cli.sets.is_empty() {
            origin.push_str(&format!(" | --set {}", cli.sets.join(" ")));
        }
        let vms = if cli.vms.is_empty() {
            file.vm
        } else {
            cli.vms
                .iter()
                .map(|s| parse_vm(s))
                .collect::<Result<Vec<_>, _>>()?
        };
        for (i, a) in vms.iter().enumerate() {
            if vms[..i]
                .iter()
                .any(|b| b.name == a.name || b.socket == a.socket)
            {
                return Err(LoadDaemonConfigError::DuplicateVm(a.name.clone()));
            }
        }
        let queues = QueueOptions {
            request_queues: cli
                .request_queues
                .or(file.request_queues)
                .unwrap_or(QueueOptions::default().request_queues),
            queue_size: cli
                .queue_size
                .or(file.queue_size)
                .unwrap_or(QueueOptions::default().queue_size),
            realtime_priority: cli.realtime_priority.or(file.realtime_priority),
            tag: match cli.tag.clone().or(file.tag) {
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
        let window_text = cli.dax_window.clone().or(file.dax_window);
        let window = match window_text {
            Some(t) => cxlfs_device_model::units::parse_size(&t)
                .map_err(|e| LoadDaemonConfigError::Invalid(format!("dax_window `{t}`: {e}")))?,
            None => crate::dax::DEFAULT_WINDOW_BYTES,
        };
        if window == 0 || window % crate::dax::SLOT_SIZE != 0 {
            return Err(LoadDaemonConfigError::Invalid(format!(
                "dax_window must be a positive multiple of 2 MiB, got {window}"
            )));
        }
        let dax = DaxOptions {
            // On unless turned off; an abnormal exit cannot wedge the
            // process (kvm-ept's exit guard), and without FUSE it falls back.
            enabled: cli.dax.or(file.dax).unwrap_or(OnOff::On) == OnOff::On,
            window,
            pool_dir: cli.pool_dir.clone().or(file.pool_dir),
        };
        let cxl_ratio = match cli.cxl_ratio.or(file.cxl_ratio) {
            Some(r) => crate::placement::check_ratio(r)
                .map_err(|e| LoadDaemonConfigError::Invalid(e.to_string()))?,
            None => crate::placement::DEFAULT_CXL_RATIO,
        };
        let interval_text = cli.metrics_interval.clone().or(file.metrics_interval);
        let metrics_interval = match interval_text {
            Some(t) => {
                let ns = cxlfs_device_model::units::parse_duration_ns(&t).map_err(|e| {
                    LoadDaemonConfigError::Invalid(format!("metrics_interval `{t}`: {e}"))
                })?;
                if ns < 1_000_000 {
                    return Err(LoadDaemonConfigError::Invalid(format!(
                        "metrics_interval must be at least 1ms, got `{t}`"
                    )));
                }
                std::time::Duration::from_nanos(ns)
            }
            None => crate::metrics::file::DEFAULT_INTERVAL,
        };
        Ok(DaemonConfig {
            control,
            cxl_ratio,
            metrics_file: cli.metrics_file.clone().or(file.metrics_file),
            metrics_interval,
            dax,
            device,
            device_origin: origin,
            shared_dir: cli
                .shared_dir
                .clone()
                .or(file.shared_dir)
                .ok_or(LoadDaemonConfigError::Missing("shared_dir"))?,
            vms,
            cache: cli.cache.or(file.cache).unwrap_or_default(),
            metrics_addr: cli.metrics_addr.or(file.metrics_addr),
            metrics_allow_remote: cli.metrics_allow_remote
                || file.metrics_allow_remote.unwrap_or(false),
            queues,
            max_readahead: cli.max_readahead.or(file.max_readahead),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
