//! The command line of `cxlfs run`.

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
}
