//! `cxlfs replay`: drive the device model with a trace file or a synthetic
//! workload, optionally over a sweep of config overrides, and print a table
//! or JSON.

use crate::device_args::{format_ns, human_size, summary, ConfigOrigin, DeviceArgs};
use crate::trace_io::{TraceFormat, TraceReader};
use crate::workload_args::{count_arg, kind_arg, WorkloadArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use cxlfs_device_model::replay::{
    Arrival, CoalescingNote, ReplayObserver, ReplayReport, Replayer, RunError,
};
use cxlfs_device_model::trace::Access;
use cxlfs_device_model::workload::{WorkloadKind, WorkloadSpec};
use cxlfs_device_model::{Device, DeviceConfig};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use std::convert::Infallible;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Replays shorter than this get no progress bar.
const PROGRESS_MIN: u64 = 1 << 20;

/// What a replay reads and the device it drives: the flags `cxlfs replay`
/// and `cxlfs mrc` share.
#[derive(Debug, Clone, Args)]
pub struct ReplayInputArgs {
    #[command(flatten)]
    pub(crate) device: DeviceArgs,
    /// Trace file to replay (CSV `time_ns,op,addr,len` or binary; detected by its magic).
    #[arg(long, value_name = "FILE", conflicts_with = "workload")]
    pub(crate) trace: Option<PathBuf>,
    /// Synthetic workload: seq, stride:STEP, uniform, zipf:THETA, pointer-chase.
    #[arg(long, value_name = "KIND", value_parser = kind_arg)]
    pub(crate) workload: Option<WorkloadKind>,
    #[command(flatten)]
    pub(crate) shape: WorkloadArgs,
    /// When accesses arrive: `trace` (their own times), `closed[:THINK]` (one
    /// outstanding, dependent loads), `fixed:INTERVAL` (open loop)
    /// [default: for --trace the mode the trace records (`cxlfs trace gen`
    /// records one), else trace; closed for --workload].
    #[arg(long, value_name = "MODE")]
    pub(crate) arrival: Option<Arrival>,
    /// Replay the first N accesses to warm the cache, then reset the statistics.
    #[arg(long, value_name = "N", default_value = "0", value_parser = count_arg)]
    pub(crate) warmup: u64,
}

/// `cxlfs replay` arguments.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    input: ReplayInputArgs,
    /// Print the effective device config as TOML and exit.
    #[arg(long)]
    print_config: bool,
    /// Print JSON (one object; one per line for a sweep) instead of a table.
    #[arg(long)]
    json: bool,
    /// Leave out wall-clock measurements so the output is byte-identical across runs.
    #[arg(long)]
    reproducible: bool,
    /// Run once per value: `--sweep cache.policy=fifo,lru,s3fifo` (repeatable:
    /// the cartesian product of all sweeps).
    #[arg(long = "sweep", value_name = "KEY=V1,V2,...")]
    sweeps: Vec<String>,
    /// Never show a progress bar (it is shown only when stderr is a terminal).
    #[arg(long)]
    no_progress: bool,
    /// Also write the points as a results directory (`results.json`,
    /// `results.csv`) that `cxlfs plot` and `cxlfs table` read.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// With --out: draw the `[[plots]]` of this TOML file (e.g.
    /// experiments/write-log.toml) into DIR.
    #[arg(long, value_name = "FILE", requires = "out")]
    plots: Option<PathBuf>,
}

/// What is replayed.
#[derive(Debug, Clone)]
pub(crate) enum Input {
    Trace(PathBuf),
    Workload(WorkloadSpec),
}

/// The input as reported.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub(crate) enum InputDesc {
    Trace {
        trace: String,
        format: TraceFormat,
    },
    Workload {
        kind: WorkloadKind,
        wss_bytes: u64,
        accesses: u64,
        seed: u64,
        write_ratio: f64,
        access_size: u32,
        base_addr: u64,
    },
}

/// Effective config facts for reports.
#[derive(Debug, Clone, Serialize)]
struct ConfigDesc {
    #[serde(flatten)]
    origin: ConfigOrigin,
    policy: String,
    cache_bytes: u64,
    ways: u32,
    hits_visible: bool,
    prefetch_degree: u32,
    nand_enabled: bool,
    capacity_bytes: u64,
}

