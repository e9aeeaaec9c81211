//! `cxlfs run SPEC.toml --out DIR`: one experiment — a sweep of runs, each
//! with a fresh `cxlfsd` and N guests running fio — and its results
//! directory (`cxlfs plot DIR` and `cxlfs table DIR` re-read it).
//!
//! One run: a temp work dir (share, sockets) → files created in the share
//! → `.cxlfs/run.sh` written → `cxlfsd` started (own process group, so a
//! Ctrl-C reaches only us) → guests booted through `qemu-configs/run-vm.sh`
//! at once → at each phase barrier `/metrics.json` is read → guests power off
//! (or are stopped) → `cxlfsd` gets SIGTERM (never SIGKILL with DAX on) →
//! fio JSON and the metrics series are read, rows written. Any failure marks
//! the run `failed` with its error, and the sweep goes on.
//!
//! With `--slurm` the same runs are array tasks of one Slurm job, each
//! `cxlfs run --only-run N`, and `cxlfs collect` merges their rows as the
//! local sweep would have written them.
//!
//! This module holds the entry point and the sweep (results directory,
//! Ctrl-C, one run after another, the closing table and plots); the steps
//! live in its submodules, each using only those listed before it:
//!
//! * [`args`]: the command line;
//! * [`tools`]: `cxlfsd`, QEMU, the guest image, `run-vm.sh`;
//! * [`command_lines`]: a plan's `cxlfsd` and `run-vm.sh` arguments, template
//!   variables and phase commands;
//! * [`share`]: the share the guests mount;
//! * [`daemon`] and [`guests`]: the processes of one run;
//! * [`run_output`]: what one run produced, read back from the share;
//! * [`iolog_check`]: the guests' fio logs replayed (`replay_iolog`);
//! * [`execute`]: one run, start to end;
//! * [`rows`]: a run's result rows and histograms;
//! * [`provenance`]: the sweep's `provenance.json`;
//! * [`record`]: one run recorded into `runs/NNN/`, runs merged into the
//!   results files (shared by the local sweep and Slurm);
//! * [`node`]: the provenance of the node one Slurm task ran on;
//! * [`only_run`]: `--only-run N`, one run of the sweep (an array task);
//! * [`slurm`]: `--slurm`, the sweep as a Slurm job array, and `cxlfs
//!   collect DIR`, its runs merged;
//! * [`progress`]: the progress bar or lines.

mod args;
mod command_lines;
mod daemon;
mod execute;
mod guests;
mod host_memory;
mod iolog_check;
mod node;
mod only_run;
mod progress;
mod provenance;
mod record;
mod rows;
mod run_output;
mod server;
mod share;
mod slurm;
#[cfg(test)]
mod test_spec;
mod tools;
mod virtiofsd;

pub use args::RunArgs;
pub use slurm::{collect_cmd, CollectArgs};

use crate::plot;
use crate::results::{ResultsFile, Row};
use crate::spec::{self, RunPlan};
use crate::text_table::text_table;
use anyhow::{bail, Context, Result};
use command_lines::{daemon_args, phase_text};
use progress::Progress;
use provenance::Provenance;
use record::{forget_distributions, merge_run, record_run};
use run_output::RunOutput;
use serde_json::Value;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tools::{resolve_tools, Needs, Tools};

/// `cxlfs run` stopped by SIGINT / SIGTERM (exit status 130).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Interrupted(pub String);

/// Handles `cxlfs run`.
pub fn run(args: &RunArgs) -> Result<()> {
    let loaded = spec::load(&args.spec, &args.sets)?;
    let plans = loaded.expand(args.quick)?;
    if args.dry_run {
        return print_dry_run(&plans);
    }
    if let Some(n) = args.only_run {
        return only_run::run_task(args, &loaded.spec, &plans, n);
    }
    if args.slurm {
        return slurm::run_on_slurm(args, &loaded.spec, &plans);
    }
    let out_dir = prepare_out_dir(args)?;
    let tools = resolve_tools(args, Needs::of(&plans), &loaded.spec.image)?;
    let stop = stop_on_signals()?;
    let mut provenance = Provenance::start(args, &loaded.spec, &plans, &tools, &out_dir)?;

    let param_columns: Vec<String> = loaded.spec.sweep.keys().cloned().collect();
    let mut results = ResultsFile::new(&loaded.spec.name, param_columns);
    results.write(&out_dir)?;
    let sweep = Sweep {
        plans: &plans,
        tools: &tools,
        out_dir: &out_dir,
        stop: &stop,
        bar: Progress::new(plans.len() as u64, args.no_progress),
    };
    let t0 = Instant::now();
    let mut done = 0;
    let mut interrupted = false;
    for plan in &plans {
        if stop.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        let run_interrupted = sweep.run_one(plan, &mut provenance, &mut results)?;
        done += 1;
        if run_interrupted {
            interrupted = true;
            break;
        }
    }
    sweep.bar.finish();
    provenance.finish(done, interrupted)?;
    show_results(&results, &loaded.spec.plots, &out_dir, args.no_plots);
    eprintln!(
        "cxlfs run: {done} of {} run(s) in {:.0}s; results in {}",
        plans.len(),
        t0.elapsed().as_secs_f64(),
        out_dir.display()
    );
    if interrupted {
        return Err(Interrupted(format!(
            "interrupted after {done} of {} runs; partial results kept in {}",
            plans.len(),
            out_dir.display()
        ))
        .into());
    }
    Ok(())
}

