//! Device-level behaviour: timing of hits, misses and coalesced misses,
//! prefetch accounting, write-back, pin / unpin / evict, policy switching,
//! error cases, determinism.

#![allow(clippy::unwrap_used)]

use cxlfs_device_model::config::PolicyKind;
use cxlfs_device_model::device::AccessError;
use cxlfs_device_model::{Device, Op};
use proptest::prelude::*;

const PAGE: u64 = 4096;

/// A small FEMU-geometry device with round timings: tR 40 us, tProg 200 us,
/// no channel transfer, 16-page cache, 100 ns hit, 10 ns link.
fn device(extra: &[&str]) -> Device {
    let mut overrides = vec![
        "cache.size_bytes=64KiB",
        "cache.ways=0",
        "cache.policy=lru",
        "cache.hit_latency_ns=100",
        "cache.hits_visible=true",
        "link.latency_ns=10",
        "nand.channel_xfer_ns=0",
        "prefetch.degree=0",
    ];
    overrides.extend_from_slice(extra);
    let cfg = cxlfs_device_model::presets::preset("femu")
        .unwrap()
        .with_overrides(&overrides)
        .unwrap();
    Device::new(cfg).unwrap()
}

#[test]
fn miss_then_hit_latencies() {
    let mut dev = device(&[]);
    let miss = dev.access(1_000, Op::Read, 5 * PAGE, 64).unwrap();
    assert!(!miss.hit);
    assert_eq!(miss.latency_ns, 40_000 + 100 + 10);
    assert_eq!(miss.nand_reads, 1);
    let hit = dev
        .access(miss.completes_at_ns, Op::Read, 5 * PAGE + 64, 64)
        .unwrap();
    assert!(hit.hit);
    assert_eq!(hit.latency_ns, 100 + 10);
    let s = dev.stats();
    assert_eq!((s.hits, s.misses, s.nand.reads()), (1, 1, 1));
}

#[test]
fn second_miss_to_a_filling_page_coalesces() {
    let mut dev = device(&[]);
    let first = dev.access(0, Op::Read, 0, 64).unwrap();
    let second = dev.access(10_000, Op::Read, 128, 64).unwrap();
    assert!(!second.hit);
    assert_eq!(second.coalesced, 1);
    assert_eq!(second.nand_reads, 0, "an MSHR hit issues no second read");
    assert_eq!(second.completes_at_ns, first.completes_at_ns);
    assert_eq!(dev.stats().nand.reads(), 1);
    assert_eq!(dev.stats().coalesced, 1);
}

#[test]
fn access_spanning_pages_waits_for_the_slowest() {
    let mut dev = device(&[]);
    dev.access(0, Op::Read, 0, 64).unwrap();
    let span = dev.access(100_000, Op::Read, PAGE - 32, 64).unwrap();
    assert_eq!(span.pages, 2);
    assert_eq!((span.page_hits, span.page_misses), (1, 1));
    assert!(!span.hit);
    assert_eq!(span.latency_ns, 40_000 + 100 + 10);
}

#[test]
fn dirty_victims_are_programmed_and_whole_page_writes_skip_the_fill() {
    let mut dev = device(&[]);
    let w = dev.access(0, Op::Write, 0, PAGE as u32).unwrap();
    assert_eq!(
        w.nand_reads, 0,
        "a whole-page write allocates without a fill"
    );
    let partial = dev.access(0, Op::Write, PAGE, 8).unwrap();
    assert_eq!(partial.nand_reads, 1, "a partial write must fill first");
    // 16 more pages push both dirty pages out.
    let mut t = 1_000_000;
    for p in 2..18 {
        t = dev
            .access(t, Op::Read, p * PAGE, 64)
            .unwrap()
            .completes_at_ns;
    }
    let s = dev.stats();
    assert_eq!(s.writebacks, 2);
    assert_eq!(s.nand.host_programs, 2);
    assert_eq!(s.dirty_pages, 0);
}

