//! `cxlfs collect DIR`: the runs of a Slurm sweep merged into `results.csv`
//! / `results.json` / `distributions.jsonl` / plots, in run order, through
//! the same functions as a local sweep. A run that left no rows (it never
//! ran, or was killed before writing them) gets the rows of a run that
//! failed (status `failed`, or `missing` when it never ran) with Slurm's
//! state; a run whose task Slurm ended badly (cancelled, timed out, ...) is
//! `failed`. Rows that are not `ok` carry `slurm_state` and `slurm_job`.

use super::state::{task_states, TaskState};
use super::sweep_file::SlurmSweep;
use crate::distributions;
use crate::results::{ResultsFile, Row};
use crate::run_cmd::node;
use crate::run_cmd::provenance::Provenance;
use crate::run_cmd::record::{forget_distributions, merge_run, read_rows, run_dir};
use crate::run_cmd::rows::rows_of;
use crate::run_cmd::run_output::RunOutput;
use crate::run_cmd::show_results;
use crate::spec::{self, RunPlan};
use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// `cxlfs collect` arguments.
#[derive(Debug, Clone, Args)]
pub struct CollectArgs {
    /// A results directory written by `cxlfs run --slurm`.
    #[arg(value_name = "RESULTS_DIR")]
    dir: PathBuf,
    /// Do not draw plots.
    #[arg(long)]
    no_plots: bool,
}

/// Handles `cxlfs collect`.
pub fn collect_cmd(args: &CollectArgs) -> Result<()> {
    let dir =
        fs::canonicalize(&args.dir).with_context(|| format!("resolving {}", args.dir.display()))?;
    collect_dir(&dir, args.no_plots).map(|_| ())
}

/// How the runs of a sweep ended, as collected.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) ok: usize,
    pub(super) failed: usize,
    pub(super) missing: usize,
}

/// Merges the runs of the Slurm sweep in `out_dir` (absolute).
pub(super) fn collect_dir(out_dir: &Path, no_plots: bool) -> Result<Tally> {
    let sweep = SlurmSweep::read(out_dir)?.with_context(|| {
        format!(
            "{}: no {} (not a `cxlfs run --slurm` results directory)",
            out_dir.display(),
            super::sweep_file::FILE
        )
    })?;
    let loaded = spec::load(&sweep.spec, &sweep.sets)?;
    let plans = loaded.expand(sweep.quick)?;
    let (source, states) = latest_states(&sweep);
    forget_distributions(out_dir)?;
    let params: Vec<String> = loaded.spec.sweep.keys().cloned().collect();
    let mut results = ResultsFile::new(&loaded.spec.name, params);
    let mut provenance = Provenance::open(out_dir)?;
    let mut nodes = serde_json::Map::new();
    let mut tally = Tally::default();
    for plan in &plans {
        let dir = run_dir(out_dir, plan.run);
        let rows = rows_of_run(plan, &dir, states.get(&plan.run))?;
        match rows
            .first()
            .and_then(|r| r.get("status"))
            .and_then(Value::as_str)
        {
            Some("ok") => tally.ok += 1,
            Some("missing") => tally.missing += 1,
            _ => tally.failed += 1,
        }
        let dists = distributions::read(&dir)?;
        merge_run(&mut results, out_dir, rows, &dists)?;
        if let Some(facts) = node_provenance(&dir) {
            if let Some(g) = facts.get("guest") {
                provenance.set("guest", g.clone());
            }
            nodes.insert(
                plan.run.to_string(),
                json!({"node": facts["node"], "accel": facts["accel"], "kernel": facts["kernel"]}),
            );
        }
    }
    results.write(out_dir)?;
    provenance.set(
        "slurm",
        json!({"jobs": sweep.jobs, "states_from": source, "runs": nodes,
               "states": states.values().collect::<Vec<_>>()}),
    );
    provenance.finish(plans.len() - tally.missing, false)?;
    show_results(&results, &loaded.spec.plots, out_dir, no_plots);
    eprintln!(
        "cxlfs collect: {} of {} run(s) ok, {} failed, {} missing; results in {}",
        tally.ok,
        plans.len(),
        tally.failed,
        tally.missing,
        out_dir.display()
    );
    Ok(tally)
}

/// Each run's state in the latest job that ran it, and where the states
/// came from.
fn latest_states(sweep: &SlurmSweep) -> (&'static str, BTreeMap<u32, TaskState>) {
    let mut source = "none";
    let mut states = BTreeMap::new();
    for job in &sweep.jobs {
        let (from, tasks) = task_states(&job.job_id);
        if from != "none" {
            source = from;
        }
        for run in &job.runs {
            states.remove(run);
        }
        for t in tasks.into_iter().filter(|t| job.runs.contains(&t.run)) {
            states.insert(t.run, t);
        }
    }
    (source, states)
}

