//! NAND timing, FTL and GC through the public API of `cxlfs_device_model::nand`.

use cxlfs_device_model::config::NandConfig;
use cxlfs_device_model::nand::{Nand, NandStats};
use cxlfs_device_model::DeviceConfig;

const TR: u64 = 40_000;
const TPROG: u64 = 200_000;
const TBERS: u64 = 2_000_000;

/// A small geometry with round timings; tweak fields per test.
fn geometry(channels: u32, luns_per_channel: u32, blocks: u32, pages: u32) -> NandConfig {
    NandConfig {
        enabled: true,
        channels,
        luns_per_channel,
        planes_per_lun: 1,
        blocks_per_plane: blocks,
        pages_per_block: pages,
        read_ns: TR,
        program_ns: TPROG,
        erase_ns: TBERS,
        channel_xfer_ns: 0,
        overprovision_ratio: 0.25,
        gc_background_threshold: 0.25,
        gc_foreground_threshold: 0.10,
    }
}

/// Deterministic xorshift64* stream for random overwrites.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) % n
    }
}

#[test]
fn reads_on_different_channels_overlap() {
    let mut cfg = geometry(2, 1, 8, 4);
    cfg.channel_xfer_ns = 500;
    let mut nand = Nand::new(&cfg);
    // Never-written pages sit at LUN lpn % luns: lpn 0 on channel 0, lpn 1 on channel 1.
    assert_eq!(nand.lun_of(0), 0);
    assert_eq!(nand.lun_of(1), 1);
    assert_eq!(nand.read(0, 0), TR + 500);
    assert_eq!(nand.read(0, 1), TR + 500);
}

#[test]
fn reads_on_one_lun_queue() {
    let mut cfg = geometry(2, 2, 8, 4);
    cfg.channel_xfer_ns = 500;
    let mut nand = Nand::new(&cfg);
    let luns = nand.luns();
    assert_eq!(luns, 4);
    assert_eq!(nand.lun_of(3), nand.lun_of(3 + luns));
    assert_eq!(nand.read(0, 3), TR + 500);
    // Same LUN: starts when the first read frees it (its transfer overlaps).
    assert_eq!(nand.read(0, 3 + luns), 2 * TR + 500);
    assert_eq!(nand.busy_until(3), 2 * TR);
    // Latency is measured from arrival: a read arriving after the LUN is free does not queue.
    assert_eq!(nand.read(10 * TR, 3), 11 * TR + 500);
}

#[test]
fn channel_transfers_serialize() {
    let mut cfg = geometry(1, 2, 8, 4);
    cfg.channel_xfer_ns = 5_000;
    let mut nand = Nand::new(&cfg);
    assert_ne!(nand.lun_of(0), nand.lun_of(1));
    assert_eq!(
        nand.channel_of_lun(nand.lun_of(0)),
        nand.channel_of_lun(nand.lun_of(1))
    );
    // Both LUN reads finish at tR; the transfers take turns on the channel.
    assert_eq!(nand.read(0, 0), TR + 5_000);
    assert_eq!(nand.read(0, 1), TR + 10_000);
    assert_eq!(nand.channel_busy_until(0), TR + 10_000);
}

#[test]
fn unwritten_pages_are_striped_channels_first() {
    let cfg = geometry(4, 2, 8, 4);
    let nand = Nand::new(&cfg);
    for lpn in 0..64 {
        let lun = nand.lun_of(lpn);
        assert_eq!(lun, lpn % 8);
        assert_eq!(nand.channel_of_lun(lun), lpn % 4);
        assert!(!nand.is_mapped(lpn));
    }
}

#[test]
fn program_on_idle_device() {
    let mut cfg = geometry(2, 2, 8, 4);
    cfg.channel_xfer_ns = 3_000;
    let mut nand = Nand::new(&cfg);
    assert_eq!(nand.program(1_000, 7).unwrap(), 1_000 + 3_000 + TPROG);
    assert!(nand.is_mapped(7));
    // The next program goes to the next LUN (another channel): no queueing.
    assert_eq!(nand.program(1_000, 8).unwrap(), 1_000 + 3_000 + TPROG);
    // Reading back a page waits for its LUN to finish the program.
    let lun = nand.lun_of(7);
    assert_eq!(nand.busy_until(lun), 1_000 + 3_000 + TPROG);
    assert_eq!(nand.read(1_000, 7), 1_000 + 3_000 + TPROG + TR + 3_000);
    nand.check_invariants().unwrap();
}

#[test]
fn programs_on_one_lun_queue() {
    let cfg = geometry(1, 1, 8, 4);
    let mut nand = Nand::new(&cfg);
    assert_eq!(nand.program(0, 0).unwrap(), TPROG);
    assert_eq!(nand.program(0, 1).unwrap(), 2 * TPROG);
    assert_eq!(nand.read(0, 0), 2 * TPROG + TR);
}

