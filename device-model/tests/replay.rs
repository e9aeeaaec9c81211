//! The replay driver: arrival modes, reports, errors, determinism.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use cxlfs_device_model::replay::{Arrival, ReplayError, Replayer};
use cxlfs_device_model::trace::Access;
use cxlfs_device_model::workload::WorkloadSpec;
use cxlfs_device_model::{AccessError, Device, Op};

fn device(overrides: &[&str]) -> Device {
    let mut all = vec!["cache.size_bytes=1MiB", "cache.policy=fifo"];
    all.extend_from_slice(overrides);
    let cfg = cxlfs_device_model::presets::preset("femu")
        .unwrap()
        .with_overrides(&all)
        .unwrap();
    Device::new(cfg).unwrap()
}

fn read(time_ns: u64, addr: u64) -> Access {
    Access {
        time_ns,
        op: Op::Read,
        addr,
        len: 64,
    }
}

fn workload(kind: &str, wss: u64, accesses: u64) -> WorkloadSpec {
    WorkloadSpec {
        kind: kind.parse().unwrap(),
        wss_bytes: wss,
        accesses: Some(accesses),
        ..WorkloadSpec::default()
    }
}

#[test]
fn closed_loop_issues_after_completion_plus_think() {
    let mut dev = device(&[]);
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 1000 });
    let first = r.feed(read(0, 0)).unwrap();
    assert!(!first.hit);
    // The second access (same page) is issued after the first completed: a hit.
    let second = r.feed(read(0, 64)).unwrap();
    assert!(second.hit);
    assert_eq!(
        second.completes_at_ns - second.latency_ns,
        first.completes_at_ns + 1000
    );
    let rep = r.report();
    assert_eq!(rep.accesses, 2);
    assert_eq!((rep.hits, rep.misses), (1, 1));
    assert_eq!(rep.sim_time_ns, second.completes_at_ns);
}

#[test]
fn fixed_interval_is_open_loop() {
    let mut dev = device(&[]);
    let mut r = Replayer::new(&mut dev, Arrival::Fixed { interval_ns: 10 });
    let first = r.feed(read(0, 0)).unwrap();
    // Arrives at 10 ns, while the fill is in flight: it waits for it (coalesced).
    let second = r.feed(read(999_999, 64)).unwrap();
    assert_eq!(second.completes_at_ns - second.latency_ns, 10);
    assert!(!second.hit);
    assert_eq!(second.coalesced, 1);
    assert!(second.completes_at_ns >= first.completes_at_ns);
}

#[test]
fn trace_times_are_used_and_must_not_decrease() {
    let mut dev = device(&[]);
    let mut r = Replayer::new(&mut dev, Arrival::Trace);
    let a = r.feed(read(500, 0)).unwrap();
    assert_eq!(a.completes_at_ns - a.latency_ns, 500);
    r.feed(read(500, 64)).unwrap();
    let err = r.feed(read(499, 128)).unwrap_err();
    assert_eq!(
        err,
        ReplayError::TimeWentBackwards {
            index: 2,
            time_ns: 499,
            previous_ns: 500
        }
    );
    assert_eq!(err.index(), 2);
    assert!(err.to_string().contains("access 2"), "{err}");
}

#[test]
fn device_errors_carry_the_access_index() {
    let mut dev = device(&[]);
    let capacity = dev.capacity_bytes();
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    let accesses = vec![read(0, 0), read(0, 4096), read(0, capacity - 32)];
    let err = r.run(accesses).unwrap_err();
    match &err {
        ReplayError::Device {
            index: 2,
            error: AccessError::OutOfRange { capacity: c, .. },
        } => assert_eq!(*c, capacity),
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("access 2") && msg.contains(&capacity.to_string()),
        "{msg}"
    );
}

#[test]
fn report_counts_and_latency_summary() {
    let mut dev = device(&["nand.enabled=false"]);
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    // 16 pages, each touched 4 times in a row: 16 misses, 48 hits.
    let n = r
        .run(workload("stride:1024", 64 << 10, 64).generate().unwrap())
        .unwrap();
    assert_eq!(n, 64);
    let rep = r.report();
    assert_eq!(rep.accesses, 64);
    assert_eq!((rep.reads, rep.writes), (64, 0));
    assert_eq!((rep.hits, rep.misses), (48, 16));
    assert_eq!(rep.access_hits, 48);
    assert!((rep.hit_rate - 0.75).abs() < 1e-12);
    assert_eq!(rep.nand.reads, 16);
    let l = &rep.latency_ns;
    assert!(l.min <= l.p50 && l.p50 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.p999);
    assert!(l.p999 <= l.max + l.max / 500);
    assert!(l.mean > l.min as f64 && l.mean < l.max as f64);
    // 75 % hits: the median is a hit, the p90 a miss.
    assert!(l.p50 < 1000 && l.p90 > 10_000, "{l:?}");
    assert_eq!(r.histogram().len(), 64);
    let json = serde_json::to_value(&rep).unwrap();
    for key in [
        "accesses",
        "hits",
        "misses",
        "hit_rate",
        "sim_time_ns",
        "policy",
    ] {
        assert!(json.get(key).is_some(), "{key}");
    }
    for key in ["p50", "p90", "p99", "p999", "mean", "max"] {
        assert!(json["latency_ns"].get(key).is_some(), "{key}");
    }
    for key in [
        "reads",
        "programs",
        "erases",
        "gc_runs",
        "write_amplification",
    ] {
        assert!(json["nand"].get(key).is_some(), "{key}");
    }
    for key in ["issued", "used", "wasted"] {
        assert!(json["prefetch"].get(key).is_some(), "{key}");
    }
}

#[test]
fn reset_after_warmup_measures_only_the_rest() {
    let mut dev = device(&[]);
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    let mut gen = workload("seq", 256 << 10, 8192).generate().unwrap();
    r.run(gen.by_ref().take(4096)).unwrap();
    r.reset_stats();
    r.run(gen).unwrap();
    let rep = r.report();
    assert_eq!(rep.accesses, 4096);
    assert_eq!(rep.misses, 0);
    assert_eq!(rep.hit_rate, 1.0);
    assert_eq!(rep.nand.reads, 0);
    assert_eq!(r.fed(), 8192);
}

#[test]
fn identical_inputs_give_identical_reports() {
    let run = || {
        let mut dev = device(&["cache.policy=lru"]);
        let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
        let mut spec = workload("zipf:0.9", 16 << 20, 50_000);
        spec.write_ratio = 0.2;
        r.run(spec.generate().unwrap()).unwrap();
        serde_json::to_string(&r.report()).unwrap()
    };
    assert_eq!(run(), run());
}
