//! `provenance.json` of a results directory: the command, the spec (its
//! text, as `spec.toml` too, and as loaded), the machine and tools, each
//! run's effective configuration, the guest's fio and kernel, and when the
//! sweep started and ended; rewritten as the sweep goes (for a Slurm sweep:
//! started at submission, finished by `cxlfs collect`).

use super::args::RunArgs;
use super::command_lines::{daemon_args, phase_text, vm_args};
use super::rows::toml_to_json;
use super::run_output::unix_ms;
use super::tools::{output_of, repo_root, Tools};
use crate::spec::{size_value, RunPlan, Spec};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `provenance.json` of one sweep, as written so far.
pub(super) struct Provenance {
    value: Value,
    path: PathBuf,
}

impl Provenance {
    /// Writes `spec.toml` and the first `provenance.json` into `out_dir`.
    pub(super) fn start(
        args: &RunArgs,
        spec: &Spec,
        plans: &[RunPlan],
        tools: &Tools,
        out_dir: &Path,
    ) -> Result<Self> {
        let spec_text = fs::read_to_string(&args.spec).unwrap_or_default();
        let _ = fs::write(out_dir.join("spec.toml"), &spec_text);
        let started = unix_ms();
        let p = Provenance {
            value: json!({
                "command": std::env::args().collect::<Vec<_>>(),
                "spec_path": args.spec.display().to_string(),
                "spec_text": spec_text,
                "sets": args.sets,
                "quick": args.quick,
                "spec": spec,
                "started_unix_ms": started,
                "machine": machine_facts(Some(tools)),
                "runs": plans.iter().map(|p| plan_json(p, Some(tools))).collect::<Vec<_>>(),
            }),
            path: out_dir.join("provenance.json"),
        };
        p.write()?;
        Ok(p)
    }

    /// Records the guest's fio and kernel versions (`versions.txt`: one a
    /// line); written with the next [`Provenance::finish`].
    pub(super) fn set_guest(&mut self, versions: &str) {
        let mut lines = versions.lines();
        self.value["guest"] = json!({
            "fio": lines.next().unwrap_or("").trim(),
            "kernel": lines.next().unwrap_or("").trim(),
        });
    }

    /// The `provenance.json` a sweep started in `out_dir` (a Slurm sweep's,
    /// to be finished by `cxlfs collect`).
    pub(super) fn open(out_dir: &Path) -> Result<Self> {
        let path = out_dir.join("provenance.json");
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let value =
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        Ok(Provenance { value, path })
    }

    /// Sets a top-level field (`slurm`: the jobs and the nodes runs ran on);
    /// written with the next [`Provenance::finish`].
    pub(super) fn set(&mut self, key: &str, value: Value) {
        self.value[key] = value;
    }

    /// Records the end of the sweep and writes `provenance.json`.
    pub(super) fn finish(&mut self, runs_done: usize, interrupted: bool) -> Result<()> {
        self.value["finished_unix_ms"] = json!(unix_ms());
        self.value["runs_done"] = json!(runs_done);
        self.value["interrupted"] = json!(interrupted);
        self.write()
    }

    fn write(&self) -> Result<()> {
        crate::results::write_atomic(
            &self.path,
            serde_json::to_string_pretty(&self.value)?.as_bytes(),
        )?;
        Ok(())
    }
}

/// Facts about the machine and tools, for `provenance.json`.
fn machine_facts(tools: Option<&Tools>) -> Value {
    let repo = repo_root();
    let git = |args: &[&str]| output_of(Command::new("git").arg("-C").arg(&repo).args(args));
    let rev = git(&["rev-parse", "HEAD"]);
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
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
        "host": host_facts(),
    })
}

/// This machine: `uname -a`, CPU model and count, memory.
pub(super) fn host_facts() -> Value {
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
        "uname": output_of(Command::new("uname").arg("-a")),
        "cpu_model": cpu_model,
        "cpus": cpus,
        "mem_total": mem,
    })
}

/// The effective configuration of a run, for provenance and `--dry-run`.
pub(super) fn plan_json(plan: &RunPlan, tools: Option<&Tools>) -> Value {
    let vm0 = "vm0";
    json!({
        "run": plan.run,
        "point": plan.point,
        "repeat": plan.repeat,
        "params": plan.params.iter().map(|(k, v)| (k.clone(), toml_to_json(v))).collect::<serde_json::Map<_, _>>(),
        "cxlfsd_args": daemon_args(plan, tools, Path::new("RUN_DIR/metrics.jsonl")),
        "run_vm_args": vm_args(plan, vm0, Path::new("WORK/vm0.sock")),
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
