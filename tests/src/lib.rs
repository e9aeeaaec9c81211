//! The end-to-end test harness: real QEMU guests on a real `cxlfsd`.
//!
//! * [`guest_image`] builds (or finds in its cache) the guest image with
//!   `qemu-configs/build-guest-image.sh`, once per test binary;
//! * [`cxlfsd`] finds the daemon binary: `$CXLFSD`, else it runs
//!   `cargo build --release -p cxlfsd` once and takes the path cargo reports;
//! * [`Daemon`] runs `cxlfsd` on a fresh temp dir (share, sockets, logs) with a
//!   free metrics port, scrapes `/metrics` ([`Metrics`]) or reads
//!   `/metrics.json` ([`MetricsSnapshot`]), and stops it with
//!   SIGTERM; [`Daemon::boot`] starts a guest on one of its sockets through
//!   `qemu-configs/run-vm.sh` ([`Vm`]), so several guests run at once;
//! * everything is killed on drop (QEMU included: `run-vm.sh` runs it under
//!   `timeout`, in another process group, so the harness kills the whole tree);
//!   on a failing test the temp dir is kept and its path printed, and
//!   [`Daemon::diagnostics`] puts the logs' tails into the failure message.
//!
//! Process trees, the HTTP GET and the Prometheus parser ([`Metrics`]) come
//! from the `cxlfs` library (`cxlfs::procs`, `cxlfs::prometheus`), shared
//! with the `cxlfs run` experiment runner.
//!
//! Guests under TCG need a host core per busy vCPU: tests take
//! [`exclusive`] so that the tests of one binary never overlap.

use cxlfs::procs::{kill_tree, signal, wait_timeout};
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

pub mod soak;

pub use cxlfs::procs::{http_get, tail};
pub use cxlfs::prometheus::{Metrics, Sample};
pub use cxlfs_api::metrics::MetricsSnapshot;

/// The checkout's root directory.
pub fn repo_root() -> PathBuf {
    match std::env::var_os("CXLFS_REPO") {
        Some(r) if !r.is_empty() => PathBuf::from(r),
        _ => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
    }
}

/// Serialises the tests of one binary (2 host cores, TCG guests): hold the
/// guard for the whole test. With `$CXLFS_E2E_TIMES` set, the guard appends
/// the test's running time to that file when dropped ([`Serial`]).
pub fn exclusive() -> Serial {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    Serial {
        _guard: guard,
        started: Instant::now(),
    }
}

/// What [`exclusive`] hands out: the binary's lock, and the clock of the test
/// that holds it.
pub struct Serial {
    _guard: MutexGuard<'static, ()>,
    started: Instant,
}

impl Drop for Serial {
    /// Appends `binary<TAB>test<TAB>seconds<TAB>ok|failed` to
    /// `$CXLFS_E2E_TIMES` (what `tests/timed-suite.sh` prints at the end of
    /// `make test`); nothing when it is unset.
    fn drop(&mut self) {
        let Some(path) = std::env::var_os("CXLFS_E2E_TIMES") else {
            return;
        };
        let binary = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .map(|s| match s.rsplit_once('-') {
                Some((name, _hash)) => name.to_string(),
                None => s,
            })
            .unwrap_or_else(|| "?".into());
        let thread = std::thread::current();
        let test = thread.name().unwrap_or("?");
        let status = if std::thread::panicking() {
            "failed"
        } else {
            "ok"
        };
        let line = format!(
            "{binary}\t{test}\t{:.1}\t{status}\n",
            self.started.elapsed().as_secs_f64()
        );
        let appended = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        if let Err(e) = appended {
            eprintln!(
                "cannot record the test's time in {}: {e}",
                Path::new(&path).display()
            );
        }
    }
}

fn once_path(
    cell: &'static OnceLock<Result<PathBuf, String>>,
    f: fn() -> Result<PathBuf, String>,
) -> &'static Path {
    match cell.get_or_init(f) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// The guest image directory (`vmlinuz`, `initramfs.cpio.*`), built or found
