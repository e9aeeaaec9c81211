//! Microbenchmarks of the FUSE residency plane without a VM: this process
//! maps the pool file `MAP_SHARED` as a VMM would, and serves it too.
//!
//! (a) hit latency through the pool vs a plain shared-memory (memfd) page;
//! (b) the miss-path floor (modeled latency 0): first touch → FUSE_READ →
//!     mapped, with the time split into kernel → server, server, and
//!     server → kernel → mapped;
//! (c) achieved vs modeled miss latency with NAND reads of 3, 20, 40 µs,
//!     latency compensation off and auto side by side (interleaved rounds;
//!     `POOL_LATENCY_COMPENSATION=off,auto,12us` picks the modes,
//!     `POOL_LATENCY_ROUNDS=3` the rounds; medians over the rounds);
//! (d) the cost of NOTIFY_STORE and NOTIFY_INVAL_INODE.
//!
//! Measures and prints; asserts nothing. Run: `cargo bench -p cxlfs-residency
//! --bench pool_latency` (root, `/dev/fuse`).
#![allow(clippy::unwrap_used, missing_docs)]

use residency::pace::Compensation;
use residency::{
    FusePoolPlane, Miss, MissData, MissReply, PlaneOptions, PoolBackend, ReaderMode,
    ResidencyPlane, ServeMissError, Transport, WritebackError, PAGE_SIZE,
};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const POOL: u64 = 1 << 30;
/// Pool bytes [0, CHASE_MAX) hold the pointer-chase rings.
const CHASE_MAX: u64 = 64 << 20;
/// Pointer-chase rings: (pages, offset in the pool): 256 KiB (fits the
/// first-level TLB), 16 MiB, 44 MiB (beyond the second-level TLB's reach).
const RINGS: [(usize, usize); 3] = [(64, 0), (4096, 1 << 20), (11264, 20 << 20)];
/// Misses are measured on pages from here on.
const MISS_BASE: u64 = 128 << 20;

struct BenchBackend {
    start: Instant,
    latency_ns: AtomicU64,
    chase: Vec<u8>,
    /// (arrival, handled) per miss.
    stamps: Mutex<Vec<(u64, u64)>>,
}

impl PoolBackend for BenchBackend {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
    fn on_miss(&self, m: &Miss, dst: &mut [u8]) -> Result<MissReply, ServeMissError> {
        let at = m.pool_offset as usize;
        let data = if at + dst.len() <= self.chase.len() {
            dst.copy_from_slice(&self.chase[at..at + dst.len()]);
            MissData::InPlace { len: dst.len() }
        } else {
            MissData::Zeros
        };
        let reply = MissReply {
            data,
            completes_at_ns: m.arrival_ns + self.latency_ns.load(Ordering::Relaxed),
        };
        let handled = self.now_ns();
        self.stamps.lock().unwrap().push((m.arrival_ns, handled));
        Ok(reply)
    }
    fn on_writeback(&self, _: u64, _: &[u8], _: u32, t: u64) -> Result<u64, WritebackError> {
        Ok(t)
    }
}

struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(fd: i32, len: usize, prot: i32) -> Self {
        // SAFETY: a fresh shared mapping of an open fd; checked below.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap");
        Map {
            ptr: ptr.cast(),
            len,
        }
    }
    /// `MADV_HUGEPAGE`, as QEMU advises guest RAM.
    fn hugepage(&self) {
        // SAFETY: advice on exactly this live mapping.
        unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_HUGEPAGE) };
    }
    fn read(&self, off: u64) -> u8 {
        assert!((off as usize) < self.len);
        // SAFETY: in bounds of a live mapping.
        unsafe { self.ptr.add(off as usize).read_volatile() }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A ring visiting `pages` pages in random order, one cache line each
/// (line chosen per page), stored as offsets from the region's start.
fn chase_ring(buf: &mut [u8], pages: usize, seed: u64) {
    let mut order: Vec<usize> = (0..pages).collect();
    let mut x = seed | 1;
    for i in (1..pages).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let slot = |p: usize| p * PAGE_SIZE as usize + (p * 7 % 64) * 64;
    for i in 0..pages {
        let here = slot(order[i]);
        let next = slot(order[(i + 1) % pages]) as u64;
        buf[here..here + 8].copy_from_slice(&next.to_le_bytes());
    }
}

/// ns per dependent load around the ring starting at `base + start`.
fn chase(base: *const u8, start: u64, loads: u64) -> f64 {
    let mut off = start;
    let t = Instant::now();
    for _ in 0..loads {
        // SAFETY: every offset in the ring is inside the mapped region.
        off = unsafe { base.add(off as usize).cast::<u64>().read_volatile() };
    }
    std::hint::black_box(off);
    t.elapsed().as_nanos() as f64 / loads as f64
}

fn pct<T: Ord + Copy + Default>(v: &mut [T], p: f64) -> T {
    v.sort_unstable();
    if v.is_empty() {
        return T::default();
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn us(ns: u64) -> String {
    format!("{:.2} µs", ns as f64 / 1000.0)
}

fn sus(ns: i64) -> String {
    format!("{:+.2} µs", ns as f64 / 1000.0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A mounted plane and its mountpoint, dropped in that order.
struct Fixture {
    p: FusePoolPlane,
    _dir: tempfile::TempDir,
    /// Mapped and evicted as memory mode's regions are (see `Readers::Region`).
    region: bool,
}

/// How the plane reads its requests: threads of this process (blocking or
/// polling) on `/dev/fuse` or on FUSE over io_uring, or a helper process
/// (a split plane, as memory mode uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Readers {
    Local(ReaderMode),
    Ring(ReaderMode),
    Split,
    /// A split plane as memory mode runs it: readahead refused, mapped
    /// `MADV_HUGEPAGE` as QEMU maps guest RAM, evicted pages kept as
    /// tombstones.
    Region,
}

impl std::fmt::Display for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Readers::Local(ReaderMode::Block) => f.write_str("dev-fuse block"),
            Readers::Local(ReaderMode::Spin) => f.write_str("dev-fuse spin"),
            Readers::Ring(ReaderMode::Block) => f.write_str("io-uring block"),
            Readers::Ring(ReaderMode::Spin) => f.write_str("io-uring poll"),
            Readers::Split => f.write_str("split (helper)"),
            Readers::Region => f.write_str("split, region"),
        }
    }
}

/// Every way to read requests this host offers (the io_uring ones only
/// where the kernel offers FUSE over io_uring; said so otherwise).
fn readers() -> Vec<Readers> {
    let mut r = vec![
        Readers::Local(ReaderMode::Block),
        Readers::Local(ReaderMode::Spin),
    ];
    if residency::uring::kernel_offers() {
        r.push(Readers::Ring(ReaderMode::Block));
        r.push(Readers::Ring(ReaderMode::Spin));
    } else {
        println!(
            "    (FUSE over io_uring: not offered by this kernel, {} is not Y; io-uring rows skipped)",
            residency::uring::ENABLE_PARAM
        );
    }
    r.push(Readers::Split);
    r.push(Readers::Region);
    r
}

fn mount_as(b: &Arc<BenchBackend>, r: Readers, compensation: Compensation) -> Fixture {
    match r {
        Readers::Local(mode) => mount(b, mode, Transport::DevFuse, compensation),
        Readers::Ring(mode) => mount(b, mode, Transport::IoUring, compensation),
        Readers::Split | Readers::Region => {
            let dir = tempfile::tempdir().unwrap();
            let store = tempfile::tempfile().unwrap();
            store.set_len(POOL).unwrap();
            let helper = residency::HelperCommand {
                program: env!("CARGO_BIN_EXE_cxlfs-plane-helper").into(),
                args: Vec::new(),
                seccomp: residency::SeccompMode::Kill,
            };
            let p = FusePoolPlane::mount_split(
                dir.path(),
                POOL,
                b.clone(),
                PlaneOptions {
                    compensation,
                    refuse_readahead: r == Readers::Region,
                    ..PlaneOptions::default()
                },
                &store,
                &helper,
            )
            .expect("mount the split pool");
            Fixture {
                p,
                _dir: dir,
                region: r == Readers::Region,
            }
        }
    }
}

fn mount(
    b: &Arc<BenchBackend>,
    mode: ReaderMode,
    transport: Transport,
    compensation: Compensation,
) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let readers = if mode == ReaderMode::Spin { 1 } else { 2 };
    let p = FusePoolPlane::mount(
        dir.path(),
        POOL,
        b.clone(),
        PlaneOptions {
            readers,
            mode,
            transport,
            compensation,
            ..PlaneOptions::default()
        },
    )
    .expect("mount the pool");
    Fixture {
        p,
        _dir: dir,
        region: false,
    }
}

