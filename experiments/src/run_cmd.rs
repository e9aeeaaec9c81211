//! `cxlfs run SPEC.toml --out DIR`: one experiment — a sweep of runs, each
//! with a fresh `cxlfsd` and N guests running fio — and its results
//! directory; `cxlfs plot DIR` and `cxlfs table DIR` re-read it.
//!
//! One run: a temp work dir (share, sockets) → files created in the share
//! → `.cxlfs/run.sh` written → `cxlfsd` started (own process group, so a
//! Ctrl-C reaches only us) → guests booted through `qemu-configs/run-vm.sh`
//! at once → at each phase barrier `/metrics.json` is read → guests power off
//! (or are stopped) → `cxlfsd` gets SIGTERM (never SIGKILL with DAX on) →
//! fio JSON and the metrics series are read, rows written. Any failure marks
//! the run `failed` with its error, and the sweep goes on.

use crate::daemon_metrics::{parse_series, sample_at, Figures, SeriesSample};
use crate::distributions::{self, Buckets, Distribution};
use crate::fio_json::{self, FioSummary};
use crate::guest_script;
use crate::phase_output::{self, Extracted};
use crate::plot;
use crate::replay_check;
use crate::results::{num, text_table, ResultsFile, Row};
use crate::spec::{
    self, size_value, value_text, PhaseSpec, RunPlan, DEFAULT_CXL_RATIO, DEFAULT_PRESET,
};
use crate::template::TemplateValue;
use anyhow::{bail, Context, Result};
use clap::Args;
use cxlfs::guest_log::kernel_crash_in;
use cxlfs::procs::{http_get, signal, tail, terminate_tree, wait_timeout};
use cxlfs_device_model::units::parse_duration_ns;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs;
use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `cxlfs run` stopped by SIGINT / SIGTERM (exit status 130).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Interrupted(pub String);

/// `cxlfs run` arguments.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The experiment spec (TOML; see experiments/README.md).
    #[arg(value_name = "SPEC.toml")]
    spec: PathBuf,
    /// Results directory (created; refused if it already holds results, unless --force).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Override a spec field: a dotted path into the TOML, e.g.
    /// `--set vms.count=1`, `--set daemon.device.cache.policy=lru`,
    /// `--set sweep.daemon.cxl_ratio=[0,100]` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Smoke run: smaller files, fio sizes and device cache, fio runtimes
    /// capped (the spec's `[quick]`); the sweep's points stay the same.
    #[arg(long)]
    quick: bool,
    /// Write into --out even if it already holds results (they are replaced).
    #[arg(long)]
    force: bool,
    /// Print the runs (and each one's daemon arguments) and exit.
    #[arg(long)]
    dry_run: bool,
    /// The cxlfsd binary [default: $CXLFSD, else next to this cxlfs, else on PATH].
    #[arg(long, value_name = "PATH")]
    cxlfsd: Option<PathBuf>,
    /// Guest image directory [default: `cxlfs image build`, cached].
    #[arg(long, value_name = "DIR")]
    image: Option<PathBuf>,
    /// QEMU binary [default: $QEMU; with DAX the patched one from qemu-configs/build-qemu.sh].
    #[arg(long, value_name = "PATH")]
    qemu: Option<PathBuf>,
    /// Never show a progress bar (it is shown only when stderr is a terminal).
    #[arg(long)]
    no_progress: bool,
    /// Do not draw plots.
    #[arg(long)]
    no_plots: bool,
}

/// `cxlfs plot` / `cxlfs table` arguments.
#[derive(Debug, Clone, Args)]
pub struct ResultsDirArgs {
    /// A results directory written by `cxlfs run`.
    #[arg(value_name = "RESULTS_DIR")]
    dir: PathBuf,
}

/// The checkout holding `qemu-configs/`: `$CXLFS_REPO`, else the one this
/// binary was built from.
pub fn repo_root() -> PathBuf {
    match std::env::var_os("CXLFS_REPO") {
        Some(r) if !r.is_empty() => PathBuf::from(r),
        _ => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs a command and returns its trimmed stdout (empty on any failure).
fn output_of(cmd: &mut Command) -> String {
    cmd.stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The tools one experiment uses.
#[derive(Debug, Clone)]
struct Tools {
    cxlfsd: PathBuf,
    /// This `cxlfs` binary (`cxlfs ctl memory-fd` boots memory-mode guests).
    cxlfs: PathBuf,
    /// The spec's directory (job files are relative to it).
    spec_dir: PathBuf,
    /// `cxlfsd --help` lists `--metrics-file`.
    metrics_file: bool,
    image: PathBuf,
    qemu: String,
    run_vm: PathBuf,
}

fn find_cxlfsd(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            bail!("--cxlfsd {}: no such file", p.display())
        };
    }
    if let Some(p) = std::env::var_os("CXLFSD").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            bail!("CXLFSD={}: no such file", p.display())
        };
    }
    if let Some(sibling) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("cxlfsd")))
        .filter(|p| p.is_file())
    {
        return Ok(sibling);
    }
    let on_path = output_of(Command::new("sh").args(["-c", "command -v cxlfsd"]));
    if !on_path.is_empty() {
        return Ok(PathBuf::from(on_path));
    }
    bail!("cxlfsd not found: build it (cargo build --release -p cxlfsd) or pass --cxlfsd / set CXLFSD")
}

fn build_qemu() -> Result<String> {
    let script = repo_root().join("qemu-configs/build-qemu.sh");
    eprintln!(
        "cxlfs run: DAX needs the patched QEMU: {}",
        script.display()
    );
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("").trim().to_string();
    if !out.status.success() || last.is_empty() || !Path::new(&last).is_file() {
        bail!(
            "{} failed ({}); its log is above",
            script.display(),
            out.status
        );
    }
    Ok(last)
}

fn resolve_tools(args: &RunArgs, dax: bool, image: &crate::spec::ImageSpec) -> Result<Tools> {
    let cxlfsd = find_cxlfsd(args.cxlfsd.as_deref())?;
    let help = output_of(Command::new(&cxlfsd).arg("--help"));
    if help.is_empty() {
        bail!("{} --help failed: is it a cxlfsd binary?", cxlfsd.display());
    }
    let image = match &args.image {
        Some(d) if d.join("vmlinuz").is_file() => d.clone(),
        Some(d) => bail!("--image {}: no vmlinuz there", d.display()),
        None => crate::image_cmd::build_with(&crate::image_cmd::ImageOptions {
            packages: image.packages.clone(),
            kernel: image.kernel.clone(),
            force: false,
        })?,
    };
    let qemu = match (
        &args.qemu,
        std::env::var("QEMU").ok().filter(|q| !q.is_empty()),
    ) {
        (Some(q), _) => q.display().to_string(),
        (None, Some(q)) => q,
        (None, None) if dax => build_qemu()?,
        (None, None) => "qemu-system-x86_64".to_string(),
    };
    let run_vm = repo_root().join("qemu-configs/run-vm.sh");
    if !run_vm.is_file() {
        bail!(
            "{} not found (set CXLFS_REPO to the cxlfs checkout)",
            run_vm.display()
        );
    }
    Ok(Tools {
        cxlfsd,
        cxlfs: std::env::current_exe().context("finding this cxlfs binary")?,
        spec_dir: args
            .spec
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        metrics_file: help.contains("--metrics-file"),
        image,
        qemu,
        run_vm,
    })
}