/// in the cache by `qemu-configs/build-guest-image.sh` once per test binary.
/// The script installs its host packages (QEMU included) itself.
/// `CXLFS_GUEST_IMAGE` names another image directory instead (an older
/// build from the cache, to rerun a test side by side with it).
pub fn guest_image() -> &'static Path {
    static IMAGE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once_path(&IMAGE, || {
        let has_kernel = |dir: &Path| dir.join("vmlinuz").is_file();
        match std::env::var_os("CXLFS_GUEST_IMAGE").map(PathBuf::from) {
            Some(dir) if has_kernel(&dir) => Ok(dir),
            Some(dir) => Err(format!(
                "CXLFS_GUEST_IMAGE={}: no vmlinuz there",
                dir.display()
            )),
            None => script_result(
                "qemu-configs/build-guest-image.sh",
                "guest image",
                has_kernel,
            ),
        }
    })
}

/// The guest image with Debian's bookworm-backports kernel (6.12: memory
/// tiering from the ACPI HMAT, weighted interleave), built or found in the
/// cache like [`guest_image`].
pub fn guest_image_backports() -> &'static Path {
    static IMAGE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once_path(&IMAGE, || {
        script_result_args(
            "qemu-configs/build-guest-image.sh",
            &["--kernel", "backports"],
            "backports guest image",
            |dir| dir.join("vmlinuz").is_file(),
        )
    })
}

/// Runs one of the project's build scripts (`rel` from the repo root; its
/// log goes to stderr) and returns the path it prints as its last line,
/// which `ok` must accept.
fn script_result(rel: &str, what: &str, ok: impl Fn(&Path) -> bool) -> Result<PathBuf, String> {
    script_result_args(rel, &[], what, ok)
}

/// [`script_result`] with arguments for the script.
fn script_result_args(
    rel: &str,
    args: &[&str],
    what: &str,
    ok: impl Fn(&Path) -> bool,
) -> Result<PathBuf, String> {
    let script = repo_root().join(rel);
    let t = Instant::now();
    let out = Command::new(&script)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}): see its log on stderr",
            script.display(),
            out.status
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
    if !ok(&path) {
        return Err(format!(
            "{} printed {stdout:?}: no {what} there",
            script.display()
        ));
    }
    eprintln!("e2e: {what} {} ({:.1?})", path.display(), t.elapsed());
    Ok(path)
}

/// The `cxlfsd` binary under test: `$CXLFSD` if set, else the release
/// binary built once (per test binary) with `cargo build --release -p cxlfsd`
/// into the current target dir.
pub fn cxlfsd() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once_path(&BIN, || release_binary("CXLFSD", "cxlfsd", "cxlfsd"))
}

/// `$ENV` if set (it must be a file), else `cargo build --release --locked
/// -p PACKAGE --bin BIN` into the current target dir, with the executable's
/// path taken from cargo's JSON messages (so any `CARGO_TARGET_DIR` works).
fn release_binary(env: &str, package: &str, bin: &str) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{env}={} is not a file", p.display()))
        };
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .current_dir(repo_root())
        .args([
            "build",
            "--quiet",
            "--release",
            "--locked",
            "-p",
            package,
            "--bin",
            bin,
        ])
        .arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo build -p {package} failed ({})", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| format!("cargo build -p {package} reported no {bin} executable"))
}

/// The QEMU with a virtio-fs DAX window, built (or found in the cache) by
/// `qemu-configs/build-qemu.sh` once per test binary; `$CXLFS_QEMU` if set.
/// The first build takes about 5 minutes on 2 cores.
pub fn patched_qemu() -> &'static Path {
    static QEMU: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once_path(&QEMU, || {
        if let Some(p) = std::env::var_os("CXLFS_QEMU").filter(|p| !p.is_empty()) {
            return Ok(PathBuf::from(p));
        }
        script_result("qemu-configs/build-qemu.sh", "patched QEMU", Path::is_file)
    })
}