#[test]
fn random_overwrites_trigger_gc_and_keep_data() {
    // 1 channel, 1 LUN, 8 blocks of 4 pages, 25 % OP: 24 logical pages.
    let cfg = geometry(1, 1, 8, 4);
    let mut nand = Nand::new(&cfg);
    let logical = nand.logical_pages();
    assert_eq!(logical, 24);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut now = 0;
    let mut fg_writes = 0;
    for i in 0..3_000u64 {
        // First touch every page once, then overwrite at random.
        let lpn = if i < logical { i } else { rng.below(logical) };
        let before = nand.stats();
        // Arrive on an idle device so the latency is this write's own work.
        now = now.max(nand.busy_until(0)) + 1;
        let done = nand.program(now, lpn).unwrap();
        let after = nand.stats();
        if after.gc_foreground_runs > before.gc_foreground_runs {
            fg_writes += 1;
            let gc_ns = after.gc_busy_ns - before.gc_busy_ns;
            assert!(gc_ns >= TBERS);
            assert!(done - now > TPROG, "GC time must be charged to the write");
            assert_eq!(done - now, gc_ns + TPROG);
        } else {
            assert_eq!(done - now, TPROG);
        }
        assert!(nand.valid_pages() <= logical);
        nand.check_invariants().unwrap();
    }
    let s = nand.stats();
    assert_eq!(s.host_programs, 3_000);
    assert!(s.gc_runs > 0, "{s:?}");
    assert!(s.erases > 0, "{s:?}");
    assert!(fg_writes > 0);
    assert_eq!(
        s.gc_foreground_runs, s.gc_runs,
        "one LUN: no idle LUN for background GC"
    );
    assert!(s.write_amplification() > 1.0, "{s:?}");
    assert_eq!(s.programs(), s.host_programs + s.gc_page_copies);
    assert_eq!(nand.valid_pages(), logical);
    for lpn in 0..logical {
        assert!(nand.is_mapped(lpn));
        let t = nand.busy_until(0) + 7;
        assert_eq!(nand.read(t, lpn), t + TR);
    }
    nand.check_invariants().unwrap();
}

#[test]
fn gc_under_load_with_many_luns_and_transfers() {
    // Writes arrive faster than the flash can absorb them: queues build, GC
    // runs in the foreground on several LUNs, the FTL stays consistent.
    let mut cfg = geometry(2, 2, 8, 8);
    cfg.channel_xfer_ns = 2_000;
    let mut nand = Nand::new(&cfg);
    let logical = nand.logical_pages();
    let mut rng = Rng(42);
    let mut last = 0;
    for i in 0..20_000u64 {
        let now = i * 1_000;
        let lpn = rng.below(logical);
        if i % 3 == 0 {
            let done = nand.read(now, lpn);
            assert!(done >= now + TR + 2_000);
        } else {
            let done = nand.program(now, lpn).unwrap();
            assert!(done >= now + 2_000 + TPROG);
            last = last.max(done);
        }
        if i % 97 == 0 {
            nand.check_invariants().unwrap();
        }
    }
    nand.check_invariants().unwrap();
    let s = nand.stats();
    assert!(s.gc_foreground_runs > 0, "{s:?}");
    assert!(s.write_amplification() > 1.0);
    assert!(last > 20_000 * 1_000, "the device is write-bound");
    for lun in 0..nand.luns() {
        assert!(nand.free_blocks(lun) >= 1);
    }
}

#[test]
fn background_gc_on_idle_luns_hides_gc_from_writes() {
    let mut cfg = geometry(2, 1, 32, 16);
    cfg.gc_background_threshold = 0.5;
    cfg.gc_foreground_threshold = 0.125;
    let mut nand = Nand::new(&cfg);
    let logical = nand.logical_pages();
    let mut rng = Rng(7);
    // Far apart arrivals: every LUN is idle when the next write comes.
    let gap = 100 * TBERS;
    // Filling the device leaves it under the background threshold with no
    // invalid page to reclaim, so the first overwrites may need foreground
    // GC; once background GC has caught up, writes never wait for GC.
    let warmup = 2_000;
    for i in 0..warmup {
        let lpn = if i < logical { i } else { rng.below(logical) };
        nand.program(i * gap, lpn).unwrap();
    }
    let warm = nand.stats();
    for i in warmup..20_000u64 {
        let now = i * gap;
        let before = nand.stats();
        assert_eq!(
            nand.program(now, rng.below(logical)).unwrap(),
            now + TPROG,
            "write {i}"
        );
        let after = nand.stats();
        assert!(after.gc_runs - before.gc_runs <= 1);
        // Background GC leaves victims with under 1/8 invalid pages alone.
        assert!(after.gc_page_copies - before.gc_page_copies <= 16 - 2);
    }
    nand.check_invariants().unwrap();
    let s = nand.stats();
    assert!(s.gc_background_runs() > warm.gc_background_runs(), "{s:?}");
    assert_eq!(s.gc_foreground_runs, warm.gc_foreground_runs, "{s:?}");
    assert!(s.write_amplification() > 1.0);
}

