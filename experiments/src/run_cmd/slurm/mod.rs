//! `cxlfs run SPEC --out DIR --slurm`: the sweep as one Slurm job array,
//! one task per run (repeats included; the array index is the run number),
//! each task `cxlfs run SPEC --out DIR --only-run N` on its node. The tools
//! are resolved here, at submission (the image and QEMU built or found with
//! the same scripts as a local run), and the task is given their paths
//! (unless `--build-on-node`); DIR must be on a filesystem the nodes share.
//! By default it waits for the job and collects it; `--no-wait` prints the
//! job id; `--resume` resubmits only the runs that failed or never ran.
//!
//! * [`script`]: the job script;
//! * [`state`]: the tasks' states (`sacct`, `scontrol`, `squeue`);
//! * [`sweep_file`]: `DIR/slurm/sweep.json`, the jobs submitted;
//! * [`wait`]: waiting for a job, Ctrl-C cancelling it;
//! * [`collect`]: `cxlfs collect DIR`.

mod collect;
mod script;
mod state;
mod sweep_file;
mod wait;

pub use collect::{collect_cmd, CollectArgs};

use super::args::RunArgs;
use super::provenance::Provenance;
use super::record::{forget_rows, read_rows, run_dir};
use super::run_output::unix_ms;
use super::tools::{repo_root, resolve_tools, Needs, Tools};
use super::{prepare_out_dir, stop_on_signals, Interrupted};
use crate::spec::{RunPlan, Spec};
use anyhow::{bail, Context, Result};
use script::JobScript;
use serde_json::json;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use sweep_file::{Job, SlurmSweep};

/// Handles `cxlfs run --slurm`.
pub(super) fn run_on_slurm(args: &RunArgs, spec: &Spec, plans: &[RunPlan]) -> Result<()> {
    let o = &args.slurm_opts;
    let (out_dir, mut sweep, runs) = if o.resume {
        resume_point(args, plans)?
    } else {
        let out_dir = prepare_out_dir(args)?;
        let spec_path = fs::canonicalize(&args.spec)
            .with_context(|| format!("resolving {}", args.spec.display()))?;
        let sweep = SlurmSweep {
            spec: spec_path,
            sets: args.sets.clone(),
            quick: args.quick,
            jobs: Vec::new(),
        };
        (out_dir, sweep, plans.iter().map(|p| p.run).collect())
    };
    if runs.is_empty() {
        eprintln!(
            "cxlfs run: every run of {} is ok: nothing to resubmit",
            out_dir.display()
        );
        return collect::collect_dir(&out_dir, args.no_plots).map(|_| ());
    }
    let tools = resolve_tools(args, Needs::of(plans), &spec.image)?;
    if !o.resume {
        Provenance::start(args, spec, plans, &tools, &out_dir)?;
    }
    for run in &runs {
        forget_rows(&run_dir(&out_dir, *run))?;
    }
    let stop = stop_on_signals()?;
    let job = submit(args, spec, &sweep, &tools, &out_dir, &runs)?;
    eprintln!(
        "cxlfs run: submitted job {} ({} run(s): {}); logs in {}",
        job.job_id,
        runs.len(),
        script::array_ranges(&runs),
        out_dir.join("slurm").display()
    );
    let id = job.job_id.clone();
    sweep.jobs.push(job);
    sweep.write(&out_dir)?;
    if o.no_wait {
        println!("{id}");
        eprintln!(
            "cxlfs run: `cxlfs collect {}` merges the results once it is done",
            out_dir.display()
        );
        return Ok(());
    }
    let interrupted = wait::wait_for(&id, &stop)?;
    let tally = collect::collect_dir(&out_dir, args.no_plots)?;
    if interrupted {
        return Err(Interrupted(format!(
            "job {id} cancelled; {} of {} run(s) ok, results in {}",
            tally.ok,
            plans.len(),
            out_dir.display()
        ))
        .into());
    }
    Ok(())
}