/// The `cxlfsd` arguments of a run (besides `--shared-dir`, `--vm`, `--metrics-addr`).
fn daemon_args(plan: &RunPlan, tools: Option<&Tools>, metrics_file: &Path) -> Vec<String> {
    let d = &plan.spec.daemon;
    let mut a = vec![
        "--preset".to_string(),
        d.preset
            .clone()
            .unwrap_or_else(|| DEFAULT_PRESET.to_string()),
    ];
    for s in &plan.device_sets {
        a.push("--set".into());
        a.push(s.clone());
    }
    a.extend(["--cache".to_string(), d.cache.clone()]);
    if let Some(r) = d.cxl_ratio {
        a.extend(["--cxl-ratio".to_string(), r.to_string()]);
    }
    if d.dax {
        a.extend(["--dax".to_string(), "on".to_string()]);
    }
    if let Some(m) = d.cxl_memory_bytes() {
        for i in 0..plan.spec.vms.count {
            a.extend(["--cxl-memory".to_string(), format!("vm{i}={m}")]);
        }
    }
    if tools.map_or(true, |t| t.metrics_file) {
        a.push("--metrics-file".into());
        a.push(metrics_file.display().to_string());
        a.push("--metrics-interval".into());
        a.push(d.metrics_interval.clone());
    }
    a.extend(d.args.iter().cloned());
    a
}

/// The `run-vm.sh` arguments of guest `vm` (besides image, socket, serial).
fn vm_args(plan: &RunPlan, vm: &str) -> Vec<String> {
    let v = &plan.spec.vms;
    let timeout_s = parse_duration_ns(&v.timeout).unwrap_or(600_000_000_000) / 1_000_000_000;
    let mut a = vec![
        "--name".to_string(),
        vm.to_string(),
        "--smp".into(),
        v.smp.to_string(),
        "--mem".into(),
        v.memory.clone(),
        "--timeout".into(),
        timeout_s.max(1).to_string(),
    ];
    let mountopts = v
        .mountopts
        .clone()
        .or_else(|| plan.spec.daemon.dax.then(|| "dax=always".to_string()));
    if let Some(m) = mountopts.filter(|m| !m.is_empty()) {
        a.extend(["--mountopts".to_string(), m]);
    }
    if plan.spec.daemon.dax {
        a.extend(["--cache-size".to_string(), v.dax_window.clone()]);
    }
    if plan.spec.daemon.cxl_memory.is_some() {
        // `cxlfs ctl memory-fd` fills in the region's size and descriptor.
        a.extend(
            [
                "--cxl-memory",
                "{size}",
                "--cxl-memory-fd",
                "{fd}",
                "--append",
                "movable_node",
            ]
            .map(String::from),
        );
    }
    a
}

/// The template variables every guest of a run shares: the spec's `vars`,
/// the device cache size (`cache_bytes`), the CXL memory region size
/// (`cxl_memory_bytes`, 0 without one).
pub fn template_base(plan: &RunPlan) -> BTreeMap<String, TemplateValue> {
    let mut v: BTreeMap<String, TemplateValue> = plan
        .spec
        .vars
        .iter()
        .map(|(k, x)| (k.clone(), TemplateValue::of_toml(x)))
        .collect();
    v.insert(
        "cache_bytes".into(),
        TemplateValue::Number(plan.device.cache.size_bytes as f64),
    );
    let region = plan.spec.daemon.cxl_memory_bytes().unwrap_or(0);
    v.insert(
        "cxl_memory_bytes".into(),
        TemplateValue::Number(region as f64),
    );
    v
}

/// Fills `path` with `len` deterministic pseudo-random bytes (splitmix64
/// seeded by the file's name: same spec, same bytes).
fn fill_file(path: &Path, name: &str, len: u64) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d)?;
    }
    let mut state = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut f = std::io::BufWriter::with_capacity(1 << 20, fs::File::create(path)?);
    let mut left = len;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        for chunk in buf.chunks_mut(8) {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()
}

/// Creates the spec's files in `share`.
fn create_files(plan: &RunPlan, share: &Path) -> Result<()> {
    for f in &plan.spec.files {
        let len = size_value(&f.size).map_err(anyhow::Error::msg)?;
        for i in 0..f.count {
            let name = f.path.replace("{i}", &i.to_string());
            fill_file(&share.join(&name), &name, len)
                .with_context(|| format!("creating {name} ({len} bytes) in the share"))?;
        }
    }
    Ok(())
}

/// What one guest left behind for one phase.
#[derive(Debug, Default)]
struct PhaseResult {
    fio: Option<FioSummary>,
    /// Numbers a command's `outputs` gave (`out.NAME`).
    outputs: BTreeMap<String, f64>,
    /// Histograms a command's `outputs` gave: name, unit, buckets.
    histograms: Vec<(String, String, Buckets)>,
    /// `replay_check`: measured and predicted hit shares.
    hit_shares: Option<(f64, f64)>,
    error: Option<String>,
}

/// Everything one run produced.
#[derive(Debug, Default)]
struct RunOutput {
    /// The run's error (daemon, guests, barrier); `None` if it got through.
    error: Option<String>,
    /// Snapshots at the barriers (index K = before phase K).
    snapshots: Vec<(u64, Figures)>,
    /// Per VM, per phase.
    phases: BTreeMap<String, Vec<PhaseResult>>,
    /// The metrics series (empty if the daemon wrote none).
    series: Vec<SeriesSample>,
    /// `versions.txt` of the first guest that wrote one.
    guest_versions: Option<String>,
    interrupted: bool,
}

/// A started `cxlfsd`.
struct DaemonProc {
    child: Child,
    metrics: SocketAddr,
    dax: bool,
}

impl DaemonProc {
    /// The daemon's snapshot (`/metrics.json`): its text and its figures.
    fn scrape(&self) -> Result<(String, Figures), String> {
        let text = http_get(self.metrics, "/metrics.json").map_err(|e| e.to_string())?;
        let snap = Figures::parse(&text).map_err(|e| e.to_string())?;
        Ok((text, snap))
    }

