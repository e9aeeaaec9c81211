//! The stock `virtiofsd` of a run whose `daemon.backend` is `virtiofsd`:
//! one process per guest on the guest's socket, over the same share, with
//! the spec's `cache` (`--cache`), no sandbox and no seccomp (as
//! `daemon/bench/virtiofsd-comparison.sh` runs it); each logged in the run
//! directory, stopped with SIGTERM (each also exits when its guest goes).

use super::daemon::spawn_logged;
use super::tools::Tools;
use crate::spec::RunPlan;
use cxlfs::procs::{signal, tail, terminate_tree, wait_timeout};
use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// The started `virtiofsd`s, one per guest.
pub(super) struct VirtiofsdProcs {
    children: Vec<(String, Child)>,
}

impl VirtiofsdProcs {
    /// Their process ids (for their resident memory).
    pub(super) fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|(_, c)| c.id()).collect()
    }

    /// SIGTERM to each and wait; one that does not exit within 10 s is killed.
    pub(super) fn stop(mut self) -> Result<(), String> {
        let mut err = None;
        for (vm, c) in &mut self.children {
            signal(c.id(), libc::SIGTERM);
            match wait_timeout(c, Duration::from_secs(10)) {
                Some(_) => {}
                None => {
                    let _ = terminate_tree(c, Duration::from_secs(1));
                    err.get_or_insert(format!(
                        "virtiofsd of {vm} did not exit after SIGTERM; killed"
                    ));
                }
            }
        }
        err.map_or(Ok(()), Err)
    }
}

/// Starts one `virtiofsd` per guest of `vms` (sockets in `work`, logs
/// `virtiofsd-VM.log` in `run_dir`) and waits for every socket.
pub(super) fn start_virtiofsd(
    plan: &RunPlan,
    tools: &Tools,
    work: &Path,
    run_dir: &Path,
    vms: &[String],
) -> Result<VirtiofsdProcs, String> {
    let bin = tools
        .virtiofsd
        .as_ref()
        .ok_or("no virtiofsd was resolved for this run")?;
    let share = work.join("share");
    let mut procs = VirtiofsdProcs {
        children: Vec::new(),
    };
    let mut lines = String::new();
    for vm in vms {
        let socket = work.join(format!("{vm}.sock"));
        let args = [
            format!("--socket-path={}", socket.display()),
            format!("--shared-dir={}", share.display()),
            format!("--cache={}", plan.spec.daemon.cache),
            "--sandbox=none".to_string(),
            "--seccomp=none".to_string(),
        ];
        lines.push_str(&format!("{} {}\n", bin.display(), args.join(" ")));
        let child = spawn_logged(bin, &args, &run_dir.join(format!("virtiofsd-{vm}.log")))?;
        procs.children.push((vm.clone(), child));
    }
    let _ = fs::write(run_dir.join("daemon-command.txt"), lines);
    let t = Instant::now();
    loop {
        let up = vms.iter().all(|vm| {
            fs::symlink_metadata(work.join(format!("{vm}.sock")))
                .is_ok_and(|m| m.file_type().is_socket())
        });
        if up {
            return Ok(procs);
        }
        let exited = procs
            .children
            .iter_mut()
            .find_map(|(vm, c)| c.try_wait().ok().flatten().map(|st| (vm.clone(), st)));
        if let Some((vm, st)) = exited {
            let log = tail(&run_dir.join(format!("virtiofsd-{vm}.log")), 4);
            let _ = procs.stop();
            return Err(format!(
                "virtiofsd of {vm} exited at start ({st}): {}",
                log.trim()
            ));
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = procs.stop();
            return Err("virtiofsd not ready after 30 s (see virtiofsd-*.log)".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