#[test]
fn write_back_programs_nand_without_touching_the_cache() {
    let mut dev = device(&[]);
    // A resident dirty page and a page that is not resident.
    dev.access(0, Op::Write, 0, 64).unwrap();
    let before = dev.stats();
    assert_eq!(before.dirty_pages, 1);
    let done = dev.write_back(1_000_000, 0, 2 * PAGE).unwrap();
    let after = dev.stats();
    assert_eq!(
        after.nand.programs() - before.nand.programs(),
        2,
        "one program per page"
    );
    assert!(
        done >= 1_000_000 + 200_000,
        "a program takes tProg: done at {done}"
    );
    assert_eq!(after.dirty_pages, 0, "the resident page is clean now");
    assert_eq!(
        after.resident_pages, before.resident_pages,
        "nothing filled"
    );
    assert_eq!(
        (after.hits, after.misses),
        (before.hits, before.misses),
        "no access counted"
    );
    // Programmed: the resident page is still a hit; the other still a miss.
    assert!(dev.access(2_000_000, Op::Read, 0, 64).unwrap().hit);
    assert!(!dev.access(2_000_000, Op::Read, PAGE, 64).unwrap().hit);
    assert!(dev.write_back(0, dev.capacity_bytes(), PAGE).is_err());
}

#[test]
fn prefetch_log_names_the_prefetched_pages_and_when_they_are_ready() {
    let mut dev = device(&["prefetch.degree=2", "prefetch.stride_pages=1"]);
    dev.access(0, Op::Read, 0, 64).unwrap();
    assert!(dev.drain_prefetches().is_empty(), "not logged unless asked");
    dev.log_prefetches(true);
    dev.access(1_000_000, Op::Read, 10 * PAGE, 64).unwrap();
    let log = dev.drain_prefetches();
    let pages: Vec<u64> = log.iter().map(|&(p, _)| p).collect();
    assert_eq!(pages, [11, 12]);
    assert!(
        log.iter().all(|&(_, ready)| ready >= 1_000_000 + 40_000),
        "{log:?}"
    );
    assert!(dev.drain_prefetches().is_empty(), "drained");
    // A hit prefetches nothing.
    dev.access(2_000_000, Op::Read, 11 * PAGE, 64).unwrap();
    assert!(dev.drain_prefetches().is_empty());
}

#[test]
fn prefetch_costs_nand_reads_and_is_accounted() {
    let mut dev = device(&["prefetch.degree=2", "prefetch.stride_pages=1"]);
    let miss = dev.access(0, Op::Read, 0, 64).unwrap();
    assert_eq!(miss.nand_reads, 3, "demand page + 2 prefetched pages");
    let s = dev.stats();
    assert_eq!(s.prefetch_issued, 2);
    assert_eq!(s.nand.reads(), 3);
    let used = dev
        .access(miss.completes_at_ns, Op::Read, PAGE, 64)
        .unwrap();
    assert!(used.hit);
    assert_eq!(dev.stats().prefetch_used, 1);
    // Push everything out: the untouched prefetched page 2 is wasted.
    let mut t = used.completes_at_ns;
    for p in 100..120 {
        t = dev
            .access(t, Op::Read, p * PAGE, 64)
            .unwrap()
            .completes_at_ns;
    }
    assert!(dev.stats().prefetch_wasted >= 1);
}

#[test]
fn prefetch_skips_pages_the_filter_names() {
    let mut dev = device(&["prefetch.degree=4", "prefetch.stride_pages=1"]);
    // Odd pages hold no data on the device.
    dev.set_prefetch_skip(Some(cxlfs_device_model::PageFilter(std::sync::Arc::new(
        |p| p % 2 == 1,
    ))));
    let miss = dev.access(0, Op::Read, 0, 64).unwrap();
    assert_eq!(miss.nand_reads, 3, "demand page + pages 2 and 4");
    assert_eq!(dev.prefetch_counts(), (2, 0));
    assert_eq!(dev.nand_stats().reads(), 3);
    let odd = dev
        .access(miss.completes_at_ns, Op::Read, PAGE, 64)
        .unwrap();
    assert!(!odd.hit, "a skipped page was not fetched");
    dev.set_prefetch_skip(None);
    let t = odd.completes_at_ns;
    let next = dev.access(t, Op::Read, 20 * PAGE, 64).unwrap();
    assert_eq!(next.nand_reads, 5, "no filter: every page is prefetched");
}

#[test]
fn prefetch_turns_a_sequential_scan_into_mostly_hits() {
    let hit_rate = |degree: &str| {
        let mut dev = device(&[degree]);
        let mut t = 0;
        for p in 0..256 {
            t = dev
                .access(t, Op::Read, p * PAGE, 64)
                .unwrap()
                .completes_at_ns;
        }
        dev.stats().hit_rate()
    };
    let off = hit_rate("prefetch.degree=0");
    let on = hit_rate("prefetch.degree=4");
    assert_eq!(off, 0.0);
    assert!((on - 0.8).abs() < 0.02, "degree 4 on a cold scan: {on}");
}

