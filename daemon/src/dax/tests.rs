//! The DAX coherence of the space operations over a real residency
//! plane (a FUSE mount; root and /dev/fuse) and a real passthrough:
//! stores go through a mapping of the pool file, as a guest's through
//! its window.
use super::{DaxPlane, SLOT_SIZE};
use crate::abi::{fattr, SetattrIn, ROOT_ID};
use crate::device::{Publish, SharedDevice, EXTENT_SIZE, PAGE};
use crate::ids::FileKey;
use crate::metrics::VmMetrics;
use crate::passthrough::{CacheMode, PassthroughFs};
use crate::server::{Context, CopyRange, Fallocate, FileSystem};
use crate::sync::lock;
use crate::timing::Coherence;
use crate::timing::TimedFs;
use cxlfs_device_model::{Device, DeviceConfig};
use residency::ResidencyPlane;
use residency::{FusePoolPlane, PlaneOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, MutexGuard};

const P: u64 = PAGE;
pub(crate) const C: Context = Context {
    uid: 0,
    gid: 0,
    pid: 0,
    arrival_ns: 0,
};

/// A file's first extent mapped shared from the pool file.
pub(crate) struct Mapped {
    at: *mut u8,
}

impl Mapped {
    pub(crate) fn store(&self, page: u64, value: u8) {
        // SAFETY: `page` lies in the mapping (asserted); a store traps
        // into the plane like a guest's.
        unsafe {
            assert!(page < EXTENT_SIZE / P);
            std::ptr::write_bytes(self.at.add((page * P) as usize), value, P as usize);
        }
    }

