//! Synthetic workload generators: determinism, bounds, coverage, skew.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use cxlfs_device_model::trace::Access;
use cxlfs_device_model::workload::{BuildWorkloadError, Permutation, WorkloadKind, WorkloadSpec};
use cxlfs_device_model::{Op, PAGE_SIZE};
use std::collections::HashMap;

fn spec(kind: &str, wss: u64) -> WorkloadSpec {
    WorkloadSpec {
        kind: kind.parse().unwrap(),
        wss_bytes: wss,
        ..WorkloadSpec::default()
    }
}

fn collect(spec: &WorkloadSpec) -> Vec<Access> {
    spec.generate().unwrap().collect()
}

const KINDS: [&str; 5] = [
    "seq",
    "stride:1KiB",
    "uniform",
    "zipf:0.99",
    "pointer-chase",
];

#[test]
fn same_seed_same_sequence_different_seed_different() {
    for kind in KINDS {
        let mut s = spec(kind, 1 << 20);
        s.accesses = Some(5000);
        s.write_ratio = 0.3;
        let a = collect(&s);
        assert_eq!(a.len(), 5000);
        assert_eq!(a, collect(&s), "{kind}");
        s.seed = 2;
        let b = collect(&s);
        assert_ne!(a, b, "{kind}: seed 2 gave the same sequence");
        assert!(a.iter().all(|x| x.time_ns == 0));
    }
}

#[test]
fn addresses_stay_in_the_working_set_and_aligned() {
    for kind in KINDS {
        for (access_size, wss) in [
            (64u32, 1u64 << 20),
            (4096, 1 << 22),
            (256, 3 << 12),
            (8192, 1 << 20),
            (64, 1000),
        ] {
            let mut s = spec(kind, wss);
            s.access_size = access_size;
            s.base_addr = 1 << 30;
            if let WorkloadKind::Stride { .. } = s.kind {
                s.kind = WorkloadKind::Stride {
                    step: u64::from(access_size) * 3,
                };
            }
            s.accesses = Some(20_000);
            for a in s.generate().unwrap() {
                let off = a.addr - s.base_addr;
                assert!(a.addr >= s.base_addr, "{kind}");
                assert!(
                    off + u64::from(a.len) <= wss,
                    "{kind} {access_size} {wss}: {off:#x}"
                );
                assert_eq!(
                    off % u64::from(access_size),
                    0,
                    "{kind}: {off:#x} unaligned"
                );
                assert_eq!(a.len, access_size);
                // Accesses no larger than a page never straddle one.
                if access_size as u64 <= PAGE_SIZE {
                    assert_eq!(
                        off / PAGE_SIZE,
                        (off + u64::from(a.len) - 1) / PAGE_SIZE,
                        "{kind}"
                    );
                }
            }
        }
    }
}

#[test]
fn seq_walks_and_wraps() {
    let mut s = spec("seq", 4096);
    s.passes = 2;
    let addrs: Vec<u64> = collect(&s).iter().map(|a| a.addr).collect();
    let one: Vec<u64> = (0..64).map(|i| i * 64).collect();
    assert_eq!(addrs, [one.clone(), one].concat());
}

#[test]
fn stride_lap_touches_each_page_four_times_then_covers_every_slot() {
    let s = spec("stride:1024", 1 << 20);
    assert_eq!(s.accesses_per_pass(), 1024);
    let lap = collect(&s);
    assert_eq!(lap.len(), 1024);
    for (i, a) in lap.iter().enumerate() {
        assert_eq!(a.addr, i as u64 * 1024);
    }
    // 1024 / 64 = 16 laps cover every 64-byte slot exactly once.
    let mut all = spec("stride:1KiB", 1 << 20);
    all.passes = 16;
    let mut slots: Vec<u64> = collect(&all).iter().map(|a| a.addr / 64).collect();
    assert_eq!(slots.len(), 16 * 1024);
    slots.sort_unstable();
    assert!(slots.iter().enumerate().all(|(i, s)| *s == i as u64));
    // The second lap starts one slot in.
    assert_eq!(collect(&all)[1024].addr, 64);
}

#[test]
fn stride_larger_than_the_working_set_still_covers_it() {
    let mut s = spec("stride:8KiB", 4096);
    s.access_size = 1024;
    s.accesses = Some(8);
    let addrs: Vec<u64> = collect(&s).iter().map(|a| a.addr).collect();
    assert_eq!(addrs, [0, 1024, 2048, 3072, 0, 1024, 2048, 3072]);
}

#[test]
fn pointer_chase_visits_every_slot_once_per_pass() {
    let mut s = spec("pointer-chase", 1 << 20);
    s.passes = 3;
    let per_pass = s.accesses_per_pass();
    assert_eq!(per_pass, (1 << 20) / 64);
    let all = collect(&s);
    assert_eq!(all.len() as u64, 3 * per_pass);
    for pass in all.chunks(per_pass as usize) {
        let mut seen = vec![false; per_pass as usize];
        for a in pass {
            let slot = (a.addr / 64) as usize;
            assert!(!seen[slot], "slot {slot} twice in a pass");
            seen[slot] = true;
        }
    }
    // Not a sequential or constant-stride walk.
    let steps: std::collections::HashSet<i64> = all[..1000]
        .windows(2)
        .map(|w| w[1].addr as i64 - w[0].addr as i64)
        .collect();
    assert!(steps.len() > 900, "only {} distinct steps", steps.len());
}

