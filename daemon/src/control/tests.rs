//! Control commands over real residency planes (the rig of
//! `control::planes_rig`): a DAX window and a CXL memory region on one device.
#![allow(clippy::unwrap_used)]
use super::planes_rig::{planes, region_traps, RegionMap};
use super::Principal;
use crate::device::PAGE;
use cxlfs_api::control::{RangeSpec, Request};

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
    assert!(
        traps >= 2,
        "the region's first touches did not trap: {traps}"
    );
    assert_eq!((file.map.load(0), region.load(0)), (0x5a, 0));
    assert_eq!(
        rig.shared.stats().misses,
        file_misses,
        "a resident file page trapped"
    );
    assert_eq!(
        region_traps(&memory),
        traps,
        "a resident region page trapped"
    );

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
    assert_eq!(
        rig.shared.stats().misses,
        file_misses,
        "an unnamed file page left"
    );
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
