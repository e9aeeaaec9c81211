//! What waking a thread costs on this host, with no VM and no FUSE: the
//! floor under every hop of a trap's path (a fault's FUSE request wakes a
//! ring worker, the pacer's release wakes the faulting vCPU thread, ...).
//!
//! (a) a cross-CPU hand-off: two threads pinned to the first two CPUs
//!     wake each other in turn (`thread::park` / `unpark`, a futex), the
//!     round trip timed (two wake-ups);
//! (b) a 50 µs sleep's overshoot (`thread::sleep`), at the host's default
//!     policy and under `SCHED_FIFO` (as `cxlfsd --realtime-priority` runs
//!     its threads; skipped without CAP_SYS_NICE).
//!
//! Quantiles p50 / p90 / p99 / p99.9 / max in µs. The spread between p50
//! and p99 of one wake-up is what a miss's p99 pays per hop on top of its
//! median. Measures and prints; asserts nothing. Run: `cargo bench -p
//! cxlfs-residency --bench host_wake` (`HOST_WAKE_ROUNDS=100000` sets the
//! hand-offs, a fifth of that the sleeps).
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
}