/// `--dry-run`: each run with its daemon arguments and what its phases run.
fn print_dry_run(plans: &[RunPlan]) -> Result<()> {
    let mut o = std::io::stdout().lock();
    for p in plans {
        let server = match p.spec.daemon.backend {
            crate::spec::Backend::Cxlfsd => format!(
                "cxlfsd {}",
                daemon_args(p, None, Path::new("RUN_DIR/metrics.jsonl")).join(" ")
            ),
            crate::spec::Backend::Virtiofsd => format!(
                "virtiofsd per VM --cache={} --sandbox=none --seccomp=none",
                p.spec.daemon.cache
            ),
        };
        writeln!(
            o,
            "run {} (point {}, repeat {}): {} | {} VM(s) | {server}",
            p.run,
            p.point,
            p.repeat,
            p.label(),
            p.spec.vms.count,
        )?;
        for ph in &p.spec.phases {
            writeln!(o, "    {}: {}", ph.name, phase_text(p, ph)?)?;
        }
    }
    Ok(())
}

/// Creates `--out` (refused if it holds results, unless `--force`) with its
/// `runs/`, and returns it absolute; a re-run's old histograms are removed.
fn prepare_out_dir(args: &RunArgs) -> Result<PathBuf> {
    if args.out.join("results.json").exists() && !args.force {
        bail!(
            "{} already holds results (results.json); pass --force to replace them or choose another --out",
            args.out.display()
        );
    }
    fs::create_dir_all(args.out.join("runs"))
        .with_context(|| format!("creating {}", args.out.display()))?;
    // Absolute: cxlfsd writes its metrics series into the run directory.
    let out_dir =
        fs::canonicalize(&args.out).with_context(|| format!("resolving {}", args.out.display()))?;
    // A re-run (--force) starts the histograms afresh: they are appended per run.
    forget_distributions(&out_dir)?;
    Ok(out_dir)
}

/// A flag that SIGINT and SIGTERM set.
fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing the Ctrl-C handler")?;
    }
    Ok(stop)
}

/// The sweep under way: what every run of it shares.
struct Sweep<'a> {
    plans: &'a [RunPlan],
    tools: &'a Tools,
    /// The results directory (absolute).
    out_dir: &'a Path,
    stop: &'a AtomicBool,
    bar: Progress,
}

impl Sweep<'_> {
    /// Runs `plan` in `runs/NNN/`, adds its rows to `results` (written out)
    /// and its histograms to `distributions.jsonl`; true if it was
    /// interrupted.
    fn run_one(
        &self,
        plan: &RunPlan,
        provenance: &mut Provenance,
        results: &mut ResultsFile,
    ) -> Result<bool> {
        self.bar.start(plan.run, self.plans.len(), &plan.label());
        let t = Instant::now();
        let rec = record_run(plan, self.tools, self.out_dir, self.stop)?;
        if let Some(v) = &rec.output.guest_versions {
            provenance.set_guest(v);
        }
        self.bar.done(run_line(
            plan,
            self.plans.len(),
            &rec.output,
            &rec.rows,
            t.elapsed(),
        ));
        merge_run(results, self.out_dir, rec.rows, &rec.distributions)?;
        results.write(self.out_dir)?;
        Ok(rec.output.interrupted)
    }
}

/// How a run ended, for the progress: its status, time and error.
fn run_line(
    plan: &RunPlan,
    total: usize,
    output: &RunOutput,
    rows: &[Row],
    took: Duration,
) -> String {
    let status = if output.interrupted {
        "interrupted".to_string()
    } else {
        rows.last()
            .and_then(|r| r.get("status"))
            .and_then(Value::as_str)
            .unwrap_or("failed")
            .to_string()
    };
    let err = rows
        .last()
        .and_then(|r| r.get("error"))
        .and_then(Value::as_str)
        .map(|e| format!(": {e}"))
        .unwrap_or_default();
    format!(
        "run {}/{total} [{}] {status} in {:.1}s{err}",
        plan.run,
        plan.label(),
        took.as_secs_f64()
    )
}

/// Draws the sweep's plots into `out_dir` (unless `no_plots`) and prints
/// the results table.
fn show_results(results: &ResultsFile, plots: &[spec::PlotSpec], out_dir: &Path, no_plots: bool) {
    if !no_plots {
        draw_plots(results, plots, out_dir);
    }
    print!("{}", text_table(results));
}

/// Draws the sweep's plots into `out_dir`; a failure is only reported.
fn draw_plots(results: &ResultsFile, plots: &[spec::PlotSpec], out_dir: &Path) {
    match plot::render_all(results, plots, out_dir) {
        Ok(files) => eprintln!(
            "cxlfs run: {} plot(s) in {}",
            files.len(),
            out_dir.display()
        ),
        Err(e) => eprintln!("cxlfs run: plots not drawn: {e}"),
    }
}
