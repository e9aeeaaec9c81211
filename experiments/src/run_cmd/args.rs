//! The command line of `cxlfs run`: the sweep's options, the Slurm ones
//! (`--slurm` and what goes into the job script), and `--only-run`, the
//! entry point of one array task.

use clap::Args;
use std::path::PathBuf;

/// `cxlfs run` arguments.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The experiment spec (TOML; see experiments/README.md).
    #[arg(value_name = "SPEC.toml")]
    pub(super) spec: PathBuf,
    /// Results directory (created; refused if it already holds results, unless --force).
    #[arg(long, value_name = "DIR")]
    pub(super) out: PathBuf,
    /// Override a spec field: a dotted path into the TOML, e.g.
    /// `--set vms.count=1`, `--set daemon.device.cache.policy=lru`,
    /// `--set sweep.daemon.cxl_ratio=[0,100]` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(super) sets: Vec<String>,
    /// Smoke run: smaller files, fio sizes and device cache, fio runtimes
    /// capped (the spec's `[quick]`); the sweep's points stay the same.
    #[arg(long)]
    pub(super) quick: bool,
    /// Write into --out even if it already holds results (they are replaced).
    #[arg(long)]
    pub(super) force: bool,
    /// Print the runs (and each one's daemon arguments) and exit.
    #[arg(long)]
    pub(super) dry_run: bool,
    /// The cxlfsd binary [default: $CXLFSD, else next to this cxlfs, else on PATH].
    #[arg(long, value_name = "PATH")]
    pub(super) cxlfsd: Option<PathBuf>,
    /// Guest image directory [default: `cxlfs image build`, cached].
    #[arg(long, value_name = "DIR")]
    pub(super) image: Option<PathBuf>,
    /// QEMU binary [default: $QEMU; with DAX the patched one from qemu-configs/build-qemu.sh].
    #[arg(long, value_name = "PATH")]
    pub(super) qemu: Option<PathBuf>,
    /// Never show a progress bar (it is shown only when stderr is a terminal).
    #[arg(long)]
    pub(super) no_progress: bool,
    /// Do not draw plots.
    #[arg(long)]
    pub(super) no_plots: bool,
    /// Run only run N of the sweep into DIR/runs/NNN (its rows, histograms
    /// and node provenance there; results.csv untouched): what each Slurm
    /// array task runs.
    #[arg(long, value_name = "N", conflicts_with = "slurm")]
    pub(super) only_run: Option<u32>,
    /// Run the sweep as a Slurm job array (one task per run), then collect it.
    #[arg(long)]
    pub(super) slurm: bool,
    #[command(flatten)]
    pub(super) slurm_opts: SlurmOpts,
}

/// What `--slurm` passes to `sbatch` and how it waits.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Slurm (with --slurm)")]
pub struct SlurmOpts {
    /// sbatch --partition.
    #[arg(long, value_name = "P", requires = "slurm")]
    pub(super) partition: Option<String>,
    /// sbatch --time: each task's limit (e.g. 30:00).
    #[arg(long, value_name = "T", requires = "slurm")]
    pub(super) time: Option<String>,
    /// sbatch --cpus-per-task.
    #[arg(long, value_name = "N", requires = "slurm")]
    pub(super) cpus_per_task: Option<u32>,
    /// sbatch --mem (per node, e.g. 4G).
    #[arg(long, value_name = "M", requires = "slurm")]
    pub(super) mem: Option<String>,
    /// At most K array tasks at once (`--array=...%K`).
    #[arg(long, value_name = "K", requires = "slurm")]
    pub(super) array_limit: Option<u32>,
    /// Another sbatch option, written as an `#SBATCH` line (repeatable),
    /// e.g. `--sbatch-arg=--account=lab`.
    #[arg(
        long = "sbatch-arg",
        value_name = "ARG",
        requires = "slurm",
        allow_hyphen_values = true
    )]
    pub(super) sbatch_args: Vec<String>,
    /// Submit and print the job id; `cxlfs collect DIR` merges the results later.
    #[arg(long, requires = "slurm")]
    pub(super) no_wait: bool,
    /// Resubmit only the runs of DIR that failed or never ran.
    #[arg(long, requires = "slurm")]
    pub(super) resume: bool,
    /// Let each task find or build the guest image and QEMU on its node (the
    /// same scripts as a local run) instead of using the paths resolved here.
    #[arg(long, requires = "slurm")]
    pub(super) build_on_node: bool,
}