    /// SIGTERM and wait; with DAX on never SIGKILL (a killed daemon can leave
    /// the pool mount hanging), so a daemon that does not stop is left running.
    fn stop(mut self) -> Result<(), String> {
        signal(self.child.id(), libc::SIGTERM);
        let limit = Duration::from_secs(if self.dax { 60 } else { 30 });
        match wait_timeout(&mut self.child, limit) {
            Some(st) if st.success() => Ok(()),
            Some(st) => Err(format!("cxlfsd exited {st} after SIGTERM")),
            None if self.dax => Err(format!(
                "cxlfsd (pid {}) still running {limit:?} after SIGTERM; left running (DAX on: SIGKILL could hang the pool mount)",
                self.child.id()
            )),
            None => {
                let _ = terminate_tree(&mut self.child, Duration::from_secs(1));
                Err(format!("cxlfsd did not exit {limit:?} after SIGTERM; killed"))
            }
        }
    }
}

fn start_daemon(
    plan: &RunPlan,
    tools: &Tools,
    work: &Path,
    run_dir: &Path,
    vms: &[String],
) -> Result<DaemonProc, String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let metrics = SocketAddr::from(([127, 0, 0, 1], port));
    let mut args: Vec<String> = vec![
        "--shared-dir".into(),
        work.join("share").display().to_string(),
    ];
    for vm in vms {
        args.push("--vm".into());
        args.push(format!(
            "{vm}={}",
            work.join(format!("{vm}.sock")).display()
        ));
    }
    args.extend(["--metrics-addr".to_string(), metrics.to_string()]);
    if plan.spec.daemon.cxl_memory.is_some() {
        args.push("--control-socket".into());
        args.push(work.join("ctl.sock").display().to_string());
    }
    args.extend(daemon_args(
        plan,
        Some(tools),
        &run_dir.join("metrics.jsonl"),
    ));
    let _ = fs::write(
        run_dir.join("daemon-command.txt"),
        format!("{} {}\n", tools.cxlfsd.display(), args.join(" ")),
    );
    let log_path = run_dir.join("daemon.log");
    let log = fs::File::create(&log_path).map_err(|e| format!("daemon.log: {e}"))?;
    let log2 = log.try_clone().map_err(|e| format!("daemon.log: {e}"))?;
    let child = Command::new(&tools.cxlfsd)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log2)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", tools.cxlfsd.display()))?;
    let mut d = DaemonProc {
        child,
        metrics,
        dax: plan.spec.daemon.dax,
    };
    let t = Instant::now();
    loop {
        let sockets = vms.iter().all(|vm| {
            fs::symlink_metadata(work.join(format!("{vm}.sock")))
                .is_ok_and(|m| m.file_type().is_socket())
        });
        if sockets && TcpStream::connect_timeout(&metrics, Duration::from_millis(200)).is_ok() {
            return Ok(d);
        }
        if let Ok(Some(st)) = d.child.try_wait() {
            return Err(format!(
                "cxlfsd exited at start ({st}): {}",
                tail(&log_path, 6)
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .collect::<Vec<_>>()
                    .join(" | ")
            ));
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = d.stop();
            return Err("cxlfsd not ready after 30 s (see daemon.log)".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A booted guest.
struct Guest {
    name: String,
    child: Option<Child>,
    status: Option<i32>,
    serial: PathBuf,
}

impl Guest {
    /// Whether it is still running (collects its status when it ended).
    fn running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(Ok(Some(st))) => {
                self.status = st.code().or(Some(-1));
                self.child = None;
                false
            }
            Some(Err(_)) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let st = terminate_tree(&mut c, Duration::from_secs(10));
            self.status = st.and_then(|s| s.code()).or(Some(-1));
        }
    }

    fn describe_end(&self) -> String {
        if let Some(crash) = kernel_crash_in(&self.serial) {
            return format!(
                "{} stopped (run-vm.sh status {:?}): guest kernel crashed: {crash}",
                self.name, self.status
            );
        }
        format!(
            "{} stopped (run-vm.sh status {:?}); serial: {}",
            self.name,
            self.status,
            tail(&self.serial, 8)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" | ")
        )
    }
}

fn boot(
    plan: &RunPlan,
    tools: &Tools,
    work: &Path,
    run_dir: &Path,
    vm: &str,
) -> Result<Guest, String> {
    let serial = run_dir.join(format!("{vm}.serial.log"));
    let log = fs::File::create(run_dir.join(format!("{vm}.run.log"))).map_err(|e| e.to_string())?;
    let log2 = log.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = if plan.spec.daemon.cxl_memory.is_some() {
        // Memory mode: the daemon hands QEMU the region's descriptor.
        let mut c = Command::new(&tools.cxlfs);
        c.arg("ctl")
            .arg("--socket")
            .arg(work.join("ctl.sock"))
            .args(["memory-fd", vm, "--"])
            .arg(&tools.run_vm);
        c
    } else {
        Command::new(&tools.run_vm)
    };
    cmd.arg("--image")
        .arg(&tools.image)
        .arg("--socket")
        .arg(work.join(format!("{vm}.sock")))
        .arg("--serial")
        .arg(&serial)
        .args(vm_args(plan, vm))
        .env("QEMU", &tools.qemu)
        .stdin(Stdio::null())
        .stdout(log2)
        .stderr(log)
        .process_group(0);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start run-vm.sh: {e}"))?;
    Ok(Guest {
        name: vm.to_string(),
        child: Some(child),
        status: None,
        serial,
    })
}

