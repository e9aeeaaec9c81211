//! A soak: N TCG guests on one `cxlfsd` — DAX files and a CXL memory node
//! each, a small device cache so evictions and write-backs never stop —
//! running [`guest_job`] for the whole time while the host injects faults
//! on a schedule ([`faults`]), samples the daemon ([`samples`]) and at the
//! end checks every file and log into a [`Report`].
//!
//! The share is a tmpfs of its own (so the host can fill it: ENOSPC), the
//! shared file is read by every guest, and the mapped "victim" file is
//! truncated and deleted under them. A killed VM boots again under its
//! name once its region has been released; its serial logs are kept per
//! boot for the kernel checks.

pub mod faults;
pub mod guest_job;
pub mod report;
pub mod samples;

use crate::{env_knob, qemu_pid, seeded_bytes, sha256_hex, Daemon, Vm, VmOptions};
use cxlfs::procs::signal;
use faults::{control_storm, delete_mapped, fill_share, schedule, truncate_mapped, Fault};
use guest_job::{guest_job, SHARED_BYTES, SHARED_FILE, SOAK_DIR, STOP_FILE, VICTIM_FILE};
use report::{read_guest_log, Bounds, FaultRecord, Report};
use samples::{sample_process, DaemonSample, PoolSample};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long and how wide a soak is (`SOAK_MINUTES`, `SOAK_VMS`).
#[derive(Debug, Clone, Copy)]
pub struct SoakConfig {
    /// Length of the loaded part (faults included).
    pub length: Duration,
    /// Guests.
    pub vms: usize,
    /// Passes over every fault.
    pub rounds: u32,
    /// Whether the share is filled (ENOSPC). `SOAK_ENOSPC`; default on.
    pub enospc: bool,
    /// A device whose pool is smaller than the guests' files: the pool
    /// runs short all along. `SOAK_SMALL_POOL`; default on.
    pub small_pool: bool,
    /// What fails it.
    pub bounds: Bounds,
}

impl SoakConfig {
    /// `SOAK_MINUTES` (default 2), `SOAK_VMS` (default 4); every fault
    /// once per 15 minutes, at least once; latency windows of 5 minutes
    /// (1 minute under 30 minutes). Leak bounds: 2 % growth over the second
    /// half from 30 minutes on. A short soak's second half still holds the
    /// daemon's warm-up (allocator arenas, tables filling with the guests'
    /// files), so there its anonymous memory is only capped (256 MiB, as
    /// always) and descriptors and threads get 10 %. Neighbours beside a
    /// killed or stalled VM: 1.5x their latency outside faults from 30
    /// minutes on; 4x in a short soak, whose one kill and one stall give
    /// about 20 laps, on a 2-core host where the restarted guest's boot
    /// takes the others' CPU (2.2x measured under `make test`).
    pub fn from_env() -> SoakConfig {
        let minutes: f64 = env_knob("SOAK_MINUTES", 2.0);
        let long = minutes >= 30.0;
        SoakConfig {
            length: Duration::from_secs_f64(minutes.max(1.0) * 60.0),
            vms: env_knob("SOAK_VMS", 4usize).max(1),
            rounds: ((minutes / 15.0).floor() as u32).max(1),
            small_pool: env_knob("SOAK_SMALL_POOL", 1u8) != 0,
            enospc: env_knob("SOAK_ENOSPC", 1u8) != 0,
            bounds: Bounds {
                rss_growth_pct: long.then_some(2.0),
                rss_cap_mib: 256,
                fd_growth_pct: if long { 2.0 } else { 10.0 },
                stuck_after: Duration::from_secs(180),
                neighbour_p99_ratio: if long { 1.5 } else { 4.0 },
                window: Duration::from_secs(if long { 300 } else { 60 }),
            },
        }
    }
}

/// Pool bytes left for files on the soak's device.
pub const POOL_FOR_FILES: u64 = 100 << 20;

/// A small device (2 channels x 2 LUNs x 1 plane, blocks of 1 MiB, 7 %
/// over-provisioned) with just enough blocks for the VMs' 64 MiB memory
/// regions and [`POOL_FOR_FILES`] (50 extents of 2 MiB), less than the
/// guests' files take (each file takes an extent): the pool keeps running
/// short, so idle files are reclaimed, extents taken back from files
/// guests hold (for window slots) and chunks aliased all along.
fn small_device(vms: usize) -> Vec<String> {
    let mib = (vms as u64 * 64) + (POOL_FOR_FILES >> 20) + 2;
    let blocks = (mib as f64 / (4.0 * 0.93)).ceil() as u64;
    vec![
        "nand.channels=2".into(),
        "nand.luns_per_channel=2".into(),
        "nand.planes_per_lun=1".into(),
        format!("nand.blocks_per_plane={blocks}"),
    ]
}