    pub(crate) fn load(&self, page: u64) -> u8 {
        assert!(page < EXTENT_SIZE / P);
        // SAFETY: inside the mapping, which lives as long as `self`.
        unsafe { std::ptr::read_volatile(self.at.add((page * P) as usize)) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: our own mapping of EXTENT_SIZE bytes, unmapped once.
        unsafe {
            libc::munmap(self.at.cast(), EXTENT_SIZE as usize);
        }
    }
}

/// One plane test at a time: while one runs, another's write-backs
/// (its syncs, its unmount) were seen to set the kernel writing back
/// this one's dirty pool pages too, at random, which the write-back
/// counts below cannot tell from the operation's own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A tmpfs mounted over a rig's share (a share that fills up), unmounted
/// when the rig goes.
struct SmallShare(std::ffi::CString);

impl SmallShare {
    fn mount(at: &std::path::Path, bytes: u64) -> Self {
        use std::os::unix::ffi::OsStrExt;
        let size = format!("size={bytes}");
        crate::sandbox::mount(None, at, Some("tmpfs"), 0, Some(&size)).expect("mount tmpfs");
        SmallShare(std::ffi::CString::new(at.as_os_str().as_bytes()).unwrap())
    }
}

impl Drop for SmallShare {
    fn drop(&mut self) {
        // SAFETY: a valid NUL-terminated path.
        unsafe {
            libc::umount2(self.0.as_ptr(), libc::MNT_DETACH);
        }
    }
}

pub(crate) struct Rig {
    _one: MutexGuard<'static, ()>,
    pub(crate) fs: TimedFs<PassthroughFs>,
    pub(crate) dax: Arc<DaxPlane>,
    pub(crate) shared: Arc<SharedDevice>,
    _small: Option<SmallShare>,
    pub(crate) share: tempfile::TempDir,
    _mnt: tempfile::TempDir,
}

/// An open file of the share: node, handle, key, and its chunk 0
/// mapped from the pool.
pub(crate) struct Opened {
    pub(crate) nodeid: u64,
    pub(crate) fh: u64,
    pub(crate) key: FileKey,
    pub(crate) map: Mapped,
}

/// The plane mounted over a fresh device; `None` (the test is skipped)
/// without root or /dev/fuse, outside CI.
pub(super) fn rig() -> Option<Rig> {
    rig_on(SharedDevice::new)
}

/// The device the rigs run: a 16 MiB cache, 2 µs NAND reads.
pub(crate) fn rig_device() -> Device {
    let cfg = DeviceConfig::default()
        .with_overrides(&["cache.size_bytes=16MiB", "nand.read_ns=2us"])
        .unwrap();
    Device::new(cfg).unwrap()
}

/// [`rig_on`] over the shared device `make` builds of [`rig_device`].
pub(crate) fn rig_on(make: impl FnOnce(Device) -> SharedDevice) -> Option<Rig> {
    rig_with(make, None)
}

/// [`rig`] whose share is a tmpfs of `share_bytes`, or the host's
/// temporary directory.
pub(crate) fn rig_with(
    make: impl FnOnce(Device) -> SharedDevice,
    share_bytes: Option<u64>,
) -> Option<Rig> {
    let one = lock(&ONE_AT_A_TIME);
    let mnt = tempfile::tempdir().unwrap();
    let share = tempfile::tempdir().unwrap();
    let shared = Arc::new(make(rig_device()));
    let mount = |size, backend| {
        FusePoolPlane::mount(mnt.path(), size, backend, PlaneOptions::default())
            .map(|p| Arc::new(p) as Arc<dyn ResidencyPlane>)
    };
    let dax = match DaxPlane::start(shared.clone(), SLOT_SIZE, mount) {
        Ok(d) => d,
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the DAX tests need a residency plane (root, /dev/fuse): {e}"
            );
            eprintln!("skipped: no residency plane ({e})");
            return None;
        }
    };
    // Write-backs only when a test asks: no periodic sync, and the
    // pool's FUSE mount off the strict per-mount dirty limit (with it,
    // a fresh mount's tiny share of the dirty threshold has the kernel
    // write back a few dirty pages at once, at random).
    dax.set_writeback_interval(std::time::Duration::ZERO);
    if let Ok(m) = dax.plane().unwrap().map_target().file.metadata() {
        use std::os::unix::fs::MetadataExt;
        let (major, minor) = (rustix::fs::major(m.dev()), rustix::fs::minor(m.dev()));
        let knob = format!("/sys/class/bdi/{major}:{minor}/strict_limit");
        // Older kernels have no knob: the counts below may then flake.
        let _ = std::fs::write(knob, "0");
    }
    let small = share_bytes.map(|b| SmallShare::mount(share.path(), b));
    let fs = PassthroughFs::new(share.path(), CacheMode::Never).unwrap();
    let metrics = Arc::new(VmMetrics::new("t"));
    let coherence: Arc<dyn Coherence> = dax.clone();
    let fs = TimedFs::new(fs, shared.clone(), metrics, Some(coherence));
    Some(Rig {
        _one: one,
        fs,
        dax,
        shared,
        _small: small,
        share,
        _mnt: mnt,
    })
}

impl Rig {
    /// Creates `name` with `pages` pages of `fill` (a sparse file of
    /// that size with `fill` 0), opens it with `flags`, maps it.
    pub(crate) fn file(&self, name: &str, pages: u64, fill: u8, flags: i32) -> Opened {
        let path = self.share.path().join(name);
        let f = std::fs::File::create(&path).unwrap();
        if fill == 0 {
            f.set_len(pages * P).unwrap();
        } else {
            f.write_all_at(&vec![fill; (pages * P) as usize], 0)
                .unwrap();
        }
        let nodeid = self
            .fs
            .lookup(&C, ROOT_ID, name.as_bytes())
            .unwrap()
            .value
            .nodeid;
        let fh = self.fs.open(&C, nodeid, flags as u32, 0).unwrap().value.fh;
        let key = self.fs.file_key(nodeid, Some(fh)).unwrap();
        let open = || {
            self.fs
                .host_file(nodeid, Some(fh), true)?
                .pool_file
                .ok_or(rustix::io::Errno::BADF)
        };
        let extent = self.dax.window_extent(key, 0, open).unwrap().unwrap();
        let pool = self.dax.plane().unwrap().map_target().file.clone();
        // SAFETY: a fresh shared mapping of the pool file at the
        // extent's offset; nothing else lives there.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                EXTENT_SIZE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                pool.as_raw_fd(),
                (extent * EXTENT_SIZE) as libc::off_t,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        Opened {
            nodeid,
            fh,
            key,
            map: Mapped { at: at.cast() },
        }
    }

