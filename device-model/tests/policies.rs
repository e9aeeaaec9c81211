//! Eviction policies and cache mechanics through the public API: golden
//! sequences worked out by hand, one per policy, and property tests.

use cxlfs_device_model::cache::{Cache, Insert};
use cxlfs_device_model::config::{CacheConfig, PolicyKind, PolicyParams};
use cxlfs_device_model::DeviceConfig;
use proptest::prelude::*;
use std::collections::BTreeSet;

const PAGE: u64 = 4096;

/// A cache config through the same override path as the command line.
fn config(overrides: &[&str]) -> CacheConfig {
    match DeviceConfig::default().with_overrides(overrides) {
        Ok(cfg) => cfg.cache,
        Err(e) => panic!("{overrides:?}: {e}"),
    }
}

/// Panics with the description of a broken cache invariant.
fn check(c: &Cache) {
    if let Err(e) = c.check_invariants() {
        panic!("cache invariant broken: {e}");
    }
}

fn cache_cfg(pages: u64, ways: u32, policy: PolicyKind) -> CacheConfig {
    let mut c = DeviceConfig::default().cache;
    c.size_bytes = pages * PAGE;
    c.ways = ways;
    c.policy = policy;
    c.params = PolicyParams::default();
    c
}

/// Outcome of one access, written compactly: `H` hit, `M` miss without
/// eviction, `E(p)` miss that evicted page `p`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    H,
    M,
    E(u64),
}
use Step::{E, H, M};

/// One demand access as the device does it: lookup → hit (visible) or insert.
fn access(c: &mut Cache, page: u64) -> Step {
    if let Some(slot) = c.lookup(page) {
        c.record_hit(slot);
        return H;
    }
    match c.insert(page, 0, false, false) {
        Insert::Placed { evicted: None, .. } => M,
        Insert::Placed {
            evicted: Some(e), ..
        } => E(e.page),
        Insert::SetFullyPinned => panic!("set of page {page} is fully pinned"),
    }
}

fn run(c: &mut Cache, pages: &[u64]) -> Vec<Step> {
    let steps = pages.iter().map(|&p| access(c, p)).collect();
    check(c);
    steps
}

fn golden(policy: &str, pages: u64, pages_seq: &[u64], extra: &[&str]) -> Vec<Step> {
    let size = format!("cache.size_bytes={}", pages * PAGE);
    let pol = format!("cache.policy={policy}");
    let mut o = vec![size.as_str(), "cache.ways=0", pol.as_str()];
    o.extend_from_slice(extra);
    let mut c = Cache::new(&config(&o), 1 << 20);
    assert_eq!(c.capacity_pages(), pages);
    run(&mut c, pages_seq)
}

// ---------------------------------------------------------------------------
// Golden sequences

#[test]
fn fifo_golden() {
    // Capacity 3. 1 2 3 fill; 1 hits (no effect on order); 4 evicts the
    // oldest insertion, 1, although it was just used; then 1 evicts 2, 5
    // evicts 3.
    let seq = [1, 2, 3, 1, 4, 1, 5];
    assert_eq!(
        golden("fifo", 3, &seq, &[]),
        vec![M, M, M, H, E(1), E(2), E(3)]
    );
}

#[test]
fn lru_golden() {
    // Same sequence as FIFO. After the hit on 1 the LRU order is 2 3 1, so 4
    // evicts 2 (FIFO: 1); 1 hits again (order 3 4 1); 5 evicts 3.
    let seq = [1, 2, 3, 1, 4, 1, 5];
    assert_eq!(golden("lru", 3, &seq, &[]), vec![M, M, M, H, E(2), H, E(3)]);
}

#[test]
fn lifo_golden() {
    // Capacity 3. 1 2 3 fill; 4 evicts the newest, 3; 5 evicts the newest,
    // 4; 1 and 2 (the head of the scan) stayed and hit; 3 evicts 5.
    let seq = [1, 2, 3, 4, 5, 1, 2, 3];
    assert_eq!(
        golden("lifo", 3, &seq, &[]),
        vec![M, M, M, E(3), E(4), H, H, E(5)]
    );
}