#[test]
fn varied_geometries_keep_invariants() {
    let mut rng = Rng(0xDEAD_BEEF);
    let (mut cases, mut gc_cases) = (0, 0);
    for case in 0..40u64 {
        let channels = 1 + rng.below(3) as u32;
        let luns_per_channel = 1 + rng.below(3) as u32;
        let planes = 1 + rng.below(2) as u32;
        let blocks = 2 + rng.below(6) as u32;
        let pages = 1 + rng.below(8) as u32;
        let mut cfg = geometry(channels, luns_per_channel, blocks, pages);
        cfg.planes_per_lun = planes;
        let bpl = f64::from(planes * blocks);
        if bpl < 4.0 {
            continue;
        }
        cfg.overprovision_ratio = (2.0 / bpl).max(0.07) + 0.01 * rng.below(10) as f64;
        cfg.gc_foreground_threshold = 0.05 * rng.below(4) as f64;
        cfg.gc_background_threshold = cfg.gc_foreground_threshold + 0.1 * rng.below(4) as f64;
        cfg.channel_xfer_ns = 1_000 * rng.below(3);
        let mut nand = Nand::new(&cfg);
        let logical = nand.logical_pages();
        assert!(logical > 0, "{cfg:?}");
        let mut now = 0;
        for i in 0..3_000u64 {
            now += if rng.below(2) == 0 {
                rng.below(1_000)
            } else {
                rng.below(5 * TBERS)
            };
            let lpn = rng.below(logical);
            if rng.below(3) == 0 {
                assert!(nand.read(now, lpn) >= now + TR);
            } else {
                let done = nand
                    .program(now, lpn)
                    .unwrap_or_else(|e| panic!("{e} {cfg:?}"));
                assert!(done >= now + TPROG);
            }
            if i % 251 == 0 {
                nand.check_invariants()
                    .unwrap_or_else(|e| panic!("case {case}: {e} {cfg:?}"));
            }
        }
        nand.check_invariants()
            .unwrap_or_else(|e| panic!("case {case}: {e} {cfg:?}"));
        for lun in 0..nand.luns() {
            assert!(nand.free_blocks(lun) >= 1);
        }
        cases += 1;
        gc_cases += u32::from(nand.stats().gc_runs > 0);
    }
    eprintln!("{cases} geometries, {gc_cases} with GC");
    assert!(cases >= 20 && gc_cases >= cases / 2);
}

#[test]
fn same_ops_same_results() {
    let run = || {
        let mut cfg = geometry(2, 2, 8, 4);
        cfg.channel_xfer_ns = 1_500;
        cfg.gc_background_threshold = 0.5;
        let mut nand = Nand::new(&cfg);
        let logical = nand.logical_pages();
        let mut rng = Rng(2024);
        let mut times = Vec::new();
        let mut now = 0;
        for i in 0..5_000u64 {
            now += rng.below(400_000);
            let lpn = rng.below(logical + logical / 4); // some reads beyond the written set
            if i % 2 == 0 && lpn < logical {
                times.push(nand.program(now, lpn).unwrap());
            } else {
                times.push(nand.read(now, lpn));
            }
        }
        (times, nand.stats())
    };
    let (a, sa) = run();
    let (b, sb) = run();
    assert_eq!(a, b);
    assert_eq!(sa, sb);
    assert!(sa.gc_runs > 0, "{sa:?}");
}

#[test]
fn model_off_is_flat() {
    let cfg = DeviceConfig::default()
        .with_overrides(&[
            "nand.enabled=false",
            "nand.read_ns=3us",
            "nand.program_ns=100us",
        ])
        .unwrap()
        .nand;
    let mut nand = Nand::new(&cfg);
    assert!(!nand.is_enabled());
    for i in 0..10 {
        // Same page, same time: no queueing at all.
        assert_eq!(nand.read(123, 5), 123 + 3_000);
        assert_eq!(nand.program(456 + i, 5).unwrap(), 456 + i + 100_000);
    }
    assert_eq!(
        nand.stats(),
        NandStats {
            host_reads: 10,
            host_programs: 10,
            ..NandStats::default()
        }
    );
    nand.reset_stats();
    assert_eq!(nand.stats(), NandStats::default());
    nand.check_invariants().unwrap();
}

