//! `cxlfs trace convert` and `cxlfs trace gen`.

use crate::trace_io::{TraceFormat, TraceReader, TraceWriter};
use crate::workload_args::{kind_arg, WorkloadArgs};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use cxlfs_device_model::replay::Arrival;
use cxlfs_device_model::units::parse_duration_ns;
use cxlfs_device_model::workload::WorkloadKind;
use std::path::PathBuf;

/// `cxlfs trace ...`
#[derive(Debug, Clone, Subcommand)]
pub enum TraceCommand {
    /// Convert a trace between CSV and binary (streaming; the arrival mode it records is kept).
    Convert(ConvertArgs),
    /// Write a synthetic workload as a trace file.
    Gen(GenArgs),
}

/// `cxlfs trace convert` arguments.
#[derive(Debug, Clone, Args)]
pub struct ConvertArgs {
    /// Input trace (CSV or binary, detected by its magic).
    #[arg(value_name = "IN")]
    input: PathBuf,
    /// Output file.
    #[arg(value_name = "OUT")]
    output: PathBuf,
    /// Output format [default: the other one than the input's].
    #[arg(long, value_name = "FORMAT")]
    to: Option<TraceFormat>,
}

/// `cxlfs trace gen` arguments.
#[derive(Debug, Clone, Args)]
pub struct GenArgs {
    /// Synthetic workload: seq, stride:STEP, uniform, zipf:THETA, pointer-chase.
    #[arg(long, value_name = "KIND", value_parser = kind_arg)]
    workload: WorkloadKind,
    #[command(flatten)]
    shape: WorkloadArgs,
    /// Output file.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Output format [default: csv for *.csv / *.txt, else bin].
    #[arg(long, value_name = "FORMAT")]
    format: Option<TraceFormat>,
    /// How the accesses arrive, recorded in the trace so that `cxlfs replay
    /// --trace` replays with it (unless given --arrival): `closed[:THINK]`
    /// (one outstanding, dependent loads; every time is written as 0 and
    /// means nothing) or `fixed:INTERVAL` (access i at i × INTERVAL, the
    /// times written) [default: closed].
    #[arg(long, value_name = "MODE", conflicts_with = "interval")]
    arrival: Option<Arrival>,
    /// Same as --arrival fixed:NS (units ok: 100ns, 1us).
    #[arg(long, value_name = "NS", value_parser = duration_arg)]
    interval: Option<u64>,
}

fn duration_arg(s: &str) -> Result<u64, String> {
    parse_duration_ns(s).map_err(|e| e.to_string())
}

/// Runs `cxlfs trace ...`.
pub fn run(cmd: &TraceCommand) -> Result<()> {
    match cmd {
        TraceCommand::Convert(args) => convert(args),
        TraceCommand::Gen(args) => gen(args),
    }
}

fn convert(args: &ConvertArgs) -> Result<()> {
    let reader = TraceReader::open(&args.input)?;
    let to = args.to.unwrap_or(match reader.format() {
        TraceFormat::Csv => TraceFormat::Bin,
        TraceFormat::Bin => TraceFormat::Csv,
    });
    let mut writer = TraceWriter::create(&args.output, to, reader.arrival())?;
    for access in reader {
        writer.write(&access?)?;
    }
    let records = writer.finish()?;
    eprintln!(
        "wrote {records} accesses to {} ({})",
        args.output.display(),
        to.name()
    );
    Ok(())
}

fn gen(args: &GenArgs) -> Result<()> {
    let arrival = match (args.arrival, args.interval) {
        (Some(Arrival::Trace), _) => bail!(
            "--arrival trace: a generated workload has no times of its own; \
             give closed[:THINK] or fixed:INTERVAL"
        ),
        (Some(arrival), _) => arrival,
        (None, Some(interval_ns)) => Arrival::Fixed { interval_ns },
        (None, None) => Arrival::Closed { think_ns: 0 },
    };
    let interval = match arrival {
        Arrival::Fixed { interval_ns } => interval_ns,
        Arrival::Closed { .. } | Arrival::Trace => 0,
    };
    let spec = args.shape.spec(args.workload);
    let workload = spec.generate().context("bad workload")?;
    let format = args
        .format
        .unwrap_or_else(|| TraceFormat::from_extension(&args.out));
    let mut writer = TraceWriter::create(&args.out, format, Some(arrival))?;
    let mut time_ns = 0u64;
    for mut access in workload {
        access.time_ns = time_ns;
        writer.write(&access)?;
        time_ns = time_ns.saturating_add(interval);
    }
    let records = writer.finish()?;
    eprintln!(
        "wrote {records} accesses ({spec}, arrival {arrival}) to {} ({})",
        args.out.display(),
        format.name()
    );
    Ok(())
}