#[test]
fn clock_golden() {
    // Capacity 3. 1 2 3 fill (queue, oldest first: 1 2 3, no bits); hits on
    // 2 and 1 set their bits. 4: the hand finds 1 referenced → clear, to the
    // back (2 3 1); 2 referenced → clear (3 1 2); 3 unreferenced → evict 3.
    // Queue 1 2 4, no bits set. 5: evicts 1, the oldest survivor.
    let seq = [1, 2, 3, 2, 1, 4, 5];
    assert_eq!(
        golden("clock", 3, &seq, &[]),
        vec![M, M, M, H, H, E(3), E(1)]
    );
    // LRU differs on the last step: its order after 4 is 2 1 4 → evicts 2.
    assert_eq!(golden("lru", 3, &seq, &[]), vec![M, M, M, H, H, E(3), E(2)]);
}

#[test]
fn s3fifo_golden() {
    // libCacheSim's S3-FIFO. Capacity 5, small ratio 0.4 and ghost ratio 0.4:
    // S holds 2, M 3, the ghost FIFO G 2; move-to-main threshold 2 (the
    // default: two hits while in S). Queues written newest first, G oldest
    // first.
    //  1 2      miss → S: 2 1
    //  3 4 5    S is full and nothing was evicted yet → M: 5 4 3
    //  1 1      hits in S: freq(1) = 2
    //  6        |M| = 3 is not over 3, S not empty → S's tail 1 has freq 2
    //           → M's head with freq 0 (M: 1 5 4 3); tail 2 has freq 0 →
    //           evicted, G: 2. S: 6                                     E(2)
    //  7        |M| = 4 > 3 → M's tail 3, freq 0 → evicted, no ghost.
    //           S: 7 6                                                  E(3)
    //  2        in G: leaves G (now empty); evict S's tail 6 → G: 6;
    //           2 → M: 2 1 5 4                                          E(6)
    //  8        |M| = 4 > 3 → M's tail 4 goes. S: 8 7                   E(4)
    //  9        S's tail 7 → G: 6 7. S: 9 8                             E(7)
    //  10       S's tail 8 → G full: 6 is pushed out, G: 7 8. S: 10 9   E(8)
    //  6        no longer a ghost → S; S's tail 9 → G: 8 9. S: 6 10     E(9)
    //  9        in G: leaves it (G: 8); S's tail 10 → G: 8 10;
    //           9 → M: 9 2 1 5                                         E(10)
    //  8        in G — the entry survived because 9 left G (with "the
    //           last two victims" as the ghost, 8 would not be one): G:
    //           10; |M| = 4 > 3 → M's tail 5 goes; 8 → M: 8 9 2 1       E(5)
    //  1 1 1    hits in M: freq(1) = 3
    //  11       |M| = 4 > 3: M's tail 1 has freq 3 → M's head with
    //           min(3, 3) − 1 = 2 (M: 1 8 9 2); tail 2, freq 0, goes.
    //           S: 11 6                                                 E(2)
    //  12       |M| = 3, S's tail 6 → G: 10 6. S: 12 11                 E(6)
    let seq = [
        1, 2, 3, 4, 5, 1, 1, 6, 7, 2, 8, 9, 10, 6, 9, 8, 1, 1, 1, 11, 12,
    ];
    let expect = vec![
        M,
        M,
        M,
        M,
        M,
        H,
        H,
        E(2),
        E(3),
        E(6),
        E(4),
        E(7),
        E(8),
        E(9),
        E(10),
        E(5),
        H,
        H,
        H,
        E(2),
        E(6),
    ];
    let params = [
        "cache.params.s3fifo_small_ratio=0.4",
        "cache.params.s3fifo_ghost_ratio=0.4",
    ];
    assert_eq!(golden("s3fifo", 5, &seq, &params), expect);
}

#[test]
fn s3fifo_threshold_one_moves_after_a_single_hit() {
    // Capacity 5, S 2, M 3, G 2 as above, threshold 1. 1 2 → S; 3 4 5 → M;
    // one hit on 1; 6: S's tail 1 has freq 1 ≥ 1 → M (1 5 4 3), then 2 is
    // evicted. With the default threshold 2 the same hit is not enough: 1
    // itself is evicted.
    let seq = [1, 2, 3, 4, 5, 1, 6];
    let s = [
        "cache.params.s3fifo_small_ratio=0.4",
        "cache.params.s3fifo_ghost_ratio=0.4",
    ];
    let one = [s[0], s[1], "cache.params.s3fifo_move_to_main_threshold=1"];
    assert_eq!(
        golden("s3fifo", 5, &seq, &one),
        vec![M, M, M, M, M, H, E(2)]
    );
    assert_eq!(golden("s3fifo", 5, &seq, &s), vec![M, M, M, M, M, H, E(1)]);
}

