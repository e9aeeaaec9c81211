//! `cxlfs`: the user's single command-line entry point.
//!
//! * `cxlfs replay` — replay a trace or a synthetic workload against the
//!   device model (table or JSON; sweeps over config keys);
//! * `cxlfs mrc` — miss-ratio curves (many cache sizes, several policies,
//!   one pass: exact for LRU, sampled for any policy);
//! * `cxlfs trace convert|gen` — trace file tools;
//! * `cxlfs presets` — the named device configurations;
//! * `cxlfs config` — print an effective device config;
//! * `cxlfs image build` — build (or find cached) the test-guest image;
//! * `cxlfs ctl` — cache control of a running `cxlfsd` (its control socket).
//! * `cxlfs run SPEC.toml --out DIR` — an experiment: `cxlfsd` + N guests
//!   running fio over a sweep, results as CSV/JSON/PNG (`--slurm`: as a
//!   Slurm job array, `cxlfs collect DIR` merging it); `cxlfs plot DIR`
//!   and `cxlfs table DIR` re-read a results directory.

mod ctl_cmd;
mod daemon_metrics;
mod device_args;
mod distributions;
mod fio_json;
mod guest_script;
mod image_cmd;
mod iolog_replay;
mod mrc_cmd;
mod mrc_out;
mod parallel_map;
mod phase_output;
mod plot;
mod plot_axis;
mod plot_cmd;
mod plot_data;
mod plot_draw;
mod plot_scale;
mod plot_spec;
mod read_ahead;
mod replay_check;
mod replay_cmd;
mod replay_out;
mod results;
mod run_cmd;
mod spec;
mod split_pass;
mod table_cmd;
mod template;
mod text_table;
mod trace_cmd;
mod trace_io;
mod trace_map;
mod workload_args;

use clap::{Parser, Subcommand};
use cxlfs_device_model::presets::{preset, PRESETS};
use device_args::{format_ns, human_size, DeviceArgs};
use std::io::Write;
use std::process::ExitCode;

/// cxlfs: an emulated CXL-SSD (DRAM cache in front of NAND) for memory-systems research.
#[derive(Debug, Parser)]
#[command(name = "cxlfs", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a trace or a synthetic workload against the device model.
    Replay(Box<replay_cmd::ReplayArgs>),
    /// A miss-ratio curve (miss ratio against cache size) for one or more
    /// policies in one pass: exact for LRU, sampled in miniature for any policy.
    Mrc(Box<mrc_cmd::MrcArgs>),
    /// Trace file tools: convert CSV <-> binary, generate a workload trace.
    #[command(subcommand)]
    Trace(trace_cmd::TraceCommand),
    /// List the named device presets.
    Presets,
    /// Print an effective device config as TOML (loadable with --config).
    Config(DeviceArgs),
    /// The test-guest image (kernel + initramfs with fio and busybox).
    #[command(subcommand)]
    Image(image_cmd::ImageCommand),
    /// Cache control of a running cxlfsd: prefetch, pin, unpin, evict,
    /// set-policy, set-prefetch, set-cxl-ratio, stats, reset-stats, config.
    Ctl(ctl_cmd::CtlArgs),
    /// Run an experiment: cxlfsd + N guests running fio, over a sweep; write a results directory.
    Run(Box<run_cmd::RunArgs>),
    /// Merge the runs of a `cxlfs run --slurm` results directory into its
    /// results files and plots (failed and missing runs as rows with Slurm's state).
    Collect(run_cmd::CollectArgs),
    /// Re-draw the PNG plots of a results directory.
    Plot(results::ResultsDirArgs),
    /// Print a results directory as a text table.
    Table(results::ResultsDirArgs),
}

fn list_presets() -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<9} {:>9} {:>6} {:<7} {:<5} {:>7} {:>7} {:>7} {:>5} {:>9}",
        "NAME", "CACHE", "WAYS", "POLICY", "HITS", "tR", "tProg", "tBERS", "LUNS", "CAPACITY"
    )?;
    for name in PRESETS {
        let cfg = preset(name)?;
        let c = &cfg.cache;
        let n = &cfg.nand;
        let ways = if c.ways == 0 {
            "full".to_string()
        } else {
            c.ways.to_string()
        };
        writeln!(
            out,
            "{:<9} {:>9} {:>6} {:<7} {:<5} {:>7} {:>7} {:>7} {:>5} {:>9}",
            name,
            human_size(c.size_bytes),
            ways,
            c.policy.name(),
            if c.hits_visible { "seen" } else { "blind" },
            format_ns(n.read_ns as f64),
            format_ns(n.program_ns as f64),
            format_ns(n.erase_ns as f64),
            n.luns(),
            human_size(cfg.capacity_bytes()),
        )?;
    }
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Replay(args) => replay_cmd::run(&args),
        Command::Mrc(args) => mrc_cmd::run(&args),
        Command::Trace(cmd) => trace_cmd::run(&cmd),
        Command::Presets => list_presets(),
        Command::Image(cmd) => Ok(image_cmd::run(&cmd)?),
        Command::Ctl(args) => ctl_cmd::run(&args),
        Command::Run(args) => run_cmd::run(&args),
        Command::Collect(args) => run_cmd::collect_cmd(&args),
        Command::Plot(args) => plot_cmd::run(&args),
        Command::Table(args) => table_cmd::run(&args),
        Command::Config(args) => {
            let (cfg, _) = args.load(&[])?;
            std::io::stdout()
                .lock()
                .write_all(cfg.to_toml_string().as_bytes())?;
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // A closed stdout (`cxlfs replay ... | head`) is not worth a message.
            let broken_pipe = err
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe);
            if !broken_pipe {
                eprintln!("error: {err:#}");
            }
            if err.downcast_ref::<run_cmd::Interrupted>().is_some() {
                return ExitCode::from(130);
            }
            ExitCode::FAILURE
        }
    }
}
