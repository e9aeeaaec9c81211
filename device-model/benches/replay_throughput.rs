//! Replay throughput: accesses per second through `Device::access`, single
//! thread, for every eviction policy, uniform and zipf(0.99) page popularity
//! over 4 M pages with a 1 M-page cache, NAND model off and on.
//!
//! `make bench` runs it. The accesses are generated before the clock starts,
//! so only the device model (and the replay loop's latency histogram) is
//! timed. `BENCH_ACCESSES` (default 10 M) sets the accesses per run,
//! `BENCH_POLICIES` (comma-separated) narrows the policies.
//!
//! A benchmark prints what it measures; it asserts nothing about speed.

use cxlfs_device_model::config::PolicyKind;
use cxlfs_device_model::replay::{Arrival, Replayer};
use cxlfs_device_model::trace::Access;
use cxlfs_device_model::workload::{WorkloadKind, WorkloadSpec};
use cxlfs_device_model::{Device, DeviceConfig};
use std::time::Instant;

const DEVICE_PAGES: u64 = 4 << 20;
const CACHE_PAGES: u64 = 1 << 20;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn policies() -> Vec<PolicyKind> {
    match std::env::var("BENCH_POLICIES") {
        Ok(list) => list.split(',').filter_map(|p| p.parse().ok()).collect(),
        Err(_) => PolicyKind::ALL.to_vec(),
    }
}

fn accesses(kind: WorkloadKind, count: u64) -> Vec<Access> {
    let spec = WorkloadSpec {
        kind,
        wss_bytes: DEVICE_PAGES * 4096,
        accesses: Some(count),
        seed: 42,
        access_size: 64,
        ..WorkloadSpec::default()
    };
    match spec.generate() {
        Ok(w) => w.collect(),
        Err(e) => {
            eprintln!("cannot generate {kind}: {e}");
            std::process::exit(2);
        }
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
    let built = DeviceConfig::default()
        .with_overrides(&overrides)
        .map_err(|e| e.to_string())
        .and_then(|cfg| Device::new(cfg).map_err(|e| e.to_string()));
    match built {
        Ok(dev) => dev,
        Err(e) => {
            eprintln!("cannot build device: {e}");
            std::process::exit(2);
        }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let count = env_or("BENCH_ACCESSES", 10_000_000);
    println!(
        "replay throughput: {count} accesses per run, 64 B reads, {DEVICE_PAGES} pages, \
         {CACHE_PAGES}-page fully associative cache, closed-loop arrivals, single thread"
    );
    println!(
        "{:<8} {:<10} {:<5} {:>10} {:>9} {:>11}",
        "policy", "workload", "nand", "Macc/s", "hit_rate", "wa"
    );
    for kind in [WorkloadKind::Uniform, WorkloadKind::Zipf { theta: 0.99 }] {
        let trace = accesses(kind, count);
        for nand in [false, true] {
            for policy in policies() {
                let mut dev = device(policy, nand);
                let mut replayer = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
                let start = Instant::now();
                let result = replayer.run(trace.iter().copied());
                let secs = start.elapsed().as_secs_f64();
                if let Err(e) = result {
                    eprintln!("{policy} {kind}: {e}");
                    std::process::exit(1);
                }
                let report = replayer.report();
                println!(
                    "{:<8} {:<10} {:<5} {:>10.2} {:>9.4} {:>11.3}",
                    policy.name(),
                    kind.to_string(),
                    if nand { "on" } else { "off" },
                    count as f64 / secs / 1e6,
                    report.hit_rate,
                    report.nand.write_amplification,
                );
            }
        }
    }
}
