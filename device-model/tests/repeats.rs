//! Leaving out the settled repeats of runs of accesses to one page
//! (`mrc::repeats`) changes nothing a miniature can see: for every policy,
//! with hits visible or not, fully associative or in sets, with the
//! policies' parameters at their edges (LFRU with no privileged room never
//! settles), the trimmed accesses give the same misses, evictions and
//! resident pages as all of them, and the same miss on every access both
//! replay. A settling count one too small is caught, so the comparison can
//! fail.

#![allow(clippy::unwrap_used)]

mod common;

use common::{mrc_config, replay_stats};
use cxlfs_device_model::mrc::repeats::trim;
use cxlfs_device_model::trace::Access;
use cxlfs_device_model::{Device, DeviceConfig, Op, PolicyKind, PAGE_SIZE};

/// Runs of accesses to one page (lengths 1 to 300), over 40 pages, a
/// quarter of them writes, now and then one that crosses into the next page.
fn runs(seed: u64, accesses: usize) -> Vec<Access> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let lengths = [1, 1, 1, 2, 2, 3, 4, 6, 9, 15, 40, 300];
    let mut out = Vec::with_capacity(accesses);
    while out.len() < accesses {
        let page = next(40);
        let run = lengths[next(lengths.len() as u64) as usize];
        for _ in 0..run {
            let crossing = next(50) == 0;
            out.push(Access {
                time_ns: 0,
                op: if next(4) == 0 { Op::Write } else { Op::Read },
                addr: page * PAGE_SIZE + if crossing { PAGE_SIZE - 32 } else { 64 },
                len: 64,
            });
        }
    }
    out.truncate(accesses);
    out
}

/// What a closed-loop replay leaves that a curve or a later access could
/// tell apart: the measured misses, evictions and resident pages.
fn outcome(cfg: &DeviceConfig, accesses: &[Access], warmup: u64) -> [u64; 3] {
    let s = replay_stats(cfg, accesses, warmup);
    [s.misses, s.evictions, s.resident_pages]
}

/// The first page of every access that missed, in order (closed loop).
fn missed_pages(cfg: &DeviceConfig, accesses: &[Access]) -> Vec<u64> {
    let mut dev = Device::new(cfg.clone()).unwrap();
    let mut now = 0;
    let mut out = Vec::new();
    for a in accesses {
        let o = dev.access(now, a.op, a.addr, a.len).unwrap();
        if !o.hit {
            out.push(a.addr / PAGE_SIZE);
        }
        now = o.completes_at_ns;
    }
    out
}

