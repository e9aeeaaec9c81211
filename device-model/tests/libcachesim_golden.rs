//! The model against libCacheSim, request by request: each case's expected
//! hit/miss string was recorded from libCacheSim 0.3.5's Python bindings
//! (`pip install libcachesim`; object-count mode, every object of size 1)
//! running the same sequence with the same parameters; the model runs it on
//! a fully associative cache (one set) the way the device does (lookup →
//! hit, else insert). The cases cover FIFO, LRU, CLOCK (one reference bit),
//! S3-FIFO and 2Q with libCacheSim's defaults, which are the model's, and
//! S3-FIFO / 2Q with other ratios and thresholds. Regenerating them:
//! `device-model/bench/libcachesim-compare.py` runs the large comparison;
//! these strings came from the same calls (`cache.get(req)` per request).
//!
//! Hand-checked sequences with their reasoning are in `tests/policies.rs`.

use cxlfs_device_model::cache::Cache;
use cxlfs_device_model::DeviceConfig;

/// The request sequence: 400 pages over 1..=80 (a skewed mix with short scans).
const SEQ: [u64; 400] = [
    6, 16, 5, 2, 64, 65, 66, 67, 68, 6, 40, 41, 42, 43, 44, 45, 46, 67, 7, 60, 61, 62, 63, 64, 65,
    66, 67, 19, 20, 21, 22, 23, 24, 25, 2, 2, 2, 42, 2, 3, 2, 30, 31, 32, 33, 2, 13, 41, 42, 43,
    44, 45, 46, 47, 48, 49, 54, 55, 56, 57, 58, 59, 60, 11, 30, 3, 2, 4, 4, 5, 22, 17, 2, 13, 23,
    24, 25, 57, 58, 59, 60, 61, 62, 63, 64, 2, 2, 78, 3, 8, 2, 2, 33, 3, 50, 51, 52, 53, 2, 5, 75,
    49, 50, 51, 52, 53, 54, 55, 56, 10, 2, 10, 12, 13, 14, 15, 16, 17, 18, 3, 22, 2, 37, 47, 77, 2,
    1, 2, 4, 80, 75, 2, 2, 57, 28, 29, 30, 31, 32, 33, 3, 5, 21, 22, 23, 24, 25, 6, 5, 5, 65, 28,
    3, 8, 2, 13, 33, 34, 35, 36, 37, 38, 39, 40, 29, 14, 56, 57, 58, 18, 19, 20, 21, 2, 33, 34, 35,
    36, 37, 38, 10, 63, 64, 65, 66, 67, 68, 69, 2, 2, 24, 2, 4, 35, 36, 37, 38, 3, 2, 3, 35, 36,
    37, 38, 39, 40, 7, 66, 67, 68, 3, 3, 4, 24, 9, 3, 2, 3, 9, 30, 31, 32, 33, 34, 35, 74, 56, 25,
    3, 9, 2, 2, 18, 65, 4, 4, 2, 16, 47, 48, 49, 2, 5, 2, 38, 10, 11, 12, 13, 14, 15, 16, 17, 18,
    2, 34, 67, 12, 2, 2, 2, 6, 76, 13, 14, 15, 16, 31, 4, 5, 14, 15, 16, 17, 2, 71, 31, 32, 33, 49,
    2, 18, 18, 3, 2, 5, 4, 55, 2, 5, 2, 58, 59, 60, 61, 62, 63, 64, 37, 4, 2, 34, 6, 35, 36, 37,
    38, 3, 19, 55, 6, 11, 60, 68, 69, 70, 71, 72, 73, 74, 30, 41, 39, 3, 70, 2, 41, 2, 70, 2, 2, 2,
    2, 2, 7, 51, 2, 2, 6, 16, 17, 18, 19, 20, 58, 59, 60, 61, 62, 5, 67, 68, 69, 70, 71, 72, 57,
    10, 5, 64, 65, 66, 67, 68, 69, 6, 58, 59, 60, 61, 62, 63, 64, 65, 66, 68, 35, 36, 37, 38, 39,
    40, 41, 42, 43, 48, 69, 9, 10, 11, 12, 13, 62, 63, 64, 65, 66, 67, 68, 12,
];