/// Runs one plan; never panics on bad input: every problem ends up in
/// `RunOutput::error`.
fn execute(plan: &RunPlan, tools: &Tools, run_dir: &Path, stop: &AtomicBool) -> RunOutput {
    let mut out = RunOutput::default();
    let vms: Vec<String> = (0..plan.spec.vms.count).map(|i| format!("vm{i}")).collect();
    let work = match tempfile::Builder::new().prefix("cxlfs-run.").tempdir() {
        Ok(w) => w,
        Err(e) => {
            out.error = Some(format!("cannot create a work dir: {e}"));
            return out;
        }
    };
    let share = work.path().join("share");
    let prepared = (|| -> Result<()> {
        for vm in &vms {
            fs::create_dir_all(share.join(".cxlfs/out").join(vm))?;
        }
        fs::create_dir_all(share.join(".cxlfs/sync"))?;
        let script = guest_script::script(&plan.spec, &template_base(plan))?;
        fs::write(share.join(".cxlfs/run.sh"), &script)?;
        fs::write(run_dir.join("guest-run.sh"), &script)?;
        for (k, phase) in plan.spec.phases.iter().enumerate() {
            if let Some(j) = guest_script::job_file(&plan.spec, phase) {
                let src = tools.spec_dir.join(&j);
                let dst = share.join(".cxlfs/jobs").join(format!("{k}.fio"));
                fs::create_dir_all(share.join(".cxlfs/jobs"))?;
                fs::copy(&src, &dst).with_context(|| format!("fio.job_file {}", src.display()))?;
            }
        }
        create_files(plan, &share)
    })();
    if let Err(e) = prepared {
        out.error = Some(format!("preparing the share: {e:#}"));
        return out;
    }
    let daemon = match start_daemon(plan, tools, work.path(), run_dir, &vms) {
        Ok(d) => d,
        Err(e) => {
            out.error = Some(e);
            return out;
        }
    };
    let mut guests = Vec::new();
    for vm in &vms {
        match boot(plan, tools, work.path(), run_dir, vm) {
            Ok(g) => guests.push(g),
            Err(e) => {
                out.error = Some(e);
                break;
            }
        }
    }
    let limit =
        Duration::from_nanos(parse_duration_ns(&plan.spec.vms.timeout).unwrap_or(600_000_000_000))
            + Duration::from_secs(30);
    let started = Instant::now();
    let sync = share.join(".cxlfs/sync");
    if out.error.is_none() {
        'barriers: for k in 0..=plan.spec.phases.len() {
            loop {
                if stop.load(Ordering::Relaxed) {
                    out.interrupted = true;
                    out.error = Some("interrupted".into());
                    break 'barriers;
                }
                let ready = vms
                    .iter()
                    .all(|vm| sync.join(format!("ready-{vm}-{k}")).exists());
                if ready {
                    break;
                }
                let mut ended = None;
                for g in guests.iter_mut() {
                    if !sync.join(format!("ready-{}-{k}", g.name)).exists() && !g.running() {
                        ended = Some(g.describe_end());
                        break;
                    }
                }
                if let Some(e) = ended {
                    out.error = Some(format!("barrier {k}: {e}"));
                    break 'barriers;
                }
                if started.elapsed() > limit {
                    out.error = Some(format!("barrier {k}: guests not there after {limit:?}"));
                    break 'barriers;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            match daemon.scrape() {
                Ok((text, snap)) => {
                    let _ = fs::write(run_dir.join(format!("metrics-{k}.json")), text);
                    out.snapshots.push((unix_ms(), snap));
                }
                Err(e) => {
                    out.error = Some(format!("scraping cxlfsd at barrier {k}: {e}"));
                    break 'barriers;
                }
            }
            if let Err(e) = fs::write(sync.join(format!("go-{k}")), b"") {
                out.error = Some(format!("writing go-{k}: {e}"));
                break 'barriers;
            }
        }
    }
    // The guests power off after the last barrier; stop any that do not.
    let end = Instant::now();
    for g in &mut guests {
        while out.error.is_none() && g.running() && end.elapsed() < Duration::from_secs(60) {
            if stop.load(Ordering::Relaxed) {
                out.interrupted = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if g.running() {
            g.stop();
        }
        if out.error.is_none() && g.status != Some(0) {
            out.error = Some(g.describe_end());
        }
    }
    if let Err(e) = daemon.stop() {
        out.error.get_or_insert(e);
    }
    // What the guests left in the share.
    let fio_dir = run_dir.join("fio");
    let _ = fs::create_dir_all(&fio_dir);
    for vm in &vms {
        let dir = share.join(".cxlfs/out").join(vm);
        if out.guest_versions.is_none() {
            out.guest_versions = fs::read_to_string(dir.join("versions.txt")).ok();
        }
        let serial = run_dir.join(format!("{vm}.serial.log"));
        let mut results = Vec::new();
        for (k, phase) in plan.spec.phases.iter().enumerate() {
            let src = dir.join(k.to_string());
            let kept = run_dir.join("out").join(vm).join(&phase.name);
            let _ = copy_dir(&src, &kept);
            let _ = fs::copy(
                src.join("fio.json"),
                fio_dir.join(format!("{vm}-{}.json", phase.name)),
            );
            let _ = fs::copy(
                src.join("stderr"),
                fio_dir.join(format!("{vm}-{}.log", phase.name)),
            );
            results.push(read_phase(plan, phase, &kept, vm, &serial));
        }
        out.phases.insert(vm.clone(), results);
    }
    if let Ok(text) = fs::read_to_string(run_dir.join("metrics.jsonl")) {
        out.series = parse_series(&text).0;
    }
    out
}

/// Copies the plain files of `src` into `dst` (created), one level deep.
fn copy_dir(src: &Path, dst: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dst)?;
    for e in fs::read_dir(src)? {
        let e = e?;
        if e.file_type()?.is_file() {
            fs::copy(e.path(), dst.join(e.file_name()))?;
        }
    }
    Ok(())
}

/// What guest `vm` left for `phase` in `dir` (a copy of its `$out/K/`):
/// fio's JSON, or a command's outputs; never fails, errors go into the result
/// (a phase that never ran names the guest kernel's crash in `serial`, if any).
fn read_phase(
    plan: &RunPlan,
    phase: &PhaseSpec,
    dir: &Path,
    vm: &str,
    serial: &Path,
) -> PhaseResult {
    let mut r = PhaseResult::default();
    let what = if phase.command.is_some() {
        "command"
    } else {
        "fio"
    };
    let name = &phase.name;
    let rc = fs::read_to_string(dir.join("rc"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    let stderr_tail = || {
        tail(&dir.join("stderr"), 4)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    match rc {
        None => {
            r.error = Some(match kernel_crash_in(serial) {
                Some(c) => {
                    format!("{vm} {name}: the {what} did not run: guest kernel crashed: {c}")
                }
                None => format!("{vm} {name}: the {what} did not run"),
            });
            return r;
        }
        Some(0) => {}
        Some(code) => {
            r.error = Some(format!(
                "{vm} {name}: {what} exited {code}: {}",
                stderr_tail()
            ));
            return r;
        }
    }
    if phase.command.is_none() {
        match fs::read_to_string(dir.join("fio.json"))
            .map_err(|e| e.to_string())
            .and_then(|t| fio_json::parse(&t).map_err(|e| e.to_string()))
        {
            Ok(s) => {
                if s.error != 0 {
                    r.error = Some(format!("{vm} {name}: fio job error {}", s.error));
                }
                r.fio = Some(s);
            }
            Err(e) => r.error = Some(format!("{vm} {name}: {e}")),
        }
        return r;
    }
    let mut errors = Vec::new();
    // Each file read once, however many outputs it holds.
    let mut texts: BTreeMap<&str, Result<String, String>> = BTreeMap::new();
    for (out_name, o) in &phase.outputs {
        let file = o.file.as_deref().unwrap_or("stdout");
        let text = texts
            .entry(file)
            .or_insert_with(|| fs::read_to_string(dir.join(file)).map_err(|e| e.to_string()));
        match text.as_deref().map(|t| phase_output::extract(o, file, t)) {
            Ok(Ok(Extracted::Number(x))) => {
                r.outputs.insert(out_name.clone(), x);
            }
            Ok(Ok(Extracted::Histogram { unit, buckets })) => {
                r.histograms.push((out_name.clone(), unit, buckets));
            }
            Ok(Err(e)) => errors.push(format!("{out_name}: {e}")),
            Err(e) => errors.push(format!("{out_name}: {file}: {e}")),
        }
    }
    if let Some(rc) = &phase.replay_check {
        let probe = phase
            .outputs
            .get(&rc.histogram)
            .and_then(|o| texts.get(o.file.as_deref().unwrap_or("stdout")))
            .and_then(|t| t.as_deref().ok());
        match hit_share_check(plan, rc, dir, &r, probe) {
            Ok(v) => r.hit_shares = Some(v),
            Err(e) => errors.push(format!("replay_check: {e:#}")),
        }
    }
    if !errors.is_empty() {
        r.error = Some(format!("{vm} {name}: {}", errors.join("; ")));
    }
    r
}

/// `replay_check`: the measured hit share (the histogram below
/// `hit_below_ns`) and the replay's prediction for the probe's sequence.
fn hit_share_check(
    plan: &RunPlan,
    rc: &crate::spec::ReplayCheckSpec,
    dir: &Path,
    r: &PhaseResult,
    probe_output: Option<&str>,
) -> Result<(f64, f64)> {
    let (_, unit, buckets) = r
        .histograms
        .iter()
        .find(|h| h.0 == rc.histogram)
        .context("the histogram output is missing")?;
    if unit != "ns" {
        bail!("the histogram is in {unit}, not ns");
    }
    let measured = distributions::share_below(buckets, rc.hit_below_ns);
    let probe = probe_output
        .and_then(phase_output::json_of)
        .context("the probe's JSON is missing")?;
    let field = |k: &str| {
        probe
            .get(k)
            .and_then(Value::as_u64)
            .and_then(|x| u32::try_from(x).ok())
            .with_context(|| format!("the probe's JSON has no `{k}`"))
    };
    let (laps, warmup) = (field("laps")?, field("warmup_laps")?);
    let bytes = fs::read(dir.join(&rc.sequence))
        .with_context(|| format!("reading the sequence {}", rc.sequence))?;
    let seq = replay_check::decode_sequence(&bytes)?;
    let p = replay_check::predict(&plan.device, &seq, warmup, laps)?;
    Ok((measured, p.hit_share))
}

/// The rows of one run: per phase, one per VM and one `all`.
fn rows_of(plan: &RunPlan, out: &RunOutput) -> Vec<Row> {
    let vms: Vec<String> = (0..plan.spec.vms.count).map(|i| format!("vm{i}")).collect();
    let phase_errors: Vec<String> = out
        .phases
        .values()
        .flatten()
        .filter_map(|p| p.error.clone())
        .collect();
    // The run's own error wins; else the first guest error (and how many more).
    let run_error = out.error.clone().or_else(|| {
        phase_errors.first().map(|e| match phase_errors.len() {
            1 => e.clone(),
            n => format!("{e} (and {} more)", n - 1),
        })
    });
    let status = if out.interrupted {
        "interrupted"
    } else if run_error.is_some() {
        "failed"
    } else {
        "ok"
    };
    let mut rows = Vec::new();
    let n_phases = plan.spec.phases.len();
    for (k, phase) in plan.spec.phases.iter().enumerate() {
        let base = |vm: &str| -> Row {
            let mut r = Row::new();
            r.insert("run".into(), json!(plan.run));
            r.insert("point".into(), json!(plan.point));
            r.insert("repeat".into(), json!(plan.repeat));
            r.insert("phase".into(), json!(phase.name));
            r.insert("status".into(), json!(status));
            r.insert(
                "error".into(),
                run_error.clone().map_or(Value::Null, Value::from),
            );
            r.insert("vm".into(), json!(vm));
            r.insert("vms".into(), json!(plan.spec.vms.count));
            r.insert(
                "cxl_ratio".into(),
                json!(plan.spec.daemon.cxl_ratio.unwrap_or(DEFAULT_CXL_RATIO)),
            );
            r.insert("policy".into(), json!(plan.device.cache.policy.name()));
            for (key, v) in &plan.params {
                r.insert(key.clone(), toml_to_json(v));
            }
            r
        };
        let window = match (out.snapshots.get(k), out.snapshots.get(k + 1)) {
            (Some(a), Some(b)) => Some((a, b)),
            _ => None,
        };
        let mut all = base("all");
        let mut sums: BTreeMap<String, f64> = BTreeMap::new();
        let mut lat: BTreeMap<String, (f64, u32)> = BTreeMap::new();
        for vm in &vms {
            let mut r = base(vm);
            let pr = out.phases.get(vm).and_then(|p| p.get(k));
            if let Some(e) = pr.and_then(|p| p.error.clone()) {
                r.insert("error".into(), json!(e));
            }
            if let Some(s) = pr.and_then(|p| p.fio.as_ref()) {
                for (name, x) in &s.fields {
                    r.insert(name.clone(), num(*x));
                    if name.contains("_clat_") {
                        let e = lat.entry(name.clone()).or_default();
                        e.0 += x;
                        e.1 += 1;
                    } else if !name.starts_with("fio_") {
                        *sums.entry(name.clone()).or_default() += x;
                    }
                }
            }
            for (name, x) in pr.map(command_figures).unwrap_or_default() {
                r.insert(name.clone(), num(x));
                let summed = name
                    .strip_prefix("out.")
                    .and_then(|o| phase.outputs.get(o))
                    .is_some_and(|o| o.aggregate.as_deref() == Some("sum"));
                if summed {
                    *sums.entry(name).or_default() += x;
                } else {
                    let e = lat.entry(name).or_default();
                    e.0 += x;
                    e.1 += 1;
                }
            }
            if let Some(((t0, a), (t1, b))) = window {
                r.insert("elapsed_s".into(), num((t1 - t0) as f64 / 1e3));
                let d = a.delta(b, vm);
                for (name, x) in &d {
                    r.insert(format!("daemon.{name}"), num(*x));
                    *sums.entry(format!("daemon.{name}")).or_default() += x;
                }
                let hits = d.get("device_hits").copied().unwrap_or(0.0);
                let misses = d.get("device_misses").copied().unwrap_or(0.0);
                r.insert("device_hits".into(), num(hits));
                r.insert("device_misses".into(), num(misses));
                *sums.entry("device_hits".into()).or_default() += hits;
                *sums.entry("device_misses".into()).or_default() += misses;
            }
            add_series(
                &mut r,
                out,
                vm,
                window.map(|(_, (t1, _))| *t1),
                k + 1 == n_phases,
            );
            rows.push(r);
        }
        for (name, x) in sums {
            all.insert(name, num(x));
        }
        for (name, (s, n)) in lat {
            all.insert(name, num(s / f64::from(n)));
        }
        if let Some(((t0, a), (t1, b))) = window {
            all.insert("elapsed_s".into(), num((t1 - t0) as f64 / 1e3));
            // Device-wide figures (no `vm` label).
            for (name, x) in a.delta(b, "") {
                all.insert(format!("daemon.{name}"), num(x));
            }
        }
        add_series(
            &mut all,
            out,
            "all",
            window.map(|(_, (t1, _))| *t1),
            k + 1 == n_phases,
        );
        rows.push(all);
    }
    // Through the DAX window hits never reach the daemon: no hit rate there.
    for r in rows.iter_mut().filter(|_| !plan.spec.daemon.dax) {
        let get = |k: &str| r.get(k).and_then(Value::as_f64);
        if let (Some(h), Some(m)) = (get("device_hits"), get("device_misses")) {
            if h + m > 0.0 {
                r.insert("device_hit_rate".into(), num(h / (h + m)));
            }
        }
    }
    rows
}

/// A command phase's columns: `out.NAME` per number, `out.NAME_p50` /
/// `_p99` per histogram, and the `replay_check` hit shares.
fn command_figures(p: &PhaseResult) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = p
        .outputs
        .iter()
        .map(|(k, x)| (format!("out.{k}"), *x))
        .collect();
    for (name, _, buckets) in &p.histograms {
        for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
            if let Some(x) = distributions::quantile(buckets, q) {
                v.push((format!("out.{name}_{label}"), x));
            }
        }
    }
    if let Some((measured, predicted)) = p.hit_shares {
        v.push(("hit_share.full_system".into(), measured));
        v.push(("hit_share.replay".into(), predicted));
        v.push((
            "hit_share.diff_points".into(),
            (measured - predicted) * 100.0,
        ));
    }
    v
}

/// The histograms of one run, for `distributions.jsonl`.
fn distributions_of(plan: &RunPlan, out: &RunOutput) -> Vec<Distribution> {
    let params: BTreeMap<String, Value> = plan
        .params
        .iter()
        .map(|(k, v)| (k.clone(), toml_to_json(v)))
        .collect();
    let mut ds = Vec::new();
    for (vm, phases) in &out.phases {
        for (phase, r) in plan.spec.phases.iter().zip(phases) {
            for (name, unit, buckets) in &r.histograms {
                ds.push(Distribution {
                    run: plan.run,
                    point: plan.point,
                    repeat: plan.repeat,
                    phase: phase.name.clone(),
                    vm: vm.clone(),
                    params: params.clone(),
                    name: name.clone(),
                    unit: unit.clone(),
                    buckets: buckets.clone(),
                });
            }
        }
    }
    ds
}

/// `metrics.FIELD` cells from the series sample describing the phase's end.
fn add_series(r: &mut Row, out: &RunOutput, vm: &str, end_ms: Option<u64>, last_phase: bool) {
    let Some(end) = end_ms else { return };
    if let Some(s) = sample_at(&out.series, vm, end, last_phase) {
        for (k, v) in &s.fields {
            r.insert(format!("metrics.{k}"), v.clone());
        }
    }
}

fn toml_to_json(v: &toml::Value) -> Value {
    match v {
        toml::Value::Integer(i) => json!(i),
        toml::Value::Float(f) => num(*f),
        toml::Value::Boolean(b) => json!(b),
        other => json!(value_text(other)),
    }
}

/// Facts about the machine and tools, for `provenance.json`.
fn machine_facts(tools: Option<&Tools>) -> Value {
    let repo = repo_root();
    let git = |args: &[&str]| output_of(Command::new("git").arg("-C").arg(&repo).args(args));
    let rev = git(&["rev-parse", "HEAD"]);
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string());
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let mem = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .map(|l| l.trim_start_matches("MemTotal:").trim().to_string());
    json!({
        "git": {"revision": rev, "dirty": dirty},
        "cxlfs_version": env!("CARGO_PKG_VERSION"),
        "cxlfsd": tools.map(|t| json!({
            "path": t.cxlfsd.display().to_string(),
            "version": output_of(Command::new(&t.cxlfsd).arg("--version")),
            "metrics_file_supported": t.metrics_file,
        })),
        "qemu": tools.map(|t| json!({
            "binary": t.qemu,
            "version": output_of(Command::new(&t.qemu).arg("--version")).lines().next().unwrap_or("").to_string(),
        })),
        "guest_image": tools.map(|t| t.image.display().to_string()),
        "host": {
            "uname": output_of(Command::new("uname").arg("-a")),
            "cpu_model": cpu_model,
            "cpus": cpus,
            "mem_total": mem,
        },
    })
}

/// What a phase runs in vm0, as text: the rendered command, the job file,
/// or fio's arguments.
fn phase_text(plan: &RunPlan, phase: &PhaseSpec) -> Result<String> {
    let vars = guest_script::vm_vars(&template_base(plan), "vm0", 0, plan.spec.vms.count);
    if let Some(c) = guest_script::command_line(phase, &vars)? {
        return Ok(format!("sh -c {}", guest_script::sh_quote(&c)));
    }
    if let Some(j) = guest_script::job_file(&plan.spec, phase) {
        return Ok(format!("fio {j} (job file, verbatim)"));
    }
    Ok(format!(
        "fio {}",
        guest_script::fio_args(&plan.spec, phase, "vm0", 0).join(" ")
    ))
}

/// The effective configuration of a run, for provenance and `--dry-run`.
fn plan_json(plan: &RunPlan, tools: Option<&Tools>) -> Value {
    let vm0 = "vm0";
    json!({
        "run": plan.run,
        "point": plan.point,
        "repeat": plan.repeat,
        "params": plan.params.iter().map(|(k, v)| (k.clone(), toml_to_json(v))).collect::<serde_json::Map<_, _>>(),
        "cxlfsd_args": daemon_args(plan, tools, Path::new("RUN_DIR/metrics.jsonl")),
        "run_vm_args": vm_args(plan, vm0),
        "phases": plan.spec.phases.iter().map(|p| json!({
            "phase": p.name,
            "vm0": phase_text(plan, p).unwrap_or_else(|e| e.to_string()),
            "numa": p.numa,
        })).collect::<Vec<_>>(),
        "files": plan.spec.files.iter().map(|f| json!({
            "path": f.path, "count": f.count, "bytes": size_value(&f.size).ok(),
        })).collect::<Vec<_>>(),
        "device_config": plan.device.to_toml_string(),
    })
}

/// Handles `cxlfs run`.
pub fn run(args: &RunArgs) -> Result<()> {
    let loaded = spec::load(&args.spec, &args.sets)?;
    let plans = loaded.expand(args.quick)?;
    if args.dry_run {
        let mut o = std::io::stdout().lock();
        for p in &plans {
            writeln!(
                o,
                "run {} (point {}, repeat {}): {} | {} VM(s) | cxlfsd {}",
                p.run,
                p.point,
                p.repeat,
                p.label(),
                p.spec.vms.count,
                daemon_args(p, None, Path::new("RUN_DIR/metrics.jsonl")).join(" ")
            )?;
            for ph in &p.spec.phases {
                writeln!(o, "    {}: {}", ph.name, phase_text(p, ph)?)?;
            }
        }
        return Ok(());
    }
    if args.out.join("results.json").exists() && !args.force {
        bail!(
            "{} already holds results (results.json); pass --force to replace them or choose another --out",
            args.out.display()
        );
    }
    fs::create_dir_all(args.out.join("runs"))
        .with_context(|| format!("creating {}", args.out.display()))?;
    // Absolute: cxlfsd writes its metrics series into the run directory.
    let out_dir =
        fs::canonicalize(&args.out).with_context(|| format!("resolving {}", args.out.display()))?;
    // A re-run (--force) starts the histograms afresh: they are appended per run.
    match fs::remove_file(out_dir.join(distributions::FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).context("removing the old distributions.jsonl")
        }
        _ => {}
    }
    let dax = plans.iter().any(|p| p.spec.daemon.dax);
    let tools = resolve_tools(args, dax, &loaded.spec.image)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing the Ctrl-C handler")?;
    }
    let spec_text = fs::read_to_string(&args.spec).unwrap_or_default();
    let _ = fs::write(out_dir.join("spec.toml"), &spec_text);
    let started = unix_ms();
    let mut provenance = json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "spec_path": args.spec.display().to_string(),
        "spec_text": spec_text,
        "sets": args.sets,
        "quick": args.quick,
        "spec": loaded.spec,
        "started_unix_ms": started,
        "machine": machine_facts(Some(&tools)),
        "runs": plans.iter().map(|p| plan_json(p, Some(&tools))).collect::<Vec<_>>(),
    });
    let write_provenance = |p: &Value| -> Result<()> {
        crate::results::write_atomic(
            &out_dir.join("provenance.json"),
            serde_json::to_string_pretty(p)?.as_bytes(),
        )?;
        Ok(())
    };
    write_provenance(&provenance)?;

    let param_columns: Vec<String> = loaded.spec.sweep.keys().cloned().collect();
    let mut results = ResultsFile::new(&loaded.spec.name, param_columns);
    results.write(&out_dir)?;
    let bar = Progress::new(plans.len() as u64, args.no_progress);
    let t0 = Instant::now();
    let mut done = 0;
    let mut interrupted = false;
    for plan in &plans {
        if stop.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        let run_dir = out_dir.join("runs").join(format!("{:03}", plan.run));
        fs::create_dir_all(&run_dir)?;
        fs::write(
            run_dir.join("plan.json"),
            serde_json::to_string_pretty(&plan_json(plan, Some(&tools)))?,
        )?;
        bar.start(plan.run, plans.len(), &plan.label());
        let t = Instant::now();
        let output = execute(plan, &tools, &run_dir, &stop);
        if let Some(v) = &output.guest_versions {
            let mut lines = v.lines();
            provenance["guest"] = json!({
                "fio": lines.next().unwrap_or("").trim(),
                "kernel": lines.next().unwrap_or("").trim(),
            });
        }
        let rows = rows_of(plan, &output);
        distributions::append(&out_dir, &distributions_of(plan, &output))?;
        let status = if output.interrupted {
            "interrupted".to_string()
        } else {
            rows.last()
                .and_then(|r| r.get("status"))
                .and_then(Value::as_str)
                .unwrap_or("failed")
                .to_string()
        };
        let err = rows
            .last()
            .and_then(|r| r.get("error"))
            .and_then(Value::as_str)
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        bar.done(format!(
            "run {}/{} [{}] {status} in {:.1}s{err}",
            plan.run,
            plans.len(),
            plan.label(),
            t.elapsed().as_secs_f64()
        ));
        results.push(rows);
        results.write(&out_dir)?;
        done += 1;
        if output.interrupted {
            interrupted = true;
            break;
        }
    }
    bar.finish();
    provenance["finished_unix_ms"] = json!(unix_ms());
    provenance["runs_done"] = json!(done);
    provenance["interrupted"] = json!(interrupted);
    write_provenance(&provenance)?;
    if !args.no_plots {
        match plot::render_all(&results, &loaded.spec.plots, &out_dir) {
            Ok(files) => eprintln!(
                "cxlfs run: {} plot(s) in {}",
                files.len(),
                out_dir.display()
            ),
            Err(e) => eprintln!("cxlfs run: plots not drawn: {e}"),
        }
    }
    print!("{}", text_table(&results));
    eprintln!(
        "cxlfs run: {done} of {} run(s) in {:.0}s; results in {}",
        plans.len(),
        t0.elapsed().as_secs_f64(),
        out_dir.display()
    );
    if interrupted {
        return Err(Interrupted(format!(
            "interrupted after {done} of {} runs; partial results kept in {}",
            plans.len(),
            out_dir.display()
        ))
        .into());
    }
    Ok(())
}