#[test]
fn uniform_covers_pages_evenly() {
    let mut s = spec("uniform", 256 * 4096);
    s.accesses = Some(256_000);
    let mut counts = vec![0u32; 256];
    for a in s.generate().unwrap() {
        counts[(a.addr / 4096) as usize] += 1;
    }
    let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    assert!(*min > 800 && *max < 1200, "min {min} max {max}");
    assert_eq!(s.accesses_per_pass(), 256);
}

#[test]
fn zipf_is_skewed_and_scattered() {
    let pages = 10_000u64;
    let mut s = spec("zipf:0.99", pages * 4096);
    s.accesses = Some(200_000);
    let mut counts: HashMap<u64, u64> = HashMap::new();
    for a in s.generate().unwrap() {
        *counts.entry(a.addr / 4096).or_default() += 1;
    }
    let mut by_count: Vec<(u64, u64)> = counts.iter().map(|(p, c)| (*c, *p)).collect();
    by_count.sort_unstable_by(|a, b| b.cmp(a));
    let top: u64 = by_count
        .iter()
        .take((pages / 100) as usize)
        .map(|(c, _)| c)
        .sum();
    let share = top as f64 / 200_000.0;
    assert!(
        share > 0.25,
        "top 1 % of pages got only {share:.3} of accesses"
    );
    // The hottest pages are not packed at the start of the working set.
    let hottest: Vec<u64> = by_count.iter().take(10).map(|(_, p)| *p).collect();
    assert!(hottest.iter().any(|p| *p > pages / 10), "{hottest:?}");
    // Theta 0 is uniform.
    let mut flat = spec("zipf:0", pages * 4096);
    flat.accesses = Some(200_000);
    let mut counts: HashMap<u64, u64> = HashMap::new();
    for a in flat.generate().unwrap() {
        *counts.entry(a.addr / 4096).or_default() += 1;
    }
    let max = counts.values().max().unwrap();
    assert!(*max < 60, "theta 0 hottest page got {max}");
}

#[test]
fn write_ratio_is_honoured_and_does_not_move_addresses() {
    for ratio in [0.0, 0.1, 0.5, 0.9, 1.0] {
        let mut s = spec("uniform", 1 << 24);
        s.accesses = Some(100_000);
        s.write_ratio = ratio;
        let accesses = collect(&s);
        let writes = accesses.iter().filter(|a| a.op == Op::Write).count() as f64;
        let got = writes / 100_000.0;
        assert!((got - ratio).abs() < 0.01, "ratio {ratio}: got {got}");
        let mut reads_only = s.clone();
        reads_only.write_ratio = 0.0;
        let a: Vec<u64> = accesses.iter().map(|a| a.addr).collect();
        let b: Vec<u64> = collect(&reads_only).iter().map(|a| a.addr).collect();
        assert_eq!(a, b);
    }
}

#[test]
fn default_access_counts() {
    let mut s = spec("uniform", 1 << 30);
    assert_eq!(s.total_accesses(), (1 << 30) / 4096);
    s.passes = 3;
    assert_eq!(s.total_accesses(), 3 * (1 << 30) / 4096);
    s.accesses = Some(7);
    assert_eq!(s.total_accesses(), 7);
    assert_eq!(s.generate().unwrap().count(), 7);
    assert_eq!(spec("seq", 1 << 20).total_accesses(), (1 << 20) / 64);
    assert_eq!(
        spec("pointer-chase", 1 << 20).total_accesses(),
        (1 << 20) / 64
    );
    assert_eq!(spec("stride:4KiB", 1 << 20).total_accesses(), 256);
    assert_eq!(spec("zipf:0.5", 1 << 20).total_accesses(), 256);
}

#[test]
fn bad_specs_are_refused() {
    let mut s = spec("uniform", 1 << 20);
    s.write_ratio = 1.5;
    assert_eq!(
        s.generate().unwrap_err(),
        BuildWorkloadError::BadWriteRatio(1.5)
    );
    let mut s = spec("uniform", 32);
    assert!(matches!(
        s.generate(),
        Err(BuildWorkloadError::WssTooSmall { .. })
    ));
    s.access_size = 0;
    assert_eq!(
        s.generate().unwrap_err(),
        BuildWorkloadError::BadAccessSize(0)
    );
    let s = spec("stride:32", 1 << 20);
    assert!(matches!(
        s.generate(),
        Err(BuildWorkloadError::StrideTooSmall { .. })
    ));
    let mut s = spec("seq", 1 << 20);
    s.base_addr = u64::MAX - 10;
    assert!(matches!(
        s.generate(),
        Err(BuildWorkloadError::Overflow { .. })
    ));
}

#[test]
fn permutation_is_a_bijection_for_awkward_sizes() {
    for n in [1u64, 2, 5, 64, 65, 1 << 16, (1 << 16) + 1, 100_003] {
        for seed in [0, 1, 99] {
            let p = Permutation::new(n, seed);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let j = p.apply(i) as usize;
                assert!(!seen[j]);
                seen[j] = true;
            }
        }
    }
    assert_ne!(
        (0..100)
            .map(|i| Permutation::new(1000, 1).apply(i))
            .collect::<Vec<_>>(),
        (0..100)
            .map(|i| Permutation::new(1000, 2).apply(i))
            .collect::<Vec<_>>()
    );
}

#[test]
fn generation_is_fast_enough() {
    // A smoke check in debug builds; the real figure is in the benchmark.
    let mut s = spec("uniform", 16 << 30);
    s.accesses = Some(1_000_000);
    let sum: u64 = s.generate().unwrap().map(|a| a.addr & 1).sum();
    assert_eq!(sum, 0);
}
