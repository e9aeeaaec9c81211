//! The command line: the same [`Settings`] as `daemon.toml`, plus what is
//! only a flag (`--config`, `--set`, `--print-config`).

use super::{parse_vm, LoadDaemonConfigError, OnOff, Settings};
use crate::passthrough::CacheMode;
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;

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
    /// Host directory exported to every VM without a directory of its own.
    #[arg(long, value_name = "DIR")]
    pub shared_dir: Option<PathBuf>,
    /// A VM: its name, its vhost-user socket and optionally its own shared
    /// directory (`NAME=SOCK:DIR`; VMs share files only where they share a
    /// directory). Repeatable; replaces the file's list.
    #[arg(long = "vm", value_name = "NAME=SOCKET_PATH[:DIR]")]
    pub vms: Vec<String>,
    /// Memory mode: give the VM NAME a CXL memory region of SIZE on the
    /// emulated device (e.g. `vm0=2GiB`, a multiple of 2 MiB), which its
    /// QEMU maps as a CPU-less NUMA node (fd from `cxlfs ctl memory-fd`).
    /// Repeatable; replaces the file's list.
    #[arg(long = "cxl-memory", value_name = "NAME=SIZE")]
    pub cxl_memory: Vec<String>,
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
    /// Run every daemon thread under SCHED_FIFO at this priority (1..=99;
    /// needs CAP_SYS_NICE): other work on a busy host cannot preempt a
    /// miss's path. For one or a few guests: with many, their vCPUs starve.
    #[arg(long, value_name = "PRIO")]
    pub realtime_priority: Option<u8>,
    /// Latency compensation: auto (default) | off | a duration (e.g.
    /// `12us`), for both paths, or `dax=SPEC,fuse=SPEC` for each. Held
    /// replies (DAX traps; READ / WRITE on the FUSE path) are released
    /// ahead of their modeled completion by the path's own cost, so that
    /// the guest sees the modeled latency, not the modeled latency plus
    /// the path. `auto` measures it (the plane: calibration probes at
    /// mount and 16 a second; the FUSE path: one host thread wake-up, a
    /// lower bound); `off` holds every reply to its modeled completion, as
    /// before.
    #[arg(long, value_name = "auto|off|NS|dax=..,fuse=..")]
    pub latency_compensation: Option<String>,
    /// How the residency planes (the DAX window's, and memory mode's
    /// region helpers) talk to the host kernel: auto (default: FUSE over
    /// io_uring where the kernel offers it, i.e.
    /// `/sys/module/fuse/parameters/enable_uring` is Y, else /dev/fuse) |
    /// dev-fuse | io-uring (refuse to start a plane without it).
    #[arg(long, value_name = "auto|dev-fuse|io-uring")]
    pub plane_transport: Option<String>,
    /// One plane thread polls for traps instead of sleeping ones: saves a
    /// wake-up per miss, burns a core.
    #[arg(long)]
    pub plane_poll: bool,
    /// Access sampling: off (default) | RATE, resident device-cache pages
    /// armed per second (`2000/s`, or a bare number; at most 1000000/s).
    /// An armed page is dropped from its residency plane (DAX window or
    /// CXL memory region) while the device cache keeps it: the guest's next
    /// access to it traps and is charged as a device hit, so the policy
    /// sees accesses that otherwise run at memory speed unseen. Costs one
    /// trap per sampled access; charges no NAND time.
    #[arg(long, value_name = "off|RATE")]
    pub access_sampling: Option<String>,
    /// Accessed bits: on (default) | off. On: each VM's DAX window and CXL
    /// memory region get a bit area beside its socket (`SOCKET.dax-abits`,
    /// `SOCKET.cxl-abits`) that a VMM with the bits (the project's QEMU,
    /// TCG: `run-vm.sh --dax-abits` / `--cxl-abits`) sets on each page's
    /// first access after a re-arm; the daemon reads and clears them every
    /// period and tells the device's policy of each page referenced: every
    /// hit, at most once a page a period, no trap. A VM whose VMM does not
    /// attach the area falls back to access sampling, if that is on.
    #[arg(long, value_name = "on|off")]
    pub access_bits: Option<String>,
    /// How often the accessed bits are read and the VMM re-arms them
    /// (default 10ms; 1ms to 10s): a page's hits reach the policy at most
    /// once a period, at its end.
    #[arg(long, value_name = "DURATION")]
    pub access_bits_period: Option<String>,
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
    /// Size of each VM's DAX window, reported by GET_SHMEM_CONFIG: QEMU's
    /// `cache-size` must be the same (the patched QEMU asks and refuses to
    /// start with another), e.g. `1GiB`. Multiple of 2 MiB.
    #[arg(long, value_name = "BYTES")]
    pub dax_window: Option<String>,
    /// Where to mount the pool (default: /run/cxlfsd/pool-PID).
    #[arg(long, value_name = "DIR")]
    pub pool_dir: Option<PathBuf>,
    /// Write the pool's dirty pages (guest stores through DAX windows) back
    /// to the host files this often (default 5s; 0: off). A daemon crash
    /// loses at most this much of them.
    #[arg(long, value_name = "DURATION")]
    pub dax_writeback_interval: Option<String>,
    /// Evicted pool pages that may wait for their invalidation in the
    /// guests' windows before a DAX miss's reply waits for them (at most
    /// 20 ms): auto (default: 1/32 of the device cache, 32 to 512 pages) |
    /// off (misses never wait) | PAGES (0: every eviction is written before
    /// the next miss is answered). Until its invalidation lands, an evicted
    /// page is a hit the device model never sees.
    #[arg(long, value_name = "auto|off|PAGES")]
    pub dax_eviction_backlog: Option<String>,
    /// How long a SHMEM_MAP / SHMEM_UNMAP waits for the VMM's reply-ack
    /// before that VM's connection is dropped (default 10s).
    #[arg(long, value_name = "DURATION")]
    pub dax_reply_timeout: Option<String>,
    /// Serve cache-control commands (JSON lines) on this Unix socket.
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,
    /// Permissions of the control socket, octal (default 0600: owner only).
    #[arg(long, value_name = "MODE")]
    pub control_socket_mode: Option<String>,
    /// Bytes each VM may pin in the device cache (default: 25 % of it).
    #[arg(long, value_name = "BYTES")]
    pub pin_quota_bytes: Option<String>,
    /// Most bytes of file data one pin or prefetch covers (default: the
    /// device cache size); a larger pin is refused, a prefetch cut.
    #[arg(long, value_name = "BYTES")]
    pub max_range_bytes: Option<String>,
    /// Bytes each VM may prefetch per second through hints (default: the
    /// device cache size).
    #[arg(long, value_name = "BYTES")]
    pub prefetch_budget_bytes: Option<String>,
    /// Inodes + open files each VM may hold (each is a host fd); LOOKUP /
    /// OPEN beyond it get EMFILE (default 65536).
    #[arg(long, value_name = "N")]
    pub max_open_files: Option<u64>,
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
    /// Sandbox (as virtiofsd's): `namespace` = a private mount namespace
    /// whose root holds only the shares, `/proc` and fusectl; `none`.
    /// Default: `namespace` as root, else `none`.
    #[arg(long, value_name = "namespace|none")]
    pub sandbox: Option<crate::sandbox::SandboxMode>,
    /// What a system call off the allow-list does: kill (default) | log |
    /// trap | none. `log` allows and logs it to the kernel log.
    #[arg(long, value_name = "ACTION", default_value_t)]
    pub seccomp: crate::sandbox::SeccompMode,
    /// Print the effective configuration and exit.
    #[arg(long)]
    pub print_config: bool,
    // --- guest credentials (issue 11 item 3) ---
    /// Translate uids between guests and the host, virtiofsd's syntax
    /// (repeatable): `map:GUEST:HOST:COUNT`, `guest:GUEST:HOST:COUNT`,
    /// `host:HOST:GUEST:COUNT`, `squash-guest:GUEST:HOST:COUNT`,
    /// `squash-host:HOST:GUEST:COUNT`, `forbid-guest:GUEST:COUNT`. Ids no
    /// rule covers pass unchanged.
    #[arg(long = "translate-uid", value_name = "RULE")]
    pub translate_uid: Vec<String>,
    /// Translate gids (same syntax as --translate-uid; repeatable).
    #[arg(long = "translate-gid", value_name = "RULE")]
    pub translate_gid: Vec<String>,
    /// Strip S_ISUID / S_ISGID from the modes guests give files (CREATE,
    /// chmod; directories keep S_ISGID): for hosts that mount the shared
    /// directory without `nosuid`.
    #[arg(long)]
    pub strip_setid: bool,
}

