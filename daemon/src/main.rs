//! `cxlfsd`: the multi-VM vhost-user virtio-fs daemon over the emulated CXL-SSD.

use clap::Parser;
use cxlfs_device_model::Device;
use cxlfsd::abits::{self, AccessBitsSource};
use cxlfsd::hits::{HitPlanes, HitSource, HitSources, RegionKind};
use cxlfsd::sandbox::{caps, seccomp, Keep, Leftovers, SandboxMode};
use cxlfsd::server::ServerOptions;
use cxlfsd::{
    AccessSampler, Cli, ControlSocket, DaemonConfig, DaemonState, Features, ListeningVm,
    MemoryRegions, MetricsFileWriter, Placement, RegionPlane, SessionOptions, SharedDevice, VmSpec,
};
use residency::HelperCommand;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use tracing_subscriber::EnvFilter;

/// glibc's malloc gives each busy thread an arena of its own (up to eight
/// per core) and, once a large buffer is freed, serves large buffers from
/// the arenas too; the daemon's many request threads then keep freed memory
/// in each, and its resident memory climbs for as long as it runs (the
/// soak measured 9 → 91 MiB over 20 minutes with 17 MiB of live heap).
/// Two arenas and a fixed 128 KiB mmap threshold keep it flat (16–18 MiB
/// over the same soak). `MALLOC_ARENA_MAX` or a malloc `GLIBC_TUNABLES` in
/// the environment win.
fn bound_malloc_arenas() {
    let tuned = std::env::var_os("MALLOC_ARENA_MAX").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("malloc"));
    if !tuned {
        // SAFETY: mallopt takes two integers; called first thing in main,
        // before any other thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
            libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
        }
    }
}

fn main() -> ExitCode {
    bound_malloc_arenas();
    // A memory region's plane helper is this same program re-run: it
    // serves and exits here, before anything else starts.
    residency::helper_main_if_requested();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = format!("cxlfsd: {e}");
            let mut src = e.source();
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}

/// What `run` and its steps fail with (printed with its sources by `main`).
type BoxError = Box<dyn std::error::Error>;

