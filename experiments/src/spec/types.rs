//! The tables of an experiment spec: [`Spec`] itself, `[daemon]`, `[vms]`,
//! `[[files]]` and `[image]`, with their defaults. The phase tables are in
//! `phase.rs`, `[quick]` in `quick.rs`.

use super::phase::PhaseSpec;
use super::tree::size_value;
use crate::plot_spec::PlotSpec;
use cxlfs_api::hits::{access_bits, access_sampling_rate, AccessBits};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One experiment, as written (after `--set`, before the sweep).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Short name (plot titles, the table header).
    pub name: String,
    /// What the experiment measures (free text).
    #[serde(default)]
    pub description: String,
    /// Runs per sweep point.
    #[serde(default = "one")]
    pub repeats: u32,
    /// The daemon.
    #[serde(default)]
    pub daemon: DaemonSpec,
    /// The guests.
    #[serde(default)]
    pub vms: VmsSpec,
    /// The guest image: extra Debian packages, the kernel.
    #[serde(default)]
    pub image: ImageSpec,
    /// Free variables for phase commands (`{name}`), sweepable as `vars.NAME`.
    #[serde(default)]
    pub vars: toml::Table,
    /// Files created in the share before the daemon starts.
    #[serde(default)]
    pub files: Vec<FileSpec>,
    /// fio options for every job of every phase (`--KEY=VALUE`).
    #[serde(default)]
    pub fio: toml::Table,
    /// The phases (a fio invocation or a shell command each), in order, in
    /// the same boot.
    pub phases: Vec<PhaseSpec>,
    /// Replay the guests' fio I/O through the run's device and count its
    /// hit share as the daemon counts it (`replay.*` columns): each guest's
    /// fio logs its I/O (`write_iolog`, kept in the guest until the last
    /// barrier; logging costs a TCG guest about a fifth of its IOPS). For
    /// fio phases over the DAX window, one job a phase, every file page on
    /// the CXL tier (`cxl_ratio` 100; runs at other ratios neither log nor
    /// replay: which pages the pool put on DRAM is the daemon's).
    #[serde(default)]
    pub replay_iolog: bool,
    /// Swept keys: dotted path → values (cartesian product, keys in sorted order).
    #[serde(default)]
    pub sweep: BTreeMap<String, Vec<toml::Value>>,
    /// How `--quick` shrinks the run.
    #[serde(default)]
    pub quick: QuickSpec,
    /// Plots (default: every fio/daemon figure of interest against each swept key).
    #[serde(default)]
    pub plots: Vec<PlotSpec>,
}

fn one() -> u32 {
    1
}

impl Spec {
    /// Whether this run's guests log their fio I/O for the replay
    /// (`replay_iolog`): only where it can be replayed, with every file
    /// page on the CXL tier (`cxl_ratio` 100).
    pub fn replays_iolog(&self) -> bool {
        self.replay_iolog && self.daemon.cxl_ratio.unwrap_or(super::DEFAULT_CXL_RATIO) == 100
    }
}