#[test]
fn twoq_golden() {
    // libCacheSim's 2Q. Capacity 4: Kin = ⌊0.25 × 4⌋ = 1, Kout = ⌊0.5 × 4⌋
    // = 2. A1in written newest first, Am MRU first, A1out oldest first.
    //  1 2 3 4  miss → A1in: 4 3 2 1
    //  5        |A1in| 4 > Kin: A1in's tail 1 → A1out: 1. A1in: 5 4 3 2 E(1)
    //  1        in A1out: leaves it; A1in's tail 2 → A1out: 2; 1 → Am   E(2)
    //  2        the same: 3 → A1out: 3; Am: 2 1                         E(3)
    //  3        the same: 4 → A1out: 4; Am: 3 2 1; A1in: 5              E(4)
    //  1        hit in Am → MRU: Am 1 3 2                               H
    //  6        |A1in| 1 = Kin → Am's LRU 2 goes (no ghost). A1in: 6 5  E(2)
    //  5        hit in A1in: nothing (correlated reference)             H
    //  7        |A1in| 2 > Kin → A1in's tail 5 goes although it was hit;
    //           A1out: 4 5. A1in: 7 6                                   E(5)
    //  8        A1in's tail 6 → A1out full: 4 pushed out, A1out: 5 6    E(6)
    //  5        in A1out: leaves it (A1out: 6); A1in's tail 7 → A1out:
    //           6 7; 5 → Am: 5 1 3. A1in: 8                             E(7)
    //  6        in A1out (A1out: 7); |A1in| = Kin → Am's LRU 3 goes;
    //           Am: 6 5 1                                               E(3)
    //  9        |A1in| = Kin → Am's LRU 1 goes. A1in: 9 8               E(1)
    //  10       A1in's tail 8 → A1out: 7 8. A1in: 10 9                  E(8)
    //  8        in A1out (A1out: 7); A1in's tail 9 → A1out: 7 9;
    //           Am: 8 6 5                                               E(9)
    //  7        in A1out — it survived because 8 left (with "the last two
    //           victims" as the ghost, 8 and 9, 7 would not be one):
    //           A1out: 9; |A1in| = Kin → Am's LRU 5 goes; Am: 7 8 6     E(5)
    //  11       |A1in| = Kin → Am's LRU 6 goes. A1in: 11 10             E(6)
    //  12       A1in's tail 10 → A1out: 9 10                           E(10)
    let seq = [
        1, 2, 3, 4, 5, 1, 2, 3, 1, 6, 5, 7, 8, 5, 6, 9, 10, 8, 7, 11, 12,
    ];
    let expect = vec![
        M,
        M,
        M,
        M,
        E(1),
        E(2),
        E(3),
        E(4),
        H,
        E(2),
        H,
        E(5),
        E(6),
        E(7),
        E(3),
        E(1),
        E(8),
        E(9),
        E(5),
        E(6),
        E(10),
    ];
    assert_eq!(golden("2q", 4, &seq, &[]), expect);
}

#[test]
fn lfru_golden() {
    // Capacity 4, privileged target 0.5 * 4 = 2, promotion at frequency 3.
    // Unprivileged buckets written newest first.
    //  1 2 3 4  miss → bucket 1: 4 3 2 1
    //  1 2      hits → frequency 2: bucket 2: 2 1, bucket 1: 4 3
    //  1        frequency 3 → privileged: P 1; bucket 2: 2
    //  5 6 7    each evicts the oldest of the lowest bucket: 3, 4, 5;
    //           2 (bucket 2) survives although older
    //  6 7      hits → bucket 2: 7 6 2; bucket 1 empty
    //  8        lowest non-empty bucket is 2: evict its oldest, 2
    //  6        frequency 3 → P 6 1
    //  7        frequency 3 → P 7 6 1 > 2: demote LRU 1 to bucket 1: 1 8
    //  9        evicts 8; 10 evicts the demoted 1
    //  11       bucket 1 holds 10 9 → evicts 9; 6 and 7 stay privileged
    let seq = [1, 2, 3, 4, 1, 2, 1, 5, 6, 7, 6, 7, 8, 6, 7, 9, 10, 11, 6, 7];
    let expect = vec![
        M,
        M,
        M,
        M,
        H,
        H,
        H,
        E(3),
        E(4),
        E(5),
        H,
        H,
        E(2),
        H,
        H,
        E(8),
        E(1),
        E(9),
        H,
        H,
    ];
    let got = golden("lfru", 4, &seq, &["cache.params.lfru_promote_threshold=3"]);
    assert_eq!(got, expect);
}

