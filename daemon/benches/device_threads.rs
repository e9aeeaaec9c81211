//! One device, many VMs: what the device lock costs the trap path as the
//! threads that charge it grow from 1 to 16.
//!
//! Each thread is one VM's trap path with the call a DAX trap makes on
//! the device (`DaemonPoolBackend::on_miss`): `SharedDevice::charge_trap`
//! of one 4 KiB page read at the daemon's clock (the charge and the
//! lookup of the extent's owner, in one transaction). Each VM traps on pages of
//! its own file (2 Ki pages), chosen at random; together they are twice
//! the device cache, so nearly every charge misses and evicts, and an
//! observer takes the evictions as the DAX plane's does. No sleeping: a
//! thread charges as fast as the lock lets it (a TCG guest traps every
//! ~15 µs at most; this is the lock's ceiling, not a guest's rate).
//!
//! Per thread count: charges per second (all threads), the lock's hold
//! time (p50 / p99) and wait time (p50 / p99), and the share of the
//! threads' time spent waiting for it (summed waits over threads × wall
//! time). Scaling is against one thread. On a machine with fewer cores
//! than threads, a thread preempted while it holds the lock makes the
//! others wait for the whole preemption: the wait share there measures
//! the host, not only the critical sections. Measures and prints;
//! asserts nothing about timing. Run:
//!
//! ```sh
//! cargo bench -p cxlfsd --bench device_threads
//! ```
#![allow(clippy::unwrap_used, missing_docs)]

use cxlfs_device_model::{Device, DeviceConfig, Op};
use cxlfsd::{
    DeviceObserver, FileKey, LockTimesSnapshot, Placement, Publish, SharedDevice, EXTENT_SIZE, PAGE,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Pages each VM traps on.
const VM_PAGES: u64 = 2048;
const THREADS: [usize; 5] = [1, 2, 4, 8, 16];
/// How long each thread count runs.
const RUN: Duration = Duration::from_secs(2);

/// Takes the evictions as the DAX plane does (hands them on, never waits).
#[derive(Default)]
struct Evictions(AtomicU64);

impl DeviceObserver for Evictions {
    fn evicted(&self, pages: Vec<u64>) {
        self.0.fetch_add(pages.len() as u64, Ordering::Relaxed);
    }
    fn prefetched(&self, _pages: Vec<(u64, u64)>) {}
    fn released(&self, _key: FileKey, _extents: &[u64], _file_gone: bool) {}
    fn moved_to_cxl(&self, _old: u8, _new: u8) -> u64 {
        0
    }
}

/// A small xorshift: the page each trap touches.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

struct Point {
    threads: usize,
    charges: u64,
    wall: Duration,
    lock: LockTimesSnapshot,
}

fn run(threads: usize) -> Point {
    let cache = threads as u64 * VM_PAGES * PAGE / 2;
    let cfg = DeviceConfig::default()
        .with_overrides(&[format!("cache.size_bytes={cache}")])
        .unwrap();
    // Every pool page on the CXL-SSD tier: each charge reaches the device.
    let shared = Arc::new(SharedDevice::with_placement(
        Device::new(cfg).unwrap(),
        Placement::new(100).unwrap(),
    ));
    let observer: Arc<dyn DeviceObserver> = Arc::new(Evictions::default());
    shared.subscribe(Arc::downgrade(&observer));
    // Each VM's file gets its extents in the pool, as a first map would.
    let bases: Vec<Vec<u64>> = (0..threads as u64)
        .map(|vm| {
            let key = FileKey {
                dev: 1,
                ino: vm + 1,
            };
            shared
                .transact(Publish::Hand, |pool, _| {
                    pool.acquire(key);
                    pool.segments(key, 0, VM_PAGES * PAGE)
                        .iter()
                        .map(|s| s.addr)
                        .collect()
                })
                .0
        })
        .collect();
    let start = Barrier::new(threads + 1);
    let total = AtomicU64::new(0);
    shared.reset_lock_times();
    let wall = std::thread::scope(|s| {
        for (vm, extents) in bases.iter().enumerate() {
            let (shared, start, total) = (&shared, &start, &total);
            s.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15 ^ (vm as u64 + 1);
                let mut n = 0u64;
                start.wait();
                let until = Instant::now() + RUN;
                while Instant::now() < until {
                    for _ in 0..64 {
                        let page = next(&mut x) % VM_PAGES;
                        let addr = extents[(page * PAGE / EXTENT_SIZE) as usize]
                            + page * PAGE % EXTENT_SIZE;
                        let c = shared.charge_trap(shared.now_ns(), Op::Read, addr, PAGE as u32);
                        std::hint::black_box(c.unwrap());
                        n += 1;
                    }
                }
                total.fetch_add(n, Ordering::Relaxed);
            });
        }
        start.wait();
        let t0 = Instant::now();
        // The scope joins every thread before it returns.
        t0
    });
    let wall = wall.elapsed();
    Point {
        threads,
        charges: total.load(Ordering::Relaxed),
        wall,
        lock: shared.lock_times(),
    }
}

fn main() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "device_threads: one device, N VMs' trap paths (charge_trap of a 4 KiB read), {} s each, {cores} cores",
        RUN.as_secs()
    );
    println!(
        "{:>7} {:>12} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "threads",
        "charges/s",
        "scaling",
        "hold p50",
        "hold p99",
        "wait p50",
        "wait p99",
        "wait %",
        "takes/ch"
    );
    let mut one = None;
    for threads in THREADS {
        let p = run(threads);
        let rate = p.charges as f64 / p.wall.as_secs_f64();
        let base = *one.get_or_insert(rate);
        let waited = p.lock.wait_ns_total as f64 / (p.threads as f64 * p.wall.as_nanos() as f64);
        println!(
            "{:>7} {:>12.0} {:>7.2}x {:>8} ns {:>8} ns {:>8} ns {:>8} ns {:>9.1}% {:>8.2}",
            p.threads,
            rate,
            rate / base,
            p.lock.hold_p50_ns,
            p.lock.hold_p99_ns,
            p.lock.wait_p50_ns,
            p.lock.wait_p99_ns,
            100.0 * waited,
            p.lock.acquisitions as f64 / p.charges.max(1) as f64,
        );
    }
}