/// `[daemon]`: how `cxlfsd` is started.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonSpec {
    /// The virtio-fs back-end the guests mount: `cxlfsd` (the default) or
    /// the stock `virtiofsd`, one per guest, the baseline (no device, no
    /// DAX, no memory mode; `cache` is its `--cache`).
    #[serde(default)]
    pub backend: Backend,
    /// Device preset (`cxlfsd --preset`).
    #[serde(default)]
    pub preset: Option<String>,
    /// Device-model keys (`cxlfsd --set KEY=VALUE`), nested or dotted:
    /// `cache.size_bytes = "16MiB"`, `nand.read_ns = "40us"`.
    #[serde(default)]
    pub device: toml::Table,
    /// Guest caching (`cxlfsd --cache`): never | auto | always.
    #[serde(default = "default_cache")]
    pub cache: String,
    /// Share of file pages on the CXL-SSD tier, 0–100 (`cxlfsd --cxl-ratio`;
    /// not passed when absent: the daemon's default, 100).
    #[serde(default)]
    pub cxl_ratio: Option<u8>,
    /// DAX window (`cxlfsd --dax on`; guests get a window and mount with `dax=always`).
    #[serde(default)]
    pub dax: bool,
    /// Memory mode: each VM gets a CXL memory region of this size
    /// (`cxlfsd --cxl-memory VM=SIZE`), its CPU-less NUMA node 1.
    #[serde(default)]
    pub cxl_memory: Option<toml::Value>,
    /// Access sampling (`cxlfsd --access-sampling N/s`): resident pages
    /// armed per second, so that hits at memory speed reach the policy;
    /// `"off"` (the default: no flag), a whole number, or `"N/s"`.
    #[serde(default)]
    pub access_sampling: Option<toml::Value>,
    /// Accessed bits (`cxlfsd --access-bits`, the guests' `run-vm.sh
    /// --dax-abits` / `--cxl-abits`): `"on"` or `"off"` (or a boolean);
    /// [`DEFAULT_ACCESS_BITS`] when absent.
    #[serde(default)]
    pub access_bits: Option<toml::Value>,
    /// How often the bits are read and re-armed (`cxlfsd
    /// --access-bits-period`, e.g. `"10ms"`; absent: the daemon's default).
    #[serde(default)]
    pub access_bits_period: Option<String>,
    /// Evicted pool pages a DAX miss may leave awaiting invalidation
    /// (`cxlfsd --dax-eviction-backlog`): `"auto"` (the daemon's default:
    /// no flag), `"off"`, or a number of pages (0: none).
    #[serde(default)]
    pub dax_eviction_backlog: Option<toml::Value>,
    /// Latency compensation (`cxlfsd --latency-compensation`): `auto` (the
    /// daemon's default: no flag), `off`, a duration, or `dax=…,fuse=…`.
    #[serde(default)]
    pub latency_compensation: Option<String>,
    /// Daemon metrics sample interval (`--metrics-interval`), when the daemon supports it.
    #[serde(default = "default_metrics_interval")]
    pub metrics_interval: String,
    /// Extra `cxlfsd` arguments, verbatim.
    #[serde(default)]
    pub args: Vec<String>,
}

/// `[daemon] backend`: which virtio-fs back-end serves the guests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// One `cxlfsd` for every guest, on the emulated device.
    #[default]
    Cxlfsd,
    /// The stock `virtiofsd`, one process per guest (`qemu-configs/install-virtiofsd.sh`).
    Virtiofsd,
}

impl Backend {
    /// Its name in specs and results.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cxlfsd => "cxlfsd",
            Backend::Virtiofsd => "virtiofsd",
        }
    }
}

/// `[daemon] access_bits` when a spec leaves it out: the daemon's default.
pub const DEFAULT_ACCESS_BITS: AccessBits = AccessBits::On;

fn default_cache() -> String {
    "never".into()
}

fn default_metrics_interval() -> String {
    "1s".into()
}

impl DaemonSpec {
    /// The CXL memory region size in bytes (memory mode), `None` without
    /// one (a spec that loaded has a valid size here).
    pub fn cxl_memory_bytes(&self) -> Option<u64> {
        self.cxl_memory.as_ref().and_then(|m| size_value(m).ok())
    }

    /// The access-sampling rate (pages per second), `None` when off (a spec
    /// that loaded has a valid value here).
    pub fn access_sampling_rate(&self) -> Option<u32> {
        self.access_sampling
            .as_ref()
            .and_then(|v| access_sampling_rate(v.into()).ok().flatten())
    }

    /// The accessed bits' period (ns): the spec's, or the daemon's default
    /// (a spec that loaded has a valid value here).
    pub fn access_bits_period_ns(&self) -> u64 {
        self.access_bits_period
            .as_deref()
            .and_then(|t| cxlfs_device_model::units::parse_duration_ns(t).ok())
            .unwrap_or(cxlfs_api::hits::DEFAULT_ACCESS_BITS_PERIOD_NS)
    }

    /// The DAX eviction backlog (a spec that loaded has a valid value here).
    pub fn dax_eviction_backlog(&self) -> cxlfs_api::dax::EvictionBacklogSetting {
        self.dax_eviction_backlog
            .as_ref()
            .and_then(|v| cxlfs_api::dax::eviction_backlog(v.into()).ok())
            .unwrap_or_default()
    }

    /// Whether the guests need the project's QEMU: for a DAX window, or
    /// for accessed bits.
    pub fn needs_patched_qemu(&self) -> bool {
        self.dax || self.access_bits().is_on()
    }

    /// Accessed bits on or off (a spec that loaded has a valid value here).
    pub fn access_bits(&self) -> AccessBits {
        if self.backend == Backend::Virtiofsd {
            return AccessBits::Off;
        }
        self.access_bits
            .as_ref()
            .and_then(|v| access_bits(v.into()).ok())
            .unwrap_or(DEFAULT_ACCESS_BITS)
    }
}