/// The rows of one run: those it wrote, else those of a run that failed
/// or never ran; marked with Slurm's state unless `ok`.
pub(super) fn rows_of_run(
    plan: &RunPlan,
    dir: &Path,
    state: Option<&TaskState>,
) -> Result<Vec<Row>> {
    let (mut rows, status) = match read_rows(dir)? {
        Some(rows) if rows.iter().all(|r| r.get("status") == Some(&json!("ok"))) => {
            return Ok(rows)
        }
        Some(rows) if state.is_some_and(TaskState::ended_badly) => (rows, Some("failed")),
        Some(rows) => (rows, None),
        None => {
            let ran = state.is_some_and(TaskState::ended_badly);
            let output = RunOutput {
                error: Some(no_rows_error(state, ran)),
                ..RunOutput::default()
            };
            (
                rows_of(plan, &output),
                Some(if ran { "failed" } else { "missing" }),
            )
        }
    };
    for r in &mut rows {
        if let Some(s) = status {
            r.insert("status".into(), json!(s));
        }
        if let Some(t) = state.filter(|t| t.ended_badly() && t.state != "FAILED") {
            let e = r.get("error").and_then(Value::as_str).unwrap_or("");
            if !e.contains(&t.state) {
                r.insert("error".into(), json!(format!("slurm: {}; {e}", t.state)));
            }
        }
        r.insert(
            "slurm_state".into(),
            json!(state.map_or("unknown", |t| t.state.as_str())),
        );
        r.insert("slurm_job".into(), json!(state.map(|t| t.job.clone())));
    }
    Ok(rows)
}

/// The error of a run that left no rows.
fn no_rows_error(state: Option<&TaskState>, ran: bool) -> String {
    match state {
        Some(t) if ran => format!(
            "slurm task {} {} (exit {}) on {}; it left no rows",
            t.job, t.state, t.exit_code, t.node
        ),
        Some(t) => format!("not run (slurm task {}: {})", t.job, t.state),
        None => "never ran (no Slurm state for it)".into(),
    }
}

/// `runs/NNN/provenance.json` of a run that ran as a task.
fn node_provenance(dir: &Path) -> Option<Value> {
    let text = fs::read_to_string(dir.join(node::FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::run_cmd::record::ROWS_FILE;
    use crate::run_cmd::test_spec::SPEC;
    use crate::spec::load_str;

    fn task(state: &str, node: &str) -> TaskState {
        TaskState {
            run: 1,
            job: "7_1".into(),
            state: state.into(),
            exit_code: "0:15".into(),
            node: node.into(),
        }
    }

    fn statuses(rows: &[Row]) -> Vec<&str> {
        rows.iter().map(|r| r["status"].as_str().unwrap()).collect()
    }

    #[test]
    fn runs_without_rows_fail_or_are_missing_with_slurms_state() {
        let plans = load_str("t.toml", SPEC, &[])
            .unwrap()
            .expand(false)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        // Killed before it wrote rows: failed, one row per phase and VM + all.
        let rows = rows_of_run(&plans[0], dir.path(), Some(&task("CANCELLED", "n1"))).unwrap();
        assert_eq!(rows.len(), 2 * 3);
        assert_eq!(statuses(&rows), ["failed"; 6]);
        assert_eq!(rows[0]["slurm_state"], "CANCELLED");
        assert_eq!(rows[0]["slurm_job"], "7_1");
        assert_eq!(rows[0]["daemon.cxl_ratio"], 0);
        let e = rows[2]["error"].as_str().unwrap();
        assert!(e.contains("7_1 CANCELLED (exit 0:15) on n1"), "{e}");
        // Still pending, cancelled before it ran, or unknown to Slurm: missing.
        for st in [Some(task("PENDING", "")), Some(task("CANCELLED", "")), None] {
            let rows = rows_of_run(&plans[0], dir.path(), st.as_ref()).unwrap();
            assert_eq!(statuses(&rows), ["missing"; 6], "{st:?}");
        }
        let rows = rows_of_run(&plans[0], dir.path(), None).unwrap();
        assert_eq!(rows[0]["slurm_state"], "unknown");
    }

    #[test]
    fn a_runs_own_rows_are_kept_and_marked_when_slurm_ended_it() {
        let plans = load_str("t.toml", SPEC, &[])
            .unwrap()
            .expand(false)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let write = |status: &str| {
            let rows: Vec<Value> = (0..6)
                .map(|i| json!({"run": 1, "vm": i.to_string(), "status": status, "error": null}))
                .collect();
            fs::write(dir.path().join(ROWS_FILE), Value::from(rows).to_string()).unwrap();
        };
        write("ok");
        let rows = rows_of_run(&plans[0], dir.path(), Some(&task("COMPLETED", "n1"))).unwrap();
        assert_eq!(statuses(&rows), ["ok"; 6]);
        assert!(
            rows[0].get("slurm_state").is_none(),
            "ok rows stay as a local run wrote them"
        );
        // scancel while it ran: the task wrote `interrupted` rows.
        write("interrupted");
        let rows = rows_of_run(&plans[0], dir.path(), Some(&task("CANCELLED", "n1"))).unwrap();
        assert_eq!(statuses(&rows), ["failed"; 6]);
        assert_eq!(rows[0]["error"], "slurm: CANCELLED; ");
        // The run itself failed (the task exited 1): its own error stays.
        write("failed");
        let rows = rows_of_run(&plans[0], dir.path(), Some(&task("FAILED", "n1"))).unwrap();
        assert_eq!(statuses(&rows), ["failed"; 6]);
        assert_eq!(rows[0]["slurm_state"], "FAILED");
        assert!(rows[0]["error"].is_null());
    }
}