impl ConfigDesc {
    fn new(origin: ConfigOrigin, cfg: &DeviceConfig) -> Self {
        ConfigDesc {
            origin,
            policy: cfg.cache.policy.name().to_string(),
            cache_bytes: cfg.cache.size_bytes,
            ways: cfg.cache.ways,
            hits_visible: cfg.cache.hits_visible,
            prefetch_degree: cfg.prefetch.degree,
            nand_enabled: cfg.nand.enabled,
            capacity_bytes: cfg.capacity_bytes(),
        }
    }
}

/// Swept `key=value` pairs, serialised as an ordered JSON object.
struct Params<'a>(&'a [(String, String)]);

impl Serialize for Params<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// One JSON output object.
#[derive(Serialize)]
struct JsonRecord<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<Params<'a>>,
    config: &'a ConfigDesc,
    workload: &'a InputDesc,
    arrival: String,
    warmup: u64,
    #[serde(flatten)]
    report: &'a ReplayReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    sim_accesses_per_sec: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    coalescing_warning: Option<&'a CoalescingNote>,
}

/// One replay's result.
pub(crate) struct PointResult {
    pub(crate) report: ReplayReport,
    pub(crate) wall: Duration,
    /// The replaying thread's CPU time over the same span (less than `wall`
    /// when other work shares the core).
    cpu: Duration,
    /// Most misses coalesced under open-loop arrival (see [`Replayer::coalescing_note`]).
    note: Option<CoalescingNote>,
}

impl PointResult {
    fn accesses_per_sec(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.report.accesses as f64 / secs
        } else {
            0.0
        }
    }
}

/// Runs `cxlfs replay`.
pub fn run(args: &ReplayArgs) -> Result<()> {
    let (base_cfg, _) = args.input.device.load(&[])?;
    if args.print_config {
        std::io::stdout()
            .lock()
            .write_all(base_cfg.to_toml_string().as_bytes())?;
        return Ok(());
    }
    let input = input_of(&args.input)?;
    let (input_desc, recorded) = describe_input(&input)?;
    let (arrival, arrival_source) = arrival_of(args.input.arrival, &input, recorded);
    let arrival_origin = match arrival_source {
        ArrivalSource::Recorded => " (recorded in the trace)",
        ArrivalSource::Given | ArrivalSource::Times => "",
    };

    // Every sweep point's config is built before anything runs, so a bad
    // value fails at once.
    let sweep = parse_sweeps(&args.sweeps)?;
    let points = cartesian(&sweep);
    let configs = point_configs(&args.input.device, &points)?;

    let progress = !args.no_progress && std::io::stderr().is_terminal();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let swept = !sweep.is_empty();
    if !args.json {
        print_header(
            &mut out,
            &args.input.device,
            &base_cfg,
            &input,
            &format!("{arrival}{arrival_origin}"),
            args.input.warmup,
            swept,
        )?;
    }
    let mut rows = Vec::new();
    let mut saved = Vec::new();
    for (i, (params, (cfg, desc))) in points.iter().zip(&configs).enumerate() {
        let label = if swept {
            format!("[{}/{}] {}", i + 1, points.len(), point_name(params))
        } else {
            "replay".to_string()
        };
        let result = run_point(
            cfg,
            &input,
            arrival,
            args.input.warmup,
            progress.then_some(label),
        );
        let result = if swept {
            result.with_context(|| point_name(params))?
        } else {
            result?
        };
        if let Some(note) = &result.note {
            let name = if swept {
                format!(" ({})", point_name(params))
            } else {
                String::new()
            };
            eprintln!("{}", coalescing_warning(note, arrival_source, &name));
        }
        if args.out.is_some() {
            saved.push((params.clone(), result.report.clone()));
        }
        if args.json {
            let record = JsonRecord {
                params: swept.then_some(Params(params)),
                config: desc,
                workload: &input_desc,
                arrival: arrival.to_string(),
                warmup: args.input.warmup,
                report: &result.report,
                sim_accesses_per_sec: (!args.reproducible)
                    .then(|| result.accesses_per_sec().round() as u64),
                coalescing_warning: result.note.as_ref(),
            };
            serde_json::to_writer(&mut out, &record)?;
            writeln!(out)?;
            out.flush()?;
        } else if swept {
            rows.push((params.clone(), result));
        } else {
            print_report(&mut out, &result, args.reproducible)?;
        }
    }
    if !args.json && swept {
        print_sweep_table(&mut out, &sweep, &rows, args.reproducible)?;
    }
    if let Some(dir) = &args.out {
        let keys: Vec<String> = sweep.iter().map(|(k, _)| k.clone()).collect();
        for f in crate::replay_out::write(dir, args.plots.as_deref(), &keys, &saved)? {
            eprintln!("{}", f.display());
        }
    }
    Ok(())
}

