//! Miss counts of the cache model on a page sequence, for side-by-side
//! comparison with libCacheSim (`device-model/bench/libcachesim-compare.py`).
//!
//! ```text
//! cargo run --release -p cxlfs-device-model --example policy_misses -- \
//!     PAGES.u64 POLICY CAPACITY[,CAPACITY...] [PARAM=VALUE ...]
//! ```
//!
//! `PAGES.u64` holds the page numbers, little-endian `u64`s back to back.
//! The cache is fully associative (one set) with `CAPACITY` pages; every
//! access is a demand read whose policy sees the hit (`hits_visible`), with
//! no timing: lookup → hit, else insert (the device's path without MSHRs or
//! prefetch). `PARAM` is a field of `PolicyParams` (`s3fifo_small_ratio=0.1`).
//! Prints `POLICY CAPACITY MISSES REQUESTS` per capacity.

use cxlfs_device_model::cache::Cache;
use cxlfs_device_model::config::{PolicyKind, PolicyParams};
use cxlfs_device_model::{DeviceConfig, PAGE_SIZE};
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("policy_misses: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path, policy, capacities, params @ ..] = args.as_slice() else {
        return Err("usage: PAGES.u64 POLICY CAPACITY[,CAPACITY...] [PARAM=VALUE ...]".into());
    };
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    if bytes.len() % 8 != 0 {
        return Err(format!(
            "{path}: {} bytes is not a whole number of u64s",
            bytes.len()
        ));
    }
    let pages: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect();
    let kind: PolicyKind = policy.parse()?;
    let params = parse_params(params)?;
    let max_page = pages.iter().copied().max().unwrap_or(0);
    for cap in capacities.split(',') {
        let cap: u64 = cap
            .trim()
            .parse()
            .map_err(|e| format!("capacity `{cap}`: {e}"))?;
        let mut cfg = DeviceConfig::default().cache;
        cfg.size_bytes = cap * PAGE_SIZE;
        cfg.ways = 0;
        cfg.policy = kind;
        cfg.hits_visible = true;
        cfg.params = params.clone();
        let mut cache = Cache::new(&cfg, max_page + 1);
        let mut misses = 0u64;
        for &p in &pages {
            match cache.lookup(p) {
                Some(slot) => cache.record_hit(slot),
                None => {
                    misses += 1;
                    cache.insert(p, 0, false, false);
                }
            }
        }
        println!("{kind} {cap} {misses} {}", pages.len());
    }
    Ok(())
}

/// `key=value` pairs over the defaults, through serde (as the control API
/// merges them).
fn parse_params(pairs: &[String]) -> Result<PolicyParams, String> {
    let mut merged = serde_json::to_value(PolicyParams::default()).map_err(|e| e.to_string())?;
    for pair in pairs {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("`{pair}` is not PARAM=VALUE"))?;
        let slot = merged
            .get_mut(k)
            .ok_or_else(|| format!("unknown policy parameter `{k}`"))?;
        *slot = serde_json::from_str(v).map_err(|e| format!("{k}: {e}"))?;
    }
    serde_json::from_value(merged).map_err(|e| e.to_string())
}
