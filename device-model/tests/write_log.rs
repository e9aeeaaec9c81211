//! The write log (`cache.write_log_bytes`): golden sequences worked out by
//! hand, determinism, and properties (with the log off nothing changes;
//! every logged line ends in exactly one program or one merge).

#![allow(clippy::unwrap_used)]

use cxlfs_device_model::replay::{Arrival, Replayer};
use cxlfs_device_model::workload::{WorkloadKind, WorkloadSpec};
use cxlfs_device_model::{Device, DeviceConfig, Op};
use proptest::prelude::*;

const PAGE: u64 = 4096;
const HIT: u64 = 50;
const LINK: u64 = 150;
const T_R: u64 = 40_000;
const T_PROG: u64 = 200_000;

/// One channel, one LUN (every NAND operation queues on it), tR 40 us,
/// tProg 200 us, no channel transfer; a 16-page cache (LRU, 50 ns hit,
/// 150 ns link) of which the write log takes `log` bytes.
fn config(log: &str, extra: &[&str]) -> DeviceConfig {
    let write_log = format!("cache.write_log_bytes={log}");
    let mut overrides = vec![
        "nand.enabled=true",
        "nand.channels=1",
        "nand.luns_per_channel=1",
        "nand.planes_per_lun=1",
        "nand.blocks_per_plane=16",
        "nand.pages_per_block=64",
        "nand.overprovision_ratio=0.25",
        "nand.read_ns=40us",
        "nand.program_ns=200us",
        "nand.channel_xfer_ns=0",
        "cache.size_bytes=64KiB",
        "cache.ways=0",
        "cache.policy=lru",
        "cache.hit_latency_ns=50",
        "cache.hits_visible=true",
        "link.latency_ns=150",
        "prefetch.degree=0",
        write_log.as_str(),
    ];
    overrides.extend_from_slice(extra);
    DeviceConfig::default().with_overrides(&overrides).unwrap()
}

fn device(log: &str) -> Device {
    Device::new(config(log, &[])).unwrap()
}

#[test]
fn config_validates_the_log() {
    let base = DeviceConfig::default();
    for (set, key) in [
        ("cache.write_log_bytes=100", "cache.write_log_bytes"),
        ("cache.write_log_bytes=64", "cache.write_log_bytes"),
        (
            "cache.write_log_clean_start=1.5",
            "cache.write_log_clean_start",
        ),
        (
            "cache.write_log_clean_start=0",
            "cache.write_log_clean_start",
        ),
        (
            "cache.write_log_clean_stop=0.6",
            "cache.write_log_clean_stop",
        ),
    ] {
        let err = base.with_overrides(&[set]).unwrap_err();
        assert!(err.to_string().contains(key), "{set}: {err}");
    }
    let err = base
        .with_overrides(&["cache.size_bytes=64KiB", "cache.write_log_bytes=64KiB"])
        .unwrap_err();
    assert!(err.to_string().contains("cache.write_log_bytes"), "{err}");
    // Every preset ships with the log off and SkyByte's thresholds.
    for name in cxlfs_device_model::presets::PRESETS {
        let c = cxlfs_device_model::presets::preset(name).unwrap().cache;
        assert_eq!(c.write_log_bytes, 0, "{name}");
        assert_eq!(
            (c.write_log_clean_start, c.write_log_clean_stop),
            (0.51, 0.01)
        );
        assert_eq!(c.page_cache_bytes(), c.size_bytes, "{name}");
    }
}

#[test]
fn the_log_is_carved_out_of_the_cache() {
    let cfg = config("8KiB", &[]);
    assert_eq!(cfg.cache.page_cache_bytes(), 56 << 10);
    let mut dev = Device::new(cfg).unwrap();
    // 16 distinct pages read: only 14 fit the page cache.
    for p in 0..16 {
        dev.access(0, Op::Read, p * PAGE, 64).unwrap();
    }
    assert_eq!(dev.stats().resident_pages, 14);
    assert_eq!(dev.stats().evictions, 2);
    assert_eq!(dev.write_log().unwrap().capacity(), 128);
}