#[test]
fn lfru_evicts_privileged_when_unprivileged_is_empty() {
    // Capacity 2, privileged target 1, promotion at 2: 1 and 2 fill; a hit on
    // 1 promotes it, a hit on 2 promotes 2 and demotes 1 (P 2, bucket 1: 1).
    // 3 evicts 1; a hit on 3 promotes it and demotes 2; 4 evicts 2. With
    // privileged_ratio 1 nothing is ever demoted: after 5 6 (5 evicts 3 … )
    // the unprivileged partition empties and the privileged LRU goes.
    let seq = [1, 2, 1, 2, 3, 3, 4];
    assert_eq!(
        golden("lfru", 2, &seq, &[]),
        vec![M, M, H, H, E(1), H, E(2)]
    );
    let seq = [1, 2, 1, 2, 3, 1];
    // P: 1, then 2 1 (target 2, no demotion); 3: unprivileged empty → evict
    // the privileged LRU, 1; 1 then evicts 3 (unprivileged first).
    let got = golden("lfru", 2, &seq, &["cache.params.lfru_privileged_ratio=1.0"]);
    assert_eq!(got, vec![M, M, H, H, E(1), E(3)]);
}

#[test]
fn s3fifo_and_twoq_parameters_are_libcachesims() {
    let p = PolicyParams::default();
    assert_eq!(
        (
            p.s3fifo_small_ratio,
            p.s3fifo_ghost_ratio,
            p.s3fifo_move_to_main_threshold,
            p.twoq_kin_ratio,
            p.twoq_kout_ratio
        ),
        (0.10, 0.90, 2, 0.25, 0.50)
    );
    // Parameters saved before the ghost ratio existed still load.
    let old = r#"{"s3fifo_small_ratio":0.1,"s3fifo_move_to_main_threshold":1,
        "twoq_kin_ratio":0.25,"twoq_kout_ratio":0.5,"lfru_privileged_ratio":0.5,
        "lfru_promote_threshold":2}"#;
    let loaded: PolicyParams = serde_json::from_str(old).unwrap();
    assert_eq!(loaded.s3fifo_ghost_ratio, 0.90);
    // Ranges: the ghost may be up to 4 × the ways; the threshold is capped
    // by the frequency counter.
    let ok = |o: &[&str]| DeviceConfig::default().with_overrides(o).is_ok();
    assert!(ok(&["cache.params.s3fifo_ghost_ratio=4.0"]));
    assert!(!ok(&["cache.params.s3fifo_ghost_ratio=4.5"]));
    assert!(!ok(&["cache.params.s3fifo_ghost_ratio=-0.1"]));
    assert!(ok(&["cache.params.s3fifo_move_to_main_threshold=127"]));
    assert!(!ok(&["cache.params.s3fifo_move_to_main_threshold=128"]));
}

#[test]
fn s3fifo_ghost_ratio_sets_the_ghost_fifo() {
    // Capacity 5, S 2, M 3, threshold 2, as in the golden; G 2 (ratio 0.4)
    // or none (ratio 0).
    //  1 2 → S: 2 1; 3 4 5 → M: 5 4 3
    //  6   S's tail 1 is evicted (into G if any). S: 6 2            E(1)
    //  1   G 2: a ghost → M, after S's tail 2 is evicted: M 1 5 4 3,
    //      S 6. No G: a plain miss → S, S's tail 2 evicted: S 1 6   E(2)
    //  7   G 2: |M| = 4 > 3 → M's tail 3 goes. S: 7 6               E(3)
    //      No G: S's tail 6 goes. S: 7 1                            E(6)
    //  1   a hit either way (in M / in S)                           H
    //  8   G 2: S's tail 6 goes                                     E(6)
    //      No G: S's tail 1, one hit < 2, goes                      E(1)
    let seq = [1, 2, 3, 4, 5, 6, 1, 7, 1, 8];
    let small = "cache.params.s3fifo_small_ratio=0.4";
    let with = golden(
        "s3fifo",
        5,
        &seq,
        &[small, "cache.params.s3fifo_ghost_ratio=0.4"],
    );
    assert_eq!(with, vec![M, M, M, M, M, E(1), E(2), E(3), H, E(6)]);
    let without = golden(
        "s3fifo",
        5,
        &seq,
        &[small, "cache.params.s3fifo_ghost_ratio=0"],
    );
    assert_eq!(without, vec![M, M, M, M, M, E(1), E(2), E(6), H, E(1)]);
}