impl TryFrom<&Cli> for Settings {
    type Error = LoadDaemonConfigError;

    /// The settings the flags give (`None` where a flag is absent; a
    /// switch that is not given leaves the file's value). `--preset NAME`
    /// is `device = "NAME"`; `--vm` replaces the file's whole VM list.
    fn try_from(cli: &Cli) -> Result<Self, Self::Error> {
        let vm = if cli.vms.is_empty() {
            None
        } else {
            Some(
                cli.vms
                    .iter()
                    .map(|s| parse_vm(s))
                    .collect::<Result<_, _>>()?,
            )
        };
        Ok(Settings {
            device: cli.preset.clone().map(toml::Value::String),
            sets: (!cli.sets.is_empty()).then(|| cli.sets.clone()),
            shared_dir: cli.shared_dir.clone(),
            vm,
            cxl_memory: (!cli.cxl_memory.is_empty()).then(|| cli.cxl_memory.clone()),
            cache: cli.cache,
            metrics_addr: cli.metrics_addr,
            metrics_allow_remote: cli.metrics_allow_remote.then_some(true),
            request_queues: cli.request_queues,
            queue_size: cli.queue_size,
            max_readahead: cli.max_readahead,
            realtime_priority: cli.realtime_priority,
            latency_compensation: cli.latency_compensation.clone(),
            plane_transport: cli.plane_transport.clone(),
            plane_poll: cli.plane_poll.then_some(true),
            access_sampling: cli.access_sampling.clone().map(toml::Value::String),
            access_bits: cli.access_bits.clone().map(toml::Value::String),
            access_bits_period: cli.access_bits_period.clone(),
            tag: cli.tag.clone(),
            dax: cli.dax,
            dax_window: cli.dax_window.clone(),
            pool_dir: cli.pool_dir.clone(),
            dax_writeback_interval: cli.dax_writeback_interval.clone(),
            dax_reply_timeout: cli.dax_reply_timeout.clone(),
            dax_eviction_backlog: cli.dax_eviction_backlog.clone().map(toml::Value::String),
            control_socket: cli.control_socket.clone(),
            control_socket_mode: cli.control_socket_mode.clone(),
            pin_quota_bytes: cli.pin_quota_bytes.clone(),
            max_range_bytes: cli.max_range_bytes.clone(),
            prefetch_budget_bytes: cli.prefetch_budget_bytes.clone(),
            max_open_files: cli.max_open_files,
            guest_device_control: cli.guest_device_control.then_some(true),
            cxl_ratio: cli.cxl_ratio,
            metrics_file: cli.metrics_file.clone(),
            metrics_interval: cli.metrics_interval.clone(),
            translate_uid: (!cli.translate_uid.is_empty()).then(|| cli.translate_uid.clone()),
            translate_gid: (!cli.translate_gid.is_empty()).then(|| cli.translate_gid.clone()),
            strip_setid: cli.strip_setid.then_some(true),
        })
    }
}
