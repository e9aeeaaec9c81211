//! What metrics cost: FUSE READ throughput with every metric on against
//! every metric off, alternating in one process, through the real
//! vhost-user back-end (a front-end in this program, no VM).
//!
//! Worst case for the relative cost: 4 KiB READs of a host-cached file with
//! a zero-latency device (every reply released inline), one request in
//! flight, so a request costs only the daemon's own work (~10 µs here).
//! "On" = latency histograms (FUSE, pacing) recorded, a JSON-lines writer
//! sampling every 100 ms (10× the default rate) and a Prometheus scrape
//! every second. "Off" = histograms off, no writer, no scrapes. Counters
//! (plain relaxed atomics) count in both.
//!
//! Wall-clock throughput on a shared 2-core host moves by ±30 % from round
//! to round (other processes take the cores), so the figure that carries
//! the 2 % target is the daemon's CPU time per request (process CPU less
//! this front-end thread's), which is what throughput is made of on a
//! CPU-bound daemon; both are printed.
//!
//! Measures and prints; asserts nothing about timing. Run:
//!
//! ```sh
//! cargo bench -p cxlfsd --bench metrics_overhead
//! ```
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use common::Guest;
use cxlfs_device_model::{Device, DeviceConfig};
use cxlfsd::server::ServerOptions;
use cxlfsd::{
    CacheMode, DaemonState, MetricsFileWriter, QueueOptions, SessionOptions, SharedDevice, VmSpec,
};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const REQUESTS: u64 = 40_000;
const ROUNDS: usize = 12;
const READ: u32 = 4096;
const FILE: u64 = 4 << 20;

