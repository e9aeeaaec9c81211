//! What waking a thread costs on this host, with no VM and no FUSE: the
//! floor under every hop of a trap's path (a fault's FUSE request wakes a
//! ring worker, the pacer's release wakes the faulting vCPU thread, ...).
//!
//! (a) a cross-CPU hand-off: two threads pinned to the first two CPUs
//!     wake each other in turn (`thread::park` / `unpark`, a futex), the
//!     round trip timed (two wake-ups);
//! (b) a 50 µs sleep's overshoot (`thread::sleep`), at the host's default
//!     policy and under `SCHED_FIFO` (as `cxlfsd --realtime-priority` runs
//!     its threads; skipped without CAP_SYS_NICE);
//! (c) what a thread that never sleeps loses: pinned to each CPU in turn,
//!     it reads the clock in a loop, and every gap over 2 µs between two
//!     reads is time the host took the CPU away (its interrupts, its
//!     hypervisor). Printed per CPU and policy: the share of time lost,
//!     gaps a second of at least 10 / 20 / 50 / 100 µs, and the share of
//!     40 µs windows (a 40 µs NAND read's miss) that overlap one gap of
//!     at least 20 / 50 µs: a miss that meets one is slower by that much,
//!     whatever the daemon does.
//!
//! Quantiles p50 / p90 / p99 / p99.9 / max in µs. The spread between p50
//! and p99 of one wake-up is what a miss's p99 pays per hop on top of its
//! median. Measures and prints; asserts nothing. Run: `cargo bench -p
//! cxlfs-residency --bench host_wake` (`HOST_WAKE_ROUNDS=100000` sets the
//! hand-offs, a fifth of that the sleeps; `HOST_WAKE_SPIN_S=2` the seconds
//! of (c) per CPU and policy).
#![allow(clippy::unwrap_used, missing_docs)]

use rustix::thread::{sched_setaffinity, CpuSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

fn pin(cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu);
    if let Err(e) = sched_setaffinity(None, &set) {
        eprintln!("cannot pin to CPU {cpu}: {e}");
    }
}

/// `SCHED_FIFO` at priority 5 for the calling thread; false without the
/// privilege.
fn realtime() -> bool {
    let param = libc::sched_param { sched_priority: 5 };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0
    // is the calling thread.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 }
}

fn line(what: &str, mut ns: Vec<u64>) {
    ns.sort_unstable();
    let q = |p: f64| ns[((ns.len() - 1) as f64 * p) as usize] as f64 / 1e3;
    println!(
        "{what:<44} p50 {:>7.1}  p90 {:>7.1}  p99 {:>7.1}  p99.9 {:>7.1}  max {:>8.1}  (n = {})",
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999),
        q(1.0),
        ns.len()
    );
}

/// Round trips of a hand-off between threads on CPUs 0 and 1, measured
/// on a thread of its own (so that `SCHED_FIFO` stays with it).
fn hand_off(rounds: usize, fifo: bool) -> Option<Vec<u64>> {
    thread::spawn(move || hand_off_here(rounds, fifo))
        .join()
        .ok()
        .flatten()
}

fn hand_off_here(rounds: usize, fifo: bool) -> Option<Vec<u64>> {
    // Even: the peer's turn; odd: ours.
    let turn = Arc::new(AtomicU64::new(1));
    let me = thread::current();
    let peer_turn = turn.clone();
    let peer = thread::spawn(move || {
        pin(1);
        if fifo && !realtime() {
            return;
        }
        for i in 0..rounds as u64 {
            while peer_turn.load(Ordering::Acquire) != 2 * i + 2 {
                thread::park();
            }
            peer_turn.store(2 * i + 3, Ordering::Release);
            me.unpark();
        }
    });
    pin(0);
    if fifo && !realtime() {
        let _ = peer.join();
        return None;
    }
    let mut out = Vec::with_capacity(rounds);
    for i in 0..rounds as u64 {
        let t = Instant::now();
        turn.store(2 * i + 2, Ordering::Release);
        peer.thread().unpark();
        while turn.load(Ordering::Acquire) != 2 * i + 3 {
            thread::park();
        }
        out.push(t.elapsed().as_nanos() as u64);
    }
    peer.join().ok()?;
    Some(out)
}

/// How much later than asked `rounds` sleeps of 50 µs wake.
fn sleep_overshoot(rounds: usize) -> Vec<u64> {
    let want = Duration::from_micros(50);
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            thread::sleep(want);
            t.elapsed().saturating_sub(want).as_nanos() as u64
        })
        .collect()
}

