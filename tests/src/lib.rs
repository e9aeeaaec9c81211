//! The end-to-end test harness: real QEMU guests on a real `cxlfsd`.
//!
//! * [`guest_image`] builds (or finds in its cache) the guest image with
//!   `qemu-configs/build-guest-image.sh`, once per test binary;
//! * [`cxlfsd`] finds the daemon binary: `$CXLFSD`, else it runs
//!   `cargo build --release -p cxlfsd` once and takes the path cargo reports;
//! * [`Daemon`] runs `cxlfsd` on a fresh temp dir (share, sockets, logs) with a
//!   free metrics port, scrapes `/metrics` ([`Metrics`]), and stops it with
//!   SIGTERM; [`Daemon::boot`] starts a guest on one of its sockets through
//!   `qemu-configs/run-vm.sh` ([`Vm`]), so several guests run at once;
//! * everything is killed on drop (QEMU included: `run-vm.sh` runs it under
//!   `timeout`, in another process group, so the harness kills the whole tree);
//!   on a failing test the temp dir is kept and its path printed, and
//!   [`Daemon::diagnostics`] puts the logs' tails into the failure message.
//!
//! Guests under TCG need a host core per busy vCPU: tests take
//! [`exclusive`] so that the tests of one binary never overlap.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

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
/// guard for the whole test.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
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
pub fn guest_image() -> &'static Path {
    static IMAGE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once_path(&IMAGE, || {
        let script = repo_root().join("qemu-configs/build-guest-image.sh");
        let t = Instant::now();
        let out = Command::new(&script)
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
        let dir = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
        if !dir.join("vmlinuz").is_file() {
            return Err(format!(
                "{} printed {stdout:?}: no image there",
                script.display()
            ));
        }
        eprintln!("e2e: guest image {} ({:.1?})", dir.display(), t.elapsed());
        Ok(dir)
    })
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
        let script = repo_root().join("qemu-configs/build-qemu.sh");
        let t = Instant::now();
        let out = Command::new(&script)
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
        let bin = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
        if !bin.is_file() {
            return Err(format!(
                "{} printed {stdout:?}: no binary there",
                script.display()
            ));
        }
        eprintln!("e2e: patched QEMU {} ({:.1?})", bin.display(), t.elapsed());
        Ok(bin)
    })
}

/// The `cxlfs` command (for `cxlfs ctl`): `$CXLFS` if set, else the release
/// binary built once (per test binary) with `cargo build --release -p cxlfs`.
pub fn cxlfs_cli() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once_path(&BIN, || release_binary("CXLFS", "cxlfs", "cxlfs"))
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
    /// to be the patched QEMU ([`patched_qemu`]).
    pub cache_size: Option<String>,
    /// The QEMU binary (`$QEMU` of `run-vm.sh`); `None`: the system's.
    pub qemu: Option<PathBuf>,
}

impl VmOptions {
    /// A guest that mounts the share with `dax=always` through a DAX window
    /// of `window` (QEMU syntax) on the patched QEMU.
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
        }
    }
}

/// Sends `sig` to `pid`.
fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours;
        // the pid is that of a child we have not reaped yet (or of one of its
        // descendants), so it cannot name a recycled process of someone else's.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Every descendant of `root`, found through `/proc/*/stat`.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent = Vec::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|s| s.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent.push((pid, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent {
            if pp == p && !out.contains(&c) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// Kills `child` and all its descendants, and reaps it.
