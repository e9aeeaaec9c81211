//! One run recorded into its directory, and the runs' records merged back:
//! the parts a local sweep and a Slurm array task share. A run's directory
//! `runs/NNN/` gets `plan.json`, everything the run left, its rows
//! (`rows.json`) and its histograms (`distributions.jsonl`); the results
//! directory's `results.csv` / `results.json` / `distributions.jsonl` are
//! made of those, in run order.

use super::execute::execute;
use super::provenance::plan_json;
use super::rows::{distributions_of, rows_of};
use super::run_output::RunOutput;
use super::tools::Tools;
use crate::distributions::{self, Distribution};
use crate::results::{write_atomic, ResultsFile, Row};
use crate::spec::RunPlan;
use anyhow::{Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// The rows of a run inside its directory.
pub(super) const ROWS_FILE: &str = "rows.json";

/// What one run produced and left in its directory.
pub(super) struct RunRecord {
    pub(super) output: RunOutput,
    pub(super) rows: Vec<Row>,
    pub(super) distributions: Vec<Distribution>,
}

/// `runs/NNN` of run `run` in the results directory `out_dir`.
pub(super) fn run_dir(out_dir: &Path, run: u32) -> PathBuf {
    out_dir.join("runs").join(format!("{run:03}"))
}

/// Runs `plan` in `runs/NNN/` of `out_dir` (absolute) and writes its
/// `plan.json`, `rows.json` and `distributions.jsonl` there.
pub(super) fn record_run(
    plan: &RunPlan,
    tools: &Tools,
    out_dir: &Path,
    stop: &AtomicBool,
) -> Result<RunRecord> {
    let dir = run_dir(out_dir, plan.run);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    forget_rows(&dir)?;
    fs::write(
        dir.join("plan.json"),
        serde_json::to_string_pretty(&plan_json(plan, Some(tools)))?,
    )?;
    let output = execute(plan, tools, &dir, stop);
    let rows = rows_of(plan, &output);
    let distributions = distributions_of(plan, &output);
    distributions::append(&dir, &distributions)?;
    write_atomic(
        &dir.join(ROWS_FILE),
        serde_json::to_string_pretty(&rows)?.as_bytes(),
    )?;
    Ok(RunRecord {
        output,
        rows,
        distributions,
    })
}

/// Removes the rows and histograms an earlier run left in `dir` (a run
/// about to run again).
pub(super) fn forget_rows(dir: &Path) -> Result<()> {
    for f in [ROWS_FILE, distributions::FILE] {
        match fs::remove_file(dir.join(f)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", dir.join(f).display()))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The rows a run left in its directory; `None` if it left none.
pub(super) fn read_rows(dir: &Path) -> Result<Option<Vec<Row>>> {
    let path = dir.join(ROWS_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Adds one run's rows to `results` and its histograms to the results
/// directory's `distributions.jsonl` (`results.write` writes the rows out).
pub(super) fn merge_run(
    results: &mut ResultsFile,
    out_dir: &Path,
    rows: Vec<Row>,
    dists: &[Distribution],
) -> Result<()> {
    distributions::append(out_dir, dists)?;
    results.push(rows);
    Ok(())
}

/// Removes the results directory's `distributions.jsonl` (histograms are
/// appended run by run, so a sweep or a collect starts it afresh).
pub(super) fn forget_distributions(out_dir: &Path) -> Result<()> {
    match fs::remove_file(out_dir.join(distributions::FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).context("removing the old distributions.jsonl")
        }
        _ => Ok(()),
    }
}
