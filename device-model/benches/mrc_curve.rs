//! A 64-point miss-ratio curve against replays: for each workload (zipf
//! 0.99 and uniform over 4 Mi pages, accesses from memory) and policy, the
//! time of the curve (one pass over the accesses, then the 64 points: LRU
//! from stack distances, LIFO from its thresholds, the other policies from
//! miniature caches at the default rate) against one full replay of the largest size (2× the
//! working set) and against 64 replays (8 × the replays of every 8th
//! size), and the miss ratios' mean and largest error (points) against
//! those 8 replays.
//!
//! `cargo bench -p cxlfs-device-model --bench mrc_curve`. `BENCH_ACCESSES`
//! (default 10 M), `BENCH_POLICIES` (comma-separated), `BENCH_WORKLOADS`
//! (`zipf`, `uniform`) narrow it. It prints what it measures and asserts
//! nothing about speed.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{log_sizes, mrc_config as config};
use cxlfs_device_model::config::PolicyKind;
use cxlfs_device_model::mrc::shards::Sampler;
use cxlfs_device_model::mrc::{default_rate, exact_curve, minisim, CurvePass};
use cxlfs_device_model::replay::{Arrival, Replayer};
use cxlfs_device_model::trace::Access;
use cxlfs_device_model::workload::{WorkloadKind, WorkloadSpec};
use cxlfs_device_model::{Device, DeviceConfig, PAGE_SIZE};
use std::time::Instant;

const WSS_PAGES: u64 = 4 << 20;
const POINTS: u32 = 64;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// Misses over page lookups of one full replay; and its seconds.
fn replay(cfg: &DeviceConfig, size: u64, accesses: &[Access]) -> (f64, f64) {
    let mut cfg = cfg.clone();
    cfg.cache.size_bytes = size;
    let mut dev = Device::new(cfg).unwrap_or_else(|e| panic!("device: {e}"));
    let t = Instant::now();
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    r.run(accesses.iter().copied())
        .unwrap_or_else(|e| panic!("replay: {e:?}"));
    let secs = t.elapsed().as_secs_f64();
    let s = r.device().stats();
    (s.misses as f64 / s.page_accesses.max(1) as f64, secs)
}

/// The curve's miss ratios and its seconds (pass and points).
fn curve(cfg: &DeviceConfig, sizes: &[u64], accesses: &[Access]) -> (Vec<f64>, f64) {
    let t = Instant::now();
    let (lru, lifo) = (
        cfg.cache.policy == PolicyKind::Lru,
        cfg.cache.policy == PolicyKind::Lifo,
    );
    let sampler = (!lru && !lifo).then(|| Sampler::fixed_rate(default_rate(sizes[0])));
    let mut pass = CurvePass::new(cfg.capacity_bytes(), 0, sampler);
    if lru {
        pass = pass.with_lru(sizes);
    }
    if lifo {
        pass = pass.with_lifo(sizes);
    }
    for a in accesses {
        pass.feed(a).unwrap_or_else(|e| panic!("{e}"));
    }
    let got = pass.finish();
    let counts = got
        .stack
        .as_ref()
        .map(|s| s.counts())
        .or(got.lifo.as_ref().map(|l| l.counts()));
    let ratios = match (counts, &got.sample) {
        (Some(counts), _) => exact_curve(counts, sizes)
            .iter()
            .map(|p| p.miss_ratio())
            .collect(),
        (None, Some(sample)) => sizes
            .iter()
            .map(|&s| minisim::simulate(cfg, sample, s).map_or(f64::NAN, |m| m.miss_ratio))
            .collect(),
        (None, None) => Vec::new(),
    };
    (ratios, t.elapsed().as_secs_f64())
}

fn main() {
    let count = env_or("BENCH_ACCESSES", 10_000_000);
    let sizes = log_sizes(WSS_PAGES / 64, WSS_PAGES * 2, POINTS);
    let wanted = |var: &str, name: &str| {
        std::env::var(var).map_or(true, |v| v.split(',').any(|w| w.trim() == name))
    };
    println!(
        "{count} accesses over {WSS_PAGES} pages, {POINTS} sizes from 1/64 to 2x the working set"
    );
    println!("workload policy   curve s  replay(2x) s  ratio  vs 64 replays  MAE(8)  max(8)");
    for (name, kind) in [
        ("zipf", WorkloadKind::Zipf { theta: 0.99 }),
        ("uniform", WorkloadKind::Uniform),
    ] {
        if !wanted("BENCH_WORKLOADS", name) {
            continue;
        }
        let spec = WorkloadSpec {
            kind,
            wss_bytes: WSS_PAGES * PAGE_SIZE,
            accesses: Some(count),
            seed: 42,
            ..WorkloadSpec::default()
        };
        let accesses: Vec<Access> = spec.generate().unwrap_or_else(|e| panic!("{e}")).collect();
        for policy in PolicyKind::ALL {
            if !wanted("BENCH_POLICIES", policy.name()) {
                continue;
            }
            let cfg = config(policy);
            let (ratios, curve_s) = curve(&cfg, &sizes, &accesses);
            let mut errors = Vec::new();
            let (mut largest_s, mut replays_s) = (0.0, 0.0);
            for (i, &size) in sizes.iter().enumerate().rev().step_by(8) {
                let (want, secs) = replay(&cfg, size, &accesses);
                if i + 1 == sizes.len() {
                    largest_s = secs;
                }
                replays_s += secs * 8.0;
                errors.push((ratios[i] - want).abs() * 100.0);
            }
            let mae = errors.iter().sum::<f64>() / errors.len() as f64;
            let max = errors.iter().copied().fold(0.0, f64::max);
            println!(
                "{name:8} {:7} {curve_s:8.2} {largest_s:13.2} {:6.2} {:14.3} {mae:7.3} {max:7.3}",
                policy.name(),
                curve_s / largest_s,
                curve_s / replays_s,
            );
        }
    }
}