/// What `args` asks to replay: the trace, or the workload (checked, with
/// accesses left after the warm-up).
pub(crate) fn input_of(args: &ReplayInputArgs) -> Result<Input> {
    Ok(match (&args.trace, args.workload) {
        (Some(path), _) => {
            if let Some(flag) = args.shape.first_given() {
                bail!("{flag} describes a synthetic workload: it needs --workload, not --trace");
            }
            Input::Trace(path.clone())
        }
        (None, Some(kind)) => {
            let spec = args.shape.spec(kind);
            spec.validate().context("bad workload")?;
            if args.warmup >= spec.total_accesses() && args.warmup > 0 {
                bail!(
                    "--warmup {} leaves nothing to measure: the workload has {} accesses",
                    args.warmup,
                    spec.total_accesses()
                );
            }
            Input::Workload(spec)
        }
        (None, None) => bail!("give --trace FILE or --workload KIND"),
    })
}

/// The arrival mode (`--arrival`, else the one the trace records, else
/// the default for the input) and where it came from.
pub(crate) fn arrival_of(
    given: Option<Arrival>,
    input: &Input,
    recorded: Option<Arrival>,
) -> (Arrival, ArrivalSource) {
    let arrival = given.unwrap_or(match input {
        Input::Trace(_) => recorded.unwrap_or(Arrival::Trace),
        Input::Workload(_) => Arrival::Closed { think_ns: 0 },
    });
    let arrival_source = match (given, input, recorded) {
        (None, Input::Trace(_), Some(_)) => ArrivalSource::Recorded,
        (None, Input::Trace(_), None) => ArrivalSource::Times,
        _ => ArrivalSource::Given,
    };
    (arrival, arrival_source)
}

/// The device config of every sweep point (the point named on error).
fn point_configs(
    device: &DeviceArgs,
    points: &[Vec<(String, String)>],
) -> Result<Vec<(DeviceConfig, ConfigDesc)>> {
    let mut configs = Vec::with_capacity(points.len());
    for params in points {
        let extra: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let (cfg, origin) = device.load(&extra).with_context(|| point_name(params))?;
        let desc = ConfigDesc::new(origin, &cfg);
        configs.push((cfg, desc));
    }
    Ok(configs)
}

fn point_name(params: &[(String, String)]) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn parse_sweeps(sweeps: &[String]) -> Result<Vec<(String, Vec<String>)>> {
    sweeps
        .iter()
        .map(|s| {
            let (key, values) = s
                .split_once('=')
                .with_context(|| format!("--sweep `{s}` is not of the form KEY=V1,V2,..."))?;
            let values: Vec<String> = values
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            if key.trim().is_empty() || values.is_empty() {
                bail!("--sweep `{s}` is not of the form KEY=V1,V2,...");
            }
            Ok((key.trim().to_string(), values))
        })
        .collect()
}

/// All combinations, the first sweep varying slowest. No sweep: one empty point.
fn cartesian(sweep: &[(String, Vec<String>)]) -> Vec<Vec<(String, String)>> {
    let mut points = vec![Vec::new()];
    for (key, values) in sweep {
        let mut next = Vec::with_capacity(points.len() * values.len());
        for point in &points {
            for v in values {
                let mut p: Vec<(String, String)> = point.clone();
                p.push((key.clone(), v.clone()));
                next.push(p);
            }
        }
        points = next;
    }
    points
}