/// 8 writes of 64 bytes to 2 pages (4 lines each, one line written twice),
/// then a flush: 2 read-modify-writes, 2 programs, 6 + 1 lines merged.
#[test]
fn eight_writes_to_two_pages_clean_into_two_programs() {
    let mut dev = device("4KiB");
    let lines = [
        (0, 0),
        (0, 1),
        (1, 0),
        (0, 2),
        (1, 5),
        (0, 3),
        (1, 9),
        (0, 1),
    ];
    for (i, (page, line)) in lines.into_iter().enumerate() {
        let out = dev
            .access(i as u64 * 10, Op::Write, page * PAGE + line * 64, 64)
            .unwrap();
        assert_eq!(out.latency_ns, HIT + LINK, "write {i}");
        assert_eq!((out.nand_reads, out.nand_programs), (0, 0));
    }
    let s = dev.stats();
    assert_eq!(s.log_writes, 8);
    assert_eq!(s.log_coalesced, 1, "line 1 of page 0 written twice");
    assert_eq!(s.log_entries, 7);
    assert_eq!(s.nand_programs, 0, "below the start threshold: no cleaning");
    assert_eq!(s.dirty_pages, 0);
    assert_eq!(s.resident_pages, 0, "writes do not fill the page cache");

    // Page 0 then page 1 on the one LUN: R0 P0 R1 P1.
    let done = dev.flush(1_000).unwrap();
    assert_eq!(done, 1_000 + 2 * (T_R + T_PROG));
    let s = dev.stats();
    assert_eq!(s.nand_programs, 2);
    assert_eq!(
        s.nand.host_reads, 2,
        "neither page was cached: two RMW reads"
    );
    assert_eq!(s.log_programs, 2);
    assert_eq!(s.log_coalesced, 1 + 3 + 2);
    assert_eq!(s.log_entries, 0);
    assert_eq!(s.log_writes, s.log_coalesced + s.log_programs);
}

#[test]
fn a_cached_page_is_cleaned_without_a_read() {
    let mut dev = device("4KiB");
    let fill = dev.access(0, Op::Read, 3 * PAGE, 64).unwrap();
    assert_eq!(fill.nand_reads, 1);
    let t = fill.completes_at_ns;
    let w = dev.access(t, Op::Write, 3 * PAGE + 128, 64).unwrap();
    assert_eq!(w.latency_ns, HIT + LINK);
    assert_eq!(dev.flush(t + 10).unwrap(), t + 10 + T_PROG);
    let s = dev.stats();
    assert_eq!((s.nand.host_reads, s.nand_programs), (1, 1));
}

#[test]
fn read_after_write_of_a_logged_line_costs_the_hit_latency() {
    let mut dev = device("4KiB");
    dev.access(0, Op::Write, 7 * PAGE + 256, 64).unwrap();
    let r = dev.access(1_000, Op::Read, 7 * PAGE + 256, 64).unwrap();
    assert_eq!(r.latency_ns, HIT + LINK);
    assert!(r.hit);
    assert_eq!(r.nand_reads, 0);
    assert_eq!(dev.stats().log_hits, 1);
    // A line of the same page that is not logged needs the page: a NAND read.
    let other = dev.access(2_000, Op::Read, 7 * PAGE + 512, 64).unwrap();
    assert_eq!(other.nand_reads, 1);
    assert_eq!(other.latency_ns, T_R + HIT + LINK);
    // Without the log the same read-after-write is a miss (write-allocate fill).
    let mut plain = device("0");
    let w = plain.access(0, Op::Write, 7 * PAGE + 256, 64).unwrap();
    assert_eq!(w.latency_ns, T_R + HIT + LINK);
}

/// Writes 33 lines on 33 pages at t = 0 into a 64-entry log: the 33rd
/// reaches 51 % and cleaning takes all 33 pages (R then P each, on the one
/// LUN). A read of another page issued after that queues behind them.
#[test]
fn reads_queue_behind_cleaning_programs() {
    let mut dev = device("4KiB");
    for p in 0..32 {
        let out = dev.access(0, Op::Write, p * PAGE, 64).unwrap();
        assert_eq!(out.nand_programs, 0);
    }
    let trigger = dev.access(0, Op::Write, 32 * PAGE, 64).unwrap();
    assert_eq!((trigger.nand_reads, trigger.nand_programs), (33, 33));
    assert_eq!(
        trigger.latency_ns,
        HIT + LINK,
        "cleaning runs in the background"
    );
    let s = dev.stats();
    assert_eq!((s.log_cleanings, s.log_entries), (1, 0));
    let read = dev.access(1_000, Op::Read, 500 * PAGE, 64).unwrap();
    assert_eq!(read.completes_at_ns, 33 * (T_R + T_PROG) + T_R + HIT + LINK);
}

/// After the 33 above, 31 more lines fill the 64 entries (33 still being
/// cleaned); the next write waits for the first cleaning program to
/// complete, at tR + tProg, which frees one entry.
#[test]
fn a_full_log_stalls_a_write() {
    let mut dev = device("4KiB");
    for p in 0..64 {
        let out = dev.access(0, Op::Write, p * PAGE, 64).unwrap();
        assert_eq!(out.latency_ns, HIT + LINK, "write {p} fits");
    }
    let s = dev.stats();
    assert_eq!((s.log_entries, s.log_stalls), (31, 0));
    let stalled = dev.access(0, Op::Write, 64 * PAGE, 64).unwrap();
    assert_eq!(stalled.latency_ns, T_R + T_PROG + HIT + LINK);
    assert_eq!(stalled.nand_programs, 0);
    let s = dev.stats();
    assert_eq!((s.log_stalls, s.log_stall_ns), (1, T_R + T_PROG));
    assert_eq!(s.log_entries, 32);
    assert_eq!(dev.write_log().unwrap().in_flight(), 32);
    // An overwrite of a logged line needs no room: no stall.
    let again = dev.access(0, Op::Write, 64 * PAGE, 64).unwrap();
    assert_eq!(again.latency_ns, HIT + LINK);
}

