//! `cxlfs run SPEC --out DIR --only-run N`: run N of the sweep alone, into
//! `DIR/runs/NNN/` (its rows, histograms and node provenance there;
//! `results.csv` is `cxlfs collect`'s). What each Slurm array task runs;
//! it exits non-zero when the run did not end `ok`, so Slurm's state of the
//! task says the same as its rows.

use super::args::RunArgs;
use super::node::{node_facts, write_node_provenance};
use super::record::{record_run, run_dir};
use super::tools::{resolve_tools, Needs};
use super::{run_line, stop_on_signals, Interrupted};
use crate::spec::{RunPlan, Spec};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::fs;
use std::time::Instant;

/// Runs run `n` of `plans` into `--out`'s `runs/NNN/`.
pub(super) fn run_task(args: &RunArgs, spec: &Spec, plans: &[RunPlan], n: u32) -> Result<()> {
    let Some(plan) = plans.iter().find(|p| p.run == n) else {
        bail!("--only-run {n}: the sweep has runs 1 to {}", plans.len());
    };
    fs::create_dir_all(args.out.join("runs"))
        .with_context(|| format!("creating {}", args.out.display()))?;
    let out_dir =
        fs::canonicalize(&args.out).with_context(|| format!("resolving {}", args.out.display()))?;
    let facts = node_facts();
    let tools = resolve_tools(args, Needs::of([plan]), &spec.image)?;
    let stop = stop_on_signals()?;
    eprintln!(
        "cxlfs run: run {n}/{} [{}] on {} ...",
        plans.len(),
        plan.label(),
        facts["node"].as_str().unwrap_or("?")
    );
    let t = Instant::now();
    let rec = record_run(plan, &tools, &out_dir, &stop)?;
    let line = run_line(plan, plans.len(), &rec.output, &rec.rows, t.elapsed());
    eprintln!("cxlfs run: {line}");
    let status = rec
        .rows
        .last()
        .and_then(|r| r.get("status"))
        .and_then(Value::as_str)
        .unwrap_or("failed");
    let status = if rec.output.interrupted {
        "interrupted"
    } else {
        status
    };
    write_node_provenance(
        facts,
        &run_dir(&out_dir, n),
        status,
        rec.output.guest_versions.as_deref(),
    )?;
    match status {
        "ok" => Ok(()),
        "interrupted" => Err(Interrupted(line).into()),
        _ => bail!("{line}"),
    }
}
