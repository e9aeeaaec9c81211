//! The FUSE residency plane against the real host kernel: a pool mounted
//! with a test backend, mapped `MAP_SHARED` by this process as a VMM would.
//! Skips (passes with a message) when `/dev/fuse` cannot be opened or the
//! mount is not permitted; fails instead under `CI=true`.
#![allow(clippy::unwrap_used)]

mod common;
use common::{fuse_usable, skip_or_fail};

use residency::{
    ActiveTransport, FusePoolPlane, MapTarget, Miss, MissData, MissReply, PlaneOptions,
    PoolBackend, ReaderMode, ResidencyPlane, ServeMissError, Transport, WritebackError, PAGE_SIZE,
};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const POOL: u64 = 1 << 20;
const PAGES: u64 = POOL / PAGE_SIZE;
const DELAY_NS: u64 = 20_000;

/// In-memory pool data, a fixed modeled delay, a log of calls.
struct TestBackend {
    start: Instant,
    data: Mutex<Vec<u8>>,
    misses: Mutex<Vec<Miss>>,
    writebacks: Mutex<Vec<(u64, Vec<u8>, u32)>>,
}

impl TestBackend {
    fn new() -> Arc<Self> {
        let data = (0..POOL).map(|i| (i / PAGE_SIZE * 7 + i) as u8).collect();
        Arc::new(TestBackend {
            start: Instant::now(),
            data: Mutex::new(data),
            misses: Mutex::new(Vec::new()),
            writebacks: Mutex::new(Vec::new()),
        })
    }
    fn misses(&self) -> Vec<Miss> {
        self.misses.lock().unwrap().clone()
    }
    fn byte(&self, off: u64) -> u8 {
        self.data.lock().unwrap()[off as usize]
    }
}

impl PoolBackend for TestBackend {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
    fn on_miss(&self, m: &Miss, dst: &mut [u8]) -> Result<MissReply, ServeMissError> {
        self.misses.lock().unwrap().push(*m);
        let d = self.data.lock().unwrap();
        let at = m.pool_offset as usize;
        dst.copy_from_slice(&d[at..at + dst.len()]);
        Ok(MissReply {
            data: MissData::InPlace { len: dst.len() },
            completes_at_ns: m.arrival_ns + DELAY_NS,
        })
    }
    fn on_writeback(
        &self,
        off: u64,
        data: &[u8],
        pid: u32,
        arrival_ns: u64,
    ) -> Result<u64, WritebackError> {
        self.writebacks
            .lock()
            .unwrap()
            .push((off, data.to_vec(), pid));
        self.data.lock().unwrap()[off as usize..off as usize + data.len()].copy_from_slice(data);
        Ok(arrival_ns + DELAY_NS)
    }
}