/// (policy, capacity, parameters, libCacheSim's outcome per request: `h` hit, `.` miss).
const CASES: &[(&str, u64, &[&str], &str)] = &[
    (
        "fifo",
        20,
        &[],
        concat!(
            ".........h.......h.....hhhh........hhhh.h....h......................h...h....hhh",
            "h....hh.h.hh.h....hh..hhhh.....h.........h...h.h...hh.......h..h....hh.h....h...",
            ".............h.hhhhh.........h.h......hhhhhh...hhhhhhh.hhhh.....h...hhhh..hh....",
            ".h.h.......h.hhh.hhhh..hhhh..hhhhhh.h..h..h.hhh.h.h........hh....h.h.hh.h.......",
            "....h.hhhhhhhh..hhh...h...............h...hhh.hhhhh.hhhh............h....h.....h",
        ),
    ),
    (
        "lru",
        20,
        &[],
        concat!(
            ".........h.......h.....hhhh........hh.h.h....h..h...................h...h....hhh",
            "h....hh.h.hh.h....h...hhhh....hh.......h.h...h.h...hh.......h..h....hh.hh.h.h...",
            ".............hhhhhhh........hh.h.hhhh.hhhhhh...hhhhhhh.hhhh.....h...hhhh..hhh...",
            ".h.h.......h.hh..hhhh..hhhh..hhhhhh.h...hhh.hhh.hhh........hh....h.h.hh.h.......",
            "...hh.hhhhhhhh..hhh..............h....h...hhh.hhhhh.hhhh.......................h",
        ),
    ),
    (
        "clock",
        20,
        &[],
        concat!(
            ".........h.......h.....hhhh........hh.h.h....h..h.................h.h...h....hhh",
            "h....hh.h.hh.h....h...hhhh....hh.......h.h...h.h...hh.......h..h....hh.hh.h.h...",
            ".............hh..hhh........hh.h.hhhh.hhhhhh...hhhhhhh.hhhh.....h...hhhh..hhh...",
            ".h.h.......h.hh..hhhh..hhhh.hhhhhhh.h...hhhhhhh.hhh........hh....h....h.h.......",
            "...hh.hhhhhhhh..hhh..............h....h...hhhhhhhhh.hhhh..........h.......hhh..h",
        ),
    ),
    (
        "s3fifo",
        20,
        &[],
        concat!(
            ".........h.......h.....hhhh.......hhhhh.h....h.hhhhhh.........h...h.h...h.......",
            "h....hh...hh......h...........hh.......h.h...h.h...hh.......hh......hh..h.h.....",
            "......h......hh...h.........hh.hhhhhhhhhhhhh......hhhh.hhhh...hhh.h.h.hh..hhh...",
            ".hhhh........hhh..hhh..hh.h.hhhhh.h.h.h.hhhhhhh.hhh.......hhh..h.hhh..h.........",
            "...h.h.hhhhhhh..hhhh.h.......h...h....h...hh.hhh.hh..h.h..........h.....h..hhhh.",
        ),
    ),
    (
        "2q",
        20,
        &[],
        concat!(
            ".........h.......h.....hhhh........hhhh.h....h....................h.h...h.......",
            ".....hh.h.hh.h....h...hhhh....hh.h.....hhh...h.h...hhh..h...hh.h....hh..h.hh....",
            ".......hh....hh.............hh.h.hhhhhhhhhhh......hhhh.hhhh...hhh...h.hh.h.hh...",
            ".h.hh.........hhhhhhh..hhhh.h..hhhh.h.h.hhhhhhh.hhh........hhh...hhh..h.........",
            "...h.hhhhhhhhh..hhh..h....h..h...hh...h......h..h...hhhh..........h.....h....hhh",
        ),
    ),
    (
        "fifo",
        32,
        &[],
        concat!(
            ".........h.......h.....hhhh.......hhhhh.h....h.hhhhhh.........h.hh..h.h.hhhhhhhh",
            "hhhh.hh.h.hhhh....hh.hhhhhhhh.hh.h...h...h.h.h.hh.hhhh......hh.h.....h.hhh..h...",
            "h...hh...h..hhhhhhhh...h....hhhh.hh.h.hhhhhhhh.hhhhhhh.hhhh....hh.h.hhhh..hh....",
            ".h.h.h.....h.hh.hhhhh..hhhhhhhhhhhh.hhhhhhhhhhh.hhh.........hhh..hh..hhhh...h...",
            "...hh.hhhhhhhh..hhh.h.h.hhhhh..hhhhh..hh..hhh........hhh....h.h.....h...hhhhhh.h",
        ),
    ),
    (
        "lru",
        32,
        &[],
        concat!(
            ".........h.......h.....hhhh.......hhhhh.h....h.hhhhhh...........hhh.h.h.hhhhhhhh",
            "h....hh.h.hh.h....hh.hhhhhhhh.hh.h.....h.h...h.h..hhh.......h..h....hh.hh.hhh...",
            "h...h..h....hhhhhhhh...h....hh.h.hhhhhhhhhhhhh.hhhhhhh.hhhh...hhh...hhhhhhhhh...",
            ".h.hh......h.hhhhhhhh..hhhhhhhhhhhh.hhhhhhhhhhh.hhh........hhhh..h.h.hh.h...h...",
            "...hhhhhhhhhhh..hhh...h...h....hhhhh..h...hhhhhhhhh.hhhh..........h.h...hhhhhhhh",
        ),
    ),
    (
        "clock",
        32,
        &[],
        concat!(
            ".........h.......h.....hhhh.......hhhhh.h....h.hhhhhh...........hhh.h...hh...hhh",
            "h....hh.h.hh.h....hh.hhhhhhhh.hh.h.....h.h...h.hh.hhhh......hh.h....hh.hh.hhh...",
            "....h..h....hhhhhhhhh..h....hh.h.hhhhhhhhhhhhh.hhhhhhh.hhhh...hhh...hhhh.hhhh...",
            ".hhhhh.....h.hhhhhhhh..hhhh.hhhhhhh.h.hhhhhhhhh.hhh........hhhhh.h.h.hh.h.......",
            "...hhhhhhhhhhh..hhh.h.h...h....hhhhh..h...hhhhhhhhh.hhhh..h...h...h.h...hhhhhhhh",
        ),
    ),
    (
        "s3fifo",
        32,
        &[],
        concat!(
            ".........h.......h.....hhhh.......hhhhh.h....h.hhhhhh.........h.hhh.h.h.h.hhh...",
            "h..hhhh.h.hh.h....hh.....h....hh.......hhh...h.h...hh...h..hhh.hhhh.hh..h.h.h...",
            "......h......hh...h.........hhhhhhhhhhhhhhhh......hhhh.hhhhh..hhh.hhhhhhhhhhh...",
            ".hhhhh.......hhhhhhhh....hhhhhhhh.h.h.h.hhhhhhh.hhh.......hhhh.hhhhh..h.h.......",
            "...h.hhhhhhhhh..hhhh.hh......h..hhh...hh...hhh.hh...hhhhhhhh......h.....h.h...hh",
        ),
    ),
    (
        "2q",
        32,
        &[],
        concat!(
            ".........h.......h.....hhhh.......hhhhh.h....h.hhhhhh.........h.hh..h.h.hhhhhhhh",
            "hhhh.hh.h.hhhh....hh.hhhhhhhh.hh.h...h...h.h.h.hh.hhhh......hh.h....hh.hh.h.h...",
            "h...h.......hhhhhh.h..hh....hhhh...h.hhhhhhh...hhhhhhh.hhhh...h.h.hhhhhhh.hhh...",
            ".h.hhh..hh.h.hhh.hhhh..hhhh..hhhhhh.h.hhhhhhhhh.hhh........hhhhh.hhh..h.h.......",
            "...hhhhhhhhhhh..hhhh.hh........hhhhh..h...h.hhhhhhh.hhhhh.........h.h...hhhhh.hh",
        ),
    ),
    (
        "s3fifo",
        20,
        &[
            "s3fifo_small_ratio=0.3",
            "s3fifo_ghost_ratio=0.5",
            "s3fifo_move_to_main_threshold=1",
        ],
        concat!(
            ".........h.......h.....hhhh........hhhh.h....h..h.hhh.........h...h.h...h.......",
            "h...hhh...hh.h....h.....hh....hh.......h.h...h.h...hhh......h.......hh..h.h.....",
            ".......h.....hh.....h.......hh.h.hhhhhhhhhhh......hhhh.hhhh...h.h...hhhh..hhh...",
            ".h.hh.........h..hhhh....hh.h.hhh.h.h.h.h.hhhhh.hhh........hh..h.hhh..h.........",
            "...h.hhhhhhhhh..hhhh......h..h...hh...h......h..h...hhhh................h.hhh.hh",
        ),
    ),
    (
        "s3fifo",
        32,
        &["s3fifo_ghost_ratio=2.0", "s3fifo_move_to_main_threshold=3"],
        concat!(
            ".........h.......h.....hhhh.......hhhhh.h....h.hhhhhh.........h.hhh.h.h.h.hhh...",
            "h..hhhh.h.hh.h....hh.....h....hh.......hhh...h.h...hh...h..hhh.hhhh.hh..h.h.h...",
            "......h......hh...h.........hhhhhhhhhhhhhhhh......hhhh.hhhhh..hhh.hhhhhhhhhhh...",
            ".hhhhh.......hhhhhhhh....hhhhhhhh.h.hhh.hhhhhhh.hhh.......hhhh.hhhhh..h.h.......",
            "...h.hhhhhhhhh..hhhh.hh......h..hhh...hh...hhh.hh...hhhhhhhh......h.....h.h...hh",
        ),
    ),
    (
        "2q",
        20,
        &["twoq_kin_ratio=0.1", "twoq_kout_ratio=1.0"],
        concat!(
            ".........h.......h.....hhhh........hhhh.h....h....................h.h...h.......",
            "h....hh.h.hh.h....h......h....hh.......h.h...h.h...hh......hhh......hh..h.h.h...",
            "......h......hh...h.........hh.h.hhhhhhhhhhh......hhhh.hhhh...hhh...h.hh...hh...",
            ".h.h..........hhh.hhh...h.h.h.hhh.h.h...hhhhhhh.hhh........hh.h....h..h.........",
            "...h.hhhhhhhhh..hhh.......h.....hhh........hhh.hhhh...hh..........h.....h.hh.hhh",
        ),
    ),
];

