//! The sampler over real planes (the rig of `control::planes_rig`): arming, the
//! sampled trap, deferred write-backs, the thread.
#![allow(clippy::unwrap_used)]
use super::*;
use crate::control::planes_rig::{planes, region_traps, RegionMap};
use crate::device::{Publish, PAGE};
use std::time::Duration;

/// Armed pages of a DAX window and of a memory region trap once more, as
/// device hits the policy sees; the write-backs arming forces cost no NAND
/// program until the device evicts the pages, and nothing stored is lost.
#[test]
fn armed_pages_trap_as_hits_and_their_write_backs_wait_for_the_eviction() {
    let Some((rig, memory, _)) = planes() else {
        return;
    };
    let shared = &rig.shared;
    let file = rig.file("s", 4, 0x5a, libc::O_RDWR);
    let region = RegionMap::new(memory.region("vm0").unwrap().file());
    for p in 0..2 {
        assert_eq!((file.map.load(p), region.load(p)), (0x5a, 0));
    }
    file.map.store(1, 0x77);
    region.store(1, 0x66);
    let before = shared.stats();
    let traps = region_traps(&memory);
    // Device pages: the file's chunk 0 in the pool, the region's base.
    let extent = shared.read(|p, _| p.extent_of(file.key, 0)).unwrap();
    let fpage = extent * crate::device::EXTENT_SIZE / PAGE;
    let rpage = shared.memory_base() / PAGE;
    assert_eq!(rig.dax.arm_sampled(&[fpage, fpage + 1, rpage]), 2);
    assert_eq!(memory.arm_sampled(&[fpage, rpage, rpage + 1], |_| false), 2);
    // The region's helper stores a write-back at once and tells the daemon
    // after: its deferral may come a little after the eviction ended.
    let t = Instant::now();
    while shared.sampling_counts().deferred_pages < 2 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let counts = shared.sampling_counts();
    assert_eq!(
        (counts.armed_pages, counts.deferred_pages),
        (4, 2),
        "{counts:?}"
    );
    let after_arming = shared.stats();
    assert_eq!(
        after_arming.nand.host_programs, before.nand.host_programs,
        "arming charged the write-backs it forced"
    );
    assert_eq!(
        rig.host_pages("s", 2),
        [0x5a, 0x77],
        "the store did not reach the host"
    );

    // The next access of each armed page traps once, as a device hit.
    for p in 0..2 {
        assert_eq!(file.map.load(p), [0x5a, 0x77][p as usize]);
        assert_eq!(region.load(p), [0, 0x66][p as usize]);
    }
    let after = shared.stats();
    assert_eq!(after.hits, before.hits + 4, "{after:?}");
    assert_eq!(after.misses, before.misses, "a sampled access missed");
    assert_eq!(
        after.nand.reads(),
        before.nand.reads(),
        "a sampled access read NAND"
    );
    assert_eq!(region_traps(&memory), traps + 2);
    assert_eq!(shared.sampling_counts().sampled_accesses, 4);
    // Resident again: no more traps.
    for p in 0..2 {
        file.map.load(p);
        region.load(p);
    }
    assert_eq!(shared.stats().hits, before.hits + 4);

    // The device evicts them: the two deferred programs are charged now,
    // as the eviction of the dirty pages would have without sampling.
    let now = shared.now_ns();
    shared.transact(Publish::Wait, |_, dev| {
        dev.evict(now, fpage * PAGE, 2 * PAGE).unwrap();
        dev.evict(now, rpage * PAGE, 2 * PAGE).unwrap();
    });
    let done = shared.stats();
    assert_eq!(
        done.nand.host_programs,
        before.nand.host_programs + 2,
        "{done:?}"
    );
    assert_eq!(shared.sampling_counts().deferred_programs, 2);
    assert_eq!(
        (file.map.load(1), region.load(1)),
        (0x77, 0x66),
        "a store was lost"
    );
}

/// The thread arms the oldest quarter of the pages it heard of, each once
/// while it stays untouched, and stops when dropped.
#[test]
fn the_sampler_arms_resident_pages_until_dropped() {
    let Some((rig, memory, _)) = planes() else {
        return;
    };
    let region = RegionMap::new(memory.region("vm0").unwrap().file());
    let on = crate::hits::HitPlanes {
        device: rig.shared.clone(),
        dax: Some(rig.dax.clone()),
        memory: Some(memory.clone()),
    };
    let s = AccessSampler::start(on, 1000, None).unwrap();
    // The pages it may arm: those it heard of (their traps).
    for p in 0..64 {
        region.load(p);
    }
    let t = Instant::now();
    // Only the oldest quarter may be armed: pages 0..16.
    while rig.shared.sampling_counts().armed_pages < 16 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the sampler armed too little"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(s);
    let armed = rig.shared.sampling_counts().armed_pages;
    assert_eq!(
        armed, 16,
        "it armed pages it never heard of, twice, or young ones"
    );
    let traps = region_traps(&memory);
    for p in 16..64 {
        region.load(p);
    }
    assert_eq!(
        region_traps(&memory),
        traps,
        "it armed a page younger than the oldest quarter"
    );
    for p in 0..16 {
        region.load(p);
    }
    let c = rig.shared.sampling_counts();
    assert_eq!(c.sampled_accesses, 16, "{c:?}");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        rig.shared.sampling_counts().armed_pages,
        c.armed_pages,
        "it armed after the drop"
    );
}
