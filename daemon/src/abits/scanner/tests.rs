//! The scanner over a real memory region (the rig of `control::planes_rig`):
//! bits a VMM set become references of the resident pages only, the source
//! covers the region only while the VMM has the area attached and its VM is
//! connected, and an area
//! whose header was written over is refused.
#![allow(clippy::unwrap_used)]
use super::*;
use crate::abits::{create_area, HEADER_BYTES};
use crate::control::planes_rig::{planes, RegionMap};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

/// Waits (at most 5 s) until `done`.
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "waited 5 s for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A source over vm0's memory region of `memory`, its area in `dir`
/// (re-armed every `period`), and the area's path.
fn source_on(
    rig: &crate::dax::tests::Rig,
    memory: &Arc<crate::memory::MemoryRegions>,
    dir: &std::path::Path,
    period: Duration,
    connected: Connected,
) -> (AccessBitsSource, std::path::PathBuf) {
    let size = memory.region("vm0").unwrap().size;
    let socket = dir.join("vm0.sock");
    let area = create_area("vm0", &socket, RegionKind::Memory, size, period).unwrap();
    let path = area.area.path().to_path_buf();
    let source = AccessBitsSource::start(
        vec![area],
        period,
        HitPlanes {
            device: rig.shared.clone(),
            dax: None,
            memory: Some(memory.clone()),
        },
        connected,
        false,
    )
    .unwrap();
    (source, path)
}

#[test]
fn set_bits_become_references_of_resident_pages_while_the_area_is_attached() {
    let Some((rig, memory, _)) = planes() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (source, path) = source_on(
        &rig,
        &memory,
        dir.path(),
        Duration::from_millis(100),
        Box::new(|_| true),
    );
    // Pages 0..4 of the region become resident (each one a trap, a miss).
    let region = RegionMap::new(memory.region("vm0").unwrap().file());
    for p in 0..4 {
        region.load(p);
    }
    let scans = || source.shared.figures.scans.load(Ordering::Relaxed);
    // Two scans later, the fills lie before the period being read.
    let after = scans();
    wait_for("two scans", || scans() >= after + 2);
    assert!(
        !source.covers("vm0", RegionKind::Memory),
        "not attached yet"
    );

    // The VMM: attached, bits of pages 1, 2 (resident) and 100 (not).
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    let bits: u64 = 1 << 1 | 1 << 2;
    f.write_all_at(&bits.to_le_bytes(), u64::from(HEADER_BYTES))
        .unwrap();
    f.write_all_at(&(1u64 << 36).to_le_bytes(), u64::from(HEADER_BYTES) + 8)
        .unwrap();
    let before = rig.shared.stats();
    f.write_all_at(&1u32.to_le_bytes(), 28).unwrap(); // active
    wait_for("the references", || {
        source.samples().first().is_some_and(|r| r.bits_read == 3)
    });
    let row = &source.samples()[0];
    assert_eq!((row.vm.as_str(), row.region.as_str()), ("vm0", "memory"));
    assert_eq!(row.references, 2, "{row:?}");
    assert!(source.covers("vm0", RegionKind::Memory));
    let after = rig.shared.stats();
    assert_eq!(after.references - before.references, 2);
    assert_eq!(
        (after.hits, after.misses, after.nand.reads()),
        (before.hits, before.misses, before.nand.reads()),
        "a reference is no access and reads no NAND"
    );
    let mut totals = DeviceTotals::default();
    source.add_totals(&mut totals);
    assert_eq!((totals.access_bits_read, totals.access_bits_absent), (3, 1));

    // A header written over: refused for good, nothing read from it.
    f.write_all_at(&7u64.to_le_bytes(), 16).unwrap();
    f.write_all_at(&1u64.to_le_bytes(), u64::from(HEADER_BYTES))
        .unwrap();
    let at = scans();
    wait_for("a scan", || scans() > at + 1);
    assert!(!source.covers("vm0", RegionKind::Memory));
    assert_eq!(
        source.samples()[0].bits_read,
        3,
        "a refused area is not read"
    );
}

#[test]
fn an_attached_area_covers_its_region_only_while_its_vm_is_connected() {
    let Some((rig, memory, _)) = planes() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let connected = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let c = connected.clone();
    let (source, path) = source_on(
        &rig,
        &memory,
        dir.path(),
        Duration::from_millis(50),
        Box::new(move |_| c.load(Ordering::Relaxed)),
    );
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&1u32.to_le_bytes(), 28).unwrap(); // active
    wait_for("the area to be covered", || {
        source.covers("vm0", RegionKind::Memory)
    });
    // The VMM died: its mark stays, its VM is gone.
    connected.store(false, Ordering::Relaxed);
    wait_for("the region to be left", || {
        !source.covers("vm0", RegionKind::Memory)
    });
    let read = source.samples()[0].bits_read;
    f.write_all_at(&1u64.to_le_bytes(), u64::from(HEADER_BYTES))
        .unwrap();
    let scans = || source.shared.figures.scans.load(Ordering::Relaxed);
    let at = scans();
    wait_for("two scans", || scans() > at + 1);
    assert_eq!(
        source.samples()[0].bits_read,
        read,
        "the area of a VM that left is not read"
    );
    // A new front-end of the VM connects and attaches the area again.
    connected.store(true, Ordering::Relaxed);
    wait_for("the area to be covered again", || {
        source.covers("vm0", RegionKind::Memory)
    });
}