/// A `MAP_SHARED` read-write mapping of the pool.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(t: &MapTarget) -> Self {
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
        Mapping {
            ptr: ptr.cast(),
            len: t.size as usize,
        }
    }
    fn read(&self, off: u64) -> u8 {
        assert!((off as usize) < self.len);
        // SAFETY: in bounds of a live mapping.
        unsafe { self.ptr.add(off as usize).read_volatile() }
    }
    fn write(&self, off: u64, v: u8) {
        assert!((off as usize) < self.len);
        // SAFETY: in bounds of a live writable mapping.
        unsafe { self.ptr.add(off as usize).write_volatile(v) }
    }
    fn msync(&self) {
        // SAFETY: the whole live mapping.
        let rc = unsafe { libc::msync(self.ptr.cast(), self.len, libc::MS_SYNC) };
        assert_eq!(rc, 0);
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A mounted plane and its mountpoint, dropped in that order (unmount, then
/// remove the directory).
struct Fixture {
    p: FusePoolPlane,
    dir: tempfile::TempDir,
}

/// Mounts a plane on a fresh directory, or `None` (test skipped) without FUSE.
/// A plane on transport `t` (`IoUring`: the test fails under `CI=true`
/// if the kernel cannot give it).
fn plane(b: &Arc<TestBackend>, t: Transport) -> Option<Fixture> {
    if !fuse_usable() || (t == Transport::IoUring && !uring_usable()) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let opts = PlaneOptions {
        transport: t,
        ..PlaneOptions::default()
    };
    match FusePoolPlane::mount(dir.path(), POOL, b.clone(), opts) {
        Ok(p) => {
            let on_ring = matches!(p.transport(), ActiveTransport::IoUring { .. });
            assert_eq!(on_ring, t == Transport::IoUring, "{:?}", p.transport());
            Some(Fixture { p, dir })
        }
        Err(residency::MountPlaneError::Mount { source, .. })
            if source.raw_os_error() == Some(libc::EPERM) =>
        {
            skip_or_fail(&format!("mounting FUSE is not permitted here ({source})"));
            None
        }
        Err(e) => panic!("mount: {e:?}"),
    }
}

/// Whether the kernel offers FUSE over io_uring to new connections. As
/// root, a test turns the `fuse` module's switch on (it only lets servers
/// that ask for the ring use it); else [`skip_or_fail`] says why not.
pub fn uring_usable() -> bool {
    if residency::uring::kernel_offers() {
        return true;
    }
    let _ = std::fs::write(residency::uring::ENABLE_PARAM, "Y");
    if residency::uring::kernel_offers() {
        return true;
    }
    skip_or_fail(&format!(
        "the kernel does not offer FUSE over io_uring ({} is not Y; Linux >= 6.14 with CONFIG_FUSE_IO_URING, as root)",
        residency::uring::ENABLE_PARAM
    ));
    false
}

fn gettid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn first_touch_traps_once_per_page_with_the_right_data(t: Transport) {
    let b = TestBackend::new();
    let Some(fx) = plane(&b, t) else { return };
    let p = &fx.p;
    p.register_vmm(3, std::process::id());
    let m = Mapping::new(p.map_target());
    for page in 0..PAGES {
        let off = page * PAGE_SIZE + page % 100;
        let t = Instant::now();
        assert_eq!(m.read(off), b.byte(off), "page {page}");
        if page == 0 {
            assert!(t.elapsed() >= Duration::from_nanos(DELAY_NS));
        }
    }
    let misses = b.misses();
    assert_eq!(
        misses.len() as u64,
        PAGES,
        "one trap per page (readahead off)"
    );
    let mut offs: Vec<u64> = misses.iter().map(|m| m.pool_offset).collect();
    offs.sort_unstable();
    offs.dedup();
    assert_eq!(offs.len() as u64, PAGES);
    for miss in &misses {
        assert_eq!(u64::from(miss.len), PAGE_SIZE);
        assert_eq!(miss.pid, gettid(), "the faulting thread");
        assert_eq!(residency::vm::tgid_of(miss.pid), Some(std::process::id()));
        assert_eq!(miss.vm, Some(3));
    }
    // Resident: no more traps.
    for page in 0..PAGES {
        assert_eq!(
            m.read(page * PAGE_SIZE + 4095),
            b.byte(page * PAGE_SIZE + 4095)
        );
    }
    assert_eq!(b.misses().len() as u64, PAGES);
    let s = p.metrics();
    assert_eq!(s.traps, PAGES);
    assert_eq!(s.traps_by_vm.get(&Some(3)), Some(&PAGES));
    assert_eq!(s.resident_bytes, POOL);
    // A second open keeps the page cache (FOPEN_KEEP_CACHE).
    let f = std::fs::File::open(&p.map_target().path).unwrap();
    drop(f);
    assert_eq!(m.read(0), b.byte(0));
    assert_eq!(b.misses().len() as u64, PAGES);
}

fn evicted_pages_trap_again(t: Transport) {
    let b = TestBackend::new();
    let Some(fx) = plane(&b, t) else { return };
    let p = &fx.p;
    let m = Mapping::new(p.map_target());
    for page in 0..16 {
        m.read(page * PAGE_SIZE);
    }
    assert_eq!(b.misses().len(), 16);
    p.evict(4 * PAGE_SIZE, 4 * PAGE_SIZE)
        .unwrap()
        .wait()
        .unwrap();
    for page in 0..16 {
        assert_eq!(m.read(page * PAGE_SIZE + 1), b.byte(page * PAGE_SIZE + 1));
    }
    let again: Vec<u64> = b.misses()[16..].iter().map(|m| m.pool_offset).collect();
    assert_eq!(again.len(), 4, "only the evicted pages trap: {again:?}");
    assert!(again
        .iter()
        .all(|&o| (4 * PAGE_SIZE..8 * PAGE_SIZE).contains(&o)));
    let s = p.metrics();
    assert_eq!(s.invalidations, 1);
    assert_eq!(s.resident_bytes, 16 * PAGE_SIZE);
    assert!(p.evict(1, PAGE_SIZE).is_err());
    assert!(p.evict(0, POOL + PAGE_SIZE).is_err());
}

fn stored_pages_do_not_trap(t: Transport) {
    let b = TestBackend::new();
    let Some(fx) = plane(&b, t) else { return };
    let p = &fx.p;
    let m = Mapping::new(p.map_target());
    let page = vec![0x5a; 2 * PAGE_SIZE as usize];
    let took = p.fill(8 * PAGE_SIZE, page).unwrap().wait().unwrap();
    assert!(took < Duration::from_secs(1));
    assert_eq!(m.read(8 * PAGE_SIZE), 0x5a);
    assert_eq!(m.read(9 * PAGE_SIZE + 4095), 0x5a);
    assert!(b.misses().is_empty(), "{:?}", b.misses());
    // A store over a mapped page replaces what the mapping sees.
    assert_eq!(m.read(0), b.byte(0));
    p.fill(0, vec![0x11; PAGE_SIZE as usize])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(m.read(0), 0x11);
    assert_eq!(b.misses().len(), 1);
    let s = p.metrics();
    assert_eq!(s.stores, 2);
    assert_eq!(s.resident_bytes, 3 * PAGE_SIZE);
}

fn dirty_pages_are_written_back_on_evict_and_msync(t: Transport) {
    let b = TestBackend::new();
    let Some(fx) = plane(&b, t) else { return };
    let p = &fx.p;
    let m = Mapping::new(p.map_target());
    m.write(2 * PAGE_SIZE + 10, 0xee);
    assert_eq!(
        b.misses().len(),
        1,
        "a write to a missing page reads it first"
    );
    p.evict(0, 4 * PAGE_SIZE).unwrap().wait().unwrap();
    {
        let wb = b.writebacks.lock().unwrap();
        assert_eq!(wb.len(), 1, "one dirty page");
        let (off, data, _pid) = &wb[0];
        assert_eq!(*off, 2 * PAGE_SIZE);
        assert_eq!(data.len() as u64, PAGE_SIZE);
        assert_eq!(data[10], 0xee);
    }
    // Evicted: the next touch traps and sees the written-back data.
    assert_eq!(m.read(2 * PAGE_SIZE + 10), 0xee);
    assert_eq!(b.misses().len(), 2);
    m.write(5 * PAGE_SIZE, 0x77);
    m.msync();
    let wb = b.writebacks.lock().unwrap();
    assert_eq!(wb.len(), 2);
    assert_eq!((wb[1].0, wb[1].1[0]), (5 * PAGE_SIZE, 0x77));
    assert_eq!(p.metrics().writebacks, 2);
}

fn odd_requests_get_errors_and_the_server_stays_up(t: Transport) {
    let b = TestBackend::new();
    let Some(fx) = plane(&b, t) else { return };
    let (p, dir) = (&fx.p, &fx.dir);
    let path = &p.map_target().path;
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["pool"]);
    assert_eq!(std::fs::metadata(path).unwrap().len(), POOL);
    assert!(std::fs::metadata(dir.path().join("nope")).is_err());
    // Size and mode never change.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    assert!(f.set_len(0).is_err());
    assert!(std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .is_err());
    assert!(std::fs::File::create(dir.path().join("new")).is_err());
    // Unknown opcodes (IOCTL, FALLOCATE, GETXATTR, …) get ENOSYS.
    // SAFETY: plain syscalls on a valid fd with valid buffers.
    unsafe {
        let mut v = 0u64;
        assert_eq!(libc::ioctl(f.as_raw_fd(), 0x8008_6601u64 as _, &mut v), -1);
        assert_ne!(libc::fallocate(f.as_raw_fd(), 0, 0, 4096), 0);
        let mut buf = [0u8; 64];
        assert!(
            libc::fgetxattr(
                f.as_raw_fd(),
                c"user.x".as_ptr(),
                buf.as_mut_ptr().cast(),
                64
            ) < 0
        );
    }
    // A plain read(2) is a trap too, and still served.
    let mut byte = [0u8; 1];
    std::os::unix::fs::FileExt::read_at(&f, &mut byte, 3 * PAGE_SIZE).unwrap();
    assert_eq!(byte[0], b.byte(3 * PAGE_SIZE));
    assert_eq!(p.metrics().traps, 1);
}

fn drop_unmounts_and_stops(t: Transport) {
    let b = TestBackend::new();
    let Some(Fixture { p, dir }) = plane(&b, t) else {
        return;
    };
    let mountpoint = dir.path().to_path_buf();
    let m = Mapping::new(p.map_target());
    m.read(0);
    drop(m);
    let t = Instant::now();
    drop(p);
    assert!(t.elapsed() < Duration::from_secs(5));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(mountpoint.to_str().unwrap()));
    assert!(std::fs::read_dir(&mountpoint).unwrap().next().is_none());
}