    /// The first byte of each of the host file's first `n` pages.
    pub(crate) fn host_pages(&self, name: &str, n: u64) -> Vec<u8> {
        let data = std::fs::read(self.share.path().join(name)).unwrap();
        (0..n)
            .map(|p| data.get((p * P) as usize).copied().unwrap_or(0))
            .collect()
    }

    fn programs(&self) -> u64 {
        self.shared.stats().nand.host_programs
    }
}

pub(crate) fn punch(o: &Opened, offset: u64, length: u64) -> Fallocate {
    Fallocate {
        nodeid: o.nodeid,
        fh: o.fh,
        offset,
        length,
        mode: (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32,
    }
}

/// A device eviction run the way a control command runs it (a
/// transaction that waits for the observers) leaves no page of it in
/// the window: the next load traps again, and a store made through the
/// window reached the host file before the page was dropped.
#[test]
fn an_eviction_through_the_device_leaves_the_window() {
    let Some(r) = rig() else { return };
    let f = r.file("ev", 4, 0x11, libc::O_RDWR);
    assert_eq!(f.map.load(0), 0x11);
    f.map.store(1, 0x22);
    let misses = r.shared.stats().misses;
    assert_eq!(f.map.load(0), 0x11);
    assert_eq!(r.shared.stats().misses, misses, "a resident page trapped");
    let base = r.shared.read(|p, _| p.extent_of(f.key, 0)).unwrap() * EXTENT_SIZE;
    let now = r.shared.now_ns();
    let (o, done) = r
        .shared
        .transact(Publish::Wait, |_, dev| dev.evict(now, base, 4 * P).unwrap());
    assert_eq!(o.evicted, 2, "{o:?}");
    assert_eq!(done.evicted_pages, 2);
    assert_eq!(done.dropped_pages, 2, "the window kept evicted pages");
    assert_eq!(r.host_pages("ev", 2), [0x11, 0x22], "the store was lost");
    assert_eq!((f.map.load(0), f.map.load(1)), (0x11, 0x22));
    assert_eq!(
        r.shared.stats().misses,
        misses + 2,
        "an evicted page was still mapped"
    );
}

#[test]
fn a_punched_range_leaves_the_windows_unwritten_and_never_comes_back() {
    let Some(r) = rig() else { return };
    let f = r.file("f", 4, 0xaa, libc::O_RDWR);
    let before = r.programs();
    for p in 0..4 {
        f.map.store(p, 0xbb);
    }
    r.fs.fallocate(&C, punch(&f, P, 2 * P)).unwrap();
    // Pages 1 and 2 were dropped unwritten: the host has the hole.
    // (Pages 0 and 3 may have been written back with them when the
    // page cache holds the four in one large folio: they keep bytes.)
    assert_eq!(r.host_pages("f", 4)[1..3], [0, 0]);
    // A load traps and reads the hole; the other pages keep the stores.
    assert_eq!(
        (f.map.load(0), f.map.load(1), f.map.load(3)),
        (0xbb, 0, 0xbb)
    );
    // A write-back now brings back nothing of the punched range, and
    // only pages 0 and 3 were ever programmed.
    r.dax.sync_file_range(f.key, 0, u64::MAX).unwrap();
    assert_eq!(r.host_pages("f", 4), [0xbb, 0, 0, 0xbb]);
    assert_eq!(r.programs(), before + 2);
    assert!(lock(&r.dax.state.discards).is_empty());
}

#[test]
fn a_refused_punch_stores_the_window_stores_it_held() {
    let Some(r) = rig() else { return };
    // Read-only handle: the host refuses the punch (EBADF) after the
    // pool pages were dropped.
    let f = r.file("f", 4, 0xaa, libc::O_RDONLY);
    let before = r.programs();
    for p in 0..4 {
        f.map.store(p, 0xcc);
    }
    let e = r.fs.fallocate(&C, punch(&f, 0, 4 * P)).unwrap_err();
    assert_eq!(e, rustix::io::Errno::BADF);
    assert_eq!(r.host_pages("f", 4), [0xcc; 4], "the stores survive");
    assert_eq!(
        r.programs(),
        before + 4,
        "charged as the write-backs they were"
    );
    assert!(lock(&r.dax.state.discards).is_empty());
}

#[test]
fn a_truncation_down_writes_back_only_the_page_that_keeps_bytes() {
    let Some(r) = rig() else { return };
    let f = r.file("f", 8, 0xaa, libc::O_RDWR);
    let before = r.programs();
    for p in 0..8 {
        f.map.store(p, 0xdd);
    }
    let attr = SetattrIn {
        valid: fattr::SIZE,
        size: P + 10,
        ..SetattrIn::default()
    };
    r.fs.setattr(&C, f.nodeid, &attr).unwrap();
    // Page 1 (the new end) was written back; 2..8 dropped unwritten.
    let host = std::fs::read(r.share.path().join("f")).unwrap();
    assert_eq!(host.len() as u64, P + 10);
    assert!(host[P as usize..].iter().all(|&b| b == 0xdd));
    // Page 0 too once synced (or already, in a large folio with page
    // 1); pages 2..8 were never programmed.
    r.dax.sync_file_range(f.key, 0, u64::MAX).unwrap();
    assert_eq!(r.programs(), before + 2);
    assert_eq!(r.host_pages("f", 1), [0xdd]);
}

#[test]
fn copies_seeks_and_syncfs_see_the_window_stores() {
    let Some(r) = rig() else { return };
    let src = r.file("src", 4, 0x11, libc::O_RDWR);
    let dst = r.file("dst", 4, 0x22, libc::O_RDWR);
    src.map.store(0, 0x33);
    // The destination's page is resident (clean) before the copy.
    assert_eq!(dst.map.load(1), 0x22);
    let copy = CopyRange {
        nodeid_in: src.nodeid,
        fh_in: src.fh,
        off_in: 0,
        nodeid_out: dst.nodeid,
        fh_out: dst.fh,
        off_out: P,
        len: 2 * P,
    };
    assert_eq!(
        r.fs.copy_file_range(&C, copy).unwrap().value,
        2 * P as usize
    );
    assert_eq!(r.host_pages("dst", 4), [0x22, 0x33, 0x11, 0x22]);
    assert_eq!(dst.map.load(1), 0x33, "the stale page was dropped");
    // Within one file (one guard): the copy sees its own window store.
    dst.map.store(3, 0x44);
    let copy = CopyRange {
        nodeid_in: dst.nodeid,
        fh_in: dst.fh,
        off_in: 3 * P,
        nodeid_out: dst.nodeid,
        fh_out: dst.fh,
        off_out: 0,
        len: P,
    };
    r.fs.copy_file_range(&C, copy).unwrap();
    assert_eq!(r.host_pages("dst", 4), [0x44, 0x33, 0x11, 0x44]);
    // SEEK_DATA finds data a window stored into a hole.
    let sparse = r.file("sparse", 64, 0, libc::O_RDWR);
    sparse.map.store(10, 0x55);
    let at =
        r.fs.lseek(&C, sparse.nodeid, sparse.fh, 0, libc::SEEK_DATA as u32)
            .unwrap()
            .value;
    assert_eq!(at, 10 * P);
    // SYNCFS writes back every file's window stores.
    src.map.store(2, 0x66);
    sparse.map.store(20, 0x77);
    r.fs.syncfs(&C, ROOT_ID).unwrap();
    assert_eq!(r.host_pages("src", 4), [0x33, 0x11, 0x66, 0x11]);
    assert_eq!(r.host_pages("sparse", 21)[20], 0x77);
}
