//! The guests of one run: each booted through `qemu-configs/run-vm.sh`
//! (through `cxlfs ctl memory-fd` in memory mode) in a process group of its
//! own, watched, stopped, and described when it ended early.

use super::command_lines::vm_args;
use super::tools::Tools;
use crate::spec::RunPlan;
use cxlfs::guest_log::kernel_crash_in;
use cxlfs::procs::{tail, terminate_tree};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A booted guest.
pub(super) struct Guest {
    pub(super) name: String,
    child: Option<Child>,
    pub(super) status: Option<i32>,
    serial: PathBuf,
}

impl Guest {
    /// Whether it is still running (collects its status when it ended).
    pub(super) fn running(&mut self) -> bool {
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

    /// Stops its process tree and keeps its status.
    pub(super) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let st = terminate_tree(&mut c, Duration::from_secs(10));
            self.status = st.and_then(|s| s.code()).or(Some(-1));
        }
    }

    /// Why it ended: the guest kernel's crash, else the serial log's tail.
    pub(super) fn describe_end(&self) -> String {
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

/// Boots guest `vm` (its socket in `work`, logs in `run_dir`).
pub(super) fn boot(
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
    let socket = work.join(format!("{vm}.sock"));
    cmd.arg("--image")
        .arg(&tools.image)
        .arg("--socket")
        .arg(&socket)
        .arg("--serial")
        .arg(&serial)
        .args(vm_args(plan, vm, &socket))
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