#[test]
fn pinned_range_survives_a_scan() {
    let mut dev = device(&[]);
    let pin = dev.pin(0, 0, 4 * PAGE).unwrap();
    assert_eq!((pin.pages, pin.filled), (4, 4));
    let mut t = pin.completes_at_ns;
    for p in 10..200 {
        t = dev
            .access(t, Op::Read, p * PAGE, 64)
            .unwrap()
            .completes_at_ns;
    }
    for p in 0..4 {
        assert!(
            dev.access(t, Op::Read, p * PAGE, 64).unwrap().hit,
            "pinned page {p} evicted"
        );
    }
    assert_eq!(dev.stats().pinned_pages, 4);
    assert_eq!(dev.unpin(0, 4 * PAGE).unwrap(), 4);
    for p in 300..400 {
        t = dev
            .access(t, Op::Read, p * PAGE, 64)
            .unwrap()
            .completes_at_ns;
    }
    assert!(
        !dev.access(t, Op::Read, 0, 64).unwrap().hit,
        "unpinned page stays forever"
    );
}

#[test]
fn fully_pinned_set_bypasses_and_pin_reports_it() {
    let mut dev = device(&["cache.ways=1"]);
    // 16 sets, direct-mapped: pages 0 and 16 share set 0.
    dev.pin(0, 0, PAGE).unwrap();
    let bypass = dev.access(0, Op::Read, 16 * PAGE, 64).unwrap();
    assert_eq!(bypass.bypassed, 1);
    assert!(
        dev.access(bypass.completes_at_ns, Op::Read, 0, 64)
            .unwrap()
            .hit
    );
    let err = dev.pin(0, 16 * PAGE, PAGE).unwrap_err();
    assert_eq!(err, AccessError::SetFullyPinned { page: 16 });
}

#[test]
fn explicit_evict_writes_back_and_skips_pins() {
    let mut dev = device(&[]);
    dev.access(0, Op::Write, 0, 64).unwrap();
    dev.access(0, Op::Read, PAGE, 64).unwrap();
    dev.pin(0, 2 * PAGE, PAGE).unwrap();
    let ev = dev.evict(1_000_000, 0, 3 * PAGE).unwrap();
    assert_eq!((ev.evicted, ev.written_back, ev.skipped_pinned), (2, 1, 1));
    assert!(ev.completes_at_ns >= 1_000_000 + 200_000);
    assert!(!dev.access(2_000_000, Op::Read, 0, 64).unwrap().hit);
}

#[test]
fn flush_cleans_without_evicting() {
    let mut dev = device(&[]);
    for p in 0..4 {
        dev.access(0, Op::Write, p * PAGE, 64).unwrap();
    }
    let done = dev.flush(1_000_000).unwrap();
    assert!(done >= 1_000_000 + 200_000);
    let s = dev.stats();
    assert_eq!(
        (s.dirty_pages, s.resident_pages, s.nand.host_programs),
        (0, 4, 4)
    );
}

#[test]
fn policy_switch_keeps_residency() {
    let mut dev = device(&[]);
    let mut t = 0;
    for p in 0..16 {
        t = dev
            .access(t, Op::Read, p * PAGE, 64)
            .unwrap()
            .completes_at_ns;
    }
    for kind in PolicyKind::ALL {
        dev.set_policy(kind);
        assert_eq!(dev.stats().resident_pages, 16);
        assert_eq!(dev.stats().policy, kind.name());
        for p in 0..16 {
            assert!(
                dev.access(t, Op::Read, p * PAGE, 64).unwrap().hit,
                "{kind} lost page {p}"
            );
        }
    }
}

