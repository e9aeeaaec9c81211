//! A process serving the pool that dies abnormally (SIGKILL) must not hang
//! in the kernel. Without a guard it does: a thread waiting on a write-back
//! that an eviction (NOTIFY_INVAL_INODE) started, or on the FLUSH that
//! closing the pool file sends, waits uninterruptibly for a reply that the
//! process's own, already-killed request threads would have sent, so the
//! process never finishes exiting and the mount is wedged.
//!
//! The test re-runs this binary as a child that mounts a pool, dirties
//! every page and evicts in a loop against a slow write-back; the parent
//! SIGKILLs it mid-eviction and requires it to be reaped within seconds.
//! If it is not, the parent aborts the connection through fusectl (so the
//! machine is not left with a wedged process) and fails.
#![allow(clippy::unwrap_used)]

mod common;
use common::fuse_usable;

use residency::{
    FusePoolPlane, Miss, MissData, MissReply, PlaneOptions, PoolBackend, ResidencyPlane,
    ServeMissError, WritebackError, PAGE_SIZE,
};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const POOL: u64 = 1 << 20;
const CHILD_ENV: &str = "CXLFS_ABNORMAL_EXIT_CHILD";

/// Zero pages, no modeled delay, a slow write-back so that evictions keep
/// a write-back in flight most of the time.
struct SlowWriteback {
    start: Instant,
}

impl PoolBackend for SlowWriteback {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
    fn on_miss(&self, m: &Miss, dst: &mut [u8]) -> Result<MissReply, ServeMissError> {
        dst.fill(0);
        Ok(MissReply {
            data: MissData::InPlace { len: dst.len() },
            completes_at_ns: m.arrival_ns,
        })
    }
    fn on_writeback(&self, _: u64, _: &[u8], _: u32, now: u64) -> Result<u64, WritebackError> {
        std::thread::sleep(Duration::from_millis(100));
        Ok(now)
    }
}

/// The child: mount on the directory named by the environment, then dirty
/// and evict forever. Not a test when run normally (returns at once).
#[test]
fn child_serves_until_killed() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let backend = Arc::new(SlowWriteback {
        start: Instant::now(),
    });
    let plane = FusePoolPlane::mount(
        std::path::Path::new(&dir),
        POOL,
        backend,
        PlaneOptions::default(),
    )
    .unwrap();
    let t = plane.map_target();
    // SAFETY: a fresh shared mapping of the open pool file; checked below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            POOL as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            t.file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED);
    let base: *mut u8 = ptr.cast();
    let mut announced = false;
    loop {
        for page in 0..POOL / PAGE_SIZE {
            // SAFETY: in bounds of the live writable mapping above.
            unsafe { base.add((page * PAGE_SIZE) as usize).write_volatile(1) };
        }
        let ticket = plane.evict(0, POOL).unwrap();
        if !announced {
            println!("ready");
            std::io::stdout().flush().unwrap();
            announced = true;
        }
        let _ = ticket.wait();
    }
}

/// The fusectl directory of the connection mounted at `dir`, if visible.
fn fusectl_abort_path(dev: u64) -> std::path::PathBuf {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let kdev = (u64::from(major) << 20) | u64::from(minor);
    std::path::PathBuf::from(format!("/sys/fs/fuse/connections/{kdev}/abort"))
}

fn detach(dir: &std::path::Path) {
    let p = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
}

#[test]
fn sigkill_mid_eviction_does_not_wedge_the_process() {
    if std::env::var(CHILD_ENV).is_ok() || !fuse_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root_dev = std::fs::metadata(dir.path()).unwrap().dev();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_serves_until_killed", "--nocapture"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines.any(|l| l.map(|l| l.trim() == "ready").unwrap_or(false));
    if !ready {
        let status = child.wait().unwrap();
        panic!("the child never became ready ({status})");
    }
    let dev = std::fs::metadata(dir.path()).unwrap().dev();
    assert_ne!(dev, root_dev, "the child mounted the pool");
    // Let a few eviction rounds run so a write-back is in flight.
    std::thread::sleep(Duration::from_millis(350));
    child.kill().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut reaped = None;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            reaped = Some(status);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if reaped.is_none() {
        // Unwedge the machine before failing.
        let abort = fusectl_abort_path(dev);
        let _ = std::fs::write(&abort, "1");
    }
    // Reaped already, or unwedged just above.
    let _ = child.wait();
    detach(dir.path());
    assert!(
        reaped.is_some(),
        "a SIGKILLed pool server was still not reaped after 10 s (hung in the kernel)"
    );
}
