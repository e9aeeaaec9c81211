//! Replay throughput: accesses per second through the replay loop that
//! `cxlfs replay` runs ([`Replayer::drive`]), single thread, for every
//! eviction policy, uniform and zipf(0.99) page popularity over 4 Mi pages
//! with a 1 Mi-page cache, NAND model off and on.
//!
//! Each case is replayed from three inputs, the columns:
//! * `trace` — a binary trace file (written before the clock starts, with
//!   closed-loop arrival recorded) streamed through [`BinaryReader`] with the
//!   same 1 MiB buffer: what `cxlfs replay --trace FILE` runs;
//! * `workload` — the workload generated on the fly: what `cxlfs replay
//!   --workload KIND` runs;
//! * `memory` — the accesses from a `Vec` generated before the clock
//!   starts: the model and the replay loop alone.
//!
//! `make bench` runs it. `BENCH_ACCESSES` (default 10 M) sets the accesses
//! per run, `BENCH_POLICIES` (comma-separated) narrows the policies,
//! `BENCH_WORKLOADS` (`uniform`, `zipf`) the workloads, `BENCH_NAND` (`off`,
//! `on`) the NAND settings, `BENCH_INPUTS` (`trace`, `workload`, `memory`)
//! the columns, and `BENCH_TRACE_DIR` where the trace files go (default the
//! system temporary directory; removed at the end).
//!
//! After each rate, `cpu%` is the replaying thread's CPU time over the wall
//! time of the measured part (from `/proc/thread-self/stat`, 10 ms ticks):
//! well under 100 % means other work shared the core and the rate is low by
//! about that much.
//!
//! A benchmark prints what it measures; it asserts nothing about speed.

use cxlfs_device_model::config::PolicyKind;
use cxlfs_device_model::replay::{Arrival, ReplayObserver, ReplayReport, Replayer, RunError};
use cxlfs_device_model::trace::{encode_record, Access, BinaryReader, TraceHeader};
use cxlfs_device_model::workload::{WorkloadKind, WorkloadSpec};
use cxlfs_device_model::{Device, DeviceConfig};
use std::convert::Infallible;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const DEVICE_PAGES: u64 = 4 << 20;
const CACHE_PAGES: u64 = 1 << 20;
/// `cxlfs replay`'s read buffer (experiments/src/trace_io.rs).
const BUFFER_BYTES: usize = 1 << 20;
/// What `cxlfs replay` uses when neither the trace nor `--arrival` says otherwise
/// for `--workload`, and what `cxlfs trace gen` records by default.
const ARRIVAL: Arrival = Arrival::Closed { think_ns: 0 };

fn fail(what: impl std::fmt::Display) -> ! {
    eprintln!("{what}");
    std::process::exit(2);
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// The comma-separated names in `$name`, or all of `all`.
fn selected<'a>(name: &str, all: &[&'a str]) -> Vec<&'a str> {
    match std::env::var(name) {
        Ok(list) => all
            .iter()
            .copied()
            .filter(|a| list.split(',').any(|w| w.trim() == *a))
            .collect(),
        Err(_) => all.to_vec(),
    }
}

fn policies() -> Vec<PolicyKind> {
    match std::env::var("BENCH_POLICIES") {
        Ok(list) => list.split(',').filter_map(|p| p.parse().ok()).collect(),
        Err(_) => PolicyKind::ALL.to_vec(),
    }
}

fn spec(kind: WorkloadKind, count: u64) -> WorkloadSpec {
    WorkloadSpec {
        kind,
        wss_bytes: DEVICE_PAGES * 4096,
        accesses: Some(count),
        seed: 42,
        access_size: 64,
        ..WorkloadSpec::default()
    }
}

/// Writes the workload as a binary trace recording closed-loop arrival, as
/// `cxlfs trace gen --workload KIND --wss 16GiB --seed 42 ...` does.
fn write_trace(path: &Path, spec: &WorkloadSpec) {
    let written = File::create(path).and_then(|file| {
        let mut out = BufWriter::with_capacity(BUFFER_BYTES, file);
        let header = TraceHeader {
            count: Some(spec.total_accesses()),
            arrival: Some(ARRIVAL),
        };
        out.write_all(&header.encode())?;
        for access in spec.generate().unwrap_or_else(|e| fail(e)) {
            out.write_all(&encode_record(&access).unwrap_or_else(|e| fail(e)))?;
        }
        out.flush()
    });
    if let Err(e) = written {
        fail(format!("cannot write {}: {e}", path.display()));
    }
}

fn device(policy: PolicyKind, nand: bool) -> Device {
    let overrides = [
        format!("cache.size_bytes={}", CACHE_PAGES * 4096),
        "cache.ways=0".to_string(),
        format!("cache.policy={policy}"),
        "cache.hits_visible=true".to_string(),
        format!("nand.enabled={nand}"),
    ];
    DeviceConfig::default()
        .with_overrides(&overrides)
        .map_err(|e| e.to_string())
        .and_then(|cfg| Device::new(cfg).map_err(|e| e.to_string()))
        .unwrap_or_else(|e| fail(format!("cannot build device: {e}")))
}