/// The gaps over [`GAP_NS`] a thread pinned to `cpu` sees between two
/// clock reads in `secs` seconds of reading, and the time it read for
/// (gap starts on that reading time's axis). It reads in slices of
/// [`SLICE_NS`] with a 10 ms sleep between them: a `SCHED_FIFO` thread
/// that never sleeps would meet the kernel's real-time throttling (50 ms a
/// second), which no daemon thread does.
fn spin_gaps(cpu: usize, secs: f64, fifo: bool) -> Option<(Vec<(u64, u64)>, u64)> {
    thread::spawn(move || {
        pin(cpu);
        if fifo && !realtime() {
            return None;
        }
        let end = (secs * 1e9) as u64;
        let mut gaps = Vec::new();
        let mut read = 0u64;
        while read < end {
            let start = Instant::now();
            let mut prev = 0u64;
            while prev < SLICE_NS {
                let t = start.elapsed().as_nanos() as u64;
                if t - prev > GAP_NS {
                    gaps.push((read + prev, t - prev));
                }
                prev = t;
            }
            read += prev;
            thread::sleep(Duration::from_millis(10));
        }
        Some((gaps, read))
    })
    .join()
    .ok()
    .flatten()
}

/// A gap between two clock reads longer than this is time lost.
const GAP_NS: u64 = 2_000;

/// One slice of reading the clock.
const SLICE_NS: u64 = 100_000_000;

/// The share of windows of `window_ns` in `total_ns` that overlap a gap
/// of at least `min_ns` (`gaps` in time order, as (start, length)).
fn windows_hit(gaps: &[(u64, u64)], window_ns: u64, min_ns: u64, total_ns: u64) -> f64 {
    let mut covered = 0u64;
    let mut reach = 0u64;
    for &(start, len) in gaps.iter().filter(|g| g.1 >= min_ns) {
        let (from, to) = (start.saturating_sub(window_ns).max(reach), start + len);
        covered += to.saturating_sub(from);
        reach = reach.max(to);
    }
    covered as f64 / total_ns.max(1) as f64
}

fn spin_line(cpu: usize, secs: f64, fifo: bool) {
    let policy = if fifo { "SCHED_FIFO" } else { "default policy" };
    let Some((gaps, total)) = spin_gaps(cpu, secs, fifo) else {
        println!("(c) CPU {cpu}, {policy}: not permitted here");
        return;
    };
    let lost: u64 = gaps.iter().map(|g| g.1).sum();
    let per_s = |min: u64| gaps.iter().filter(|g| g.1 >= min).count() as f64 * 1e9 / total as f64;
    let hit = |min: u64| 100.0 * windows_hit(&gaps, 40_000, min, total);
    println!(
        "(c) CPU {cpu}, {policy:<14} lost {:>5.2} %  gaps/s >= 10 µs {:>6.1}  >= 20 {:>6.1}  >= 50 {:>5.1}  >= 100 {:>5.1}  max {:>7.1} µs  40 µs windows hit by >= 20 µs {:>5.2} %, >= 50 µs {:>5.2} %",
        100.0 * lost as f64 / total as f64,
        per_s(10_000),
        per_s(20_000),
        per_s(50_000),
        per_s(100_000),
        gaps.iter().map(|g| g.1).max().unwrap_or(0) as f64 / 1e3,
        hit(20_000),
        hit(50_000),
    );
}

fn main() {
    let rounds: usize = std::env::var("HOST_WAKE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
        .max(100);
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "host_wake: {cpus} CPUs, {rounds} hand-offs, {} sleeps, µs",
        rounds / 5
    );
    if cpus >= 2 {
        line(
            "(a) hand-off CPU 0 -> 1 -> 0, default policy",
            hand_off(rounds, false).unwrap_or_default(),
        );
        match hand_off(rounds, true) {
            Some(v) => line("(a) hand-off CPU 0 -> 1 -> 0, SCHED_FIFO", v),
            None => println!("(a) SCHED_FIFO: not permitted here"),
        }
    } else {
        println!("(a) needs two CPUs");
    }
    // On its own thread, so that SCHED_FIFO stays with it.
    let default = thread::spawn(move || sleep_overshoot(rounds / 5))
        .join()
        .unwrap();
    line("(b) 50 µs sleep, overshoot, default policy", default);
    let fifo = thread::spawn(move || realtime().then(|| sleep_overshoot(rounds / 5)))
        .join()
        .unwrap();
    match fifo {
        Some(v) => line("(b) 50 µs sleep, overshoot, SCHED_FIFO", v),
        None => println!("(b) SCHED_FIFO: not permitted here"),
    }
    let secs: f64 = std::env::var("HOST_WAKE_SPIN_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2.0);
    for cpu in 0..cpus.min(2) {
        for fifo in [false, true] {
            spin_line(cpu, secs, fifo);
        }
    }
}