/// The share's own tmpfs, unmounted on drop (after the daemon is gone).
struct ShareMount(PathBuf);

impl Drop for ShareMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The soak's processes and what it has seen so far.
struct Soak {
    daemon: Daemon,
    vms: Vec<Option<Vm>>,
    names: Vec<String>,
    boots_at: BTreeMap<String, Vec<Duration>>,
    serial_logs: Vec<PathBuf>,
    samples: Vec<DaemonSample>,
    faults: Vec<FaultRecord>,
    started: Instant,
    next_sample: Duration,
    victim: Vec<u8>,
}

/// Runs a soak and returns what it found (the caller asserts on it, and
/// holds [`crate::exclusive`]).
pub fn run_soak(cfg: &SoakConfig) -> Report {
    let names: Vec<String> = (0..cfg.vms).map(|i| format!("vm{i}")).collect();
    let shared = seeded_bytes(SHARED_BYTES as u64, 11);
    let victim = seeded_bytes(1 << 20, 12);
    // The windows' accessed bits on (the daemon's default), made for the
    // guests' 32 MiB windows.
    let mut args: Vec<String> = vec![
        "--set".into(),
        "cache.size_bytes=8MiB".into(),
        "--dax-window".into(),
        "32MiB".into(),
    ];
    if cfg.small_pool {
        for set in small_device(cfg.vms) {
            args.extend(["--set".into(), set]);
        }
    }
    for n in &names {
        args.extend(["--cxl-memory".into(), format!("{n}=64MiB")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut mount = None;
    let daemon = Daemon::start(&name_refs, &args, |share| {
        mount = Some(mount_share(share));
        fs::create_dir_all(share.join(SOAK_DIR)).expect("create the soak dir");
        fs::write(share.join(SHARED_FILE), &shared).expect("write the shared file");
        fs::write(share.join(VICTIM_FILE), &victim).expect("write the mapped file");
    });
    let _mount = mount;
    let sum = sha256_hex(&daemon.share().join(SHARED_FILE));
    daemon.write_guest_script(&guest_job(&sum));
    let mut soak = Soak {
        daemon,
        vms: Vec::new(),
        names: names.clone(),
        boots_at: BTreeMap::new(),
        serial_logs: Vec::new(),
        samples: Vec::new(),
        faults: Vec::new(),
        started: Instant::now(),
        next_sample: Duration::ZERO,
        victim,
    };
    for (i, n) in names.iter().enumerate() {
        let vm = soak.boot(n, cfg);
        soak.vms.push(Some(vm));
        debug_assert_eq!(soak.vms.len(), i + 1);
    }
    let plan = schedule(
        Duration::from_secs(45).min(cfg.length / 5),
        cfg.length,
        Duration::from_secs(30).min(cfg.length / 10),
        cfg.rounds,
    );
    let mut turns: BTreeMap<Fault, usize> = BTreeMap::new();
    for (at, fault) in plan {
        if fault == Fault::Enospc && !cfg.enospc {
            continue;
        }
        soak.idle_until(at);
        let vm = matches!(fault, Fault::KillVm | Fault::StallVm).then(|| {
            let turn = turns.entry(fault).or_default();
            *turn += 1;
            // Stalls start one VM further on than kills.
            let offset = usize::from(fault == Fault::StallVm);
            names[(*turn - 1 + offset) % names.len()].clone()
        });
        soak.inject(fault, vm, cfg);
    }
    soak.idle_until(cfg.length);
    soak.finish(cfg)
}

/// Mounts a 512 MiB tmpfs over `share` (it becomes the share's own file
/// system) and makes `.cxlfs` in it again.
fn mount_share(share: &Path) -> ShareMount {
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512m,mode=0755", "cxlfs-soak"])
        .arg(share)
        .status()
        .expect("run mount");
    assert!(st.success(), "mount a tmpfs on the share (root?): {st}");
    fs::create_dir_all(share.join(".cxlfs")).expect("create .cxlfs");
    ShareMount(share.to_path_buf())
}

impl Soak {
    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Boots `vm` (DAX window and CXL node), recording when.
    fn boot(&mut self, vm: &str, cfg: &SoakConfig) -> Vm {
        let opts = VmOptions {
            mem: "384M".into(),
            cxl_memory: Some("64M".into()),
            timeout: cfg.length + Duration::from_secs(900),
            access_bits: true,
            ..VmOptions::dax("32M")
        };
        let at = self.now();
        self.boots_at.entry(vm.to_string()).or_default().push(at);
        self.daemon.boot(vm, &opts)
    }

    /// Samples the daemon every 10 s until `until` (since the start).
    fn idle_until(&mut self, until: Duration) {
        while self.now() < until {
            self.tick();
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Takes a sample if one is due.
    fn tick(&mut self) {
        let now = self.now();
        if now < self.next_sample {
            return;
        }
        self.next_sample = now + Duration::from_secs(10);
        let Some(pid) = self.daemon.pid() else { return };
        let pool = pool_sample(&self.daemon);
        if let Some(s) = sample_process(pid, now, pool) {
            self.samples.push(s);
        }
    }

    /// Injects one fault and records it.
    fn inject(&mut self, fault: Fault, vm: Option<String>, cfg: &SoakConfig) {
        let start = self.now();
        let share = self.daemon.share().to_path_buf();
        let hold = Duration::from_secs(5);
        let outcome = match fault {
            Fault::KillVm => self.kill_and_restart(vm.as_deref().unwrap_or("vm0"), cfg),
            Fault::StallVm => self.stall_vm(vm.as_deref().unwrap_or("vm0"), Duration::from_secs(6)),
            Fault::StopDaemon => self.stop_daemon(hold),
            Fault::Enospc => fill_share(&share, Duration::from_secs(10)),
            Fault::TruncateMapped => truncate_mapped(&share.join(VICTIM_FILE), &self.victim, hold),
            Fault::DeleteMapped => delete_mapped(&share.join(VICTIM_FILE), &self.victim, hold),
            Fault::ControlStorm => {
                let ratio = self.daemon.snapshot().device.cxl_ratio;
                let sock = self.daemon.work_dir().join("control.sock");
                control_storm(&sock, &self.names, SHARED_FILE, ratio)
            }
        };
        let end = self.now();
        eprintln!(
            "soak {:>7.1}s {}{}: {outcome:?}",
            start.as_secs_f64(),
            fault.name(),
            vm.as_deref().map(|v| format!(" ({v})")).unwrap_or_default()
        );
        self.faults.push(FaultRecord {
            fault,
            vm,
            start,
            end,
            outcome,
        });
    }

    fn stall_vm(&mut self, vm: &str, hold: Duration) -> Result<String, String> {
        let qemu = qemu_pid(self.daemon.work_dir(), vm).ok_or("no QEMU process for the VM")?;
        pause(qemu, hold);
        Ok(format!("QEMU {qemu} stopped {hold:?}"))
    }

    fn stop_daemon(&mut self, hold: Duration) -> Result<String, String> {
        pause(self.daemon.pid().ok_or("the daemon is gone")?, hold);
        Ok(format!("stopped {hold:?}"))
    }

    /// SIGKILL of `vm`'s QEMU; once the VM is gone and its region released,
    /// it boots again; done when the new boot has logged its start.
    fn kill_and_restart(&mut self, vm: &str, cfg: &SoakConfig) -> Result<String, String> {
        let i = self
            .names
            .iter()
            .position(|n| n == vm)
            .ok_or("no such VM")?;
        let releases = |d: &Daemon| {
            d.snapshot()
                .memory_regions
                .iter()
                .find(|r| r.vm == vm)
                .map_or(0, |r| r.releases)
        };
        let before = releases(&self.daemon);
        let pool_before = pool_sample(&self.daemon);
        let qemu = qemu_pid(self.daemon.work_dir(), vm).ok_or("no QEMU process for the VM")?;
        signal(qemu, libc::SIGKILL);
        let mut old = self.vms[i].take().ok_or("the VM was not running")?;
        let released = self.wait_for(Duration::from_secs(60), |s| {
            !old.running() && releases(&s.daemon) > before
        });
        drop(old);
        let pool_released = pool_sample(&self.daemon);
        let restarted = self.restart(i, vm, cfg);
        released.map_err(|_| "the killed VM's region was not released within 60 s".to_string())?;
        restarted?;
        let pool_after = pool_sample(&self.daemon);
        Ok(format!(
            "killed QEMU {qemu}; region released; booted again; pool references {} → {} → {}, held {} → {} → {} MiB",
            pool_before.file_refs,
            pool_released.file_refs,
            pool_after.file_refs,
            pool_before.held_bytes >> 20,
            pool_released.held_bytes >> 20,
            pool_after.held_bytes >> 20
        ))
    }

    /// Boots VM `i` again, its last serial log kept; done when the new boot
    /// has logged its start.
    fn restart(&mut self, i: usize, vm: &str, cfg: &SoakConfig) -> Result<(), String> {
        let serial = self.daemon.work_dir().join(format!("{vm}.serial.log"));
        let kept = serial.with_extension(format!("log.{}", self.serial_logs.len()));
        let _ = fs::rename(&serial, &kept);
        self.serial_logs.push(kept);
        let laps = self.daemon.share().join(SOAK_DIR).join(vm).join("laps");
        let boots = |p: &Path| fs::read_to_string(p).map_or(0, |t| t.matches(" BOOT ").count());
        let booted = boots(&laps);
        let vm_now = self.boot(vm, cfg);
        self.vms[i] = Some(vm_now);
        self.wait_for(Duration::from_secs(300), |_| boots(&laps) > booted)
            .map_err(|_| "the restarted VM did not start its job within 300 s".to_string())
    }

    /// Polls `done` (sampling meanwhile) until it holds or `limit` passes.
    fn wait_for(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Soak) -> bool,
    ) -> Result<(), ()> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if done(self) {
                return Ok(());
            }
            self.tick();
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(())
    }

    /// Stops the guests, checks the files and logs, stops the daemon.
    fn finish(mut self, cfg: &SoakConfig) -> Report {
        let length = self.now();
        let share = self.daemon.share().to_path_buf();
        fs::write(share.join(STOP_FILE), b"").expect("write the stop file");
        let mut unstopped = Vec::new();
        for (i, vm) in self.vms.iter_mut().enumerate() {
            let Some(vm) = vm.take() else { continue };
            let run = vm.wait();
            if !run.ok() {
                unstopped.push(format!("{} ({})", self.names[i], run.describe()));
            }
        }
        let mut guests = BTreeMap::new();
        for n in &self.names {
            let dir = share.join(SOAK_DIR).join(n);
            let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap_or_default();
            let boots = self.boots_at.get(n).cloned().unwrap_or_default();
            guests.insert(
                n.clone(),
                read_guest_log(&read("laps"), &read("errors"), &boots),
            );
            self.serial_logs
                .push(self.daemon.work_dir().join(format!("{n}.serial.log")));
        }
        // Each session returns its pool references when its front-end has
        // gone; with every VM stopped, nothing may be held.
        let t = Instant::now();
        let mut pool_left = pool_sample(&self.daemon);
        while (pool_left.file_refs > 0 || pool_left.held_bytes > 0)
            && t.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(200));
            pool_left = pool_sample(&self.daemon);
        }
        let (files_checked, file_mismatches) = check_files(&share.join(SOAK_DIR), &self.names);
        let kernel_problems = kernel_problems(&self.serial_logs);
        let pool_aliased_extents = self.daemon.snapshot().device.pool_aliased_extents;
        let st = self.daemon.stop();
        if !st.success() {
            unstopped.push(format!("cxlfsd exited {st}"));
        }
        Report {
            guests,
            faults: self.faults,
            samples: self.samples,
            files_checked,
            file_mismatches,
            kernel_problems,
            unstopped,
            length,
            pool_aliased_extents,
            pool_left,
            small_pool: cfg.small_pool,
            bounds: cfg.bounds,
        }
    }
}

/// The pool's figures now (`/metrics.json`).
fn pool_sample(d: &Daemon) -> PoolSample {
    let dev = d.snapshot().device;
    PoolSample {
        allocated_bytes: dev.pool_allocated_bytes,
        held_bytes: dev.pool_held_bytes,
        file_refs: dev.pool_file_refs,
    }
}

/// SIGSTOP of `pid` for `hold`, then SIGCONT.
fn pause(pid: u32, hold: Duration) {
    signal(pid, libc::SIGSTOP);
    std::thread::sleep(hold);
    signal(pid, libc::SIGCONT);
}

/// Every `w.SLOT.SUM.bin` a guest left: its content against its name.
fn check_files(dir: &Path, vms: &[String]) -> (u64, Vec<String>) {
    let mut checked = 0;
    let mut bad = Vec::new();
    for vm in vms {
        let Ok(entries) = fs::read_dir(dir.join(vm)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let parts: Vec<&str> = name.split('.').collect();
            if let ["w", _, sum, "bin"] = parts.as_slice() {
                checked += 1;
                let got = sha256_hex(&e.path());
                if got != *sum {
                    bad.push(format!("{vm}/{name}: content sums to {got}"));
                }
            }
        }
    }
    (checked, bad)
}

/// Oopses, BUGs, panics and hung tasks in the guests' serial logs.
fn kernel_problems(logs: &[PathBuf]) -> Vec<String> {
    const SIGNS: [&str; 6] = [
        "Oops",
        "BUG:",
        "Kernel panic",
        "blocked for more than",
        "general protection fault",
        "soft lockup",
    ];
    let mut found = Vec::new();
    for p in logs {
        let text = fs::read(p)
            .map(|b| String::from_utf8_lossy(&b).to_string())
            .unwrap_or_default();
        for line in text.lines().filter(|l| SIGNS.iter().any(|s| l.contains(s))) {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            found.push(format!("{name}: {}", line.trim()));
        }
    }
    found
}