/// Where the arrival mode of a replay came from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ArrivalSource {
    /// `--arrival`, or the default for a generated workload.
    Given,
    /// The mode the trace records.
    Recorded,
    /// A trace that records none: its own times.
    Times,
}

/// The warning printed (on stderr) with a [`CoalescingNote`].
fn coalescing_warning(note: &CoalescingNote, source: ArrivalSource, point: &str) -> String {
    let advice = match source {
        ArrivalSource::Times => {
            "; if the trace's times are not real arrival times, replay it with \
             --arrival closed (one access outstanding), or regenerate it with \
             `cxlfs trace gen`, which records its arrival mode"
        }
        ArrivalSource::Recorded => {
            "; that is the arrival mode the trace records: --arrival closed \
             replays one access at a time"
        }
        ArrivalSource::Given => "; --arrival closed replays one access at a time",
    };
    format!("warning{point}: {note}{advice}")
}

/// The input as reported, and the arrival mode a trace records.
pub(crate) fn describe_input(input: &Input) -> Result<(InputDesc, Option<Arrival>)> {
    Ok(match input {
        Input::Trace(path) => {
            let reader = TraceReader::open(path)?;
            let desc = InputDesc::Trace {
                trace: path.display().to_string(),
                format: reader.format(),
            };
            (desc, reader.arrival())
        }
        Input::Workload(spec) => (
            InputDesc::Workload {
                kind: spec.kind,
                wss_bytes: spec.wss_bytes,
                accesses: spec.total_accesses(),
                seed: spec.seed,
                write_ratio: spec.write_ratio,
                access_size: spec.access_size,
                base_addr: spec.base_addr,
            },
            None,
        ),
    })
}

/// A progress bar on stderr, or nothing.
struct Progress(Option<ProgressBar>);

impl Progress {
    fn new(label: Option<String>, total: Option<u64>) -> Progress {
        let Some(label) = label else {
            return Progress(None);
        };
        if total.is_some_and(|t| t < PROGRESS_MIN) {
            return Progress(None);
        }
        let target = ProgressDrawTarget::stderr_with_hz(4);
        let bar = match total {
            Some(total) => {
                let bar = ProgressBar::with_draw_target(Some(total), target);
                if let Ok(style) = ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {human_pos}/{human_len} accesses ({rate}, eta {eta})",
                ) {
                    bar.set_style(style.progress_chars("=> ").with_key("rate", rate));
                }
                bar
            }
            None => {
                let bar = ProgressBar::with_draw_target(None, target);
                if let Ok(style) = ProgressStyle::with_template(
                    "{prefix} {spinner} {human_pos} accesses ({per_sec})",
                ) {
                    bar.set_style(style);
                }
                bar
            }
        };
        bar.set_prefix(label);
        Progress(Some(bar))
    }

    #[inline]
    fn set(&self, done: u64) {
        if let Some(bar) = &self.0 {
            bar.set_position(done);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// Progress-bar key: accesses per second in millions.
fn rate(state: &ProgressState, out: &mut dyn std::fmt::Write) {
    let _ = write!(out, "{:.2} M/s", state.per_sec() / 1e6);
}

/// This thread's CPU time so far.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; on failure it
    // writes nothing and the zero stands.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// The CLI's side of [`Replayer::drive`]: the progress bar and the clocks.
struct Clock<'a> {
    progress: &'a Progress,
    /// When the measured part started.
    start: Instant,
    /// The thread's CPU time then.
    cpu_start: Duration,
}

impl Clock<'_> {
    /// Wall and CPU time since the measured part started.
    fn elapsed(&self) -> (Duration, Duration) {
        (
            self.start.elapsed(),
            thread_cpu_time().saturating_sub(self.cpu_start),
        )
    }
}