#[test]
fn policy_switch_with_params_is_validated_and_keeps_pins() {
    let mut dev = device(&[]);
    let t = dev.pin(0, 0, 2 * PAGE).unwrap().completes_at_ns;
    assert!(dev.is_pinned(0) && dev.is_pinned(PAGE) && !dev.is_pinned(2 * PAGE));
    assert!(dev.is_resident(PAGE) && !dev.is_resident(2 * PAGE));
    let mut params = dev.config().cache.params.clone();
    params.s3fifo_small_ratio = 0.3;
    dev.set_policy_with_params(PolicyKind::S3Fifo, params.clone())
        .unwrap();
    assert_eq!(dev.config().cache.policy, PolicyKind::S3Fifo);
    assert_eq!(dev.config().cache.params.s3fifo_small_ratio, 0.3);
    assert!(dev.is_pinned(0) && dev.access(t, Op::Read, 0, 64).unwrap().hit);
    // An out-of-range parameter changes nothing.
    params.s3fifo_small_ratio = 3.0;
    assert!(dev.set_policy_with_params(PolicyKind::Lru, params).is_err());
    assert_eq!(dev.config().cache.policy, PolicyKind::S3Fifo);
    assert_eq!(dev.config().cache.params.s3fifo_small_ratio, 0.3);
    assert_eq!(dev.stats().policy, "s3fifo");
}

#[test]
fn invisible_hits_change_lru_into_fifo() {
    // With hits invisible, LRU never learns that page 0 is hot.
    let run = |visible: &str| {
        let mut dev = device(&[visible]);
        let mut t = 0;
        for p in 0..16 {
            t = dev
                .access(t, Op::Read, p * PAGE, 64)
                .unwrap()
                .completes_at_ns;
        }
        t = dev.access(t, Op::Read, 0, 64).unwrap().completes_at_ns;
        t = dev
            .access(t, Op::Read, 16 * PAGE, 64)
            .unwrap()
            .completes_at_ns;
        dev.access(t, Op::Read, 0, 64).unwrap().hit
    };
    assert!(run("cache.hits_visible=true"));
    assert!(!run("cache.hits_visible=false"));
}

#[test]
fn bad_ranges_are_errors() {
    let mut dev = device(&[]);
    let cap = dev.capacity_bytes();
    assert!(matches!(
        dev.access(0, Op::Read, cap - 32, 64),
        Err(AccessError::OutOfRange { .. })
    ));
    assert!(matches!(
        dev.access(0, Op::Read, u64::MAX, 64),
        Err(AccessError::OutOfRange { .. })
    ));
    assert!(matches!(
        dev.access(0, Op::Read, 0, 0),
        Err(AccessError::Empty { .. })
    ));
    assert!(dev.access(0, Op::Read, cap - 64, 64).is_ok());
}

#[test]
fn reset_stats_keeps_contents() {
    let mut dev = device(&[]);
    let t = dev.access(0, Op::Read, 0, 64).unwrap().completes_at_ns;
    dev.reset_stats();
    assert_eq!(dev.stats().accesses, 0);
    assert!(dev.access(t, Op::Read, 0, 64).unwrap().hit);
}

fn op_strategy() -> impl Strategy<Value = (bool, u64, u32)> {
    (any::<bool>(), 0u64..64 * PAGE, 1u32..9000)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Same inputs, same outputs: two devices fed the same sequence agree on
    /// every completion time and on every counter.
    #[test]
    fn deterministic(ops in proptest::collection::vec(op_strategy(), 1..300), degree in 0u32..4) {
        let degree = format!("prefetch.degree={degree}");
        let mut a = device(&[&degree, "cache.policy=s3fifo"]);
        let mut b = device(&[&degree, "cache.policy=s3fifo"]);
        let mut t = 0u64;
        for (write, addr, len) in ops {
            let op = if write { Op::Write } else { Op::Read };
            let oa = a.access(t, op, addr, len).unwrap();
            let ob = b.access(t, op, addr, len).unwrap();
            prop_assert_eq!(oa, ob);
            t += 500;
        }
        prop_assert_eq!(a.stats(), b.stats());
    }

    /// Completion is never before arrival, and hits cost exactly hit + link.
    #[test]
    fn latency_bounds(ops in proptest::collection::vec(op_strategy(), 1..200)) {
        let mut dev = device(&[]);
        let mut t = 0u64;
        for (write, addr, len) in ops {
            let op = if write { Op::Write } else { Op::Read };
            let o = dev.access(t, op, addr, len).unwrap();
            prop_assert!(o.completes_at_ns >= t + 110);
            if o.hit {
                prop_assert_eq!(o.latency_ns, 110);
            }
            prop_assert!(dev.stats().resident_pages <= 16);
            t += 1_000;
        }
    }
}