// ---------------------------------------------------------------------------
// Mechanics

#[test]
fn direct_mapped_pages_of_one_set_evict_each_other() {
    let mut c = Cache::new(
        &config(&["cache.size_bytes=16KiB", "cache.ways=1"]),
        1 << 20,
    );
    assert_eq!((c.sets(), c.ways()), (4, 1));
    // 1 and 5 share set 1; 2 lives in set 2.
    let steps = run(&mut c, &[1, 2, 5, 1, 2, 9, 5]);
    assert_eq!(steps, vec![M, M, E(1), E(5), H, E(1), E(9)]);
    assert_eq!(c.resident_pages(), 2);
}

#[test]
fn two_way_sets() {
    let mut c = Cache::new(&cache_cfg(4, 2, PolicyKind::Lru), 1 << 20);
    assert_eq!((c.sets(), c.ways()), (2, 2));
    // Even pages share set 0, odd pages set 1; each set is its own LRU.
    let steps = run(&mut c, &[0, 2, 1, 0, 4, 3, 5, 2]);
    assert_eq!(steps, vec![M, M, M, H, E(2), M, E(1), E(0)]);
}

#[test]
fn pins_are_skipped_and_a_fully_pinned_set_bypasses() {
    let mut c = Cache::new(&cache_cfg(3, 0, PolicyKind::Fifo), 1 << 20);
    run(&mut c, &[1, 2, 3]);
    let s1 = c.lookup(1).unwrap();
    c.pin(s1);
    assert!(c.state(s1).pinned);
    assert_eq!(c.pinned_pages(), 1);
    // FIFO would evict 1; it is pinned, so 2 goes, then 3.
    assert_eq!(run(&mut c, &[4, 5]), vec![E(2), E(3)]);
    for p in [4, 5] {
        let s = c.lookup(p).unwrap();
        c.pin(s);
    }
    assert_eq!(c.insert(6, 0, false, false), Insert::SetFullyPinned);
    assert_eq!(c.resident_pages(), 3);
    // Explicit removal works on pinned pages.
    let ev = c.remove(4).unwrap();
    assert_eq!(ev.page, 4);
    assert_eq!(c.pinned_pages(), 2);
    assert_eq!(run(&mut c, &[6]), vec![M]);
    // Unpinning hands 1 back as a fresh insertion, newer than 6.
    c.unpin(s1);
    assert_eq!(c.pinned_pages(), 1);
    assert_eq!(run(&mut c, &[7, 8]), vec![E(6), E(1)]);
    check(&c);
}

#[test]
fn dirty_and_prefetch_flags_travel_with_evictions() {
    let mut c = Cache::new(&cache_cfg(2, 0, PolicyKind::Fifo), 1 << 20);
    let Insert::Placed { slot: a, .. } = c.insert(10, 5, true, false) else {
        panic!()
    };
    let Insert::Placed { slot: b, .. } = c.insert(11, 6, false, true) else {
        panic!()
    };
    assert_eq!(c.dirty_pages(), 1);
    assert_eq!(c.dirty_slots(), vec![a]);
    assert!(c.state(b).prefetched_unused);
    let Insert::Placed {
        evicted: Some(e), ..
    } = c.insert(12, 7, false, false)
    else {
        panic!()
    };
    assert_eq!((e.page, e.dirty, e.prefetched_unused), (10, true, false));
    assert_eq!(c.dirty_pages(), 0);
    c.set_dirty(b, true);
    c.mark_used(b);
    let Insert::Placed {
        evicted: Some(e), ..
    } = c.insert(13, 8, false, false)
    else {
        panic!()
    };
    assert_eq!((e.page, e.dirty, e.prefetched_unused), (11, true, false));
    assert_eq!(c.dirty_pages(), 0);
    check(&c);
}