impl ReplayObserver for Clock<'_> {
    fn measuring(&mut self) {
        self.start = Instant::now();
        self.cpu_start = thread_cpu_time();
    }

    fn progress(&mut self, fed: u64) {
        self.progress.set(fed);
    }
}

pub(crate) fn run_point(
    cfg: &DeviceConfig,
    input: &Input,
    arrival: Arrival,
    warmup: u64,
    progress_label: Option<String>,
) -> Result<PointResult> {
    let mut device = Device::new(cfg.clone())?;
    let capacity = device.capacity_bytes();
    let mut replayer = Replayer::new(&mut device, arrival);
    let ((wall, cpu), fed) = match input {
        Input::Workload(spec) => {
            if spec.end_addr() > capacity {
                bail!(
                    "workload working set {:#x}..{:#x} ({}) reaches beyond the device capacity of {} bytes ({})",
                    spec.base_addr,
                    spec.end_addr(),
                    human_size(spec.wss_bytes),
                    capacity,
                    human_size(capacity)
                );
            }
            let progress = Progress::new(progress_label, Some(spec.total_accesses()));
            let mut clock = Clock {
                progress: &progress,
                start: Instant::now(),
                cpu_start: thread_cpu_time(),
            };
            let accesses = spec.generate()?.map(Ok::<Access, Infallible>);
            let result = replayer.drive(accesses, warmup, &mut clock);
            progress.finish();
            match result {
                Ok(fed) => (clock.elapsed(), fed),
                Err(RunError::Input { error, .. }) => match error {},
                Err(RunError::Replay(e)) => {
                    return Err(anyhow::Error::new(e).context("workload"));
                }
            }
        }
        Input::Trace(path) => {
            let mut reader = TraceReader::open(path)?;
            let progress = Progress::new(progress_label, reader.declared_records());
            let mut clock = Clock {
                progress: &progress,
                start: Instant::now(),
                cpu_start: thread_cpu_time(),
            };
            let result = reader.drive(&mut replayer, warmup, &mut clock);
            progress.finish();
            match result {
                Ok(fed) => (clock.elapsed(), fed),
                Err(RunError::Input { error, .. }) => return Err(error.into()),
                Err(RunError::Replay(e)) => {
                    let at = reader.location_of(e.index());
                    return Err(anyhow::Error::new(e).context(at));
                }
            }
        }
    };
    if warmup > 0 && fed <= warmup {
        bail!("--warmup {warmup} leaves nothing to measure: the trace has {fed} accesses");
    }
    Ok(PointResult {
        report: replayer.report(),
        wall,
        cpu,
        note: replayer.coalescing_note(),
    })
}

fn print_header(
    out: &mut impl Write,
    device: &DeviceArgs,
    cfg: &DeviceConfig,
    input: &Input,
    arrival: &str,
    warmup: u64,
    swept: bool,
) -> Result<()> {
    let origin = match (&device.config, &device.preset) {
        (Some(file), _) => format!("config {}", file.display()),
        (None, Some(name)) => format!("preset {name}"),
        (None, None) => format!("preset {}", crate::device_args::DEFAULT_PRESET),
    };
    let sets = if device.sets.is_empty() {
        String::new()
    } else {
        format!(" | --set {}", device.sets.join(" "))
    };
    let base = if swept { " (base)" } else { "" };
    writeln!(out, "device{base}: {origin}: {}{sets}", summary(cfg))?;
    let input = match input {
        Input::Trace(path) => format!("trace {}", path.display()),
        Input::Workload(spec) => format!("workload {spec}"),
    };
    let warm = if warmup > 0 {
        format!(" | warmup {warmup}")
    } else {
        String::new()
    };
    writeln!(out, "input: {input} | arrival {arrival}{warm}")?;
    writeln!(out)?;
    Ok(())
}

fn percent(rate: f64) -> String {
    format!("{:.2} %", rate * 100.0)
}