#[test]
fn discard_drops_pages_without_write_back() {
    let mut dev = device(&[]);
    dev.access(0, Op::Write, 0, 64).unwrap();
    dev.access(0, Op::Read, PAGE, 64).unwrap();
    dev.pin(0, 2 * PAGE, PAGE).unwrap();
    assert_eq!(dev.discard(0, 3 * PAGE).unwrap(), 3);
    let s = dev.stats();
    assert_eq!((s.resident_pages, s.pinned_pages, s.dirty_pages), (0, 0, 0));
    assert_eq!((s.discarded, s.writebacks, s.nand.host_programs), (3, 0, 0));
    assert!(!dev.access(1_000_000, Op::Read, 0, 64).unwrap().hit);
}

#[test]
fn eviction_log_lists_victims_only_when_asked() {
    let mut dev = device(&[]);
    // Off by default: nothing is kept.
    for p in 0..17 {
        dev.access(0, Op::Read, p * PAGE, 64).unwrap();
    }
    assert!(dev.drain_evictions().is_empty());
    dev.log_evictions(true);
    // The 16-page LRU cache holds pages 1..=16; two more misses evict 1 and 2.
    dev.access(0, Op::Read, 100 * PAGE, 64).unwrap();
    dev.access(0, Op::Read, 101 * PAGE, 64).unwrap();
    assert_eq!(dev.drain_evictions(), vec![1, 2]);
    assert!(dev.drain_evictions().is_empty(), "drained");
    // Explicit evictions are logged, discards are not.
    dev.evict(0, 100 * PAGE, PAGE).unwrap();
    dev.discard(101 * PAGE, PAGE).unwrap();
    assert_eq!(dev.drain_evictions(), vec![100]);
    assert_eq!(dev.stats().evictions, 1 + 2 + 1);
    dev.log_evictions(false);
    dev.access(0, Op::Read, 102 * PAGE, 64).unwrap();
    dev.access(0, Op::Read, 103 * PAGE, 64).unwrap();
    dev.access(0, Op::Read, 104 * PAGE, 64).unwrap();
    assert!(dev.drain_evictions().is_empty());
}

/// Fills pages `0..n` with one read each, 1 ms apart from t = 1 ms.
fn fill_pages(dev: &mut Device, n: u64) {
    for p in 0..n {
        dev.access((p + 1) * 1_000_000, Op::Read, p * PAGE, 64)
            .unwrap();
    }
}

#[test]
fn a_reference_keeps_a_page_from_lru_eviction_at_no_cost() {
    let settled = 100_000_000; // after every fill is ready
    let mut seen = device(&[]);
    fill_pages(&mut seen, 16);
    let nand_before = seen.nand_stats().reads();
    let r = seen.reference(settled, &[0]);
    assert_eq!((r.referenced, r.absent, r.fresh), (1, 0, 0));
    assert_eq!(
        seen.nand_stats().reads(),
        nand_before,
        "a reference reads no NAND"
    );
    let s = seen.stats();
    assert_eq!((s.references, s.page_accesses, s.hits), (1, 16, 0));

    let mut blind = device(&[]);
    fill_pages(&mut blind, 16);
    for dev in [&mut seen, &mut blind] {
        dev.access(settled + 1_000, Op::Read, 16 * PAGE, 64)
            .unwrap();
    }
    // Without the reference page 0 is LRU's victim; with it, page 1.
    assert!(!blind.is_resident(0) && blind.is_resident(PAGE));
    assert!(seen.is_resident(0) && !seen.is_resident(PAGE));
}

#[test]
fn a_reference_skips_evicted_pages_and_pages_filled_since_the_period_began() {
    let mut dev = device(&[]);
    fill_pages(&mut dev, 4);
    // Page 3 was filled at 4 ms: a period that began at 3.5 ms saw its miss.
    let r = dev.reference(3_500_000, &[0, 3, 40]);
    assert_eq!((r.referenced, r.absent, r.fresh), (1, 1, 1));
    assert!(
        !dev.is_resident(40 * PAGE),
        "a reference never fills a page"
    );
    assert_eq!(dev.stats().references, 1);
}

#[test]
fn a_reference_to_a_fresh_prefetched_page_is_its_first_use() {
    let mut dev = device(&["prefetch.degree=1", "prefetch.stride_pages=1"]);
    dev.access(1_000, Op::Read, 0, 64).unwrap(); // page 1 prefetched
    let r = dev.reference(0, &[1]);
    assert_eq!((r.referenced, r.fresh), (1, 0));
    assert_eq!(dev.stats().prefetch_used, 1);
}
