//! A split pool plane (requests read by a helper process) against the real
//! host kernel, with this process mapping the pool itself — the memory-mode
//! case where the serving process also maps guest memory backed by the
//! pool. Skips (passes with a message) without `/dev/fuse` or permission to
//! mount; fails instead under `CI=true`.
#![allow(clippy::unwrap_used)]

mod common;
use common::{fuse_usable, skip_or_fail};

use residency::{
    FusePoolPlane, HelperCommand, MapTarget, Miss, MissData, MissReply, PlaneOptions, PoolBackend,
    ResidencyPlane, ServeMissError, WritebackError, PAGE_SIZE,
};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const POOL: u64 = 4 << 20;
const PAGES: u64 = POOL / PAGE_SIZE;
const DELAY_NS: u64 = 10_000;

/// Misses read the store (what the helper wrote back); stored write-backs
/// are logged.
struct StoreBackend {
    start: Instant,
    /// How long a miss takes (modeled).
    miss_ns: AtomicU64,
    /// While set, a miss never gets its answer: this process's receiver
    /// sits in `on_miss` (for at most 30 s).
    silent: AtomicBool,
    store: Arc<File>,
    misses: Mutex<Vec<Miss>>,
    stored: Mutex<Vec<(u64, u64, u32)>>,
}

impl PoolBackend for StoreBackend {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
    fn on_miss(&self, m: &Miss, _: &mut [u8]) -> Result<MissReply, ServeMissError> {
        let t = Instant::now();
        while self.silent.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.misses.lock().unwrap().push(*m);
        Ok(MissReply {
            data: MissData::File {
                file: self.store.clone(),
                offset: m.pool_offset,
            },
            completes_at_ns: m.arrival_ns + self.miss_ns.load(Ordering::Relaxed),
        })
    }
    fn on_writeback(&self, _: u64, _: &[u8], _: u32, _: u64) -> Result<u64, WritebackError> {
        panic!("a split plane's helper stores write-backs itself");
    }
    fn on_stored_writeback(
        &self,
        off: u64,
        len: u64,
        pid: u32,
        arrival_ns: u64,
    ) -> Result<u64, WritebackError> {
        self.stored.lock().unwrap().push((off, len, pid));
        Ok(arrival_ns)
    }
}

impl StoreBackend {
    fn stored_bytes(&self) -> u64 {
        self.stored.lock().unwrap().iter().map(|s| s.1).sum()
    }
}

