//! [`Settings`]: the one shape both sources fill. `daemon.toml` is
//! deserialized into it (its keys are the field names) and the command line
//! (`Cli`) converts into it; [`Settings::over`] layers one on the
//! other, and `DaemonConfig::try_from` validates the result.

use super::{LoadDaemonConfigError, OnOff, VmSpec};
use crate::passthrough::CacheMode;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Declares [`Settings`] with every field `Option<T>`, its field names
/// ([`Settings::KEYS`]), and the layering step, generated for every field
/// alike so that no field can be forgotten in it.
macro_rules! settings {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident: $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$fmeta])* pub $field: Option<$ty>, )*
        }

        impl $name {
            /// Every field's name (the `daemon.toml` keys, and `sets`).
            pub const KEYS: &'static [&'static str] = &[$(stringify!($field)),*];

            /// Field by field: `self`'s value where it has one, else `base`'s
            /// (flags over the file: `cli.over(file)`).
            pub fn over(self, base: Self) -> Self {
                Self {
                    $( $field: self.$field.or(base.$field), )*
                }
            }
        }
    };
}

settings! {
    /// The daemon's settings as a source gives them: `None` where it says
    /// nothing. The fields are the `daemon.toml` keys.
    #[derive(Debug, Clone, Default, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Settings {
        /// A preset name or an inline device-model table (`--preset NAME`:
        /// that name).
        device: toml::Value,
        /// Device config overrides `KEY=VALUE`, applied in order on top of
        /// `device` (`--set`; flags only).
        #[serde(skip)]
        sets: Vec<String>,
        /// Shared directory.
        shared_dir: PathBuf,
        /// Cache mode.
        cache: CacheMode,
        /// Metrics address.
        metrics_addr: SocketAddr,
        /// Allow non-loopback metrics.
        metrics_allow_remote: bool,
        /// Request queues per VM.
        request_queues: usize,
        /// Largest queue size.
        queue_size: usize,
        /// Readahead cap.
        max_readahead: u32,
        /// SCHED_FIFO priority of every daemon thread.
        realtime_priority: u8,
        /// Latency compensation: "auto", "off" or a duration ("12us"), or
        /// "dax=SPEC,fuse=SPEC".
        latency_compensation: String,
        /// Residency planes' transport (DAX and memory regions): "auto",
        /// "dev-fuse" or "io-uring".
        plane_transport: String,
        /// One polling plane thread instead of sleeping ones.
        plane_poll: bool,
        /// Access sampling: "off" or resident pages armed per second
        /// ("2000/s", or a bare number).
        access_sampling: toml::Value,
        /// Accessed bits from the VMM: "on" (default) or "off".
        access_bits: toml::Value,
        /// How often the bits are read and re-armed ("10ms").
        access_bits_period: String,
        /// virtio-fs tag of the device config space.
        tag: String,
        /// DAX window on / off.
        dax: OnOff,
        /// DAX window size (e.g. "1GiB").
        dax_window: String,
        /// Pool mountpoint.
        pool_dir: PathBuf,
        /// Period of the pool's background write-back ("0": off).
        dax_writeback_interval: String,
        /// Evicted pool pages that may await invalidation before a DAX
        /// miss waits: "auto", "off" or a number of pages.
        dax_eviction_backlog: toml::Value,
        /// How long a SHMEM_MAP / SHMEM_UNMAP waits for the VMM's ack.
        dax_reply_timeout: String,
        /// Control socket path.
        control_socket: PathBuf,
        /// Control socket permissions, octal text (e.g. "0660").
        control_socket_mode: String,
        /// Per-VM pin quota (e.g. "16MiB").
        pin_quota_bytes: String,
        /// Most bytes one pin / prefetch covers (e.g. "256MiB").
        max_range_bytes: String,
        /// Bytes one VM may prefetch per second (e.g. "64MiB").
        prefetch_budget_bytes: String,
        /// Inodes + open handles one VM may hold.
        max_open_files: u64,
        /// Guests may change the whole device.
        guest_device_control: bool,
        /// Percent of file pages on the CXL tier (0..=100).
        cxl_ratio: u64,
        /// JSON-lines metrics file.
        metrics_file: PathBuf,
        /// Its sampling interval (e.g. "1s").
        metrics_interval: String,
        /// VMs (`[[vm]]`, or every `--vm`).
        vm: Vec<VmSpec>,
        /// CXL memory regions, `NAME=SIZE` each (memory mode: the VM named
        /// NAME gets a CPU-less NUMA node of SIZE on the device).
        cxl_memory: Vec<String>,
        // --- guest credentials (issue 11 item 3) ---
        /// uid translation rules (virtiofsd's `--translate-uid` syntax).
        translate_uid: Vec<String>,
        /// gid translation rules.
        translate_gid: Vec<String>,
        /// Strip set-id bits from modes guests set.
        strip_setid: bool,
    }
}

/// `daemon.toml`: the `Settings` the file gives.
pub type FileConfig = Settings;

impl Settings {
    /// Reads and parses a `daemon.toml`.
    pub fn from_file(path: &Path) -> Result<Self, LoadDaemonConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| LoadDaemonConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| LoadDaemonConfigError::Parse {
            path: shown,
            message: e.to_string(),
        })
    }
}
