//! The `cxlfsd` of one run: started in a process group of its own with the
//! run's sockets, metrics address and arguments (logged in the run
//! directory), asked for its snapshot at the phase barriers, and stopped
//! with SIGTERM.

use super::command_lines::daemon_args;
use super::tools::Tools;
use crate::daemon_metrics::Figures;
use crate::spec::RunPlan;
use cxlfs::procs::{http_get, signal, tail, terminate_tree, wait_timeout};
use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A started `cxlfsd`.
pub(super) struct DaemonProc {
    child: Child,
    metrics: SocketAddr,
    dax: bool,
}

impl DaemonProc {
    /// Its process id.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The daemon's snapshot (`/metrics.json`): its text and its figures.
    pub(super) fn scrape(&self) -> Result<(String, Figures), String> {
        let text = http_get(self.metrics, "/metrics.json").map_err(|e| e.to_string())?;
        let snap = Figures::parse(&text).map_err(|e| e.to_string())?;
        Ok((text, snap))
    }

    /// SIGTERM and wait; with DAX on never SIGKILL (a killed daemon can leave
    /// the pool mount hanging), so a daemon that does not stop is left running.
    pub(super) fn stop(mut self) -> Result<(), String> {
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

/// Starts `cxlfsd` for the guests `vms` (sockets in `work`, log and command
/// line in `run_dir`) and waits until its sockets and metrics address are up.
pub(super) fn start_daemon(
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
    let child = spawn_logged(&tools.cxlfsd, &args, &log_path)?;
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

/// Starts `bin ARGS` in a process group of its own, its stdout and stderr
/// into `log`.
pub(super) fn spawn_logged(bin: &Path, args: &[String], log: &Path) -> Result<Child, String> {
    let out = fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))
}