fn memfd(len: u64) -> File {
    // SAFETY: a valid NUL-terminated name; the fd is checked and owned below.
    let fd = unsafe { libc::memfd_create(c"split-plane-store".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd nobody else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

struct Fixture {
    p: FusePoolPlane,
    b: Arc<StoreBackend>,
    _dir: tempfile::TempDir,
}

fn split_plane() -> Option<Fixture> {
    if !fuse_usable() {
        return None;
    }
    let store = Arc::new(memfd(POOL));
    let b = Arc::new(StoreBackend {
        start: Instant::now(),
        miss_ns: AtomicU64::new(DELAY_NS),
        silent: AtomicBool::new(false),
        store: store.clone(),
        misses: Mutex::new(Vec::new()),
        stored: Mutex::new(Vec::new()),
    });
    let dir = tempfile::tempdir().unwrap();
    let helper = HelperCommand {
        program: env!("CARGO_BIN_EXE_cxlfs-plane-helper").into(),
        args: Vec::new(),
        // Serving under its allow-list: a call missing from it kills the
        // helper, and these tests fail.
        seccomp: residency::SeccompMode::Kill,
    };
    let opts = PlaneOptions {
        detach: true,
        ..PlaneOptions::default()
    };
    match FusePoolPlane::mount_split(dir.path(), POOL, b.clone(), opts, &store, &helper) {
        Ok(p) => Some(Fixture { p, b, _dir: dir }),
        Err(residency::MountPlaneError::Mount { source, .. })
            if source.raw_os_error() == Some(libc::EPERM) =>
        {
            skip_or_fail(&format!("mounting FUSE is not permitted here ({source})"));
            None
        }
        Err(e) => panic!("mount_split: {e:?}"),
    }
}

fn map(t: &MapTarget) -> *mut u8 {
    // SAFETY: a fresh shared mapping of an open file; checked below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            t.size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            t.file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED);
    ptr.cast()
}

fn pattern(page: u64) -> u8 {
    (page * 31 + 7) as u8
}

/// Runs `f` on a thread and fails the test if it does not end in `limit`.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what} did not end within {limit:?}"))
}

#[test]
fn misses_come_back_here_and_write_backs_land_in_the_store() {
    let Some(fx) = split_plane() else { return };
    fx.p.register_vmm(5, std::process::id());
    let ptr = map(fx.p.map_target()) as usize;
    // First touch: one trap per page, answered from the (zero) store.
    for page in 0..PAGES {
        // SAFETY: in bounds of the live mapping.
        let v = unsafe {
            (ptr as *const u8)
                .add((page * PAGE_SIZE) as usize)
                .read_volatile()
        };
        assert_eq!(v, 0, "a fresh pool reads as zeros");
    }
    let misses = fx.b.misses.lock().unwrap().clone();
    assert_eq!(misses.len() as u64, PAGES, "one trap per page");
    assert!(
        misses.iter().all(|m| m.vm == Some(5)),
        "attributed to this VMM"
    );
    for page in 0..PAGES {
        // SAFETY: in bounds of the live writable mapping.
        unsafe {
            (ptr as *mut u8)
                .add((page * PAGE_SIZE + 9) as usize)
                .write_volatile(pattern(page))
        };
    }
    // Evict: the helper stores the dirty pages, then the pages go.
    fx.p.evict(0, POOL).unwrap().wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while fx.b.stored_bytes() < POOL && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(fx.b.stored_bytes(), POOL, "every dirty page charged once");
    let mut byte = [0u8; 1];
    for page in 0..PAGES {
        fx.b.store
            .read_exact_at(&mut byte, page * PAGE_SIZE + 9)
            .unwrap();
        assert_eq!(byte[0], pattern(page), "page {page} in the store");
    }
    // Refault: exactly what was written.
    for page in 0..PAGES {
        // SAFETY: in bounds of the live mapping.
        let v = unsafe {
            (ptr as *const u8)
                .add((page * PAGE_SIZE + 9) as usize)
                .read_volatile()
        };
        assert_eq!(v, pattern(page), "page {page} after a refault");
    }
    assert_eq!(
        fx.b.misses.lock().unwrap().len() as u64,
        2 * PAGES,
        "evicted pages trap again"
    );
    assert!(fx.p.metrics().writeback_bytes >= POOL);
    // SAFETY: unmaps exactly what `map` mapped.
    unsafe { libc::munmap(ptr as *mut libc::c_void, POOL as usize) };
}

/// The memory-mode deadlock, by construction impossible with a split
/// plane: this process unmaps dirty pool pages (its `mmap_lock` held while
/// the kernel waits for their write-back) while its other threads keep
/// taking the same `mmap_lock` (anonymous mmap/mprotect/munmap, page
/// faults) and the plane's own threads in this process are busy. With the
/// requests read by threads of this process, the write-back could wait for
/// a thread that waits for the `mmap_lock`; here the helper answers it.
#[test]
fn unmapping_dirty_pages_ends_while_this_process_fights_for_its_mmap_lock() {
    let Some(fx) = split_plane() else { return };
    let ptr = map(fx.p.map_target()) as usize;
    for page in 0..PAGES {
        // SAFETY: in bounds of the live writable mapping.
        unsafe {
            (ptr as *mut u8)
                .add((page * PAGE_SIZE) as usize)
                .write_volatile(pattern(page))
        };
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churn: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: an anonymous private mapping, used and unmapped here.
                    unsafe {
                        let p = libc::mmap(
                            std::ptr::null_mut(),
                            1 << 20,
                            libc::PROT_READ,
                            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                            -1,
                            0,
                        );
                        if p != libc::MAP_FAILED {
                            libc::mprotect(p, 1 << 20, libc::PROT_READ | libc::PROT_WRITE);
                            p.cast::<u8>().write_volatile(1);
                            libc::munmap(p, 1 << 20);
                        }
                    }
                }
            })
        })
        .collect();
    within(
        Duration::from_secs(30),
        "munmap of dirty pool pages",
        move || {
            // SAFETY: unmaps exactly what `map` mapped.
            unsafe { libc::munmap(ptr as *mut libc::c_void, POOL as usize) }
        },
    );
    stop.store(true, Ordering::Relaxed);
    for t in churn {
        t.join().unwrap();
    }
    let mut byte = [0u8; 1];
    for page in 0..PAGES {
        fx.b.store
            .read_exact_at(&mut byte, page * PAGE_SIZE)
            .unwrap();
        assert_eq!(byte[0], pattern(page), "page {page} written back at munmap");
    }
}