/// Runs done and left with an ETA on a terminal; plain lines otherwise.
enum Progress {
    Bar(ProgressBar),
    Plain,
}

impl Progress {
    fn new(len: u64, disabled: bool) -> Self {
        if disabled || !std::io::stderr().is_terminal() {
            return Progress::Plain;
        }
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} runs, ETA {eta} {msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        Progress::Bar(bar)
    }

    fn start(&self, run: u32, total: usize, label: &str) {
        match self {
            Progress::Bar(b) => b.set_message(label.to_string()),
            Progress::Plain => eprintln!("cxlfs run: run {run}/{total} [{label}] ..."),
        }
    }

    fn done(&self, line: String) {
        match self {
            Progress::Bar(b) => {
                b.println(line);
                b.inc(1);
            }
            Progress::Plain => eprintln!("cxlfs run: {line}"),
        }
    }

    fn finish(&self) {
        if let Progress::Bar(b) = self {
            b.finish_and_clear();
        }
    }
}

/// Handles `cxlfs plot DIR`.
pub fn plot_cmd(args: &ResultsDirArgs) -> Result<()> {
    let res = ResultsFile::read(&args.dir)?;
    let plots = spec_plots(&args.dir)?;
    let files = plot::render_all(&res, &plots, &args.dir)?;
    let mut o = std::io::stdout().lock();
    for f in &files {
        writeln!(o, "{}", f.display())?;
    }
    if files.is_empty() {
        eprintln!("cxlfs plot: nothing to plot (no successful runs, or no swept key)");
    }
    Ok(())
}