/// `--resume`: the results directory, its sweep and the runs to redo (no
/// rows, or rows not `ok`); refused while a job of it is still queued.
fn resume_point(
    args: &RunArgs,
    plans: &[RunPlan],
) -> Result<(std::path::PathBuf, SlurmSweep, Vec<u32>)> {
    let out_dir =
        fs::canonicalize(&args.out).with_context(|| format!("resolving {}", args.out.display()))?;
    let sweep = SlurmSweep::read(&out_dir)?.with_context(|| {
        format!(
            "--resume: {} holds no Slurm sweep ({})",
            out_dir.display(),
            sweep_file::FILE
        )
    })?;
    if sweep.sets != args.sets || sweep.quick != args.quick {
        bail!(
            "--resume: the sweep was submitted with --set {:?}{}; resume it with the same",
            sweep.sets,
            if sweep.quick {
                " --quick"
            } else {
                " (no --quick)"
            }
        );
    }
    for job in &sweep.jobs {
        if !state::queued(&job.job_id)?.is_empty() {
            bail!("--resume: job {} of this sweep is still queued or running; wait for it or scancel it", job.job_id);
        }
    }
    let mut redo = Vec::new();
    for p in plans {
        let ok = read_rows(&run_dir(&out_dir, p.run))?
            .is_some_and(|rows| rows.iter().all(|r| r.get("status") == Some(&json!("ok"))));
        if !ok {
            redo.push(p.run);
        }
    }
    Ok((out_dir, sweep, redo))
}

/// Writes the job script `DIR/slurm/job-K.sh` for `runs` and submits it.
fn submit(
    args: &RunArgs,
    spec: &Spec,
    sweep: &SlurmSweep,
    tools: &Tools,
    out_dir: &Path,
    runs: &[u32],
) -> Result<Job> {
    let dir = out_dir.join("slurm");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let command = task_command(args, sweep, tools, out_dir);
    let repo = fs::canonicalize(repo_root()).unwrap_or_else(|_| repo_root());
    let env = [("CXLFS_REPO".to_string(), repo.display().to_string())];
    let text = JobScript {
        name: &spec.name,
        runs,
        out_dir,
        opts: &args.slurm_opts,
        env: &env,
        command: &command,
    }
    .text();
    let name = format!("job-{}.sh", sweep.jobs.len() + 1);
    let path = dir.join(&name);
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    let out = Command::new("sbatch")
        .arg("--parsable")
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .context("cannot run sbatch (is Slurm installed?)")?;
    if !out.status.success() {
        bail!(
            "sbatch {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // `--parsable`: `ID` or `ID;CLUSTER`.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let job_id = stdout.trim().split(';').next().unwrap_or("").to_string();
    if job_id.is_empty() {
        bail!("sbatch printed no job id");
    }
    Ok(Job {
        job_id,
        runs: runs.to_vec(),
        script: format!("slurm/{name}"),
        submitted_unix_ms: unix_ms(),
    })
}

/// The task's `cxlfs run` command line without `--only-run N`: this binary,
/// the spec, the results directory, `--set`s, `--quick`, and the tools
/// resolved here.
fn task_command(args: &RunArgs, sweep: &SlurmSweep, tools: &Tools, out_dir: &Path) -> Vec<String> {
    let mut c = vec![
        tools.cxlfs.display().to_string(),
        "run".into(),
        sweep.spec.display().to_string(),
        "--out".into(),
        out_dir.display().to_string(),
        "--no-progress".into(),
        "--cxlfsd".into(),
        tools.cxlfsd.display().to_string(),
    ];
    for s in &sweep.sets {
        c.extend(["--set".into(), s.clone()]);
    }
    if sweep.quick {
        c.push("--quick".into());
    }
    let on_node = args.slurm_opts.build_on_node;
    let image = match &args.image {
        Some(i) => Some(i.display().to_string()),
        None => (!on_node).then(|| tools.image.display().to_string()),
    };
    let qemu = match &args.qemu {
        Some(q) => Some(q.display().to_string()),
        None => (!on_node).then(|| tools.qemu.clone()),
    };
    for (flag, v) in [("--image", image), ("--qemu", qemu)] {
        if let Some(v) = v {
            c.extend([flag.to_string(), v]);
        }
    }
    c
}
