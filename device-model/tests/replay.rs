//! The replay driver: arrival modes, reports, errors, determinism; the
//! look-ahead loop (`run`, `try_run`, `drive`) against one access at a time.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use cxlfs_device_model::replay::{
    Arrival, ReplayError, ReplayObserver, Replayer, RunError, PROGRESS_EVERY,
};
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

/// Feeds `accesses` one at a time, resetting after `warmup`: no look-ahead.
fn one_at_a_time(dev: &mut Device, arrival: Arrival, accesses: &[Access], warmup: usize) -> String {
    let mut r = Replayer::new(dev, arrival);
    for (i, a) in accesses.iter().enumerate() {
        if i == warmup {
            r.reset_stats();
        }
        r.feed(*a).unwrap();
    }
    serde_json::to_string(&r.report()).unwrap()
}

#[test]
fn the_look_ahead_loop_reports_what_one_access_at_a_time_does() {
    let mut spec = workload("zipf:0.8", 8 << 20, 20_000);
    spec.write_ratio = 0.3;
    let mut accesses: Vec<Access> = spec.generate().unwrap().collect();
    for (i, a) in accesses.iter_mut().enumerate() {
        a.time_ns = i as u64 * 30;
    }
    for policy in cxlfs_device_model::PolicyKind::ALL {
        for arrival in [
            Arrival::Closed { think_ns: 0 },
            Arrival::Fixed { interval_ns: 50 },
            Arrival::Trace,
        ] {
            let setting = format!("cache.policy={policy}");
            let what = format!("{policy} {arrival}");
            let want = one_at_a_time(&mut device(&[&setting]), arrival, &accesses, 0);
            let mut dev = device(&[&setting]);
            let mut r = Replayer::new(&mut dev, arrival);
            r.run(accesses.iter().copied()).unwrap();
            assert_eq!(
                serde_json::to_string(&r.report()).unwrap(),
                want,
                "{what}: run"
            );
            // drive, with and without a warm-up, over a fallible input.
            for warmup in [0, 7_000] {
                let want = one_at_a_time(&mut device(&[&setting]), arrival, &accesses, warmup);
                let mut dev = device(&[&setting]);
                let mut r = Replayer::new(&mut dev, arrival);
                let input = accesses.iter().map(|a| Ok::<Access, String>(*a));
                assert_eq!(r.drive(input, warmup as u64, &mut ()).unwrap(), 20_000);
                let got = serde_json::to_string(&r.report()).unwrap();
                assert_eq!(got, want, "{what}: drive, warm-up {warmup}");
            }
        }
    }
}

#[test]
fn an_input_error_stops_the_loop_after_the_accesses_before_it() {
    let mut dev = device(&[]);
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    // Fewer accesses than the window, then more than it, before the error.
    for (good, total) in [(3u64, 3u64), (100, 103)] {
        let input = (0..200u64).map(|i| {
            if i == good {
                Err(format!("bad record {i}"))
            } else {
                Ok(read(0, i * 4096))
            }
        });
        match r.try_run(input) {
            Err(RunError::Input { index, error }) => {
                assert_eq!(
                    (index, error.as_str()),
                    (total, format!("bad record {good}").as_str())
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.fed(), total);
    }
    assert_eq!(r.report().accesses, 103);
    // A device error in the window comes before a later input error.
    let mut dev = device(&[]);
    let capacity = dev.capacity_bytes();
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    let input = [
        Ok(read(0, 0)),
        Ok(read(0, capacity)),
        Ok(read(0, 64)),
        Err("late"),
    ];
    match r.try_run(input) {
        Err(RunError::Replay(ReplayError::Device { index: 1, .. })) => {}
        other => panic!("{other:?}"),
    }
}

#[derive(Default)]
struct Calls {
    measuring_at: Vec<u64>,
    progress: Vec<u64>,
}

impl ReplayObserver for Calls {
    fn measuring(&mut self) {
        self.measuring_at
            .push(self.progress.last().copied().unwrap_or(0));
    }

    fn progress(&mut self, fed: u64) {
        self.progress.push(fed);
    }
}

#[test]
fn drive_warms_up_then_measures_and_reports_progress() {
    let mut dev = device(&[]);
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    let mut calls = Calls::default();
    let gen = workload("uniform", 64 << 20, 200_000).generate().unwrap();
    let fed = r
        .drive(gen.map(Ok::<Access, String>), 70_000, &mut calls)
        .unwrap();
    assert_eq!(fed, 200_000);
    assert_eq!(calls.measuring_at, [0]);
    // Every PROGRESS_EVERY accesses, counted from the start, and at the end.
    assert_eq!(PROGRESS_EVERY, 65_536);
    assert_eq!(calls.progress, [131_072, 196_608, 200_000]);
    assert_eq!(r.report().accesses, 130_000);
    // An input that ends within the warm-up: nothing reset, nothing measured.
    let mut dev = device(&[]);
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    let mut calls = Calls::default();
    let gen = workload("uniform", 64 << 20, 500).generate().unwrap();
    assert_eq!(
        r.drive(gen.map(Ok::<Access, String>), 1_000, &mut calls)
            .unwrap(),
        500
    );
    assert!(calls.measuring_at.is_empty() && calls.progress.is_empty());
    assert_eq!(r.report().accesses, 500);
}

#[test]
fn a_replay_whose_misses_mostly_coalesce_says_so() {
    // 16 pages read 8 times each, all at t = 0.
    let accesses: Vec<Access> = (0..128u64).map(|i| read(0, (i % 16) * 4096)).collect();
    let mut dev = device(&[]);
    let mut r = Replayer::new(&mut dev, Arrival::Trace);
    r.run(accesses.iter().copied()).unwrap();
    let note = r.coalescing_note().unwrap();
    assert_eq!(
        (note.accesses, note.misses, note.coalesced),
        (128, 128, 112)
    );
    assert_eq!((note.first_arrival_ns, note.last_arrival_ns), (0, 0));
    let text = note.to_string();
    assert!(
        text.starts_with("112 of 128 misses (87.5 %) joined a fill already in flight: all 128 accesses arrive at t = 0 ns (arrival trace)"),
        "{text}"
    );
    // Open loop faster than the fills: said, with the rate.
    let mut dev = device(&[]);
    let mut r = Replayer::new(&mut dev, Arrival::Fixed { interval_ns: 10 });
    r.run(accesses.iter().copied()).unwrap();
    let text = r.coalescing_note().unwrap().to_string();
    assert!(
        text.contains("arrive within 1270 ns, one every 10.0 ns"),
        "{text}"
    );
    // Closed loop never; spread-out arrivals have nothing to say.
    let mut dev = device(&[]);
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    r.run(accesses.iter().copied()).unwrap();
    assert_eq!(r.coalescing_note(), None);
    let spread: Vec<Access> = (0..128u64)
        .map(|i| read(i * 1_000_000, (i % 16) * 4096))
        .collect();
    let mut dev = device(&[]);
    let mut r = Replayer::new(&mut dev, Arrival::Trace);
    r.run(spread).unwrap();
    assert_eq!(r.coalescing_note(), None);
}