/// The plots named by the spec saved in `provenance.json` (none: defaults).
fn spec_plots(dir: &Path) -> Result<Vec<crate::spec::PlotSpec>> {
    let path = dir.join("provenance.json");
    let Ok(text) = fs::read_to_string(&path) else {
        return Ok(Vec::new());
    };
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    Ok(v.get("spec")
        .and_then(|s| s.get("plots"))
        .cloned()
        .map(serde_json::from_value)
        .transpose()
        .with_context(|| format!("{}: spec.plots", path.display()))?
        .unwrap_or_default())
}

/// Handles `cxlfs table DIR`.
pub fn table_cmd(args: &ResultsDirArgs) -> Result<()> {
    let res = ResultsFile::read(&args.dir)?;
    std::io::stdout()
        .lock()
        .write_all(text_table(&res).as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::spec::load_str;
    use cxlfs_api::metrics::{CounterInfo, DeviceTotals, MetricsSnapshot, VmSample};

    const SPEC: &str = r#"
name = "t"
[daemon]
preset = "femu"
device.cache.size_bytes = "8MiB"
dax = true
[vms]
count = 2
[[files]]
path = "f{i}.bin"
size = "1MiB"
count = 2
[[phases]]
name = "a"
fio.rw = "read"
[[phases]]
name = "b"
[sweep]
"daemon.cxl_ratio" = [0, 100]
"#;

    #[test]
    fn daemon_and_vm_arguments_follow_the_spec() {
        let plans = load_str("t.toml", SPEC, &[])
            .unwrap()
            .expand(false)
            .unwrap();
        let a = daemon_args(&plans[0], None, Path::new("m.jsonl"));
        assert_eq!(
            a,
            [
                "--preset",
                "femu",
                "--set",
                "cache.size_bytes=8MiB",
                "--cache",
                "never",
                "--cxl-ratio",
                "0",
                "--dax",
                "on",
                "--metrics-file",
                "m.jsonl",
                "--metrics-interval",
                "1s"
            ]
        );
        let v = vm_args(&plans[1], "vm1");
        assert_eq!(
            v,
            [
                "--name",
                "vm1",
                "--smp",
                "1",
                "--mem",
                "1G",
                "--timeout",
                "600",
                "--mountopts",
                "dax=always",
                "--cache-size",
                "64M"
            ]
        );
    }

    #[test]
    fn files_are_filled_deterministically() {
        let dir = tempfile::tempdir().unwrap();
        let plans = load_str("t.toml", SPEC, &[])
            .unwrap()
            .expand(false)
            .unwrap();
        create_files(&plans[0], dir.path()).unwrap();
        let a = fs::read(dir.path().join("f0.bin")).unwrap();
        let b = fs::read(dir.path().join("f1.bin")).unwrap();
        assert_eq!(a.len(), 1 << 20);
        assert_ne!(a, b);
        assert_ne!(&a[..4096], &a[4096..8192]);
        fill_file(&dir.path().join("again"), "f0.bin", 1 << 20).unwrap();
        assert_eq!(fs::read(dir.path().join("again")).unwrap(), a);
    }

    #[test]
    fn rows_per_phase_and_vm_with_an_aggregate() {
        let plans = load_str("t.toml", SPEC, &[])
            .unwrap()
            .expand(false)
            .unwrap();
        let fixture = include_str!("../tests/fixtures/fio-dax-mmap-randread.json");
        let prom = |h: u64| {
            let counter = |f: &str| CounterInfo {
                field: f.into(),
                family: format!("cxlfs_{f}_total"),
                help: String::new(),
            };
            let row = |vm: &str, hits: u64, misses: u64| VmSample {
                vm: vm.into(),
                counters: [
                    ("device_hits".into(), hits),
                    ("device_misses".into(), misses),
                ]
                .into(),
                ..VmSample::default()
            };
            Figures::of(&MetricsSnapshot {
                counters: vec![counter("device_hits"), counter("device_misses")],
                vms: vec![row("vm0", h, h * 2), row("vm1", 0, h * 3)],
                device: DeviceTotals {
                    nand_reads: h * 4,
                    ..DeviceTotals::default()
                },
                ..MetricsSnapshot::default()
            })
        };
        let mut out = RunOutput {
            snapshots: vec![(1000, prom(0)), (3000, prom(10)), (4000, prom(15))],
            ..RunOutput::default()
        };
        for vm in ["vm0", "vm1"] {
            out.phases.insert(
                vm.into(),
                vec![
                    PhaseResult {
                        fio: Some(fio_json::parse(fixture).unwrap()),
                        ..PhaseResult::default()
                    },
                    PhaseResult {
                        fio: Some(fio_json::parse(fixture).unwrap()),
                        ..PhaseResult::default()
                    },
                ],
            );
        }
        let rows = rows_of(&plans[0], &out);
        assert_eq!(rows.len(), 2 * 3);
        let r0 = &rows[0];
        assert_eq!(r0["vm"], "vm0");
        assert_eq!(r0["phase"], "a");
        assert_eq!(r0["status"], "ok");
        assert_eq!(r0["cxl_ratio"], 0);
        assert_eq!(r0["daemon.cxl_ratio"], 0);
        assert_eq!(r0["policy"], plans[0].device.cache.policy.name());
        assert_eq!(r0["device_hits"], 10);
        assert_eq!(r0["device_misses"], 20);
        assert!(
            !r0.contains_key("device_hit_rate"),
            "hits are invisible under DAX"
        );
        let mut no_dax = plans[0].clone();
        no_dax.spec.daemon.dax = false;
        assert_eq!(rows_of(&no_dax, &out)[0]["device_hit_rate"], num(1.0 / 3.0));
        assert_eq!(r0["elapsed_s"], 2);
        assert_eq!(r0["read_bw_bytes_per_sec"], 48_884_483);
        let all = &rows[2];
        assert_eq!(all["vm"], "all");
        assert_eq!(all["read_bw_bytes_per_sec"], 2 * 48_884_483);
        assert_eq!(all["read_clat_p99_ns"], 618_496);
        assert_eq!(all["device_misses"], 20 + 30);
        assert_eq!(all["daemon.nand_reads"], 40);
        let all_b = &rows[5];
        assert_eq!(all_b["phase"], "b");
        assert_eq!(all_b["device_misses"], 10 + 15);
        // One guest's fio failed: the run is failed, that row names the error.
        out.phases.get_mut("vm1").unwrap()[1] = PhaseResult {
            error: Some("vm1 b: fio exited 1: bad option".into()),
            ..PhaseResult::default()
        };
        let rows = rows_of(&plans[0], &out);
        assert!(rows.iter().all(|r| r["status"] == "failed"));
        assert_eq!(rows[4]["error"], "vm1 b: fio exited 1: bad option");
        // The daemon never started: rows with the error and no figures.
        let out = RunOutput {
            error: Some("cxlfsd exited at start".into()),
            ..RunOutput::default()
        };
        let rows = rows_of(&plans[1], &out);
        assert_eq!(rows.len(), 6);
        assert!(rows
            .iter()
            .all(|r| r["status"] == "failed" && r["error"] == "cxlfsd exited at start"));
        assert!(rows
            .iter()
            .all(|r| !r.contains_key("read_bw_bytes_per_sec")));
    }
}
