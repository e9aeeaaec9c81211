//! Control commands over real residency planes: a DAX window (the pool's
//! FUSE mount, a file's extent mapped as a guest's window maps it) and a
//! CXL memory region (a split plane whose helper is this test binary, run
//! again), both on one device.
#![allow(clippy::unwrap_used)]
use super::{ControlOptions, Controller, DevicePlacement, Planes, Principal};
use crate::dax::tests::{rig_on, Rig};
use crate::device::placement::Placement;
use crate::device::{SharedDevice, PAGE};
use crate::memory::{MemoryRegionSpec, MemoryRegions};
use crate::metrics::{MemorySource, Metrics, PlaneSource};
use cxlfs_api::control::{RangeSpec, Request};
use residency::HelperCommand;
use std::sync::Arc;

/// The name of [`plane_helper`] as the test harness knows it.
const HELPER_TEST: &str = "control::tests::plane_helper";
/// The memory region's size (one 2 MiB huge-page unit).
const REGION: u64 = 2 << 20;

/// Not a test: the entry point of the memory region's plane helper. The
/// region starts this binary again with the harness told to run this
/// function alone; with the helper's environment set it serves the
/// region and exits, and without it (run by hand) it returns at once.
#[test]
#[ignore = "the memory region's plane helper, started by the region itself"]
fn plane_helper() {
    residency::helper_main_if_requested();
}

/// The test binary, run as [`plane_helper`].
fn helper() -> HelperCommand {
    HelperCommand {
        program: std::env::current_exe().unwrap(),
        args: ["--exact", HELPER_TEST, "--ignored", "--test-threads=1"]
            .map(Into::into)
            .to_vec(),
    }
}

/// A shared mapping of a memory region's file: what QEMU maps as node 1.
struct RegionMap {
    at: *mut u8,
}

impl RegionMap {
    fn new(file: &std::fs::File) -> Self {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of the region file, checked below.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                REGION as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        RegionMap { at: at.cast() }
    }

    fn load(&self, page: u64) -> u8 {
        assert!(page < REGION / PAGE);
        // SAFETY: inside the mapping, which lives as long as `self`.
        unsafe { std::ptr::read_volatile(self.at.add((page * PAGE) as usize)) }
    }
}

impl Drop for RegionMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping of REGION bytes, unmapped once.
        unsafe {
            libc::munmap(self.at.cast(), REGION as usize);
        }
    }
}

/// The DAX rig with one memory region ("vm0") on its device, and a
/// controller over both planes.
fn planes() -> Option<(Rig, Arc<MemoryRegions>, Arc<Controller>)> {
    let make = |device| {
        SharedDevice::with_memory(device, Placement::new(100).unwrap(), REGION).unwrap()
    };
    let rig = rig_on(make)?;
    let spec = MemoryRegionSpec {
        vm: "vm0".into(),
        size: REGION,
    };
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryRegions::start(&rig.shared, &[spec], dir.path(), &helper()).unwrap();
    let plane: Arc<dyn PlaneSource> = rig.dax.clone();
    let metrics = Metrics::new(rig.shared.clone(), Some(plane)).with_memory(memory.clone());
    let controller = Controller::new(
        rig.shared.clone(),
        Arc::new(metrics),
        Planes {
            dax: Some(rig.dax.clone()),
            memory: Some(memory.clone()),
        },
        Arc::new(DevicePlacement(rig.shared.clone())),
        rig.share.path(),
        ControlOptions {
            pin_quota_bytes: 1 << 20,
            max_range_bytes: 1 << 20,
            prefetch_budget_bytes: 1 << 20,
            guest_device_control: false,
        },
        Default::default(),
    )
    .unwrap();
    Some((rig, memory, controller))
}

fn region_traps(memory: &MemoryRegions) -> u64 {
    MemorySource::regions(memory)[0].traps
}

/// An `evict` from the control socket reaches every plane through the
/// device: the file page leaves the DAX window and the memory page leaves
/// the region, so the next load of either traps again — while a page the
/// command did not name stays mapped.
#[test]
fn an_evicting_command_leaves_the_window_and_the_region_alike() {
    let Some((rig, memory, controller)) = planes() else {
        return;
    };
    let file = rig.file("ev", 4, 0x5a, libc::O_RDWR);
    let region = RegionMap::new(memory.region("vm0").unwrap().file());
    // First touches trap; touching again does not.
    assert_eq!((file.map.load(0), file.map.load(1)), (0x5a, 0x5a));
    assert_eq!((region.load(0), region.load(1)), (0, 0));
    let (file_misses, traps) = (rig.shared.stats().misses, region_traps(&memory));
    assert!(traps >= 2, "the region's first touches did not trap: {traps}");
    assert_eq!((file.map.load(0), region.load(0)), (0x5a, 0));
    assert_eq!(rig.shared.stats().misses, file_misses, "a resident file page trapped");
    assert_eq!(region_traps(&memory), traps, "a resident region page trapped");

    // Evict page 0 of each through the controller, as `cxlfs ctl evict`.
    let evict = |spec| {
        controller
            .execute(&Principal::Host, Request::Evict(spec))
            .unwrap()
            .result
    };
    let done = evict(RangeSpec::file("ev", Some(0), Some(PAGE)));
    assert_eq!(done["pages"], 1, "{done}");
    let done = evict(RangeSpec::memory("vm0", 0, Some(PAGE)));
    assert_eq!(done["pages"], 1, "{done}");

    // Page 1 of each stays; page 0 of each traps again.
    assert_eq!((file.map.load(1), region.load(1)), (0x5a, 0));
    assert_eq!(rig.shared.stats().misses, file_misses, "an unnamed file page left");
    assert_eq!(region_traps(&memory), traps, "an unnamed region page left");
    assert_eq!(file.map.load(0), 0x5a);
    assert_eq!(
        rig.shared.stats().misses,
        file_misses + 1,
        "the evicted file page was still mapped in the window"
    );
    assert_eq!(region.load(0), 0);
    assert_eq!(
        region_traps(&memory),
        traps + 1,
        "the evicted region page was still mapped in the region"
    );
}