/// The daemon from configuration to clean shutdown: set up the device,
/// memory regions, sessions and metrics while the host is in reach, then
/// confine the process, serve until a termination signal, and shut down.
fn run(cli: &Cli) -> Result<(), BoxError> {
    let cfg = DaemonConfig::load(cli)?;
    if cli.print_config {
        print_config(&cfg);
        return Ok(());
    }
    check_config(&cfg)?;
    // Before any thread exists, so that every thread inherits the mask
    // (and the scheduling policy).
    cxlfsd::block_termination_signals()?;
    if let Some(prio) = cfg.queues.realtime_priority {
        cxlfsd::make_daemon_realtime(prio)?;
        tracing::info!(prio, "every daemon thread under SCHED_FIFO");
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cfg.vms.len() > cpus {
            // Measured: 16 guests on 2 CPUs, one guest's reads all but
            // stopped (daemon/README.md, `--realtime-priority`).
            tracing::warn!(
                vms = cfg.vms.len(),
                cpus,
                "more VMs than CPUs under SCHED_FIFO: the daemon's threads can starve a guest's vCPUs"
            );
        }
    }
    // Also before any thread: a namespace is per thread.
    let sandbox = cli.sandbox.unwrap_or_else(default_sandbox);
    let fd_limit = cxlfsd::sandbox::prepare(sandbox)?;
    // Sessions open it by path from inside the sandbox, where the current
    // directory is the new root's.
    let shared_dir = std::fs::canonicalize(&cfg.shared_dir)?;

    let shared = start_device(&cfg)?;
    let memory = start_memory(&cfg, &shared, cli.seccomp)?;
    let (state, control_socket) = start_state(&cfg, shared, &shared_dir, memory.as_ref())?;
    let metrics_file = start_metrics(&cfg, &state)?;
    let (hit_sources, areas) = start_hit_sources(&cfg, &state, memory.as_ref())?;
    let vms = resolve_vm_dirs(&cfg)?;
    let listening = vms
        .iter()
        .map(|vm| cxlfsd::listen(vm.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    // Removed at exit through their directories: the sandbox hides them.
    let mut leftovers = Leftovers::default();
    for path in cfg
        .vms
        .iter()
        .map(|v| &v.socket)
        .chain(&cfg.control.socket)
        .chain(&areas)
    {
        leftovers.remember(path);
    }
    confine(cli, &cfg, sandbox, shared_dir, &vms, fd_limit)?;
    serve_until_signal(&state, listening)?;
    // No page is armed and no bit read once the planes start to close.
    drop(hit_sources);
    shut_down(&state, control_socket.as_ref(), metrics_file, leftovers);
    Ok(())
}

/// `--print-config`: the resolved configuration, as comments and TOML.
fn print_config(cfg: &DaemonConfig) {
    println!("# device: {}", cfg.device_origin);
    println!("# shared_dir: {}", cfg.shared_dir.display());
    println!("# cxl_ratio: {}", cfg.cxl_ratio);
    for vm in &cfg.vms {
        println!("# vm {} = {}", vm.name, vm.socket.display());
    }
    print!("{}", cfg.device.to_toml_string());
}

/// A configuration the daemon can serve: at least one VM, and a shared
/// directory that is one.
fn check_config(cfg: &DaemonConfig) -> Result<(), BoxError> {
    if cfg.vms.is_empty() {
        return Err("no VMs: pass --vm NAME=SOCKET_PATH or list [[vm]] in --config".into());
    }
    if !cfg.shared_dir.is_dir() {
        return Err(format!("shared dir {} is not a directory", cfg.shared_dir.display()).into());
    }
    Ok(())
}

/// The device model, with its DRAM/CXL placement and room for the memory
/// regions.
fn start_device(cfg: &DaemonConfig) -> Result<Arc<SharedDevice>, BoxError> {
    let device = Device::new(cfg.device.clone())?;
    tracing::info!(device = %cfg.device_origin, capacity = device.capacity_bytes(), "device model ready");
    let placement = Placement::new(cfg.cxl_ratio)?;
    let memory_bytes: u64 = cfg.memory_regions.iter().map(|r| r.size).sum();
    let shared = Arc::new(SharedDevice::with_memory(device, placement, memory_bytes)?);
    tracing::info!(cxl_ratio = cfg.cxl_ratio, "DRAM/CXL placement");
    Ok(shared)
}

/// Memory mode's regions, if any: before the sandbox (each region's
/// helper is this program, run again) and before any VM maps guest memory.
fn start_memory(
    cfg: &DaemonConfig,
    shared: &Arc<SharedDevice>,
    seccomp: seccomp::SeccompMode,
) -> Result<Option<Arc<MemoryRegions>>, BoxError> {
    if cfg.memory_regions.is_empty() {
        return Ok(None);
    }
    let dir = std::path::PathBuf::from(format!("/run/cxlfsd/memory-{}", std::process::id()));
    let m = MemoryRegions::start(
        shared,
        &cfg.memory_regions,
        &dir,
        &HelperCommand {
            seccomp,
            ..HelperCommand::current_exe()
        },
        RegionPlane {
            compensation: cfg.queues.dax_compensation,
            transport: cfg.queues.plane_transport,
        },
    )?;
    let _ = std::fs::remove_dir(&dir);
    Ok(Some(m))
}

/// The daemon's state (sessions, the DAX plane, cache control) and its
/// control socket, if one was asked for.
fn start_state(
    cfg: &DaemonConfig,
    shared: Arc<SharedDevice>,
    shared_dir: &Path,
    memory: Option<&Arc<MemoryRegions>>,
) -> Result<(Arc<DaemonState>, Option<ControlSocket>), BoxError> {
    if !cfg.dax.enabled {
        tracing::info!("DAX window off (--dax off)");
    }
    let features = Features {
        dax: cfg
            .dax
            .enabled
            .then_some((cfg.dax.pool_dir.as_deref(), cfg.dax.window)),
        control: Some(cfg),
        memory,
    };
    let (state, control_socket) = DaemonState::start(
        shared,
        SessionOptions {
            shared_dir: shared_dir.to_path_buf(),
            max_open_files: cfg.max_open_files,
            cache: cfg.cache,
            queues: cfg.queues,
            server: ServerOptions {
                max_readahead: cfg.max_readahead,
            },
            guest_ids: cfg.guest_ids.clone(),
        },
        features,
    )?;
    if let Some(d) = state.dax() {
        d.set_writeback_interval(cfg.dax.writeback_interval);
        d.set_reply_timeout(cfg.dax.reply_timeout);
    }
    Ok((state, control_socket))
}

/// The running hit sources; dropping this stops their threads (the
/// metrics keep the sources themselves for their figures).
struct RunningSources {
    bits: Option<Arc<AccessBitsSource>>,
    sampler: Option<Arc<AccessSampler>>,
}

impl Drop for RunningSources {
    fn drop(&mut self) {
        if let Some(s) = &self.sampler {
            s.stop();
        }
        if let Some(b) = &self.bits {
            b.stop();
        }
    }
}

/// The hit sources, as configured: accessed bits (an area per VM region,
/// beside the VM's socket) preferred, access sampling for what the bits do
/// not cover. Returns them and the areas' paths (removed at exit).
fn start_hit_sources(
    cfg: &DaemonConfig,
    state: &Arc<DaemonState>,
    memory: Option<&Arc<MemoryRegions>>,
) -> Result<(RunningSources, Vec<PathBuf>), BoxError> {
    let mut sources = HitSources::default();
    let on = HitPlanes {
        device: state.shared.clone(),
        dax: state.dax().cloned(),
        memory: memory.cloned(),
    };
    let mut paths = Vec::new();
    let bits = if cfg.access_bits.is_on() {
        let mut areas = Vec::new();
        for vm in &cfg.vms {
            if state.dax().is_some() {
                areas.push(abits::create_area(
                    &vm.name,
                    &vm.socket,
                    RegionKind::File,
                    cfg.dax.window,
                    cfg.access_bits_period,
                )?);
            }
            if let Some(r) = cfg.memory_regions.iter().find(|r| r.vm == vm.name) {
                areas.push(abits::create_area(
                    &vm.name,
                    &vm.socket,
                    RegionKind::Memory,
                    r.size,
                    cfg.access_bits_period,
                )?);
            }
        }
        paths.extend(areas.iter().map(|a| a.area.path().to_path_buf()));
        let live = Arc::downgrade(state);
        let connected: abits::scanner::Connected =
            Box::new(move |vm| live.upgrade().is_some_and(|s| s.is_connected(vm)));
        let source = Arc::new(AccessBitsSource::start(
            areas,
            cfg.access_bits_period,
            on.clone(),
            connected,
            cfg.access_sampling.is_some(),
        )?);
        sources.push(source.clone());
        Some(source)
    } else {
        tracing::info!("accessed bits off (--access-bits off)");
        None
    };
    let sampler = match cfg.access_sampling {
        Some(rate) => {
            let preferred = bits.clone().map(|b| b as Arc<dyn HitSource>);
            let s = Arc::new(AccessSampler::start(on, rate, preferred)?);
            sources.push(s.clone());
            Some(s)
        }
        None => None,
    };
    if bits.is_none() && sampler.is_none() {
        tracing::info!("no hit source: the device's policy sees the guests' misses only");
    }
    state.metrics.set_hit_sources(Arc::new(sources));
    Ok((RunningSources { bits, sampler }, paths))
}

/// The metrics endpoint and the metrics time series, as configured.
fn start_metrics(
    cfg: &DaemonConfig,
    state: &DaemonState,
) -> Result<Option<MetricsFileWriter>, BoxError> {
    if let Some(addr) = cfg.metrics_addr {
        let bound = cxlfsd::serve_metrics(addr, cfg.metrics_allow_remote, state.metrics.clone())?;
        tracing::info!(addr = %bound, "metrics endpoint up");
    }
    let metrics_file = match &cfg.metrics_file {
        Some(path) => {
            let w = MetricsFileWriter::start(path, cfg.metrics_interval, state.metrics.clone())?;
            tracing::info!(path = %path.display(), interval = ?cfg.metrics_interval, "metrics time series on");
            Some(w)
        }
        None => None,
    };
    Ok(metrics_file)
}

/// The VMs with their own share directories absolute and resolved: they
/// are bound at the same paths in the sandbox, whose current directory is
/// its root.
fn resolve_vm_dirs(cfg: &DaemonConfig) -> Result<Vec<VmSpec>, BoxError> {
    let mut vms = cfg.vms.clone();
    for vm in &mut vms {
        if let Some(dir) = &vm.dir {
            vm.dir =
                Some(std::fs::canonicalize(dir).map_err(|e| {
                    format!("vm {}: share directory {}: {e}", vm.name, dir.display())
                })?);
        }
    }
    Ok(vms)
}

/// Everything the daemon needs from the host is open: confines it (the
/// sandbox keeping the share directories, capabilities, seccomp).
fn confine(
    cli: &Cli,
    cfg: &DaemonConfig,
    sandbox: SandboxMode,
    shared_dir: PathBuf,
    vms: &[VmSpec],
    fd_limit: u64,
) -> Result<(), BoxError> {
    let keep = Keep {
        dirs: std::iter::once(shared_dir)
            .chain(vms.iter().filter_map(|v| v.dir.clone()))
            .collect(),
    };
    cxlfsd::sandbox::enter(sandbox, &keep)?;
    let extra_caps: &[u32] = if cfg.queues.realtime_priority.is_some() {
        &[caps::CAP_SYS_NICE]
    } else {
        &[]
    };
    caps::drop_capabilities(extra_caps)?;
    seccomp::install(cli.seccomp)?;
    tracing::info!(%sandbox, seccomp = %cli.seccomp, fd_limit, "confined; serving");
    Ok(())
}

/// Serves every VM until a termination signal, then stops the sessions
/// and waits for their threads.
fn serve_until_signal(
    state: &Arc<DaemonState>,
    listening: Vec<ListeningVm>,
) -> Result<(), BoxError> {
    let mut threads = Vec::new();
    for vm in listening {
        threads.push(state.spawn_listening(vm)?);
    }
    if let Err(e) = cxlfsd::spawn_heap_trimmer(cxlfsd::HEAP_TRIM_EVERY) {
        tracing::warn!(error = %e, "cannot start the heap trimmer: memory freed after a burst stays resident");
    }
    let sig = cxlfsd::wait_for_termination();
    tracing::info!(signal = sig, "shutting down");
    state.request_shutdown();
    for t in threads {
        if t.join().is_err() {
            tracing::error!("a VM thread panicked");
        }
    }
    Ok(())
}

/// After the sessions: the control socket closes, data is flushed, the
/// last metrics sample is written, the DAX plane stops and the sockets
/// are removed.
fn shut_down(
    state: &DaemonState,
    control_socket: Option<&ControlSocket>,
    metrics_file: Option<MetricsFileWriter>,
    leftovers: Leftovers,
) {
    if let Some(c) = control_socket {
        c.shutdown();
    }
    state.flush_all();
    // After the flush (its NAND programs count), before the plane goes
    // (its trap counters are read).
    if let Some(w) = metrics_file {
        if let Err(e) = w.finish() {
            tracing::error!(error = %e, "cannot write the final metrics sample");
        }
    }
    // Before exit: the pool must not be open on our own mount when our
    // FUSE threads die (see DaxPlane::shutdown).
    state.stop_dax();
    leftovers.remove_all();
    tracing::info!("clean shutdown");
}

/// The strongest sandbox that works: a mount namespace needs root.
fn default_sandbox() -> SandboxMode {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        SandboxMode::Namespace
    } else {
        SandboxMode::None
    }
}