#[test]
fn sequential_overwrites_have_no_amplification() {
    let cfg = geometry(2, 2, 16, 8);
    let mut nand = Nand::new(&cfg);
    let logical = nand.logical_pages();
    let mut now = 0;
    for _pass in 0..6 {
        for lpn in 0..logical {
            now += 10_000;
            nand.program(now, lpn).unwrap();
        }
    }
    nand.check_invariants().unwrap();
    let s = nand.stats();
    assert!(s.gc_runs > 0, "{s:?}");
    assert!(s.write_amplification() < 1.02, "{s:?}");
}

#[test]
fn pages_beyond_logical_capacity_take_no_ftl_space() {
    let cfg = geometry(2, 2, 8, 4);
    let mut nand = Nand::new(&cfg);
    let lpn = nand.logical_pages() + 5;
    let lun = nand.lun_of(lpn);
    assert_eq!(lun, lpn % 4);
    assert_eq!(nand.program(0, lpn).unwrap(), TPROG);
    assert_eq!(nand.busy_until(lun), TPROG);
    assert!(!nand.is_mapped(lpn));
    assert_eq!(nand.valid_pages(), 0);
    assert_eq!(nand.read(0, lpn), TPROG + TR);
    assert_eq!(nand.stats().host_programs, 1);
    nand.check_invariants().unwrap();
}

#[test]
fn stats_reset_keeps_state() {
    let cfg = geometry(1, 2, 8, 4);
    let mut nand = Nand::new(&cfg);
    nand.program(0, 3).unwrap();
    nand.read(0, 3);
    assert_eq!(nand.stats().host_reads, 1);
    assert_eq!(nand.stats().host_programs, 1);
    nand.reset_stats();
    assert_eq!(nand.stats(), NandStats::default());
    assert!(nand.is_mapped(3));
    assert_eq!(nand.valid_pages(), 1);
}

#[test]
fn rewriting_a_small_range_of_a_big_device_keeps_the_model_small() {
    // Overwrites go to fresh blocks and no GC runs on a device this size
    // (4 LUNs of 4 096 blocks of 64 pages), so each round of rewrites fills
    // new blocks: the reverse map must follow the blocks holding data, not
    // every block ever written (64 rounds of 2 048 pages would be 512 KiB).
    let cfg = geometry(2, 2, 4096, 64);
    let mut nand = Nand::new(&cfg);
    let (range, rounds) = (2_048u64, 64);
    let mut now = 0;
    let mut after_first = 0;
    for round in 0..rounds {
        for lpn in 0..range {
            now += 1_000;
            nand.program(now, lpn).unwrap();
        }
        if round == 0 {
            after_first = nand.memory_bytes();
        }
    }
    assert_eq!(nand.stats().erases, 0, "the device is big enough for no GC");
    assert_eq!(nand.valid_pages(), range);
    let bound = 4 * range * 4; // four rounds' worth of 4-byte entries
    let grown = nand.memory_bytes() - after_first;
    assert!(
        grown <= bound,
        "the model grew {grown} bytes over {} rounds of rewriting {range} pages (bound {bound})",
        rounds - 1
    );
    nand.check_invariants().unwrap();
}

#[test]
fn huge_preset_starts_small() {
    let cfg = cxlfs_device_model::presets::preset("cmm-h").unwrap().nand;
    assert!(cfg.physical_pages() > 200_000_000);
    let mut nand = Nand::new(&cfg);
    let base = nand.memory_bytes();
    assert!(base < 8 << 20, "{base} bytes before any write");
    let mut now = 0;
    for lpn in 0..50_000u64 {
        now += 1_000;
        nand.program(now, lpn * 7).unwrap();
        nand.read(now, lpn * 13);
    }
    assert!(
        nand.memory_bytes() < 16 << 20,
        "{} bytes",
        nand.memory_bytes()
    );
    assert_eq!(nand.valid_pages(), 50_000);
}

#[test]
fn config_overrides_build_small_devices() {
    let cfg = DeviceConfig::default()
        .with_overrides(&[
            "cache.size_bytes=4KiB",
            "nand.channels=2",
            "nand.luns_per_channel=1",
            "nand.planes_per_lun=1",
            "nand.blocks_per_plane=8",
            "nand.pages_per_block=4",
            "nand.overprovision_ratio=0.25",
            "nand.channel_xfer_ns=0",
        ])
        .unwrap()
        .nand;
    let mut nand = Nand::new(&cfg);
    assert_eq!(nand.logical_pages(), 48);
    let (tr, tprog) = (cfg.read_ns, cfg.program_ns);
    assert_eq!(nand.read(0, 0), tr);
    assert_eq!(nand.read(0, 1), tr);
    assert_eq!(nand.program(0, 0).unwrap(), tr + tprog);
    let mut rng = Rng(99);
    for i in 0..2_000 {
        nand.program(i * 1_000, rng.below(48)).unwrap();
    }
    nand.check_invariants().unwrap();
    assert!(nand.stats().erases > 0);
}