fn cpu_ns(clock: libc::clockid_t) -> u64 {
    // SAFETY: timespec is plain data; clock_gettime only writes into it.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a valid, writable timespec.
    unsafe { libc::clock_gettime(clock, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// One round: `(requests per second, daemon CPU ns per request)`. Daemon
/// CPU = the whole process's CPU time (queue worker, pacer, metrics writer,
/// scraper) less this front-end thread's.
fn round(g: &mut Guest, node: u64, fh: u64) -> (f64, f64) {
    let t = Instant::now();
    let process = cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
    let me = cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    for i in 0..REQUESTS {
        g.read(node, fh, (i * u64::from(READ)) % FILE, READ);
    }
    let me = cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID) - me;
    let process = cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID) - process;
    (
        REQUESTS as f64 / t.elapsed().as_secs_f64(),
        process.saturating_sub(me) as f64 / REQUESTS as f64,
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

const RERUN: &str = "cargo bench -p cxlfsd --bench metrics_overhead";
/// The target for the daemon's CPU per request, metrics on / off.
const TARGET_CPU_RATIO: f64 = 1.02;

/// A daemon over `share` on a zero-latency device (every reply released
/// inline), host page cache off.
fn zero_latency_daemon(share: &Path) -> Arc<DaemonState> {
    let cfg = DeviceConfig::default()
        .with_overrides(&[
            "cache.size_bytes=64MiB",
            "nand.read_ns=0",
            "nand.program_ns=0",
            "nand.erase_ns=0",
            "cache.hit_latency_ns=0",
            "link.latency_ns=0",
        ])
        .unwrap();
    let shared = Arc::new(SharedDevice::new(Device::new(cfg).unwrap()));
    DaemonState::new(
        shared,
        SessionOptions {
            shared_dir: share.to_path_buf(),
            max_open_files: cxlfsd::DEFAULT_MAX_OPEN_FILES,
            cache: CacheMode::Never,
            queues: QueueOptions::default(),
            server: ServerOptions {
                max_readahead: None,
            },
            guest_ids: Default::default(),
        },
    )
}

/// Prints what one export costs: a snapshot, the device totals, and a
/// Prometheus render (each the mean of 100).
fn print_export_cost(state: &DaemonState) {
    let t = Instant::now();
    for _ in 0..100 {
        std::hint::black_box(state.metrics.snapshot());
    }
    let snap = t.elapsed() / 100;
    let t = Instant::now();
    for _ in 0..100 {
        std::hint::black_box(state.metrics.device_totals());
    }
    let dev = t.elapsed() / 100;
    let s = state.metrics.snapshot();
    let t = Instant::now();
    for _ in 0..100 {
        std::hint::black_box(cxlfsd::render_prometheus(&s));
    }
    let prom = t.elapsed() / 100;
    println!(
        "export cost: one snapshot {snap:?} (device totals {dev:?}), one Prometheus render {prom:?}"
    );
}

/// One round with every metric on: histograms recorded, a JSON-lines writer
/// sampling into `out`/m`r`.jsonl every 100 ms, and a Prometheus scrape
/// every second.
fn metrics_on_round(
    state: &DaemonState,
    g: &mut Guest,
    node: u64,
    fh: u64,
    out: &Path,
    r: usize,
) -> (f64, f64) {
    state.metrics.set_latency_recording(true);
    let writer = MetricsFileWriter::start(
        &out.join(format!("m{r}.jsonl")),
        Duration::from_millis(100),
        state.metrics.clone(),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let (stop, metrics) = (stop.clone(), state.metrics.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += metrics.render().len() as u64;
                std::thread::sleep(Duration::from_millis(1000));
            }
            n
        })
    };
    let result = round(g, node, fh);
    stop.store(true, Ordering::Relaxed);
    assert!(scraper.join().unwrap() > 0, "the scraper rendered nothing");
    writer.finish().unwrap();
    result
}

/// Each round's figures, metrics on and off, and each pair's throughput
/// ratio.
#[derive(Default)]
struct Samples {
    on: Vec<f64>,
    off: Vec<f64>,
    cpu_on: Vec<f64>,
    cpu_off: Vec<f64>,
    pairs: Vec<f64>,
}

/// [`ROUNDS`] pairs of adjacent rounds, metrics on and off, in alternating
/// order, so that drift and order effects cancel; the ratio of each pair is
/// one sample.
fn paired_rounds(state: &DaemonState, g: &mut Guest, node: u64, fh: u64, out: &Path) -> Samples {
    let mut s = Samples::default();
    for r in 0..ROUNDS {
        let mut pair = [(0.0f64, 0.0f64); 2];
        for k in 0..2 {
            let metrics_on = (r + k) % 2 == 0;
            if !metrics_on {
                state.metrics.set_latency_recording(false);
                pair[1] = round(g, node, fh);
                continue;
            }
            pair[0] = metrics_on_round(state, g, node, fh, out, r);
        }
        s.on.push(pair[0].0);
        s.off.push(pair[1].0);
        s.cpu_on.push(pair[0].1);
        s.cpu_off.push(pair[1].1);
        s.pairs.push(pair[0].0 / pair[1].0);
    }
    s
}

/// Prints the medians and ratios of `s`, and whether the CPU target is met.
fn print_report(s: Samples) {
    let Samples {
        on,
        off,
        cpu_on,
        cpu_off,
        pairs,
    } = s;
    let ratio = median(pairs.clone());
    let (m_on, m_off) = (median(on), median(off));
    let (c_on, c_off) = (median(cpu_on), median(cpu_off));
    let cpu_ratio = c_on / c_off;
    println!(
        "metrics on / off ({ROUNDS} pairs of rounds, {REQUESTS} 4 KiB READs each):\n  \
         throughput: median of paired ratios {ratio:.4}; medians {m_on:.0} / {m_off:.0} req/s = {:.4}\n  \
         daemon CPU per request: medians {c_on:.0} / {c_off:.0} ns = {cpu_ratio:.4} \
         (target < {TARGET_CPU_RATIO}: {})\n  \
         pair ratios: {pairs:.3?}\n\
         rerun: {RERUN}",
        m_on / m_off,
        if cpu_ratio < TARGET_CPU_RATIO { "met" } else { "NOT met" },
    );
}

fn main() {
    // `cargo test --benches` lists the targets; there is nothing to list.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let share = tempfile::tempdir().unwrap();
    std::fs::write(share.path().join("f"), vec![5u8; FILE as usize]).unwrap();
    let socks = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let state = zero_latency_daemon(share.path());
    let t = state
        .spawn_vm(VmSpec {
            name: "b".into(),
            socket: socks.path().join("b.sock"),
            dir: None,
        })
        .unwrap();
    let mut g = Guest::connect(&socks.path().join("b.sock"));
    g.spin = true;
    g.init();
    let node = g.lookup("f");
    let fh = g.open(node);
    round(&mut g, node, fh); // warm up: page cache, device cache, allocations
    print_export_cost(&state);

    let samples = paired_rounds(&state, &mut g, node, fh, out.path());
    // The "on" rounds really exported: otherwise the ratios compare nothing.
    let written = std::fs::read_to_string(out.path().join("m0.jsonl")).unwrap();
    assert!(
        written.lines().count() >= 2,
        "the metrics writer did not run"
    );
    drop(g);
    state.request_shutdown();
    t.join().unwrap();
    print_report(samples);
}