/// This thread's CPU time (user + system), from `/proc/thread-self/stat` in
/// ticks of 10 ms (USER_HZ); zero where that cannot be read.
fn thread_cpu_time() -> Duration {
    let ticks = std::fs::read_to_string("/proc/thread-self/stat")
        .ok()
        .and_then(|stat| {
            // Fields after the `(comm)`: state is field 3; utime, stime are 14, 15.
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut fields = rest.split(' ').skip(11);
            let utime: u64 = fields.next()?.parse().ok()?;
            let stime: u64 = fields.next()?.parse().ok()?;
            Some(utime + stime)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Starts the clocks where `cxlfs replay` does.
struct Clock {
    wall: Instant,
    cpu: Duration,
}

impl ReplayObserver for Clock {
    fn measuring(&mut self) {
        self.wall = Instant::now();
        self.cpu = thread_cpu_time();
    }
}

/// Replays `input` as `cxlfs replay` does (no warm-up); returns accesses/s,
/// the share of the wall time on CPU and the report.
fn replay<I, E>(policy: PolicyKind, nand: bool, input: I) -> (f64, f64, ReplayReport)
where
    I: IntoIterator<Item = Result<Access, E>>,
    E: std::fmt::Display,
{
    let mut dev = device(policy, nand);
    let mut replayer = Replayer::new(&mut dev, ARRIVAL);
    let mut clock = Clock {
        wall: Instant::now(),
        cpu: Duration::ZERO,
    };
    let fed = match replayer.drive(input, 0, &mut clock) {
        Ok(fed) => fed,
        Err(RunError::Input { index, error }) => fail(format!("{policy}: input {index}: {error}")),
        Err(RunError::Replay(e)) => fail(format!("{policy}: {e}")),
    };
    let secs = clock.wall.elapsed().as_secs_f64();
    let cpu = thread_cpu_time().saturating_sub(clock.cpu).as_secs_f64();
    (fed as f64 / secs / 1e6, cpu / secs, replayer.report())
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let count = env_or("BENCH_ACCESSES", 10_000_000);
    let inputs = selected("BENCH_INPUTS", &["trace", "workload", "memory"]);
    let dir = std::env::var_os("BENCH_TRACE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    println!(
        "replay throughput (M accesses/s): {count} accesses per run, 64 B reads, {DEVICE_PAGES} pages, \
         {CACHE_PAGES}-page fully associative cache, closed-loop arrivals, single thread, \
         through cxlfs replay's loop (Replayer::drive); inputs: trace = binary trace file \
         (cxlfs replay --trace), workload = generated on the fly (cxlfs replay --workload), \
         memory = a Vec (model and loop alone)"
    );
    let mut header = format!("{:<8} {:<10} {:<5}", "policy", "workload", "nand");
    for input in &inputs {
        header.push_str(&format!(" {input:>9} {:>4}", "cpu%"));
    }
    println!("{header} {:>9} {:>7}", "hit_rate", "wa");
    for workload in selected("BENCH_WORKLOADS", &["uniform", "zipf"]) {
        let kind = match workload {
            "uniform" => WorkloadKind::Uniform,
            _ => WorkloadKind::Zipf { theta: 0.99 },
        };
        let spec = spec(kind, count);
        let trace_path = dir.join(format!(
            "cxlfs-replay-bench-{}-{workload}.bin",
            std::process::id()
        ));
        if inputs.contains(&"trace") {
            write_trace(&trace_path, &spec);
        }
        let in_memory: Vec<Access> = if inputs.contains(&"memory") {
            spec.generate().unwrap_or_else(|e| fail(e)).collect()
        } else {
            Vec::new()
        };
        for nand in selected("BENCH_NAND", &["off", "on"]) {
            let nand = nand == "on";
            for policy in policies() {
                let mut row = format!(
                    "{:<8} {:<10} {:<5}",
                    policy.name(),
                    kind.to_string(),
                    if nand { "on" } else { "off" }
                );
                let mut last = None;
                for input in &inputs {
                    let (rate, on_cpu, report) = match *input {
                        "trace" => {
                            let file = File::open(&trace_path).unwrap_or_else(|e| fail(e));
                            let reader =
                                BinaryReader::new(BufReader::with_capacity(BUFFER_BYTES, file))
                                    .unwrap_or_else(|e| fail(e));
                            replay(policy, nand, reader)
                        }
                        "workload" => replay(
                            policy,
                            nand,
                            spec.generate()
                                .unwrap_or_else(|e| fail(e))
                                .map(Ok::<Access, Infallible>),
                        ),
                        _ => replay(
                            policy,
                            nand,
                            in_memory.iter().copied().map(Ok::<Access, Infallible>),
                        ),
                    };
                    if let Some(previous) = &last {
                        if *previous != report {
                            fail(format!(
                                "{policy} {kind}: the {input} input replays differently"
                            ));
                        }
                    }
                    row.push_str(&format!(" {rate:>9.2} {:>4.0}", on_cpu * 100.0));
                    last = Some(report);
                }
                if let Some(report) = last {
                    println!(
                        "{row} {:>9.4} {:>7.3}",
                        report.hit_rate, report.nand.write_amplification
                    );
                }
            }
        }
        if inputs.contains(&"trace") {
            let _ = std::fs::remove_file(&trace_path);
        }
    }
}