#[test]
fn policy_switch_keeps_recency_order() {
    // LRU order after the accesses: 3 1 4 2 (least recent first). Switching
    // to FIFO feeds the pages in that order, so FIFO evicts 3, 1, 4, 2.
    let mut c = Cache::new(&cache_cfg(4, 0, PolicyKind::Lru), 1 << 20);
    run(&mut c, &[1, 2, 3, 4, 3, 1, 4, 2]);
    c.set_policy(PolicyKind::Fifo, &PolicyParams::default());
    assert_eq!(c.policy(), PolicyKind::Fifo);
    check(&c);
    assert_eq!(run(&mut c, &[5, 6, 7, 8]), vec![E(3), E(1), E(4), E(2)]);
    // And back to LRU, through every other policy, keeping residency.
    for kind in PolicyKind::ALL {
        c.set_policy(kind, &PolicyParams::default());
        check(&c);
        assert_eq!(c.resident_pages(), 4);
        for p in 5..=8 {
            assert!(c.lookup(p).is_some());
        }
    }
}

// ---------------------------------------------------------------------------
// Property tests

#[derive(Debug, Clone)]
enum Op {
    Access(u64),
    Write(u64),
    Pin(u64),
    Unpin(u64),
    Remove(u64),
    Switch(PolicyKind),
}

fn kind() -> impl Strategy<Value = PolicyKind> {
    prop::sample::select(PolicyKind::ALL.to_vec())
}

fn op(pages: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0..pages).prop_map(Op::Access),
        3 => (0..pages).prop_map(Op::Write),
        2 => (0..pages).prop_map(Op::Pin),
        2 => (0..pages).prop_map(Op::Unpin),
        1 => (0..pages).prop_map(Op::Remove),
        1 => kind().prop_map(Op::Switch),
    ]
}

fn params() -> impl Strategy<Value = PolicyParams> {
    (
        (0.0..=1.0f64, 0.0..=2.0f64),
        0u8..4,
        0.0..=1.0f64,
        0.0..=1.0f64,
        0.0..=1.0f64,
        0u8..9,
    )
        .prop_map(
            |((small, ghost), thr, kin, kout, privileged, promote)| PolicyParams {
                s3fifo_small_ratio: small,
                s3fifo_ghost_ratio: ghost,
                s3fifo_move_to_main_threshold: thr,
                twoq_kin_ratio: kin,
                twoq_kout_ratio: kout,
                lfru_privileged_ratio: privileged,
                lfru_promote_threshold: promote,
            },
        )
}

/// What one op did, for comparing two caches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Effect {
    Hit(u32),
    Placed(u32, Option<u64>),
    Bypass,
    Other(Option<u64>),
}

fn apply(c: &mut Cache, op: &Op, params: &PolicyParams) -> Effect {
    match *op {
        Op::Access(p) | Op::Write(p) => {
            let write = matches!(op, Op::Write(_));
            if let Some(s) = c.lookup(p) {
                c.record_hit(s);
                if write {
                    c.set_dirty(s, true);
                }
                Effect::Hit(s)
            } else {
                match c.insert(p, 0, write, false) {
                    Insert::Placed { slot, evicted } => {
                        Effect::Placed(slot, evicted.map(|e| e.page))
                    }
                    Insert::SetFullyPinned => Effect::Bypass,
                }
            }
        }
        Op::Pin(p) => {
            if let Some(s) = c.lookup(p) {
                c.pin(s);
            }
            Effect::Other(None)
        }
        Op::Unpin(p) => {
            if let Some(s) = c.lookup(p) {
                c.unpin(s);
            }
            Effect::Other(None)
        }
        Op::Remove(p) => Effect::Other(c.remove(p).map(|e| e.page)),
        Op::Switch(k) => {
            c.set_policy(k, params);
            Effect::Other(None)
        }
    }
}

