//! Real residency planes for tests: a DAX window (the pool's FUSE mount,
//! a file's extent mapped as a guest's window maps it) and a CXL memory
//! region (a split plane whose helper is this test binary, run again),
//! both on one device, with a controller over them.
#![allow(clippy::unwrap_used)]
use super::{ControlOptions, Controller, DevicePlacement, Planes};
use crate::dax::tests::{rig_on, Rig};
use crate::device::placement::Placement;
use crate::device::{SharedDevice, PAGE};
use crate::memory::{MemoryRegionSpec, MemoryRegions};
use crate::metrics::{MemorySource, Metrics, PlaneSource};
use residency::HelperCommand;
use std::sync::Arc;

/// The name of [`plane_helper`] as the test harness knows it.
const HELPER_TEST: &str = "control::planes_rig::plane_helper";
/// The memory region's size (one 2 MiB huge-page unit).
pub(crate) const REGION: u64 = 2 << 20;

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
        // The test harness around the helper makes calls of its own.
        seccomp: residency::SeccompMode::Log,
    }
}

/// A shared mapping of a memory region's file: what QEMU maps as node 1.
pub(crate) struct RegionMap {
    at: *mut u8,
}

impl RegionMap {
    pub(crate) fn new(file: &std::fs::File) -> Self {
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

    pub(crate) fn load(&self, page: u64) -> u8 {
        assert!(page < REGION / PAGE);
        // SAFETY: inside the mapping, which lives as long as `self`.
        unsafe { std::ptr::read_volatile(self.at.add((page * PAGE) as usize)) }
    }
}

impl RegionMap {
    pub(crate) fn store(&self, page: u64, value: u8) {
        assert!(page < REGION / PAGE);
        // SAFETY: inside the mapping, which lives as long as `self`.
        unsafe { std::ptr::write_bytes(self.at.add((page * PAGE) as usize), value, PAGE as usize) }
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
pub(crate) fn planes() -> Option<(Rig, Arc<MemoryRegions>, Arc<Controller>)> {
    let make =
        |device| SharedDevice::with_memory(device, Placement::new(100).unwrap(), REGION).unwrap();
    let rig = rig_on(make)?;
    let spec = MemoryRegionSpec {
        vm: "vm0".into(),
        size: REGION,
    };
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryRegions::start(
        &rig.shared,
        &[spec],
        dir.path(),
        &helper(),
        crate::memory::RegionPlane {
            compensation: residency::pace::Compensation::Off,
            transport: residency::Transport::Auto,
        },
    )
    .unwrap();
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

/// Traps of the rig's region so far.
pub(crate) fn region_traps(memory: &MemoryRegions) -> u64 {
    MemorySource::regions(memory)[0].traps
}
