//! Helpers shared by the miss-ratio-curve tests (`tests/mrc.rs`,
//! `tests/repeats.rs`) and bench (`benches/mrc_curve.rs`, which includes
//! this file with `#[path]`). Not every user takes every helper.
#![allow(dead_code)]

use cxlfs_device_model::config::PolicyKind;
use cxlfs_device_model::replay::{Arrival, Replayer};
use cxlfs_device_model::trace::Access;
use cxlfs_device_model::{Device, DeviceConfig, DeviceStats, PAGE_SIZE};
use std::convert::Infallible;

/// The device's counters after a closed-loop replay of `accesses` into
/// `cfg`, the first `warmup` of them warming the cache.
pub fn replay_stats(cfg: &DeviceConfig, accesses: &[Access], warmup: u64) -> DeviceStats {
    let mut dev = Device::new(cfg.clone()).unwrap_or_else(|e| panic!("config: {e}"));
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    r.drive(
        accesses.iter().map(|a| Ok::<_, Infallible>(*a)),
        warmup,
        &mut (),
    )
    .unwrap_or_else(|e| panic!("replay: {e}"));
    r.device().stats()
}

/// The config curves and the replays they are checked against run on: a
/// fully associative cache, hits visible, NAND off, `policy`. The cache
/// size is a placeholder each replay or miniature sets.
pub fn mrc_config(policy: PolicyKind) -> DeviceConfig {
    let mut cfg = DeviceConfig::default()
        .with_overrides(&[
            "cache.ways=0",
            "cache.hits_visible=true",
            "nand.enabled=false",
            "cache.size_bytes=1MiB",
        ])
        .unwrap_or_else(|e| panic!("config: {e}"));
    cfg.cache.policy = policy;
    cfg
}

/// `n` cache sizes in bytes, log-spaced from `lo` to `hi` pages, as
/// `cxlfs mrc --sizes LO..HI:N` gives them.
pub fn log_sizes(lo: u64, hi: u64, n: u32) -> Vec<u64> {
    let spec = format!("{}..{}:{n}", lo * PAGE_SIZE, hi * PAGE_SIZE);
    cxlfs_device_model::mrc::sizes::parse_sizes(&spec, PAGE_SIZE)
        .unwrap_or_else(|e| panic!("sizes {spec}: {e}"))
}