fn sorted_residents(c: &Cache) -> Vec<u64> {
    let mut r = c.resident_page_list();
    r.sort_unstable();
    r
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Capacity, pins, counters and switching, for every policy and geometry.
    #[test]
    fn cache_invariants_hold(
        start in kind(),
        ways in prop::sample::select(vec![0u32, 1, 2, 4, 8]),
        params in params(),
        ops in prop::collection::vec(op(24), 1..300),
    ) {
        let mut cfg = cache_cfg(8, ways, start);
        cfg.params = params.clone();
        let mut c = Cache::new(&cfg, 64);
        let mut pinned: BTreeSet<u64> = BTreeSet::new();
        for op in &ops {
            let before = sorted_residents(&c);
            let dirty_before = c.dirty_pages();
            let effect = apply(&mut c, op, &params);
            prop_assert!(c.resident_pages() <= c.capacity_pages());
            match (op, &effect) {
                (Op::Access(p) | Op::Write(p), Effect::Placed(_, ev)) => {
                    if let Some(v) = ev {
                        prop_assert!(!pinned.contains(v), "pinned page {} evicted", v);
                        prop_assert_eq!(c.set_of(*v), c.set_of(*p));
                    }
                    prop_assert!(c.lookup(*p).is_some());
                }
                (Op::Access(p) | Op::Write(p), Effect::Bypass) => {
                    let set = c.set_of(*p);
                    let in_set = pinned.iter().filter(|&&q| c.set_of(q) == set).count();
                    prop_assert_eq!(in_set as u32, c.ways(), "bypass with a free way");
                }
                (Op::Pin(p), _) if c.lookup(*p).is_some() => {
                    pinned.insert(*p);
                }
                (Op::Unpin(p), _) => {
                    pinned.remove(p);
                }
                (Op::Remove(p), Effect::Other(ev)) => {
                    prop_assert_eq!(*ev, before.binary_search(p).ok().map(|_| *p));
                    pinned.remove(p);
                }
                (Op::Switch(k), _) => {
                    prop_assert_eq!(c.policy(), *k);
                    prop_assert_eq!(&sorted_residents(&c), &before);
                    prop_assert_eq!(c.dirty_pages(), dirty_before);
                }
                _ => {}
            }
            prop_assert_eq!(c.pinned_pages(), pinned.len() as u64);
            for p in &pinned {
                let s = c.lookup(*p);
                prop_assert!(s.is_some(), "pinned page {} not resident", p);
                prop_assert!(c.state(s.unwrap()).pinned);
            }
            if let Err(e) = c.check_invariants() {
                prop_assert!(false, "after {:?}: {}", op, e);
            }
        }
    }

    /// A set-associative cache with a single set behaves exactly like the
    /// fully associative one: same hits, slots and victims.
    #[test]
    fn one_set_equals_fully_associative(
        start in kind(),
        pages in 1u64..12,
        params in params(),
        ops in prop::collection::vec(op(32), 1..300),
    ) {
        let mut a_cfg = cache_cfg(pages, 0, start);
        a_cfg.params = params.clone();
        let mut b_cfg = a_cfg.clone();
        b_cfg.ways = pages as u32;
        let mut a = Cache::new(&a_cfg, 64);
        let mut b = Cache::new(&b_cfg, 64);
        prop_assert_eq!((a.sets(), a.ways()), (b.sets(), b.ways()));
        for op in &ops {
            prop_assert_eq!(apply(&mut a, op, &params), apply(&mut b, op, &params), "{:?}", op);
        }
        prop_assert_eq!(a.resident_page_list(), b.resident_page_list());
    }

    /// Switching policy (to any, including the same one) keeps exactly the
    /// same pages, with their pins and dirty bits, in the same slots.
    #[test]
    fn switching_keeps_residency(
        from in kind(),
        to in kind(),
        ways in prop::sample::select(vec![0u32, 2, 4]),
        ops in prop::collection::vec(op(40), 1..200),
    ) {
        let params = PolicyParams::default();
        let mut c = Cache::new(&cache_cfg(16, ways, from), 64);
        for op in ops.iter().filter(|o| !matches!(o, Op::Switch(_))) {
            apply(&mut c, op, &params);
        }
        let states: Vec<_> = c
            .resident_page_list()
            .into_iter()
            .map(|p| (p, c.lookup(p).map(|s| c.state(s))))
            .collect();
        let counters = (c.resident_pages(), c.pinned_pages(), c.dirty_pages());
        c.set_policy(to, &params);
        prop_assert_eq!(c.policy(), to);
        let after: Vec<_> = c
            .resident_page_list()
            .into_iter()
            .map(|p| (p, c.lookup(p).map(|s| c.state(s))))
            .collect();
        prop_assert_eq!(states, after);
        prop_assert_eq!(counters, (c.resident_pages(), c.pinned_pages(), c.dirty_pages()));
        if let Err(e) = c.check_invariants() {
            prop_assert!(false, "{}", e);
        }
        // The new policy still works: fill past capacity.
        for p in 100..140 {
            apply(&mut c, &Op::Access(p), &params);
        }
        prop_assert!(c.resident_pages() <= c.capacity_pages());
        if let Err(e) = c.check_invariants() {
            prop_assert!(false, "{}", e);
        }
    }
}