fn kill_tree(child: &mut Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    let pid = child.id();
    signal(pid, libc::SIGSTOP);
    for d in descendants(pid) {
        signal(d, libc::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The last `n` lines of a log file, carriage returns and escape sequences removed.
pub fn tail(path: &Path, n: usize) -> String {
    let Ok(bytes) = fs::read(path) else {
        return format!("({} unreadable)", path.display());
    };
    let text = String::from_utf8_lossy(&bytes)
        .replace('\r', "")
        .replace('\u{1b}', "^[");
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
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
        let mut cmd = Command::new(repo_root().join("qemu-configs/run-vm.sh"));
        cmd.arg("--image")
            .arg(guest_image())
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

    /// Scrapes and parses `/metrics`.
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
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// SIGTERM, then waits (up to 20 s) for the clean shutdown; returns the
    /// exit status (a daemon still running after that is killed: panic).
    pub fn stop(&mut self) -> ExitStatus {
        let Some(mut child) = self.child.take() else {
            panic!("cxlfsd already stopped");
        };
        signal(child.id(), libc::SIGTERM);
        let t = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(st)) => return st,
                Ok(None) if t.elapsed() < Duration::from_secs(20) => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    kill_tree(&mut child);
                    panic!(
                        "cxlfsd did not stop within 20 s of SIGTERM\n{}",
                        self.diagnostics()
                    );
                }
            }
        }
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
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
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

    /// A description for failure messages: status, run-vm output, serial tail.
    pub fn describe(&self) -> String {
        let serial: Vec<&str> = self.serial.lines().collect();
        format!(
            "guest {}: status {:?} after {:.1?}\n---- run-vm.sh\n{}\n---- {}.serial.log (last 60 lines)\n{}",
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
            loop {
                match child.try_wait() {
                    Ok(Some(st)) => {
                        code = st.code();
                        break;
                    }
                    Ok(None) if self.started.elapsed() < self.limit => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    _ => {
                        kill_tree(&mut child);
                        break;
                    }
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

/// A plain HTTP/1.0 GET; returns the body.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).map_err(|e| e.to_string())?;
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {resp:?}"))?;
    if !head.starts_with("HTTP/1.") || !head.split_whitespace().nth(1).is_some_and(|c| c == "200") {
        return Err(format!("bad response: {head}"));
    }
    Ok(body.to_string())
}

/// One sample of a Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (with any `_count`/`_sum` suffix).
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// A parsed Prometheus text exposition (format 0.0.4).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Every sample, in order.
    pub samples: Vec<Sample>,
}

fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    // `s` starts right after '{'.
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without '='")?;
        let key = rest[..eq].trim().to_string();
        let mut chars = rest[eq + 1..].char_indices();
        if !matches!(chars.next(), Some((_, '"'))) {
            return Err(format!("label {key}: value not quoted"));
        }
        let mut value = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => break,
                },
                '"' => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end.ok_or_else(|| format!("label {key}: unterminated value"))?;
        labels.insert(key, value);
        rest = &rest[end..];
    }
}

impl Metrics {
    /// Parses the text format: comments and blank lines are skipped; every
    /// other line is `name[{labels}] value [timestamp]`.
    pub fn parse(text: &str) -> Result<Metrics, String> {
        let mut samples = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |e: String| format!("line {}: {e}: {line}", n + 1);
            let name_end = line
                .find(['{', ' '])
                .ok_or_else(|| err("no value".into()))?;
            let name = line[..name_end].to_string();
            let (labels, rest) = if line[name_end..].starts_with('{') {
                parse_labels(&line[name_end + 1..]).map_err(err)?
            } else {
                (BTreeMap::new(), &line[name_end..])
            };
            let v = rest
                .split_whitespace()
                .next()
                .ok_or_else(|| err("no value".into()))?;
            let value = match v {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v
                    .parse::<f64>()
                    .map_err(|e| err(format!("value {v:?}: {e}")))?,
            };
            samples.push(Sample {
                name,
                labels,
                value,
            });
        }
        Ok(Metrics { samples })
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
        })
    }

    /// The first sample of `name` whose labels include `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).next().map(|s| s.value)
    }

    /// The sum over every sample of `name` whose labels include `labels`
    /// (0 if there is none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// `sum` as an integer counter.
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.sum(name, labels).round() as u64
    }

    /// Whether any sample of `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_prometheus_text() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\na_total{vm=\"vm0\",opcode=\"read\"} 12\n\
                    a_total{vm=\"vm1\",opcode=\"read\"} 3\na_total{vm=\"vm1\",opcode=\"write\"} 4 1700000000\n\
                    g 1.5e3\nq{x=\"a\\\"b\\\\c\",y=\"\"} +Inf\n\n";
        let m = Metrics::parse(text).unwrap();
        assert_eq!(m.samples.len(), 5);
        assert_eq!(m.get("a_total", &[("vm", "vm0")]), Some(12.0));
        assert_eq!(m.sum("a_total", &[("vm", "vm1")]), 7.0);
        assert_eq!(m.count("a_total", &[]), 19);
        assert_eq!(m.get("g", &[]), Some(1500.0));
        assert_eq!(
            m.get("q", &[("x", "a\"b\\c"), ("y", "")]),
            Some(f64::INFINITY)
        );
        assert_eq!(m.get("a_total", &[("vm", "vm2")]), None);
        assert!(m.has("g") && !m.has("nope"));
        assert!(Metrics::parse("x{vm=\"a} 1").is_err());
        assert!(Metrics::parse("x 1 2\ny").is_err());
        assert!(Metrics::parse("x abc").is_err());
    }

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

    #[test]
    fn finds_and_kills_a_process_tree() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 300 & sleep 300 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let t = Instant::now();
        let mut kids = Vec::new();
        while kids.len() < 2 && t.elapsed() < Duration::from_secs(5) {
            kids = descendants(child.id());
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(kids.len(), 2, "{kids:?}");
        kill_tree(&mut child);
        std::thread::sleep(Duration::from_millis(100));
        for k in kids {
            let alive =
                fs::read_to_string(format!("/proc/{k}/stat")).is_ok_and(|s| !s.contains(") Z "));
            assert!(!alive, "{k} survived");
        }
    }
}