/// A VMM that is SIGKILLed with dirty pool pages: its exit writes them
/// back (answered by the helper), it is reaped within seconds, and the
/// store holds what it wrote.
#[test]
fn a_sigkilled_mapper_with_dirty_pages_is_reaped_and_its_pages_are_stored() {
    let Some(fx) = split_plane() else { return };
    let fd = fx.p.map_target().file.as_raw_fd();
    let mut pipe = [0i32; 2];
    // SAFETY: a valid out array of two ints.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: the child makes only async-signal-safe calls (mmap, stores
    // to its own mapping, write, pause, _exit).
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        // SAFETY: as above.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                POOL as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if p == libc::MAP_FAILED {
                libc::_exit(1);
            }
            for page in 0..PAGES {
                p.cast::<u8>()
                    .add((page * PAGE_SIZE + 1) as usize)
                    .write_volatile(pattern(page) ^ 0x5a);
            }
            libc::write(pipe[1], [1u8].as_ptr().cast(), 1);
            loop {
                libc::pause();
            }
        }
    }
    // SAFETY: closes our copy of the write end.
    unsafe { libc::close(pipe[1]) };
    let mut b = [0u8; 1];
    // SAFETY: reads one byte into a valid buffer.
    let n = unsafe { libc::read(pipe[0], b.as_mut_ptr().cast(), 1) };
    assert_eq!(n, 1, "the child dirtied its pages");
    // SAFETY: plain kill of our own child.
    unsafe { libc::kill(child, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child, non-blocking.
        let r = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if r == child {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the SIGKILLed mapper is still there after 30 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut byte = [0u8; 1];
    for page in 0..PAGES {
        fx.b.store
            .read_exact_at(&mut byte, page * PAGE_SIZE + 1)
            .unwrap();
        assert_eq!(
            byte[0],
            pattern(page) ^ 0x5a,
            "page {page} written back at exit"
        );
    }
}

#[test]
fn the_plane_shuts_down_and_reaps_its_helper() {
    let Some(fx) = split_plane() else { return };
    let ptr = map(fx.p.map_target()) as usize;
    // SAFETY: in bounds of the live writable mapping.
    unsafe { (ptr as *mut u8).write_volatile(1) };
    // SAFETY: unmaps exactly what `map` mapped.
    unsafe { libc::munmap(ptr as *mut libc::c_void, POOL as usize) };
    let helper = fx.p.helper_pid().expect("a split plane has a helper") as i32;
    // SAFETY: signal 0 only checks that the process exists.
    assert_eq!(unsafe { libc::kill(helper, 0) }, 0, "the helper runs");
    within(
        Duration::from_secs(30),
        "dropping the split plane",
        move || drop(fx),
    );
    // Reaped, not a zombie: the pid is gone.
    // SAFETY: as above.
    let rc = unsafe { libc::kill(helper, 0) };
    assert_eq!(rc, -1, "the helper was reaped");
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ESRCH)
    );
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes
    // inside it; sched_setaffinity reads it for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// A split plane once its helper has moved to the ring (within 5 s; its
/// transport is checked by the caller). `None`: no ring here (skipped, or
/// failed under CI) or no plane.
fn split_plane_on_a_ring() -> Option<Fixture> {
    if !residency::uring::kernel_offers() {
        skip_or_fail("the host kernel does not offer FUSE over io_uring");
        return None;
    }
    let fx = split_plane()?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while fx.p.transport() == residency::ActiveTransport::DevFuse && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    Some(fx)
}

/// Where the kernel offers FUSE over io_uring, the helper takes the
/// requests on a ring (one queue per possible CPU) and its misses reach
/// this process as ring requests.
#[test]
fn the_helper_takes_requests_on_a_ring_where_the_kernel_offers_one() {
    let Some(fx) = split_plane_on_a_ring() else {
        return;
    };
    match fx.p.transport() {
        residency::ActiveTransport::IoUring { queues, .. } => {
            assert_eq!(queues, residency::uring::possible_cpus())
        }
        t => panic!("the helper stayed on {t:?}"),
    }
    let ptr = map(fx.p.map_target()) as usize;
    for page in 0..8 {
        // SAFETY: in bounds of the live mapping.
        let v = unsafe {
            (ptr as *const u8)
                .add((page * PAGE_SIZE) as usize)
                .read_volatile()
        };
        assert_eq!(v, 0);
    }
    assert!(
        fx.p.ring_requests() >= 8,
        "misses came through the ring: {}",
        fx.p.ring_requests()
    );
    // SAFETY: unmaps exactly what `map` mapped.
    unsafe { libc::munmap(ptr as *mut libc::c_void, POOL as usize) };
}

/// The helper never waits for this process: with twice a ring queue's
/// entries in slow misses on one CPU, the misses beyond what the queue
/// can hold are answered at once (from the store), and a write-back from
/// that CPU is answered long before the slow misses are.
#[test]
fn a_queue_full_of_slow_misses_still_answers_write_backs() {
    let Some(fx) = split_plane() else { return };
    let ptr = map(fx.p.map_target()) as usize;
    // Page 0 dirty (its first touch a fast miss).
    // SAFETY: in bounds of the live writable mapping.
    unsafe { (ptr as *mut u8).add(3).write_volatile(0x5a) };
    let slow = Duration::from_secs(3);
    fx.b.miss_ns
        .store(slow.as_nanos() as u64, Ordering::Relaxed);
    let started = Instant::now();
    let threads = 2 * residency::split::RING_DEPTH;
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..threads {
        let tx = tx.clone();
        std::thread::spawn(move || {
            pin(0);
            let page = 1 + i as u64;
            // SAFETY: in bounds of the live mapping (PAGES > threads).
            let v = unsafe {
                (ptr as *const u8)
                    .add((page * PAGE_SIZE) as usize)
                    .read_volatile()
            };
            let _ = tx.send((v, started.elapsed()));
        });
    }
    drop(tx);
    std::thread::sleep(Duration::from_millis(300));
    let synced = within(Duration::from_secs(2), "msync of a dirty page", move || {
        pin(0);
        // SAFETY: syncs the first page of the live mapping.
        let rc =
            unsafe { libc::msync(ptr as *mut libc::c_void, PAGE_SIZE as usize, libc::MS_SYNC) };
        (rc, started.elapsed())
    });
    assert_eq!(synced.0, 0, "msync: {}", std::io::Error::last_os_error());
    assert!(
        synced.1 < slow,
        "the write-back waited for the slow misses ({:?})",
        synced.1
    );
    let reads: Vec<(u8, Duration)> = rx.iter().take(threads).collect();
    assert_eq!(reads.len(), threads);
    assert!(
        reads.iter().all(|r| r.0 == 0),
        "every page read its (zero) data"
    );
    let fast = reads.iter().filter(|r| r.1 < slow).count();
    assert!(fast < threads, "no miss was held for its modeled time");
    assert!(
        fx.b.stored_bytes() >= PAGE_SIZE,
        "the dirty page was stored"
    );
    // SAFETY: unmaps exactly what `map` mapped.
    unsafe { libc::munmap(ptr as *mut libc::c_void, POOL as usize) };
}

/// A miss whose answer never comes (this process's receivers silent) is
/// answered by the helper's ring worker itself once it has waited
/// `DEFERRED_DEADLINE_NS`, from the store: the faulting thread waits that
/// long, not forever.
#[test]
fn a_miss_whose_answer_never_comes_is_answered_after_the_deadline() {
    let Some(fx) = split_plane_on_a_ring() else {
        return;
    };
    assert_ne!(
        fx.p.transport(),
        residency::ActiveTransport::DevFuse,
        "the helper stayed on /dev/fuse"
    );
    let ptr = map(fx.p.map_target()) as usize;
    fx.b.silent.store(true, Ordering::Release);
    let deadline = Duration::from_nanos(residency::uring::DEFERRED_DEADLINE_NS);
    let (v, took) = within(
        deadline * 2,
        "a read whose miss is never answered",
        move || {
            pin(0);
            let t = Instant::now();
            // SAFETY: in bounds of the live mapping.
            let v = unsafe { (ptr as *const u8).add(PAGE_SIZE as usize).read_volatile() };
            (v, t.elapsed())
        },
    );
    fx.b.silent.store(false, Ordering::Release);
    assert_eq!(v, 0, "the page read its (zero) data");
    assert!(
        took >= deadline.mul_f64(0.9),
        "answered after {took:?}, before the deadline: was it held at all?"
    );
    // SAFETY: unmaps exactly what `map` mapped.
    unsafe { libc::munmap(ptr as *mut libc::c_void, POOL as usize) };
}