/// Every policy, with its parameters' edges, hits visible or not, fully
/// associative or 4-way, 1 to 32 pages.
fn configs() -> Vec<DeviceConfig> {
    let mut out = Vec::new();
    for policy in PolicyKind::ALL {
        for visible in [true, false] {
            for ways in [0, 4] {
                for pages in [1, 2, 3, 5, 8, 16, 32] {
                    let mut cfg = mrc_config(policy);
                    cfg.cache.hits_visible = visible;
                    cfg.cache.ways = ways;
                    cfg.cache.size_bytes = pages * PAGE_SIZE * u64::from(ways.max(1));
                    out.push(cfg.clone());
                    match policy {
                        PolicyKind::S3Fifo => {
                            for t in [1, 2, 5] {
                                let mut c = cfg.clone();
                                c.cache.params.s3fifo_move_to_main_threshold = t;
                                out.push(c);
                            }
                        }
                        PolicyKind::Lfru => {
                            for (ratio, t) in [(0.0, 2), (0.25, 3), (0.5, 9)] {
                                let mut c = cfg.clone();
                                c.cache.params.lfru_privileged_ratio = ratio;
                                c.cache.params.lfru_promote_threshold = t;
                                out.push(c);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    out
}

#[test]
fn leaving_out_settled_repeats_changes_no_miss_eviction_or_resident_page() {
    let accesses = runs(7, 20_000);
    let warmup = 3_000;
    let mut trimmed_any = 0;
    for cfg in configs() {
        let settling = Device::new(cfg.clone()).unwrap().settling_hits();
        let t = trim(&accesses, warmup, settling);
        if t.accesses.len() < accesses.len() {
            trimmed_any += 1;
        }
        let what = format!(
            "{:?} hits_visible={} ways={} size={} params={:?}: settling {settling:?}",
            cfg.cache.policy,
            cfg.cache.hits_visible,
            cfg.cache.ways,
            cfg.cache.size_bytes,
            cfg.cache.params,
        );
        assert_eq!(
            outcome(&cfg, &t.accesses, t.warmup),
            outcome(&cfg, &accesses, warmup),
            "{what}"
        );
        // A warm-up the input ends with (all reset) or within (none).
        for w in [accesses.len() as u64, accesses.len() as u64 + 1] {
            let t = trim(&accesses, w, settling);
            assert_eq!(
                outcome(&cfg, &t.accesses, t.warmup),
                outcome(&cfg, &accesses, w),
                "{what}, warm-up {w}"
            );
        }
        // The accesses left out are hits: the misses are the same ones.
        assert_eq!(
            missed_pages(&cfg, &t.accesses),
            missed_pages(&cfg, &accesses),
            "{what}"
        );
    }
    // Every config but LFRU's with no privileged room trims something.
    assert!(trimmed_any > configs().len() * 9 / 10, "{trimmed_any}");
}

#[test]
fn a_settling_count_one_too_small_changes_the_misses() {
    let accesses = runs(11, 20_000);
    for policy in [PolicyKind::Clock, PolicyKind::S3Fifo, PolicyKind::Lfru] {
        let differs = configs()
            .into_iter()
            .filter(|c| c.cache.policy == policy && c.cache.hits_visible)
            .any(|cfg| {
                let settling = Device::new(cfg.clone()).unwrap().settling_hits();
                let Some(short) = settling.and_then(|s| s.checked_sub(1)) else {
                    return false;
                };
                let t = trim(&accesses, 0, Some(short));
                outcome(&cfg, &t.accesses, 0)[0] != outcome(&cfg, &accesses, 0)[0]
            });
        assert!(
            differs,
            "{policy:?}: one hit fewer than its settling count is never seen"
        );
    }
}

/// A closed loop that does not make an access to the page the access
/// before it touched where the device calls it settled
/// (`Device::repeat_settled`), as a miniature's loop: its outcome, its
/// missed pages and how many accesses it skipped.
fn skipping_settled(
    cfg: &DeviceConfig,
    accesses: &[Access],
    warmup: u64,
) -> ([u64; 3], Vec<u64>, usize) {
    let mut dev = Device::new(cfg.clone()).unwrap();
    let (mut now, mut previous, mut skipped) = (0, u64::MAX, 0);
    let mut missed = Vec::new();
    for (i, a) in (0u64..).zip(accesses) {
        if i == warmup {
            dev.reset_stats();
        }
        let (first, last) = (
            a.addr / PAGE_SIZE,
            (a.addr + u64::from(a.len) - 1) / PAGE_SIZE,
        );
        if first == last && first == previous && dev.repeat_settled(now, first) {
            skipped += 1;
            continue;
        }
        previous = if first == last { first } else { u64::MAX };
        let o = dev.access(now, a.op, a.addr, a.len).unwrap();
        if !o.hit {
            missed.push(first);
        }
        now = o.completes_at_ns;
    }
    if warmup == accesses.len() as u64 {
        dev.reset_stats();
    }
    let s = dev.stats();
    ([s.misses, s.evictions, s.resident_pages], missed, skipped)
}

/// Skipping the repeats the device calls settled changes no miss, eviction
/// or resident page, on the whole input and on the trimmed one, for every
/// config; and for CLOCK, S3-FIFO and LFRU with hits seen it skips
/// something on the trimmed input (repeats its count keeps but the page's
/// state had settled), so the check is not idle.
#[test]
fn skipping_repeats_the_device_calls_settled_changes_no_miss_eviction_or_resident_page() {
    let accesses = runs(5, 20_000);
    let warmup = 2_500;
    let mut skipping = std::collections::BTreeSet::new();
    for cfg in configs() {
        let what = format!(
            "{:?} hits_visible={} ways={} size={} params={:?}",
            cfg.cache.policy,
            cfg.cache.hits_visible,
            cfg.cache.ways,
            cfg.cache.size_bytes,
            cfg.cache.params,
        );
        let (got, missed, _) = skipping_settled(&cfg, &accesses, warmup);
        assert_eq!(got, outcome(&cfg, &accesses, warmup), "{what}");
        assert_eq!(missed, missed_pages(&cfg, &accesses), "{what}");
        let settling = Device::new(cfg.clone()).unwrap().settling_hits();
        let t = trim(&accesses, warmup, settling);
        let (got, _, skipped) = skipping_settled(&cfg, &t.accesses, t.warmup);
        assert_eq!(got, outcome(&cfg, &accesses, warmup), "{what}, trimmed");
        if skipped > 0 && cfg.cache.hits_visible {
            skipping.insert(format!("{:?}", cfg.cache.policy));
        }
    }
    for p in ["Clock", "S3Fifo", "Lfru"] {
        assert!(skipping.contains(p), "{p} never skipped: {skipping:?}");
    }
}
