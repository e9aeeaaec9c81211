//! `runs/NNN/provenance.json` of a run that ran as a Slurm array task: the
//! node it ran on (host name, CPU, memory, kernel), whether KVM was usable
//! there and which accelerator its guests got, the Slurm job and task, the
//! guest's fio and kernel, and when it started and ended. The sweep's own
//! `provenance.json` names the submitting machine; this tells nodes apart.

use super::provenance::host_facts;
use super::run_output::unix_ms;
use super::tools::output_of;
use crate::results::write_atomic;
use anyhow::Result;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;
use std::process::Command;

/// The file inside `runs/NNN/`.
pub(super) const FILE: &str = "provenance.json";

/// The Slurm variables a task records (those set).
const SLURM_VARS: [&str; 7] = [
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_CLUSTER_NAME",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_NODELIST",
    "SLURM_CPUS_PER_TASK",
];

/// The node's facts at the start of a run.
pub(super) fn node_facts() -> Value {
    let slurm: serde_json::Map<String, Value> = SLURM_VARS
        .iter()
        .filter_map(|v| std::env::var(v).ok().map(|x| (v.to_lowercase(), json!(x))))
        .collect();
    json!({
        "node": output_of(Command::new("hostname").arg("-s")),
        "kernel": output_of(Command::new("uname").arg("-r")),
        "host": host_facts(),
        "kvm_usable": kvm_usable(),
        "slurm": slurm,
        "started_unix_ms": unix_ms(),
    })
}

/// `/dev/kvm` exists and we may open it read-write.
fn kvm_usable() -> bool {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// The accelerator `run-vm.sh` chose for guest `vm0`, from its log line
/// `run-vm: vm0: tcg (thread=single), 1 vCPU, ...` (`None` if not there).
pub(super) fn accel_of(run_log: &str) -> Option<String> {
    run_log.lines().find_map(|l| {
        let desc = l.strip_prefix("run-vm: vm0: ")?.split(',').next()?.trim();
        (desc.starts_with("kvm") || desc.starts_with("tcg")).then(|| desc.to_string())
    })
}

/// Completes `facts` with the run's end (`status`, the accelerator from
/// `vm0.run.log`, the guest's `versions.txt`) and writes it into `run_dir`.
pub(super) fn write_node_provenance(
    mut facts: Value,
    run_dir: &Path,
    status: &str,
    guest_versions: Option<&str>,
) -> Result<()> {
    let log = fs::read_to_string(run_dir.join("vm0.run.log")).unwrap_or_default();
    facts["accel"] = json!(accel_of(&log));
    facts["status"] = json!(status);
    facts["finished_unix_ms"] = json!(unix_ms());
    if let Some(v) = guest_versions {
        let mut lines = v.lines();
        facts["guest"] = json!({
            "fio": lines.next().unwrap_or("").trim(),
            "kernel": lines.next().unwrap_or("").trim(),
        });
    }
    write_atomic(
        &run_dir.join(FILE),
        serde_json::to_string_pretty(&facts)?.as_bytes(),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accel_is_read_from_run_vm_log() {
        let log = "qemu: warning\nrun-vm: vm0: tcg (thread=single), 1 vCPU, 256M, serial x\n";
        assert_eq!(accel_of(log).as_deref(), Some("tcg (thread=single)"));
        let kvm = "run-vm: KVM works: using -accel kvm\nrun-vm: vm0: kvm, 2 vCPU, 512M\n";
        assert_eq!(accel_of(kvm).as_deref(), Some("kvm"));
        assert_eq!(accel_of("run-vm: vm1: kvm, 1 vCPU"), None);
        assert_eq!(accel_of(""), None);
    }
}