/// Host reads that block until the test opens the gate (a slow host file
/// behind some VM's misses): misses of pages below `GATED` wait for it.
struct GatedBackend {
    start: Instant,
    open: Mutex<bool>,
    cv: std::sync::Condvar,
}

const GATED: u64 = 2 * PAGE_SIZE;

impl PoolBackend for GatedBackend {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
    fn on_miss(&self, m: &Miss, dst: &mut [u8]) -> Result<MissReply, ServeMissError> {
        if m.pool_offset < GATED {
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.cv.wait(open).unwrap();
            }
        }
        dst.fill(0x5a);
        Ok(MissReply {
            data: MissData::InPlace { len: dst.len() },
            completes_at_ns: m.arrival_ns,
        })
    }
    fn on_writeback(&self, _: u64, _: &[u8], _: u32, t: u64) -> Result<u64, WritebackError> {
        Ok(t)
    }
}

/// Request threads grow with the VMs registered (one more than the VMs):
/// with two VMs, two misses stuck in slow host reads still leave a thread
/// for a third miss (with the two fixed threads of before, it waited until
/// the slow reads were done).
fn request_threads_grow_with_vms_so_slow_host_reads_hold_no_other_miss(t: Transport) {
    if !fuse_usable() || (t == Transport::IoUring && !uring_usable()) {
        return;
    }
    let b = Arc::new(GatedBackend {
        start: Instant::now(),
        open: Mutex::new(false),
        cv: std::sync::Condvar::new(),
    });
    let dir = tempfile::tempdir().unwrap();
    let opts = PlaneOptions {
        readers: 2,
        transport: t,
        ..PlaneOptions::default()
    };
    let p = match FusePoolPlane::mount(dir.path(), POOL, b.clone(), opts) {
        Ok(p) => p,
        Err(residency::MountPlaneError::Mount { source, .. })
            if source.raw_os_error() == Some(libc::EPERM) =>
        {
            skip_or_fail(&format!("mounting FUSE is not permitted here ({source})"));
            return;
        }
        Err(e) => panic!("mount: {e:?}"),
    };
    // Request threads, or ring workers per CPU queue.
    let threads = |p: &FusePoolPlane| match p.transport() {
        ActiveTransport::DevFuse => p.readers(),
        ActiveTransport::IoUring {
            queues, workers, ..
        } => workers / queues,
    };
    assert_eq!(threads(&p), 2);
    p.register_vmm(0, 1_000_001);
    p.register_vmm(1, 1_000_002);
    p.register_vmm(1, 1_000_003); // the same VM again: no new thread
    assert_eq!(threads(&p), 3, "one more than the VMs");
    // Two misses stuck in slow host reads (pages 0 and 1), each on a thread
    // of its own, as two vCPUs of one VM would be.
    let target = p.map_target().clone();
    let stuck: Vec<_> = (0..2u64)
        .map(|i| {
            let t = target.clone();
            std::thread::spawn(move || Mapping::new(&t).read(i * PAGE_SIZE))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        stuck.iter().all(|h| !h.is_finished()),
        "the gate holds them"
    );
    // Another miss is answered meanwhile.
    let (tx, rx) = std::sync::mpsc::channel();
    let t = target.clone();
    std::thread::spawn(move || {
        let v = Mapping::new(&t).read(5 * PAGE_SIZE);
        let _ = tx.send(v);
    });
    let got = rx.recv_timeout(Duration::from_secs(3));
    // Open the gate whatever happened, so that nothing hangs.
    *b.open.lock().unwrap() = true;
    b.cv.notify_all();
    assert_eq!(
        got,
        Ok(0x5a),
        "a miss waited behind two others' slow host reads"
    );
    for h in stuck {
        assert_eq!(h.join().unwrap(), 0x5a);
    }
    drop(p);
    drop(dir);
}

/// Each scenario above, on `/dev/fuse` and on FUSE over io_uring.
macro_rules! on_both_transports {
    ($($name:ident),* $(,)?) => {
        mod dev_fuse {
            $(#[test]
            fn $name() {
                super::$name(residency::Transport::DevFuse)
            })*
        }
        mod io_uring {
            $(#[test]
            fn $name() {
                super::$name(residency::Transport::IoUring)
            })*
        }
    };
}

on_both_transports!(
    first_touch_traps_once_per_page_with_the_right_data,
    evicted_pages_trap_again,
    stored_pages_do_not_trap,
    dirty_pages_are_written_back_on_evict_and_msync,
    odd_requests_get_errors_and_the_server_stays_up,
    drop_unmounts_and_stops,
    request_threads_grow_with_vms_so_slow_host_reads_hold_no_other_miss,
);

/// Misses, write-backs and the plane's own requests travel through the
/// ring, not `/dev/fuse`, once it is up; a polling worker serves them too.
#[test]
fn io_uring_carries_the_misses() {
    if !fuse_usable() || !uring_usable() {
        return;
    }
    for mode in [ReaderMode::Block, ReaderMode::Spin] {
        let b = TestBackend::new();
        let dir = tempfile::tempdir().unwrap();
        let opts = PlaneOptions {
            transport: Transport::IoUring,
            mode,
            ..PlaneOptions::default()
        };
        let p = FusePoolPlane::mount(dir.path(), POOL, b.clone(), opts).expect("mount");
        let ActiveTransport::IoUring {
            queues,
            workers,
            poll,
        } = p.transport()
        else {
            panic!("not on the ring: {:?}", p.transport());
        };
        assert_eq!(poll, mode == ReaderMode::Spin);
        assert!(queues >= 1);
        assert!(workers >= 1);
        let before = p.ring_requests();
        let m = Mapping::new(p.map_target());
        for page in 0..32 {
            assert_eq!(m.read(page * PAGE_SIZE), b.byte(page * PAGE_SIZE));
        }
        m.write(40 * PAGE_SIZE, 9);
        m.msync();
        let served = p.ring_requests() - before;
        assert!(
            served >= 33,
            "{mode:?}: {served} requests through the ring for 33 misses and a write-back"
        );
        assert_eq!(b.misses().len(), 33);
        assert_eq!(b.writebacks.lock().unwrap().len(), 1);
        drop(m);
        drop(p);
    }
}

#[test]
fn transports_parse_and_print() {
    for t in [Transport::Auto, Transport::DevFuse, Transport::IoUring] {
        assert_eq!(t.to_string().parse::<Transport>(), Ok(t));
    }
    assert!("ring".parse::<Transport>().is_err());
    assert_eq!(PlaneOptions::default().transport, Transport::Auto);
}