#[test]
fn a_page_write_back_is_64_lines() {
    let mut dev = device("8KiB");
    dev.write_back(0, 2 * PAGE, PAGE).unwrap();
    let s = dev.stats();
    assert_eq!((s.log_writes, s.log_entries, s.nand_programs), (64, 64, 0));
    let r = dev.access(10, Op::Read, 2 * PAGE + 4000, 8).unwrap();
    assert_eq!(r.latency_ns, HIT + LINK);
    dev.access(20, Op::Write, 2 * PAGE, PAGE as u32).unwrap();
    assert_eq!(dev.stats().log_coalesced, 64);
}

#[test]
fn discard_drops_logged_lines() {
    let mut dev = device("4KiB");
    dev.access(0, Op::Write, 5 * PAGE, 64).unwrap();
    dev.discard(5 * PAGE, PAGE).unwrap();
    assert_eq!(dev.stats().log_entries, 0);
    assert_eq!(dev.flush(100).unwrap(), 100);
    assert_eq!(dev.stats().nand_programs, 0);
}

fn random_writes(cfg: DeviceConfig) -> cxlfs_device_model::replay::ReplayReport {
    let mut dev = Device::new(cfg).unwrap();
    let spec = WorkloadSpec {
        kind: WorkloadKind::Uniform,
        wss_bytes: 64 << 10,
        accesses: Some(20_000),
        write_ratio: 0.8,
        access_size: 64,
        seed: 7,
        ..WorkloadSpec::default()
    };
    let mut r = Replayer::new(&mut dev, Arrival::Closed { think_ns: 0 });
    r.run(spec.generate().unwrap()).unwrap();
    r.report()
}

#[test]
fn same_trace_twice_gives_identical_reports() {
    let a = random_writes(config("4KiB", &[]));
    let b = random_writes(config("4KiB", &[]));
    assert_eq!(a, b);
    assert!(a.log_writes > 0 && a.log_hits > 0 && a.log_coalesced > 0);
    assert!(a.nand_programs > 0 && a.log_cleanings > 0);
    assert_eq!(a.nand_programs, a.nand.programs);
}

#[derive(Debug, Clone, Copy)]
struct Step {
    write: bool,
    page: u64,
    offset: u64,
    len: u32,
    gap: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            any::<bool>(),
            0u64..48,
            0u64..4096,
            1u32..6000,
            0u64..300_000,
        )
            .prop_map(|(write, page, offset, len, gap)| Step {
                write,
                page,
                offset,
                len,
                gap,
            }),
        1..120,
    )
}

fn play(dev: &mut Device, steps: &[Step]) -> Vec<(u64, u32, u32)> {
    let mut now = 0;
    let mut seen = Vec::new();
    for s in steps {
        now += s.gap;
        let op = if s.write { Op::Write } else { Op::Read };
        let out = dev
            .access(now, op, s.page * PAGE + s.offset, s.len)
            .unwrap();
        seen.push((out.latency_ns, out.nand_reads, out.nand_programs));
    }
    seen
}

proptest! {
    /// With the log off its thresholds change nothing and its counters stay 0.
    #[test]
    fn log_off_changes_nothing(steps in steps()) {
        let mut a = Device::new(config("0", &[])).unwrap();
        let mut b = Device::new(config(
            "0",
            &["cache.write_log_clean_start=0.9", "cache.write_log_clean_stop=0.5"],
        ))
        .unwrap();
        prop_assert_eq!(play(&mut a, &steps), play(&mut b, &steps));
        let s = a.stats();
        prop_assert_eq!(&s, &b.stats());
        prop_assert_eq!(
            (s.log_writes, s.log_hits, s.log_coalesced, s.log_programs, s.log_entries),
            (0, 0, 0, 0, 0)
        );
        prop_assert_eq!(s.nand_programs, s.nand.programs());
        prop_assert!(a.write_log().is_none());
    }

    /// Every logged line ends in one cleaning program or one merge, and the
    /// log never holds more than its capacity.
    #[test]
    fn every_logged_line_is_programmed_or_merged(steps in steps()) {
        let mut dev = Device::new(config("4KiB", &[])).unwrap();
        let mut now = 0;
        for s in &steps {
            now += s.gap;
            let op = if s.write { Op::Write } else { Op::Read };
            dev.access(now, op, s.page * PAGE + s.offset, s.len).unwrap();
            let log = dev.write_log().unwrap();
            prop_assert!(log.entries() + log.in_flight() <= log.capacity());
            prop_assert_eq!(dev.stats().dirty_pages, 0);
        }
        dev.flush(now).unwrap();
        let s = dev.stats();
        prop_assert_eq!(s.log_entries, 0);
        prop_assert_eq!(s.log_writes, s.log_coalesced + s.log_programs);
        prop_assert_eq!(s.nand_programs, s.log_programs);
    }
}