fn hits(b: &Arc<BenchBackend>) {
    println!("(a) hit latency: pointer chase, one random cache line per page, random page order");
    let fx = mount(b, ReaderMode::Block, Transport::DevFuse, Compensation::Off);
    let p = &fx.p;
    let pool = Map::new(
        p.map_target().file.as_raw_fd(),
        CHASE_MAX as usize,
        libc::PROT_READ,
    );
    // SAFETY: memfd_create with a valid name.
    let raw = unsafe { libc::memfd_create(c"cxlfs-bench".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: a fresh fd we own.
    let memfd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate on a valid fd we own.
    let rc = unsafe { libc::ftruncate(memfd.as_raw_fd(), CHASE_MAX as i64) };
    assert_eq!(rc, 0);
    let shm = Map::new(
        memfd.as_raw_fd(),
        CHASE_MAX as usize,
        libc::PROT_READ | libc::PROT_WRITE,
    );
    // SAFETY: the memfd mapping is CHASE_MAX bytes, writable, ours.
    unsafe { std::ptr::copy_nonoverlapping(b.chase.as_ptr(), shm.ptr, CHASE_MAX as usize) };
    // Make the pool resident and mapped (one trap per page).
    for off in (0..CHASE_MAX).step_by(PAGE_SIZE as usize) {
        pool.read(off);
    }
    println!(
        "    {:>10} {:>14} {:>14} {:>7}",
        "working set", "pool ns/load", "memfd ns/load", "ratio"
    );
    for (pages, region) in RINGS {
        let loads = 4_000_000u64;
        // Warm both, then alternate runs and keep the best of each.
        let (mut bp, mut bs) = (f64::MAX, f64::MAX);
        for _ in 0..5 {
            // SAFETY: the rings lie inside both mappings (CHASE_MAX bytes).
            let (pr, sr) = unsafe { (pool.ptr.add(region), shm.ptr.add(region)) };
            // Page 0's slot (offset 0) is on every ring.
            bp = bp.min(chase(pr, 0, loads));
            bs = bs.min(chase(sr, 0, loads));
        }
        println!(
            "    {:>8} KiB {:>14.2} {:>14.2} {:>6.2}x",
            pages * 4,
            bp,
            bs,
            bp / bs
        );
    }
    drop(pool);
    drop(shm);
    let t = p.metrics();
    println!("    (pool traps while warming: {})", t.traps);
}

struct MissStats {
    total: Vec<u64>,
    to_server: Vec<u64>,
    server: Vec<u64>,
    back: Vec<u64>,
}

/// Touches `n` fresh pool pages in random order; returns per-touch times.
fn touch_fresh(b: &Arc<BenchBackend>, fx: &Fixture, n: usize, seed: u64) -> MissStats {
    let p = &fx.p;
    let len = (n as u64) * PAGE_SIZE;
    let map = Map::new(
        p.map_target().file.as_raw_fd(),
        (MISS_BASE + len) as usize,
        libc::PROT_READ,
    );
    if fx.region {
        map.hugepage();
    }
    let mut order: Vec<u64> = (0..n as u64).collect();
    let mut x = seed | 1;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    b.stamps.lock().unwrap().clear();
    let mut s = MissStats {
        total: Vec::with_capacity(n),
        to_server: Vec::with_capacity(n),
        server: Vec::with_capacity(n),
        back: Vec::with_capacity(n),
    };
    let mut starts = Vec::with_capacity(n);
    for &page in &order {
        let t0 = b.now_ns();
        map.read(MISS_BASE + page * PAGE_SIZE);
        let t1 = b.now_ns();
        starts.push((t0, t1));
    }
    let stamps = b.stamps.lock().unwrap().clone();
    for (i, &(t0, t1)) in starts.iter().enumerate() {
        s.total.push(t1 - t0);
        if let Some(&(arr, handled)) = stamps.get(i) {
            if stamps.len() == n {
                s.to_server.push(arr.saturating_sub(t0));
                s.server.push(handled.saturating_sub(arr));
                s.back.push(t1.saturating_sub(handled));
            }
        }
    }
    drop(map);
    if fx.region {
        // Tombstones, as a region's evictions leave them: the next round's
        // faults read their own folio at once.
        p.evict_to_tombstones(MISS_BASE, len)
    } else {
        p.evict(MISS_BASE, len)
    }
    .unwrap()
    .wait()
    .unwrap();
    s
}

/// Interleaved rounds of each section that takes them
/// (`POOL_LATENCY_ROUNDS`, default 3).
fn rounds() -> usize {
    std::env::var("POOL_LATENCY_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3)
        .max(1)
}

fn misses(b: &Arc<BenchBackend>) {
    let rounds = rounds();
    println!(
        "(b) miss-path floor, modeled latency 0: first touch -> FUSE_READ -> mapped; every transport side by side, {rounds} interleaved rounds of 10000 misses, medians over rounds; loadavg {}",
        loadavg()
    );
    let modes = readers();
    // per mode: per round (median, p99, to_server, server, back)
    let mut got = vec![Vec::<[u64; 5]>::new(); modes.len()];
    for round in 0..rounds {
        for (mi, &mode) in modes.iter().enumerate() {
            let fx = mount_as(b, mode, Compensation::Off);
            b.latency_ns.store(0, Ordering::Relaxed);
            let _ = touch_fresh(b, &fx, 500, 1 + round as u64); // warm-up
            let mut s = touch_fresh(b, &fx, 10_000, 2 + 10 * round as u64);
            let split = |v: &mut Vec<u64>| if v.is_empty() { 0 } else { pct(v, 0.5) };
            got[mi].push([
                pct(&mut s.total, 0.5),
                pct(&mut s.total, 0.99),
                split(&mut s.to_server),
                split(&mut s.server),
                split(&mut s.back),
            ]);
        }
    }
    let base = got
        .first()
        .map(|r| pct(&mut r.iter().map(|x| x[0]).collect::<Vec<_>>(), 0.5));
    for (mode, rs) in modes.iter().zip(&got) {
        let med = |i: usize| pct(&mut rs.iter().map(|x| x[i]).collect::<Vec<_>>(), 0.5);
        let per_round: Vec<String> = rs.iter().map(|x| us(x[0])).collect();
        println!(
            "    {:<16} median {:>9}  p99 {:>9}  ({:.2}x dev-fuse block; rounds {})",
            mode.to_string(),
            us(med(0)),
            us(med(1)),
            base.map_or(f64::NAN, |b| med(0) as f64 / b.max(1) as f64),
            per_round.join(" "),
        );
        println!(
            "      split (medians): fault -> server {}, server {}, reply -> mapped {}",
            us(med(2)),
            us(med(3)),
            us(med(4)),
        );
    }
    compensated(b);
}

/// One round's figures for a (readers, compensation, NAND latency) cell.
#[derive(Default, Clone, Copy)]
struct Cell {
    achieved_p50: u64,
    achieved_p99: u64,
    over_p50: i64,
    over_p99: i64,
    late_p50: i64,
    floor: u64,
}

fn compensations() -> Vec<Compensation> {
    std::env::var("POOL_LATENCY_COMPENSATION")
        .unwrap_or_else(|_| "off,auto".into())
        .split(',')
        .map(|c| {
            c.parse()
                .expect("POOL_LATENCY_COMPENSATION: off, auto or NS")
        })
        .collect()
}

/// (c): achieved vs modeled, every compensation mode side by side, in
/// interleaved rounds (a fresh mount, calibrated anew, per round and mode).
fn compensated(b: &Arc<BenchBackend>) {
    const LATS: [u64; 3] = [3, 20, 40];
    let comps = compensations();
    let rounds = rounds();
    println!(
        "(c) achieved vs modeled miss latency (achieved: first touch -> mapped, as the toucher sees it); compensation {} side by side, {rounds} interleaved rounds of 5000 misses, medians over rounds; loadavg {}",
        comps.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(" / "),
        loadavg()
    );
    for mode in readers() {
        // cells[comp][lat][round]
        let mut cells = vec![vec![Vec::<Cell>::new(); LATS.len()]; comps.len()];
        let mut loads = Vec::new();
        for round in 0..rounds {
            for (ci, &comp) in comps.iter().enumerate() {
                let fx = mount_as(b, mode, comp);
                let p = &fx.p;
                let _ = touch_fresh(b, &fx, 200, 99 + round as u64); // warm-up
                for (li, lat_us) in LATS.into_iter().enumerate() {
                    let lat = lat_us * 1000;
                    b.latency_ns.store(lat, Ordering::Relaxed);
                    let floor = p.compensation_ns();
                    let mut s = touch_fresh(b, &fx, 5_000, 3 + lat_us + 100 * round as u64);
                    let mut over: Vec<i64> =
                        s.total.iter().map(|&t| t as i64 - lat as i64).collect();
                    let mut late: Vec<i64> = s
                        .back
                        .iter()
                        .zip(&s.server)
                        .map(|(back, srv)| (back + srv) as i64 - lat as i64)
                        .collect();
                    cells[ci][li].push(Cell {
                        achieved_p50: pct(&mut s.total, 0.5),
                        achieved_p99: pct(&mut s.total, 0.99),
                        over_p50: pct(&mut over, 0.5),
                        over_p99: pct(&mut over, 0.99),
                        late_p50: pct(&mut late, 0.5),
                        floor,
                    });
                }
                b.latency_ns.store(0, Ordering::Relaxed);
            }
            loads.push(loadavg());
        }
        for (ci, comp) in comps.iter().enumerate() {
            for (li, lat_us) in LATS.into_iter().enumerate() {
                let c = &cells[ci][li];
                let med = |f: fn(&Cell) -> u64| pct(&mut c.iter().map(f).collect::<Vec<_>>(), 0.5);
                let meds = |f: fn(&Cell) -> i64| pct(&mut c.iter().map(f).collect::<Vec<_>>(), 0.5);
                let rounds_over: Vec<String> = c.iter().map(|x| sus(x.over_p50)).collect();
                println!(
                    "    {:<15} {:<5} NAND {:>2} µs: achieved median {:>9} p99 {:>9}; achieved-modeled median {:>10} p99 {:>10} (rounds: {}); (arrival->mapped)-modeled median {:>10}; floor {}",
                    mode.to_string(),
                    comp.to_string(),
                    lat_us,
                    us(med(|x| x.achieved_p50)),
                    us(med(|x| x.achieved_p99)),
                    sus(meds(|x| x.over_p50)),
                    sus(meds(|x| x.over_p99)),
                    rounds_over.join(" "),
                    sus(meds(|x| x.late_p50)),
                    us(med(|x| x.floor)),
                );
            }
        }
        println!("      loadavg after each round: {}", loads.join(" | "));
    }
}

fn notifies(b: &Arc<BenchBackend>) {
    println!("(d) notifications (time of the write to /dev/fuse, on the notifier thread)");
    let fx = mount(b, ReaderMode::Block, Transport::DevFuse, Compensation::Off);
    let p = &fx.p;
    let map = Map::new(
        p.map_target().file.as_raw_fd(),
        (MISS_BASE + (64 << 20)) as usize,
        libc::PROT_READ,
    );
    for size in [PAGE_SIZE, 2 << 20] {
        let n = if size == PAGE_SIZE { 2000 } else { 20 };
        let (mut store, mut touch, mut inval) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let off = MISS_BASE + (i as u64 * size) % (64 << 20);
            let d = p
                .fill(off, vec![1u8; size as usize])
                .unwrap()
                .wait()
                .unwrap();
            store.push(d.as_nanos() as u64);
            let t = Instant::now();
            for pg in (0..size).step_by(PAGE_SIZE as usize) {
                map.read(off + pg);
            }
            touch.push(t.elapsed().as_nanos() as u64);
            let d = p.evict(off, size).unwrap().wait().unwrap();
            inval.push(d.as_nanos() as u64);
        }
        let kib = size / 1024;
        println!(
            "    NOTIFY_STORE {kib:>4} KiB: median {:>9} p99 {:>9}",
            us(pct(&mut store, 0.5)),
            us(pct(&mut store, 0.99))
        );
        println!(
            "    first touch of the stored {kib} KiB (minor faults, no trap): median {:>9}",
            us(pct(&mut touch, 0.5))
        );
        println!(
            "    NOTIFY_INVAL_INODE {kib:>4} KiB (cached + mapped): median {:>9} p99 {:>9}",
            us(pct(&mut inval, 0.5)),
            us(pct(&mut inval, 0.99))
        );
    }
    drop(map);
    let m = p.metrics();
    println!(
        "    (traps during (d): {}, stores {}, invalidations {})",
        m.traps, m.stores, m.invalidations
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // `cargo bench … -- hits misses notify refs` runs only those sections.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        println!("pool_latency: SKIPPED, cannot open /dev/fuse ({e})");
        return;
    }
    let mut chase = vec![0u8; CHASE_MAX as usize];
    for (i, (pages, region)) in RINGS.into_iter().enumerate() {
        chase_ring(&mut chase[region..], pages, 11 + i as u64);
    }
    let b = Arc::new(BenchBackend {
        start: Instant::now(),
        latency_ns: AtomicU64::new(0),
        chase,
        stamps: Mutex::new(Vec::with_capacity(32_768)),
    });
    println!(
        "kvm-ept pool_latency: FUSE pool file mapped MAP_SHARED by this process, {} CPUs",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if run("hits") {
        hits(&b);
    }
    if run("misses") {
        misses(&b);
    }
    if run("notify") {
        notifies(&b);
    }
    if run("refs") {
        references();
    }
}

/// What the miss floor is made of, without FUSE: a page fault that
/// allocates a page (memfd first touch), and waking a sleeping thread on
/// the other CPU (futex ping-pong: two wake-ups per round trip).
fn references() {
    println!("(e) reference costs on this machine (what the miss floor is made of)");
    // SAFETY: memfd_create with a valid name.
    let raw = unsafe { libc::memfd_create(c"cxlfs-ref".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: a fresh fd we own.
    let memfd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len = 64usize << 20;
    // SAFETY: ftruncate on a valid fd we own.
    let rc = unsafe { libc::ftruncate(memfd.as_raw_fd(), len as i64) };
    assert_eq!(rc, 0);
    let map = Map::new(memfd.as_raw_fd(), len, libc::PROT_READ | libc::PROT_WRITE);
    let mut t = Vec::new();
    for off in (0..len as u64).step_by(PAGE_SIZE as usize) {
        let t0 = Instant::now();
        map.read(off);
        t.push(t0.elapsed().as_nanos() as u64);
    }
    println!(
        "    memfd first touch (shmem fault, page allocated + zeroed + mapped): median {:>9} p99 {:>9}",
        us(pct(&mut t, 0.5)),
        us(pct(&mut t, 0.99))
    );
    drop(map);
    // Ping-pong between two threads over a pair of channels (futex sleep / wake).
    let (to_tx, to_rx) = std::sync::mpsc::channel::<u64>();
    let (back_tx, back_rx) = std::sync::mpsc::channel::<u64>();
    let echo = std::thread::spawn(move || {
        for v in to_rx {
            if back_tx.send(v).is_err() {
                break;
            }
        }
    });
    let mut rt = Vec::new();
    for i in 0..20_000u64 {
        let t0 = Instant::now();
        to_tx.send(i).unwrap();
        back_rx.recv().unwrap();
        rt.push(t0.elapsed().as_nanos() as u64);
        // Let the echo thread go back to sleep, as a FUSE server would be.
        std::thread::sleep(std::time::Duration::from_micros(20));
    }
    drop(to_tx);
    let _ = echo.join();
    println!(
        "    thread wake-up round trip (2 sleeping wake-ups, futex): median {:>9} p99 {:>9}",
        us(pct(&mut rt, 0.5)),
        us(pct(&mut rt, 0.99))
    );
}