/// The model's outcome string for `seq` on a one-set cache of `pages`.
fn outcomes(policy: &str, pages: u64, params: &[&str], seq: &[u64]) -> String {
    let mut overrides = vec![
        format!("cache.size_bytes={}", pages * cxlfs_device_model::PAGE_SIZE),
        "cache.ways=0".to_string(),
        format!("cache.policy={policy}"),
        "cache.hits_visible=true".to_string(),
    ];
    overrides.extend(params.iter().map(|p| format!("cache.params.{p}")));
    let cfg = match DeviceConfig::default().with_overrides(&overrides) {
        Ok(cfg) => cfg.cache,
        Err(e) => panic!("{overrides:?}: {e}"),
    };
    let mut cache = Cache::new(&cfg, 1 << 10);
    let out = seq
        .iter()
        .map(|&p| match cache.lookup(p) {
            Some(slot) => {
                cache.record_hit(slot);
                'h'
            }
            None => {
                cache.insert(p, 0, false, false);
                '.'
            }
        })
        .collect();
    if let Err(e) = cache.check_invariants() {
        panic!("{policy} {pages} {params:?}: {e}");
    }
    out
}

#[test]
fn every_case_matches_libcachesim_request_by_request() {
    let mut failed = Vec::new();
    for &(policy, pages, params, expect) in CASES {
        assert_eq!(expect.len(), SEQ.len());
        let got = outcomes(policy, pages, params, &SEQ);
        if got != expect {
            let first = got.bytes().zip(expect.bytes()).position(|(a, b)| a != b);
            failed.push(format!(
                "{policy} {pages} {params:?}: first difference at request {first:?}"
            ));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn the_cases_cover_every_shared_policy() {
    for policy in ["fifo", "lru", "clock", "s3fifo", "2q"] {
        assert!(CASES.iter().any(|c| c.0 == policy), "{policy}");
    }
}