impl Default for DaemonSpec {
    fn default() -> Self {
        DaemonSpec {
            backend: Backend::default(),
            preset: None,
            device: toml::Table::new(),
            cache: default_cache(),
            cxl_ratio: None,
            dax: false,
            cxl_memory: None,
            access_sampling: None,
            access_bits: None,
            access_bits_period: None,
            dax_eviction_backlog: None,
            latency_compensation: None,
            metrics_interval: default_metrics_interval(),
            args: Vec::new(),
        }
    }
}

/// `[vms]`: the guests, all alike, named `vm0`, `vm1`, ...
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmsSpec {
    /// How many guests run at once.
    #[serde(default = "one")]
    pub count: u32,
    /// Guest RAM (QEMU syntax).
    #[serde(default = "default_memory")]
    pub memory: String,
    /// vCPUs per guest.
    #[serde(default = "one")]
    pub smp: u32,
    /// Guest mount options of the share (default with DAX: `dax=always`).
    #[serde(default)]
    pub mountopts: Option<String>,
    /// DAX window per guest, used when `daemon.dax` is on: both the
    /// daemon's `--dax-window` and QEMU's `cache-size` (which must agree).
    #[serde(default = "default_dax_window")]
    pub dax_window: String,
    /// Guest time limit per run (the guest is killed after it).
    #[serde(default = "default_vm_timeout")]
    pub timeout: String,
    /// Every vCPU thread under `SCHED_FIFO` at this priority (run-vm.sh
    /// `--realtime-priority`): a vCPU woken by a trap's reply runs before
    /// the host's ordinary threads. Below `cxlfsd`'s own priority.
    #[serde(default)]
    pub realtime_priority: Option<u8>,
    /// Extra guest kernel command-line arguments, such as
    /// `nohz_full=1` to keep the timer tick off a measuring vCPU.
    #[serde(default)]
    pub kernel_args: Vec<String>,
}

fn default_memory() -> String {
    "1G".into()
}

fn default_dax_window() -> String {
    "64M".into()
}

fn default_vm_timeout() -> String {
    "600s".into()
}

impl Default for VmsSpec {
    fn default() -> Self {
        VmsSpec {
            count: 1,
            memory: default_memory(),
            smp: 1,
            mountopts: None,
            dax_window: default_dax_window(),
            timeout: default_vm_timeout(),
            realtime_priority: None,
            kernel_args: Vec::new(),
        }
    }
}

/// `[[files]]`: a file in the share, filled with deterministic pseudo-random bytes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// Path in the share; with `count > 1` it must contain `{i}` (0, 1, ...).
    pub path: String,
    /// Size (`16MiB`, `4k`, bytes).
    pub size: toml::Value,
    /// How many files of this pattern.
    #[serde(default = "one")]
    pub count: u32,
}

/// `[image]`: what `cxlfs image build` puts in the guest image.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// Extra Debian packages (all their files and shared libraries).
    #[serde(default)]
    pub packages: Vec<String>,
    /// Kernel: `default` (Debian 12's), `backports` (bookworm-backports:
    /// weighted interleave needs Linux >= 6.9) or a package name.
    #[serde(default)]
    pub kernel: Option<String>,
}

/// The `[quick]` table: how `--quick` shrinks a spec (`quick.rs` applies it).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuickSpec {
    /// File sizes, fio sizes and the device cache are divided by this.
    #[serde(default = "default_divisor")]
    pub size_divisor: u32,
    /// No size shrinks below this.
    #[serde(default = "default_min_size")]
    pub min_size: String,
    /// fio `runtime` and `ramp_time` are capped at this.
    #[serde(default = "default_max_runtime")]
    pub max_runtime: String,
    /// Keys set under `--quick` (dotted path → value, as `--set`), applied
    /// before the sweep: `"sweep.vars.x" = [1, 2]`, `"vars.laps" = 1`.
    #[serde(default)]
    pub set: toml::Table,
}

fn default_divisor() -> u32 {
    8
}

fn default_min_size() -> String {
    "1MiB".into()
}

fn default_max_runtime() -> String {
    "2s".into()
}

impl Default for QuickSpec {
    fn default() -> Self {
        QuickSpec {
            size_divisor: default_divisor(),
            min_size: default_min_size(),
            max_runtime: default_max_runtime(),
            set: toml::Table::new(),
        }
    }
}