fn print_report(out: &mut impl Write, result: &PointResult, reproducible: bool) -> Result<()> {
    let r = &result.report;
    let l = &r.latency_ns;
    let rows: Vec<(&str, String)> = vec![
        (
            "accesses",
            format!("{} (reads {}, writes {})", r.accesses, r.reads, r.writes),
        ),
        (
            "page lookups",
            format!("{} (hits {}, misses {})", r.page_accesses, r.hits, r.misses),
        ),
        ("hit rate", percent(r.hit_rate)),
        (
            "misses detail",
            format!(
                "coalesced {}, bypassed {}, evictions {}, write-backs {}",
                r.coalesced, r.bypasses, r.evictions, r.writebacks
            ),
        ),
        (
            "latency",
            format!(
                "p50 {}  p90 {}  p99 {}  p99.9 {}",
                format_ns(l.p50 as f64),
                format_ns(l.p90 as f64),
                format_ns(l.p99 as f64),
                format_ns(l.p999 as f64)
            ),
        ),
        (
            "latency mean",
            format!(
                "{} (min {}, max {})",
                format_ns(l.mean),
                format_ns(l.min as f64),
                format_ns(l.max as f64)
            ),
        ),
        (
            "NAND",
            format!(
                "reads {}, programs {}, erases {}, GC runs {} ({} foreground), WA {:.3}",
                r.nand.reads,
                r.nand.programs,
                r.nand.erases,
                r.nand.gc_runs,
                r.nand.gc_foreground_runs,
                r.nand.write_amplification
            ),
        ),
        (
            "prefetch",
            format!(
                "issued {}, used {}, wasted {}",
                r.prefetch.issued, r.prefetch.used, r.prefetch.wasted
            ),
        ),
        (
            "cache at end",
            format!(
                "{} resident, {} pinned, {} dirty pages ({})",
                r.resident_pages, r.pinned_pages, r.dirty_pages, r.policy
            ),
        ),
        ("simulated time", format_ns(r.sim_time_ns as f64)),
    ];
    for (name, value) in rows {
        writeln!(out, "{name:<16}{value}")?;
    }
    if r.log_writes > 0 {
        writeln!(
            out,
            "{:<16}lines {}, hits {}, coalesced {}, cleanings {}, stalls {} ({}); write mean {}",
            "write log",
            r.log_writes,
            r.log_hits,
            r.log_coalesced,
            r.log_cleanings,
            r.log_stalls,
            format_ns(r.log_stall_ns as f64),
            format_ns(r.write_latency_mean_ns)
        )?;
    }
    if !reproducible {
        writeln!(
            out,
            "{:<16}{:.2} M accesses/s ({:.3} s wall, {:.3} s CPU)",
            "throughput",
            result.accesses_per_sec() / 1e6,
            result.wall.as_secs_f64(),
            result.cpu.as_secs_f64()
        )?;
    }
    Ok(())
}

fn print_sweep_table(
    out: &mut impl Write,
    sweep: &[(String, Vec<String>)],
    rows: &[(Vec<(String, String)>, PointResult)],
    reproducible: bool,
) -> Result<()> {
    let mut header: Vec<String> = sweep.iter().map(|(k, _)| k.clone()).collect();
    let keys = header.len();
    header.extend(
        [
            "hit rate",
            "p50",
            "p99",
            "mean",
            "NAND rd",
            "NAND prog",
            "WA",
            "pf issued",
            "pf used",
        ]
        .map(String::from),
    );
    if !reproducible {
        header.push("Macc/s".to_string());
    }
    let mut table = vec![header];
    for (params, result) in rows {
        let r = &result.report;
        let mut row: Vec<String> = params.iter().map(|(_, v)| v.clone()).collect();
        row.extend([
            percent(r.hit_rate),
            format_ns(r.latency_ns.p50 as f64),
            format_ns(r.latency_ns.p99 as f64),
            format_ns(r.latency_ns.mean),
            r.nand.reads.to_string(),
            r.nand.programs.to_string(),
            format!("{:.2}", r.nand.write_amplification),
            r.prefetch.issued.to_string(),
            r.prefetch.used.to_string(),
        ]);
        if !reproducible {
            row.push(format!("{:.2}", result.accesses_per_sec() / 1e6));
        }
        table.push(row);
    }
    write!(out, "{}", crate::text_table::aligned(&table, keys))?;
    Ok(())
}