/// The `cxlfs` command (for `cxlfs ctl`): `$CXLFS` if set, else the release
/// binary built once (per test binary) with `cargo build --release -p cxlfs`.
pub fn cxlfs_cli() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once_path(&BIN, || release_binary("CXLFS", "cxlfs", "cxlfs"))
}

/// Runs `cxlfs run SPEC --out OUT --quick --cxlfsd <the daemon> EXTRA...`
/// (stdin closed) and prints how long it took with its output, for the
/// test's log.
pub fn run_experiment(spec: &Path, out: &Path, extra: &[&OsStr]) -> std::process::Output {
    let t = Instant::now();
    let run = Command::new(cxlfs_cli())
        .arg("run")
        .arg(spec)
        .arg("--out")
        .arg(out)
        .arg("--quick")
        .arg("--cxlfsd")
        .arg(cxlfsd())
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cxlfs_cli().display()));
    eprintln!(
        "cxlfs run {} took {:.1?}\n{}\n{}",
        spec.display(),
        t.elapsed(),
        String::from_utf8_lossy(&run.stderr),
        String::from_utf8_lossy(&run.stdout)
    );
    run
}

/// A test knob from the environment: `name` parsed, else `default` (unset
/// or unparsable).
pub fn env_knob<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Options of one guest (see `qemu-configs/run-vm.sh`).
#[derive(Debug, Clone)]
pub struct VmOptions {
    /// vCPUs (`--smp`).
    pub smp: u32,
    /// Guest RAM, QEMU syntax (`--mem`).
    pub mem: String,
    /// The guest is killed after this long (`--timeout`; the harness adds 30 s).
    pub timeout: Duration,
    /// A short command line for the guest (`--cmd`); `None` runs the share's
    /// `.cxlfs/run.sh` (see [`Daemon::write_guest_script`]).
    pub cmd: Option<String>,
    /// Guest mount options for the share (`--mountopts`, e.g. `dax=always`).
    pub mountopts: Option<String>,
    /// The share's DAX window (`--cache-size`, QEMU syntax); needs `qemu`
    /// to be the patched QEMU ([`patched_qemu`]), and the same size as the
    /// daemon's `--dax-window` (default 1GiB): QEMU asks the daemon and
    /// exits at start with another size.
    pub cache_size: Option<String>,
    /// The QEMU binary (`$QEMU` of `run-vm.sh`); `None`: the system's.
    pub qemu: Option<PathBuf>,
    /// Memory mode: a CPU-less NUMA node backed by the VM's CXL memory
    /// region (its size, QEMU syntax): the guest is started through
    /// `cxlfs ctl memory-fd VM -- run-vm.sh ... --cxl-memory-fd {fd}`.
    pub cxl_memory: Option<String>,
    /// Boot the image with the bookworm-backports kernel
    /// ([`guest_image_backports`]) instead of the default one.
    pub backports_kernel: bool,
    /// Give QEMU the accessed-bit areas the daemon made beside the VM's
    /// socket (`--dax-abits` with a window, `--cxl-abits` with a CXL
    /// node); needs the patched QEMU.
    pub access_bits: bool,
}

impl VmOptions {
    /// A guest that mounts the share with `dax=always` through a DAX window
    /// of `window` (QEMU syntax) on the patched QEMU; start the daemon with
    /// `--dax-window` `window` (it takes the same syntax).
    pub fn dax(window: &str) -> Self {
        VmOptions {
            mountopts: Some("dax=always".to_string()),
            cache_size: Some(window.to_string()),
            qemu: Some(patched_qemu().to_path_buf()),
            ..VmOptions::default()
        }
    }
}

impl Default for VmOptions {
    fn default() -> Self {
        VmOptions {
            smp: 1,
            mem: "1G".to_string(),
            timeout: Duration::from_secs(240),
            cmd: None,
            mountopts: None,
            cache_size: None,
            qemu: None,
            cxl_memory: None,
            backports_kernel: false,
            access_bits: false,
        }
    }
}

/// A running `cxlfsd` on a temp dir: `share/` (the shared directory, with
/// `share/.cxlfs/` for guest scripts and exit files), one socket per VM, and
/// the logs. Killed on drop if still running.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    work: Option<tempfile::TempDir>,
    work_path: PathBuf,
    share: PathBuf,
    metrics: SocketAddr,
    vms: Vec<(String, PathBuf)>,
}

impl Daemon {
    /// Starts `cxlfsd --shared-dir DIR --vm NAME=SOCK... --metrics-addr
    /// 127.0.0.1:PORT ARGS...` and waits until every socket and the metrics
    /// endpoint are up. `prepare` fills the share before the daemon starts.
    pub fn start(vms: &[&str], args: &[&str], prepare: impl FnOnce(&Path)) -> Daemon {
        let bin = cxlfsd();
        let work = tempfile::Builder::new()
            .prefix("cxlfs-e2e.")
            .tempdir()
            .expect("create the test's temp dir");
        let work_path = work.path().to_path_buf();
        let share = work_path.join("share");
        fs::create_dir_all(share.join(".cxlfs")).expect("create the share");
        prepare(&share);
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("find a free port")
            .port();
        let metrics = SocketAddr::from(([127, 0, 0, 1], port));
        let vms: Vec<(String, PathBuf)> = vms
            .iter()
            .map(|v| (v.to_string(), work_path.join(format!("{v}.sock"))))
            .collect();
        let log = fs::File::create(work_path.join("daemon.log")).expect("create daemon.log");
        let mut cmd = Command::new(bin);
        cmd.arg("--shared-dir").arg(&share);
        for (name, sock) in &vms {
            cmd.arg("--vm").arg(format!("{name}={}", sock.display()));
        }
        cmd.arg("--metrics-addr")
            .arg(metrics.to_string())
            .args(args);
        if args.iter().any(|a| a.starts_with("--cxl-memory")) {
            // Guests get their region over the control socket.
            cmd.arg("--control-socket")
                .arg(work_path.join("control.sock"));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup daemon.log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut d = Daemon {
            child: Some(child),
            work: Some(work),
            work_path,
            share,
            metrics,
            vms,
        };
        d.wait_ready(Duration::from_secs(15));
        d
    }

    fn wait_ready(&mut self, limit: Duration) {
        let t = Instant::now();
        loop {
            let sockets_up = self
                .vms
                .iter()
                .all(|(_, s)| fs::symlink_metadata(s).is_ok_and(|m| m.file_type().is_socket()));
            if sockets_up
                && TcpStream::connect_timeout(&self.metrics, Duration::from_millis(200)).is_ok()
            {
                return;
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                panic!("cxlfsd exited at start ({st})\n{}", self.diagnostics());
            }
            if t.elapsed() > limit {
                panic!("cxlfsd not ready after {limit:?}\n{}", self.diagnostics());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The test's temp dir (logs, sockets, `share/`).
    pub fn work_dir(&self) -> &Path {
        &self.work_path
    }

    /// The shared directory on the host.
    pub fn share(&self) -> &Path {
        &self.share
    }

    /// The socket of VM `vm`.
    pub fn socket(&self, vm: &str) -> &Path {
        self.vms
            .iter()
            .find(|(n, _)| n == vm)
            .map(|(_, s)| s.as_path())
            .unwrap_or_else(|| panic!("no VM named {vm} on this daemon"))
    }

    /// Writes the guest job as `.cxlfs/run.sh` in the share: every guest
    /// booted without `cmd` runs it, with `$CXLFS_VM` set to its name.
    pub fn write_guest_script(&self, script: &str) {
        fs::write(self.share.join(".cxlfs/run.sh"), script).expect("write .cxlfs/run.sh");
    }

    /// Boots guest `vm` on its socket (through `qemu-configs/run-vm.sh`) and
    /// returns at once; [`Vm::wait`] collects it.
    pub fn boot(&self, vm: &str, opts: &VmOptions) -> Vm {
        let serial = self.work_path.join(format!("{vm}.serial.log"));
        let runner_log = self.work_path.join(format!("{vm}.run.log"));
        let log = fs::File::create(&runner_log).expect("create the run-vm log");
        let run_vm = repo_root().join("qemu-configs/run-vm.sh");
        let mut cmd = match &opts.cxl_memory {
            None => Command::new(&run_vm),
            Some(size) => {
                let mut c = Command::new(cxlfs_cli());
                c.arg("ctl")
                    .arg("--socket")
                    .arg(self.work_path.join("control.sock"))
                    .args(["memory-fd", vm, "--"])
                    .arg(&run_vm)
                    .args(["--cxl-memory", size, "--cxl-memory-fd", "{fd}"])
                    // Boot allocations stay off the CXL node (as on a host
                    // whose CXL memory is hot-plugged as movable).
                    .args(["--append", "movable_node"]);
                c
            }
        };
        let image = if opts.backports_kernel {
            guest_image_backports()
        } else {
            guest_image()
        };
        cmd.arg("--image")
            .arg(image)
            .arg("--socket")
            .arg(self.socket(vm))
            .args([
                "--name",
                vm,
                "--smp",
                &opts.smp.to_string(),
                "--mem",
                &opts.mem,
            ])
            .arg("--serial")
            .arg(&serial)
            .args(["--timeout", &opts.timeout.as_secs().max(1).to_string()]);
        if let Some(c) = &opts.cmd {
            cmd.arg("--cmd").arg(c);
        }
        if let Some(m) = &opts.mountopts {
            cmd.arg("--mountopts").arg(m);
        }
        if let Some(c) = &opts.cache_size {
            cmd.arg("--cache-size").arg(c);
        }
        if opts.access_bits {
            use cxlfs_api::hits::RegionKind;
            let socket = self.socket(vm);
            if opts.cache_size.is_some() {
                cmd.arg("--dax-abits")
                    .arg(RegionKind::File.area_path(socket));
            }
            if opts.cxl_memory.is_some() {
                cmd.arg("--cxl-abits")
                    .arg(RegionKind::Memory.area_path(socket));
            }
        }
        if let Some(q) = &opts.qemu {
            cmd.env("QEMU", q);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup the run-vm log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start run-vm.sh: {e}"));
        Vm {
            name: vm.to_string(),
            child: Some(child),
            serial,
            runner_log,
            started: Instant::now(),
            limit: opts.timeout + Duration::from_secs(30),
        }
    }

    /// The daemon's process id (`None` once stopped or killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Reads `/metrics.json`: the daemon's snapshot, with its own types.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let text = http_get(self.metrics, "/metrics.json")
            .unwrap_or_else(|e| panic!("reading {}: {e}\n{}", self.metrics, self.diagnostics()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad metrics JSON: {e}\n{text}"))
    }

    /// Scrapes and parses `/metrics` (the Prometheus text, for tests of the
    /// endpoint itself; for the numbers alone [`Daemon::snapshot`] will do).
    pub fn scrape(&self) -> Metrics {
        let text = http_get(self.metrics, "/metrics")
            .unwrap_or_else(|e| panic!("scraping {}: {e}\n{}", self.metrics, self.diagnostics()));
        Metrics::parse(&text).unwrap_or_else(|e| panic!("bad metrics text: {e}\n{text}"))
    }

    /// SIGKILL (no clean shutdown); returns the exit status if the process
    /// was gone within `limit`, `None` if it still was not (it is then
    /// left to the test to unwedge and report).
    pub fn kill(&mut self, limit: Duration) -> Option<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            panic!("cxlfsd already stopped");
        };
        signal(child.id(), libc::SIGKILL);
        wait_timeout(&mut child, limit)
    }

    /// SIGTERM, then waits (up to 20 s) for the clean shutdown; returns the
    /// exit status (a daemon still running after that is killed: panic).
    pub fn stop(&mut self) -> ExitStatus {
        let Some(mut child) = self.child.take() else {
            panic!("cxlfsd already stopped");
        };
        signal(child.id(), libc::SIGTERM);
        if let Some(st) = wait_timeout(&mut child, Duration::from_secs(20)) {
            return st;
        }
        kill_tree(&mut child);
        panic!(
            "cxlfsd did not stop within 20 s of SIGTERM\n{}",
            self.diagnostics()
        );
    }

    /// Tails of the daemon log and of every guest's serial and run-vm logs,
    /// for failure messages.
    pub fn diagnostics(&self) -> String {
        let mut s = format!("---- test dir: {}\n", self.work_path.display());
        let mut logs: Vec<PathBuf> = fs::read_dir(&self.work_path)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        logs.retain(|p| p.extension().is_some_and(|x| x == "log"));
        logs.sort();
        for p in logs {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let n = if name.ends_with(".serial.log") {
                40
            } else {
                25
            };
            let _ = writeln!(s, "---- {name} (last {n} lines)\n{}", tail(&p, n));
        }
        if let Some(c) = &self.child {
            s.push_str(&thread_dump(c.id()));
        }
        s
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGTERM first: a clean stop unmounts the DAX pool. Only the
            // daemon itself is killed after that, never its pool exit guard
            // (a child process), which must outlive it to abort the pool.
            signal(c.id(), libc::SIGTERM);
            let _ = wait_timeout(&mut c, Duration::from_secs(10));
            let _ = c.kill();
            let _ = c.wait();
        }
        let keep = std::thread::panicking() || std::env::var_os("CXLFS_E2E_KEEP").is_some();
        if let Some(w) = self.work.take() {
            if keep {
                eprintln!("e2e: logs and share kept in {}", w.keep().display());
            }
        }
    }
}

/// A guest started by [`Daemon::boot`]; killed (with its QEMU) on drop.
#[derive(Debug)]
pub struct Vm {
    name: String,
    child: Option<Child>,
    serial: PathBuf,
    runner_log: PathBuf,
    started: Instant,
    limit: Duration,
}

/// How a guest ended.
#[derive(Debug, Clone)]
pub struct GuestRun {
    /// The VM's name.
    pub name: String,
    /// `run-vm.sh`'s status: the guest command's exit status, 124 = timed
    /// out, 125 = QEMU stopped without an exit line; `None` if the harness
    /// had to kill it.
    pub code: Option<i32>,
    /// Boot to power-off.
    pub elapsed: Duration,
    /// The whole serial console log.
    pub serial: String,
    /// `run-vm.sh`'s own output.
    pub runner: String,
}

impl GuestRun {
    /// Whether the guest's command exited 0 (status and `CXLFS-EXIT=0` line).
    pub fn ok(&self) -> bool {
        self.code == Some(0) && self.serial.contains("CXLFS-EXIT=0")
    }

    /// A description for failure messages: status, the guest kernel's crash
    /// if it had one, run-vm output, serial tail.
    pub fn describe(&self) -> String {
        let serial: Vec<&str> = self.serial.lines().collect();
        let crash = cxlfs::guest_log::kernel_crash(&self.serial)
            .map(|c| format!(" (guest kernel crashed: {c})"))
            .unwrap_or_default();
        format!(
            "guest {}: status {:?} after {:.1?}{crash}\n---- run-vm.sh\n{}\n---- {}.serial.log (last 60 lines)\n{}",
            self.name,
            self.code,
            self.elapsed,
            self.runner.trim_end(),
            self.name,
            serial[serial.len().saturating_sub(60)..].join("\n")
        )
    }
}

impl Vm {
    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process group of the guest's runner, QEMU included (`None` once
    /// collected): for tests that freeze or signal the VMM.
    pub fn process_group(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the guest is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits until `path` exists; false if the guest ended (or `limit`
    /// passed) first. For handshakes with a guest script.
    pub fn wait_for_file(&mut self, path: &Path, limit: Duration) -> bool {
        let t = Instant::now();
        while t.elapsed() < limit {
            if path.exists() {
                return true;
            }
            if !self.running() {
                return path.exists();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Waits for the guest to power off (killing it after its timeout + 30 s).
    pub fn wait(mut self) -> GuestRun {
        let mut code = None;
        if let Some(mut child) = self.child.take() {
            let left = self.limit.saturating_sub(self.started.elapsed());
            match wait_timeout(&mut child, left) {
                Some(st) => code = st.code(),
                None => {
                    kill_tree(&mut child);
                }
            }
        }
        let serial = fs::read(&self.serial)
            .map(|b| String::from_utf8_lossy(&b).replace('\r', ""))
            .unwrap_or_default();
        GuestRun {
            name: self.name.clone(),
            code,
            elapsed: self.started.elapsed(),
            serial,
            runner: fs::read_to_string(&self.runner_log).unwrap_or_default(),
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_tree(&mut c);
        }
    }
}

/// The QEMU process of guest `vm` of the daemon whose work directory is
/// `work` (argv[0] is QEMU, not `timeout` or a shell that names it; its
/// arguments hold the directory and `-name VM` or `-name VM,OPTIONS`, as
/// run-vm.sh's `VM,debug-threads=on`): for tests that signal it.
pub fn qemu_pid(work: &Path, vm: &str) -> Option<u32> {
    let dir = work.to_string_lossy().to_string();
    let names = [format!("\0-name\0{vm}\0"), format!("\0-name\0{vm},")];
    fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let cmd = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd);
        // argv[0] itself (not `timeout` or a shell whose arguments name it).
        let argv0 = cmd.split('\0').next().unwrap_or("");
        let qemu = Path::new(argv0)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("qemu-system"));
        (qemu && cmd.contains(&dir) && names.iter().any(|n| cmd.contains(n.as_str())))
            .then_some(pid)
    })
}

/// Per-direction numbers of one fio job, from `--output-format=json`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FioStats {
    /// Bytes moved.
    pub io_bytes: u64,
    /// Job run time in ms.
    pub runtime_ms: u64,
    /// Requests completed.
    pub total_ios: u64,
    /// Mean completion latency, ns.
    pub clat_mean_ns: f64,
    /// Smallest completion latency, ns.
    pub clat_min_ns: u64,
    /// Largest completion latency, ns.
    pub clat_max_ns: u64,
    /// 5th percentile of the completion latency, ns (fio's bucket).
    pub clat_p5_ns: u64,
    /// Median completion latency, ns (fio's bucket).
    pub clat_p50_ns: u64,
    /// Errors reported by fio.
    pub errors: u64,
}

/// The `dir` ("read" or "write") numbers of the first job in fio's JSON
/// output file `path` (text before the JSON, e.g. warnings, is skipped).
pub fn fio_stats(path: &Path, dir: &str) -> Result<FioStats, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let json = text
        .find('{')
        .map(|i| &text[i..])
        .ok_or("no JSON in fio output")?;
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("{}: {e}", path.display()))?;
    let job = &v["jobs"][0];
    let d = &job[dir];
    let u = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    if d.is_null() {
        return Err(format!("{}: no jobs[0].{dir}", path.display()));
    }
    Ok(FioStats {
        io_bytes: u(&d["io_bytes"]),
        runtime_ms: u(&d["runtime"]),
        total_ios: u(&d["total_ios"]),
        clat_mean_ns: d["clat_ns"]["mean"].as_f64().unwrap_or(0.0),
        clat_min_ns: u(&d["clat_ns"]["min"]),
        clat_max_ns: u(&d["clat_ns"]["max"]),
        clat_p5_ns: u(&d["clat_ns"]["percentile"]["5.000000"]),
        clat_p50_ns: u(&d["clat_ns"]["percentile"]["50.000000"]),
        errors: u(&job["error"]),
    })
}

/// `len` pseudo-random bytes (xorshift64), the same for the same `seed`:
/// file contents that no two files or offsets share by accident.
pub fn seeded_bytes(len: u64, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The content fio writes and checks with `--verify=pattern
/// --verify_pattern=%o --bs=BS`: every `bs` block filled with its own file
/// offset as a little-endian u64, repeated.
pub fn offset_pattern(len: u64, bs: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    let mut off = 0;
    while off < len {
        let block = bs.min(len - off);
        let word = off.to_le_bytes();
        out.extend((0..block).map(|i| word[(i % 8) as usize]));
        off += block;
    }
    out
}

/// The first offset at which `a` and `b` differ (a length difference counts).
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// SHA-256 of a host file (hex), with coreutils' `sha256sum`.
pub fn sha256_hex(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run sha256sum: {e}"));
    assert!(out.status.success(), "sha256sum {} failed", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Shell functions for guest scripts: `run CMD...` runs a command with its
/// output kept in /tmp and shown (then exits with its status) only if it
/// fails; `handshake N` marks `.cxlfs/ready-$CXLFS_VM-N` in the share and
/// waits for the host to create `.cxlfs/go-$CXLFS_VM-N`.
pub const GUEST_PRELUDE: &str = r#"set -eu
run() {
    if ! "$@" >/tmp/run.out 2>&1; then
        rc=$?
        cat /tmp/run.out
        echo "E2E-FAILED (status $rc): $*"
        exit 1
    fi
}
handshake() {
    : >"/mnt/.cxlfs/ready-$CXLFS_VM-$1"
    while [ ! -e "/mnt/.cxlfs/go-$CXLFS_VM-$1" ]; do sleep 0.02; done
}
grep -q ' /mnt virtiofs ' /proc/mounts
"#;

/// Host side of `handshake N`: waits for the guest's ready mark (panics with
/// diagnostics if the guest ends first), runs `f`, then lets the guest go on.
pub fn handshake<T>(d: &Daemon, vm: &mut Vm, n: u32, f: impl FnOnce() -> T) -> T {
    let ready = d.share().join(format!(".cxlfs/ready-{}-{n}", vm.name()));
    if !vm.wait_for_file(&ready, Duration::from_secs(180)) {
        panic!(
            "guest {} never reached handshake {n}\n{}",
            vm.name(),
            d.diagnostics()
        );
    }
    let r = f();
    fs::write(d.share().join(format!(".cxlfs/go-{}-{n}", vm.name())), b"")
        .expect("write the go mark");
    r
}

/// What a daemon's threads are doing (name, state, wait channel, kernel
/// stack where readable) and how many requests each FUSE connection on the
/// host holds: a hung guest is most often a daemon thread stuck in a fault
/// on the pool, and this says where.
fn thread_dump(pid: u32) -> String {
    let mut s = format!("---- cxlfsd (pid {pid}) threads\n");
    let dir = PathBuf::from(format!("/proc/{pid}/task"));
    let mut tids: Vec<PathBuf> = fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    tids.sort();
    for t in tids {
        let read = |f: &str| fs::read_to_string(t.join(f)).unwrap_or_default();
        let state = read("status")
            .lines()
            .find(|l| l.starts_with("State:"))
            .map(|l| l.trim_start_matches("State:").trim().to_string())
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "{} {} [{}] wchan={}",
            t.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            read("comm").trim(),
            state,
            read("wchan").trim()
        );
        for l in read("stack").lines().take(12) {
            let _ = writeln!(s, "    {l}");
        }
    }
    let conns = Path::new("/sys/fs/fuse/connections");
    for c in fs::read_dir(conns).into_iter().flatten().flatten() {
        let waiting = fs::read_to_string(c.path().join("waiting")).unwrap_or_default();
        if waiting.trim() != "0" {
            let _ = writeln!(
                s,
                "fuse connection {}: waiting {}",
                c.file_name().to_string_lossy(),
                waiting.trim()
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn offset_pattern_matches_fio() {
        let p = offset_pattern(3 * 16 + 4, 16);
        assert_eq!(&p[..16], &[0u8; 16]);
        assert_eq!(&p[16..24], &16u64.to_le_bytes());
        assert_eq!(&p[24..32], &16u64.to_le_bytes());
        assert_eq!(&p[48..52], &48u64.to_le_bytes()[..4]);
        assert_eq!(first_difference(&p, &p), None);
        assert_eq!(first_difference(&p, &p[..10]), Some(10));
        let mut q = p.clone();
        q[33] ^= 1;
        assert_eq!(first_difference(&p, &q), Some(33));
    }
}
