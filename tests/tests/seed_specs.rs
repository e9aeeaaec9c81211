//! The seeds' experiments as shipped (`experiments/*.toml`), each run with
//! `cxlfs run --quick` on the real `cxlfsd` with real TCG guests in memory
//! mode, and the issue's properties asserted on their results — not only
//! that they ran:
//!
//! * `cylon-latency`: device-cache hits on the CXL node within 1.5x of
//!   DRAM's median; with a working set 1.75x the cache the latency is
//!   bimodal (miss mode at the modeled NAND read, within 3 µs), and the
//!   full-system hit share is within 5 points of what the device model's
//!   replay of the same sequence predicts;
//! * `bandwidth-vs-wss-memory`: a plateau up to 0.5x the cache (every
//!   measured pass served by the device cache), a fall through the knee
//!   that never climbs back, a floor at least 3x below the plateau;
//! * `redis` (its two ends, NAND reads scaled to TCG's slow guest CPU):
//!   at 2.10x the cache the GETs miss over 2x as often as at 0.33x, and
//!   0.33x serves over 1.3x the GET throughput;
//! * `cmm-h-interleave`: more of the dataset on the CXL node (DRAM:CXL
//!   3:1, 1:1, 0:1; weighted interleave, bookworm-backports kernel) means
//!   more device misses, and all of it there at most 0.8x the GET
//!   throughput of a DRAM-only twin in the same guest, below 1:1;
//! * `tiering` (SkyByte's host lever, bookworm-backports kernel, a fresh
//!   guest per configuration): with demotion and promotion on, the guest
//!   kernel promotes and demotes pages, and the chase runs at least 1.2x
//!   faster with fewer device misses than with every page on the CXL node;
//!   without the knobs it moves nothing;
//! * `miss-latency` (NAND 0, compensation off): a DAX file page's miss
//!   costs what a CXL-node page's does, give or take the trap path — not
//!   the ~230 µs of a fault that waits for the eviction of its own page —
//!   and the lap over twice the cache traps on about as many loads in
//!   both modes (evictions reach the DAX window before its pages are
//!   loaded again); the spec's vCPU ran under `SCHED_FIFO`;
//! * `policy-full-system` (FIFO and LRU only): without access sampling the
//!   full-system hit share is the hit-blind replay's; with it the policy
//!   sees hits: LRU's device misses fall, FIFO's (which ignores hits) do
//!   not, and nothing is sampled when it is off;
//! * `policy-full-system` over a DAX file (FIFO and 2Q): with the bits,
//!   2Q's device misses fall by at least 90 % of what the replay that sees
//!   every hit predicts, and FIFO's do not move;
//! * `demo` (at 100 % on the CXL-SSD, `replay_iolog` on): the hit share the
//!   daemon counts from the accessed bits is within 10 points of the one
//!   the replay of the guests' fio logs counts the same way, and the logs
//!   hold every read fio made.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{exclusive, repo_root, run_experiment};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Runs a shipped spec with `--quick`; returns its results directory (kept
/// on failure) and the `ok` rows of results.json.
fn run_spec(name: &str) -> (tempfile::TempDir, Vec<Value>) {
    run_spec_with(name, &[])
}

/// [`run_spec`] with extra `cxlfs run` arguments (`--set ...`).
fn run_spec_with(name: &str, extra: &[&str]) -> (tempfile::TempDir, Vec<Value>) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("cxlfs-e2e-{name}."))
        .tempdir()
        .unwrap();
    let out = dir.path().join("results");
    let spec = repo_root().join(format!("experiments/{name}.toml"));
    let extra: Vec<&std::ffi::OsStr> = extra.iter().map(std::ffi::OsStr::new).collect();
    let run = run_experiment(&spec, &out, &extra);
    // On failure the directory is kept (not deleted) for a look.
    let keep = |dir: tempfile::TempDir, why: String| -> ! {
        let kept = dir.keep();
        panic!("{why}; kept {}", kept.display());
    };
    if !run.status.success() {
        keep(dir, format!("cxlfs run {name} failed ({})", run.status))
    }
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let rows: Vec<Value> = results["rows"].as_array().unwrap().clone();
    let failed: Vec<&Value> = rows.iter().filter(|r| r["status"] != "ok").collect();
    if !failed.is_empty() {
        keep(
            dir,
            format!("{name}: runs failed: {:#?}", failed[0]["error"]),
        );
    }
    for png in plots(&out) {
        let svg = png.with_extension("svg");
        assert!(svg.is_file(), "no SVG beside {}", png.display());
    }
    assert!(!plots(&out).is_empty(), "{name}: no plots drawn");
    (dir, rows)
}

fn plots(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "png"))
        .collect()
}

fn f(r: &Value, k: &str) -> f64 {
    r[k].as_f64()
        .unwrap_or_else(|| panic!("{k} = {:?} in {r:#}", r[k]))
}

/// A row's device misses as the printed table counts them: the VM's file
/// pages (`device_misses`) and its CXL memory region together.
fn device_misses(r: &Value) -> f64 {
    f(r, "device_misses") + f(r, "daemon.region_device_misses")
}

/// The rows of `vm` (`all` for the aggregate) and `phase`, in run order.
fn of<'r>(rows: &'r [Value], vm: &str, phase: &str) -> Vec<&'r Value> {
    rows.iter()
        .filter(|r| r["vm"] == vm && r["phase"] == phase)
        .collect()
}

/// `rows` grouped by their value of the swept `key`, in the order each
/// value first appears (the sweep's order).
fn grouped<'r>(rows: &[&'r Value], key: &str) -> Vec<(&'r Value, Vec<&'r Value>)> {
    let mut groups: Vec<(&Value, Vec<&Value>)> = Vec::new();
    for &r in rows {
        match groups.iter_mut().find(|(v, _)| *v == &r[key]) {
            Some((_, g)) => g.push(r),
            None => groups.push((&r[key], vec![r])),
        }
    }
    groups
}

/// The mean of `column` over `rows`.
fn mean(rows: &[&Value], column: &str) -> f64 {
    assert!(!rows.is_empty(), "no rows for the mean of {column}");
    rows.iter().map(|r| f(r, column)).sum::<f64>() / rows.len() as f64
}

/// distributions.jsonl of results directory `out`: its text (for
/// messages) and its lines.
fn distributions(out: &Path) -> (String, Vec<Value>) {
    let text = std::fs::read_to_string(out.join("distributions.jsonl")).unwrap();
    let ds = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (text, ds)
}

/// A histogram line of distributions.jsonl: (low, high, count) buckets.
fn buckets(d: &Value) -> Vec<(f64, f64, f64)> {
    d["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let a = b.as_array().unwrap();
            (
                a[0].as_f64().unwrap(),
                a[1].as_f64().unwrap(),
                a[2].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The median of the buckets inside `[lo, hi)` (bucket midpoints, geometric).
fn median_within(b: &[(f64, f64, f64)], lo: f64, hi: f64) -> Option<f64> {
    let inside: Vec<&(f64, f64, f64)> = b.iter().filter(|x| x.0 >= lo && x.1 <= hi).collect();
    let total: f64 = inside.iter().map(|x| x.2).sum();
    let mut seen = 0.0;
    for x in inside {
        seen += x.2;
        if seen >= total / 2.0 && total > 0.0 {
            return Some((x.0 * x.1).sqrt());
        }
    }
    None
}

/// The mode (the fullest bucket's geometric midpoint) inside `[lo, hi)`.
fn mode_within(b: &[(f64, f64, f64)], lo: f64, hi: f64) -> Option<f64> {
    b.iter()
        .filter(|x| x.0 >= lo && x.1 <= hi && x.2 > 0.0)
        .max_by(|x, y| x.2.total_cmp(&y.2))
        .map(|x| (x.0 * x.1).sqrt())
}

#[test]
fn cylon_latency_is_bimodal_and_matches_the_replay() {
    let _serial = exclusive();
    let (dir, rows) = run_spec("cylon-latency");
    let out = dir.path().join("results");
    let (text, ds) = distributions(&out);
    let hist = |phase: &str| {
        buckets(
            ds.iter()
                .find(|d| d["phase"] == phase && d["name"] == "latency")
                .unwrap_or_else(|| panic!("no {phase} histogram in {text}")),
        )
    };
    let (dram, dram_fits, fits, cxl) = (
        hist("dram"),
        hist("dram-fits"),
        hist("cxl-fits"),
        hist("cxl"),
    );
    const SPLIT_NS: f64 = 5_000.0;
    // The cylon preset's NAND read (tR).
    const NAND_READ_NS: f64 = 40_000.0;
    let dram_median = median_within(&dram, 0.0, f64::MAX).unwrap();
    let fits_median = median_within(&fits, 0.0, f64::MAX).unwrap();
    let dram_fits_median = median_within(&dram_fits, 0.0, f64::MAX).unwrap();
    let hit_mode = mode_within(&cxl, 0.0, SPLIT_NS).expect("no hits on the CXL node");
    let miss_mode = mode_within(&cxl, SPLIT_NS, f64::MAX).expect("no misses on the CXL node");
    let count = |b: &[(f64, f64, f64)], lo: f64, hi: f64| -> f64 {
        b.iter()
            .filter(|x| x.0 >= lo && x.1 <= hi)
            .map(|x| x.2)
            .sum()
    };
    let (hits, misses) = (count(&cxl, 0.0, SPLIT_NS), count(&cxl, SPLIT_NS, f64::MAX));
    eprintln!(
        "DRAM median {dram_median:.0} ns; set half the cache: DRAM {dram_fits_median:.0} ns, \
         CXL {fits_median:.0} ns; \
         CXL, 1.75x the cache: hit mode {hit_mode:.0} ns ({:.2}x DRAM), miss mode {miss_mode:.0} ns; \
         hits {hits} misses {misses}",
        hit_mode / dram_median
    );
    // A device-cache hit is a load at memory speed: with the working set in
    // the cache, the CXL node's median is within 1.5x of DRAM's at the same
    // size, chased in turn with it by the same probe (`against_p50_ns`):
    // phases apart, TCG's own memory speed drifts by up to 2x (DRAM 360 and
    // 640 ns in one run). (In the 1.75x run hits follow traps, on a host
    // core whose caches the trap's threads just used: the hit mode there is
    // reported, not asserted.)
    let fits_row = of(&rows, "vm0", "cxl-fits");
    let fits_row = fits_row.first().expect("no cxl-fits row");
    let (cxl_p50, dram_p50) = (f(fits_row, "out.p50_ns"), f(fits_row, "out.against_p50_ns"));
    eprintln!("set half the cache, chased in turn: CXL {cxl_p50:.0} ns, DRAM {dram_p50:.0} ns");
    assert!(
        cxl_p50 <= 1.5 * dram_p50,
        "CXL hits {cxl_p50:.0} ns vs DRAM {dram_p50:.0} ns, chased in turn"
    );
    // No traps once the set is resident: loads at NAND time (>= tR) are as
    // rare as on DRAM at the same size (host preemptions of the vCPU
    // thread), within 0.5 % of the loads. A set that thrashed would trap
    // each page once a lap: 1 load in 64 (1.6 %) at one load per line.
    // (Loads of 4-10 us, about 1 % on either node here, are the emulator's
    // and the host's, not the device's: they are not counted.)
    let fits_loads = count(&fits, 0.0, f64::MAX);
    let (fits_slow, dram_fits_slow) = (
        count(&fits, NAND_READ_NS, f64::MAX),
        count(&dram_fits, NAND_READ_NS, f64::MAX),
    );
    eprintln!(
        "loads >= tR with the set in the cache: CXL {fits_slow} vs DRAM {dram_fits_slow} \
         of {fits_loads}"
    );
    assert!(
        fits_slow <= dram_fits_slow + 0.005 * fits_loads,
        "a working set that fits the cache still trapped: {fits_slow} loads >= tR \
         (DRAM at the same size: {dram_fits_slow}) of {fits_loads}"
    );
    // Misses at NAND time: compensation (on by default) releases a miss
    // ahead of its modeled completion by the trap path's measured cost, to
    // within a few µs either way (one run's mode: 39 923 ns).
    assert!(
        miss_mode >= NAND_READ_NS - 3_000.0,
        "miss mode {miss_mode:.0} ns < tR {NAND_READ_NS} - 3 us"
    );
    // Bimodal: both modes hold a real share of the loads, with next to
    // nothing between them (5 us .. tR - 3 us: compensated misses sit at
    // tR within a few µs either way). Loads of 1-5 us are device hits
    // whose page QEMU had not mapped yet (a host minor fault, no NAND).
    let total = hits + misses;
    assert!(
        hits > 0.2 * total && misses > 0.2 * total,
        "hits {hits} misses {misses}"
    );
    let between = count(&cxl, SPLIT_NS, NAND_READ_NS - 3_000.0);
    assert!(between < 0.05 * total, "{between} loads between the modes");
    assert!(
        hit_mode * 10.0 < miss_mode,
        "modes {hit_mode:.0} / {miss_mode:.0} ns"
    );
    // DRAM: no NAND-time loads to speak of (host preemptions only: 0.1-0.3 %
    // here, against 45 % on the CXL node).
    let (dram_slow, dram_loads) = (
        count(&dram, NAND_READ_NS, f64::MAX),
        count(&dram, 0.0, f64::MAX),
    );
    assert!(
        dram_slow < 0.01 * dram_loads,
        "{dram_slow} of {dram_loads} DRAM loads at NAND time"
    );

    let cxl_row = of(&rows, "vm0", "cxl");
    let r = cxl_row.first().unwrap();
    let (full, replay) = (f(r, "hit_share.full_system"), f(r, "hit_share.replay"));
    eprintln!("hit share: full system {full:.3}, replay {replay:.3}");
    assert!(
        (full - replay).abs() <= 0.05,
        "full-system hit share {full:.3} vs replay {replay:.3}"
    );
    // And the daemon saw the misses as region traps of vm0.
    assert!(f(r, "daemon.region_traps") >= 0.5 * misses);
}

#[test]
fn miss_latency_file_mode_misses_like_memory_mode() {
    let _serial = exclusive();
    let (dir, rows) = run_spec_with(
        "miss-latency",
        &[
            "--set",
            "sweep.daemon.device.nand.read_ns=[\"0us\"]",
            "--set",
            "sweep.daemon.latency_compensation=[\"off\"]",
        ],
    );
    let out = dir.path().join("results");
    let (text, ds) = distributions(&out);
    // Loads slower than the spec's miss split: the ones that trapped.
    let trapped = |run: &Value, phase: &str| -> f64 {
        let d = ds
            .iter()
            .find(|d| d["run"] == *run && d["phase"] == phase && d["name"] == "latency")
            .unwrap_or_else(|| panic!("no {phase} histogram of run {run} in {text}"));
        buckets(d)
            .iter()
            .filter(|b| b.0 >= 5_000.0)
            .map(|b| b.2)
            .sum()
    };
    let files = of(&rows, "vm0", "file");
    assert!(!files.is_empty(), "no file rows: {rows:#?}");
    for file in files {
        let run = &file["run"];
        let memory = rows
            .iter()
            .find(|r| r["vm"] == "vm0" && r["phase"] == "memory" && r["run"] == *run)
            .unwrap_or_else(|| panic!("no memory row of run {run}"));
        // The spec's vms.realtime_priority reached the vCPU thread.
        let log = out.join(format!("runs/{:03}/vm0.run.log", f(file, "run") as u64));
        let log =
            std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        assert!(
            log.contains("vCPU thread(s) under SCHED_FIFO 4"),
            "run {run}: the vCPU was not put under SCHED_FIFO: {log}"
        );
        let (file_p50, memory_p50) = (f(file, "miss_p50_ns"), f(memory, "miss_p50_ns"));
        let (file_traps, memory_traps) = (trapped(run, "file"), trapped(run, "memory"));
        eprintln!(
            "run {run}: file p50 {:.1} µs over {file_traps} trapped loads, memory p50 {:.1} µs over {memory_traps}",
            file_p50 / 1e3,
            memory_p50 / 1e3
        );
        // The lap is a loop over twice the cache: nearly every load misses
        // in the model in both modes. Evictions that trail the traps would
        // leave file pages mapped, and the lap would reach them without a
        // trap; a miss waits while more than the plane's bound of evicted
        // pages (64 of the 2 048 here) are still mapped.
        assert!(
            file_traps >= 0.9 * memory_traps,
            "run {run}: {file_traps} file loads trapped against {memory_traps} on the CXL node: DAX evictions trail the traps (out: {})",
            dir.path().display()
        );
        // Both pay one trap path; on a loaded 2-core machine they swing,
        // so the bound is generous — a fault that waits for its page's
        // eviction costs ~230 µs, several times memory mode's miss.
        assert!(
            file_p50 <= 1.5 * memory_p50 + 30_000.0,
            "run {run}: a DAX miss felt {:.1} µs against {:.1} µs on the CXL node",
            file_p50 / 1e3,
            memory_p50 / 1e3
        );
    }
}

#[test]
fn bandwidth_falls_from_a_plateau_to_a_nand_floor() {
    let _serial = exclusive();
    let (_dir, rows) = run_spec("bandwidth-vs-wss-memory");
    let mut points: Vec<(f64, f64)> = of(&rows, "vm0", "membw")
        .iter()
        .map(|r| (f(r, "vars.wss_over_cache"), f(r, "out.read_mb_s")))
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    eprintln!("read MB/s by working set / cache: {points:?}");
    assert_eq!(points.len(), 5, "{points:?}");
    let bw = |x: f64| points.iter().find(|p| p.0 == x).unwrap().1;
    let floor = bw(4.0);
    // The plateau: while the set fits (0.25x, 0.5x) every measured pass is
    // served from the device cache — the region traps no more than its
    // pages once (first touch) — at memory speed, far above the floor.
    // (Between those two points TCG's own memory speed varies by 2x with
    // the host's CPU caches; that is not the device.)
    const CACHE_PAGES: f64 = 8.0 * 256.0; // --quick: 8 MiB
    for r in of(&rows, "vm0", "membw") {
        let x = f(r, "vars.wss_over_cache");
        if x <= 0.5 {
            let traps = f(r, "daemon.region_traps");
            assert!(
                traps <= 1.2 * x * CACHE_PAGES + 256.0,
                "{traps} traps at {x}x: the plateau is not served from the cache"
            );
        }
    }
    let plateau = bw(0.25).min(bw(0.5));
    // The fall through the knee, down to the floor at 2x. At 1x the set is
    // still mostly served from the cache at TCG's memory speed, which
    // varies 2x from point to point as on the plateau: 1x is held to the
    // plateau's higher point (one CI run had 0.25x 3 378, 0.5x 1 566 and
    // 1x 1 816 MB/s), 2x to 1x.
    let knee = bw(1.0);
    assert!(
        knee <= 1.15 * bw(0.25).max(bw(0.5)),
        "bandwidth climbs from the plateau to 1x: {points:?}"
    );
    assert!(
        bw(2.0) <= 1.15 * knee,
        "bandwidth climbs from 1x to 2x: {points:?}"
    );
    // The floor: 2x and 4x both take one trap per page; they agree within
    // 2x (4x read 1.05-1.27x 2x's in five runs here, 1.67x in one under
    // `make test`) and neither climbs back to the knee.
    let floor_2x = bw(2.0);
    assert!(
        floor <= 2.0 * floor_2x && floor_2x <= 2.0 * floor && floor < bw(1.0),
        "the floor is not flat: 2x {floor_2x:.0}, 4x {floor:.0}, 1x {:.0} MB/s",
        bw(1.0)
    );
    assert!(
        floor * 3.0 <= plateau,
        "floor {floor:.0} MB/s not 3x below the plateau {plateau:.0} MB/s"
    );
}

#[test]
fn redis_throughput_falls_as_the_dataset_outgrows_the_cache() {
    let _serial = exclusive();
    // The sweep's two ends (0.33x fits, 2.10x is twice the cache), each
    // twice: each point is a fresh boot, and under TCG on 2 cores one
    // boot's GET/s can come out half another's at the same point (0.33x:
    // 3 523 and 4 852 with one daemon, 3 632 and 7 020 with another). The
    // middle point, 1.06x, swung between its neighbours from boot to boot
    // at --quick (the full-size spec shows the strict fall).
    //
    // NAND reads of 400 us, not the preset's 40: under TCG a GET costs the
    // guest 150-300 us of CPU, tens of times what it costs on hardware, so
    // at 40 us the misses of a 2.10x dataset (about 1.5 a GET) add little
    // to a GET's time (1.23x fewer GET/s than 0.33x in one CI run, where a
    // miss came to ~60 us). Scaled with the guest's CPU, a miss weighs in
    // a GET as it does on hardware. 10 000 GETs a run keep its length.
    let (_dir, rows) = run_spec_with(
        "redis",
        &[
            "--set",
            "sweep.vars.dataset_over_cache=[0.33,2.1]",
            "--set",
            "repeats=2",
            "--set",
            "daemon.device.nand.read_ns=400us",
            "--set",
            "vars.requests=10000",
        ],
    );
    // Per dataset/cache: the best GET/s of its boots (the least disturbed
    // by the host), the mean device misses of the GETs.
    let gets = of(&rows, "vm0", "get");
    let points: Vec<(f64, f64, f64)> = grouped(&gets, "vars.dataset_over_cache")
        .into_iter()
        .map(|(x, at)| {
            let best = at
                .iter()
                .map(|r| f(r, "out.ops_per_sec"))
                .fold(0.0, f64::max);
            (
                x.as_f64().unwrap(),
                best,
                mean(&at, "daemon.region_device_misses"),
            )
        })
        .collect();
    eprintln!("redis GET (dataset/cache, best ops/s, mean device misses): {points:?}");
    assert_eq!(points.len(), 2);
    // The device: the GETs miss more (4x in quick runs here).
    assert!(
        2.0 * points[0].2 < points[1].2,
        "device misses do not rise with the dataset: {points:?}"
    );
    // The guest: the dataset that fits is served faster than the one twice
    // the cache.
    assert!(
        points[0].1 > 1.3 * points[1].1,
        "throughput does not fall from 0.33x to 2.10x the cache: {points:?}"
    );
    // The dataset really sat on the CXL node, at the sizes asked for.
    for r in of(&rows, "vm0", "load") {
        let used = f(r, "out.used_memory_mib");
        let want = f(r, "vars.dataset_over_cache") * 8.0;
        assert!(
            used >= 0.8 * want,
            "redis used {used:.1} MiB for a {want:.1} MiB dataset"
        );
    }
}

#[test]
fn cmm_h_interleave_orders_dram_cxl_ratios() {
    let _serial = exclusive();
    // 1:0 (both servers on DRAM) is left out: no bound holds on it across
    // boots (below), and it cost a quarter of the run.
    let (_dir, rows) = run_spec_with(
        "cmm-h-interleave",
        &["--set", r#"sweep.phases.0.numa.ratio=["3:1","1:1","0:1"]"#],
    );
    // The GET rows per DRAM:CXL ratio; those at one, and a `column`'s mean.
    let by_ratio = grouped(&of(&rows, "vm0", "get"), "phases.0.numa.ratio");
    let at = |ratio: &str| -> &Vec<&Value> {
        let (_, at) = by_ratio
            .iter()
            .find(|(r, _)| *r == ratio)
            .unwrap_or_else(|| panic!("no run at {ratio}"));
        at
    };
    let mean_at = |ratio: &str, column: &str| mean(at(ratio), column);
    // Each run's GET throughput over its DRAM-only twin's, benchmarked in
    // turn in the same guest (one boot's GET/s varied 1 450-3 313 between
    // runs; rounds taken in turn move together).
    let norm = |ratio: &str| mean_at(ratio, "out.normalised");
    let (a, b, c) = (norm("3:1"), norm("1:1"), norm("0:1"));
    eprintln!("GET ops/s over the DRAM-only twin's: 3:1 {a:.2}, 1:1 {b:.2}, 0:1 {c:.2}");
    // Each step puts more of the dataset on the CXL node: the GETs' device
    // misses rise strictly (1.5 k / 7 k / 27 k here).
    let misses = |ratio: &str| {
        let rows = at(ratio);
        rows.iter().map(|r| device_misses(r)).sum::<f64>() / rows.len() as f64
    };
    let (ma, mb, mc) = (misses("3:1"), misses("1:1"), misses("0:1"));
    assert!(
        ma < mb && mb < mc,
        "device misses 3:1 {ma} < 1:1 {mb} < 0:1 {mc} does not hold"
    );
    // The twin is a reference within one boot only: at 1:0, both servers
    // on DRAM, one boot's pair came out 0.66x and another's 1.27x (the
    // first-loaded against the second), so no bound holds across boots.
    // All on the CXL node against its own twin came out 0.55-0.58x in
    // four runs: at most 0.8x, and below 1:1.
    assert!(
        c <= 0.8 && c < b,
        "all on the CXL node {c:.2}x its DRAM twin (1:1: {b:.2}x): not 0.8x or less, or not below 1:1"
    );
}

/// `tiering.toml`'s sweep without its `demotion` point.
const TIERING_CONFIGS: &str = r#"sweep.config=[
  { name = "cxl-only", "phases.0.numa" = { membind = "cxl" }, "phases.0.tiering" = { promotion = false, demotion = false } },
  { name = "interleave", "phases.0.numa" = { ratio = "1:1" }, "phases.0.tiering" = { promotion = false, demotion = false } },
  { name = "tiering", "phases.0.tiering" = { promotion = true, demotion = true } },
]"#;

#[test]
fn tiering_promotes_hot_pages_and_beats_all_on_cxl() {
    let _serial = exclusive();
    // The spec's `demotion` configuration (demotion alone) is left out: no
    // assertion reads it, and each configuration is a fresh guest.
    let (_dir, rows) = run_spec_with("tiering", &["--set", TIERING_CONFIGS]);
    let config = |name: &str| -> &Value {
        of(&rows, "vm0", "chase")
            .into_iter()
            .find(|r| r["config"] == name)
            .unwrap_or_else(|| panic!("no {name} row"))
    };
    let (cxl, tiering) = (config("cxl-only"), config("tiering"));
    let speedup = f(tiering, "out.loads_per_s") / f(cxl, "out.loads_per_s");
    eprintln!(
        "tiering: {speedup:.2}x the loads/s of all-on-CXL; promotions {}, demotions {}; \
         device misses {} vs {}",
        tiering["out.promotions"],
        tiering["out.demotions"],
        device_misses(tiering),
        device_misses(cxl)
    );
    assert!(
        f(tiering, "out.promotions") > 0.0,
        "no promotion: {tiering:#}"
    );
    assert!(
        f(tiering, "out.demotions") > 0.0,
        "no demotion: {tiering:#}"
    );
    assert!(speedup >= 1.2, "tiering only {speedup:.2}x all-on-CXL");
    assert!(
        device_misses(tiering) < device_misses(cxl),
        "tiering did not lower device misses"
    );
    // Without the knobs the kernel moves nothing.
    for name in ["cxl-only", "interleave"] {
        let r = config(name);
        assert_eq!(
            f(r, "out.promotions") + f(r, "out.demotions"),
            0.0,
            "{name}: {r:#}"
        );
    }
}

#[test]
fn policy_full_system_bits_and_sampling_show_lru_its_hits() {
    let _serial = exclusive();
    let (_dir, rows) = run_spec_with(
        "policy-full-system",
        &[
            "--set",
            r#"sweep.daemon.device.cache.policy=["fifo","lru"]"#,
            "--set",
            r#"sweep.daemon.access_sampling=["off","30000/s"]"#,
            "--set",
            r#"sweep.daemon.access_bits=["off","on"]"#,
        ],
    );
    let row = |policy: &str, sampling: &str, bits: &str| pfs_row(&rows, policy, sampling, bits);
    let misses = |r: &Value| f(r, "daemon.region_device_misses");
    for policy in ["fifo", "lru"] {
        // Blind, and seeing each page once a bits' period: the full system
        // against the replay with the same information (the target is 1
        // point; 2 on a loaded host).
        for bits in ["off", "on"] {
            let r = row(policy, "off", bits);
            let diff = (f(r, "hit_share.full_system") - f(r, "hit_share.replay")).abs();
            assert!(
                diff < 0.02,
                "{policy} bits {bits}: full system vs replay {diff}: {r:#}"
            );
        }
        let off = row(policy, "off", "off");
        assert_eq!(f(off, "daemon.region_sampled_accesses"), 0.0, "{off:#}");
        assert_eq!(f(off, "daemon.region_sampling_armed_pages"), 0.0, "{off:#}");
        let sampled = row(policy, "30000/s", "off");
        assert!(
            f(sampled, "daemon.region_sampled_accesses") > 0.0,
            "{sampled:#}"
        );
        let bits = row(policy, "off", "on");
        assert!(f(bits, "daemon.references") > 0.0, "{bits:#}");
        // Both on: the bits cover the region, sampling arms none of it.
        let both = row(policy, "30000/s", "on");
        assert_eq!(
            f(both, "daemon.region_sampling_armed_pages"),
            0.0,
            "{both:#}"
        );
    }
    // The rate is pages armed per second of wall time: the faster a miss
    // is served, the fewer accesses a rate samples. With the region
    // helper on FUSE over io_uring, 10000/s sampled too few to move LRU
    // (0.976x); at 30000/s, measured here: LRU 0.90x its misses without
    // sampling, FIFO 1.00x, LRU 0.90x FIFO's. The bits (10 ms): LRU 0.81x,
    // FIFO 1.00x.
    let (lru_off, fifo_off) = (
        misses(row("lru", "off", "off")),
        misses(row("fifo", "off", "off")),
    );
    for (how, sampling, bits, lru_bound) in [
        ("sampled", "30000/s", "off", 0.94),
        ("accessed bits", "off", "on", 0.90),
    ] {
        let lru = misses(row("lru", sampling, bits));
        let fifo = misses(row("fifo", sampling, bits));
        assert!(
            lru < lru_bound * lru_off,
            "LRU did not learn from the {how} hits: {lru_off} -> {lru}"
        );
        assert!(
            fifo > 0.97 * fifo_off && fifo < 1.03 * fifo_off,
            "FIFO ignores hits, yet with {how} hits: {fifo_off} -> {fifo}"
        );
        assert!(
            lru < 0.95 * fifo,
            "LRU with {how} hits {lru} vs FIFO {fifo}"
        );
    }
}

/// The one `policy-full-system` row of `policy` with `access_sampling`
/// `sampling` and `access_bits` `bits`.
fn pfs_row<'r>(rows: &'r [Value], policy: &str, sampling: &str, bits: &str) -> &'r Value {
    let found: Vec<&Value> = of(rows, "vm0", "zipf")
        .into_iter()
        .filter(|r| {
            r["daemon.device.cache.policy"] == policy
                && r["daemon.access_sampling"] == sampling
                && r["daemon.access_bits"] == bits
        })
        .collect();
    assert_eq!(found.len(), 1, "{policy} {sampling} {bits}: {rows:#?}");
    found[0]
}

#[test]
fn policy_full_system_over_dax_gives_2q_the_fall_its_replay_predicts() {
    let _serial = exclusive();
    // The chase over a file of the DAX share: 2Q blind and with the bits,
    // FIFO beside it. The target: with the bits, the device's misses fall
    // by at least 90 % of what the replay that sees every hit predicts
    // (three rounds here: 96-97 %; 85-91 % while the probe's own pages sat
    // on the CXL node, in the same device cache as the chase), and FIFO's
    // move by at most 2 % (-0.2 to +0.2 %).
    let (_dir, rows) = run_spec_with(
        "policy-full-system",
        &[
            "--set",
            "daemon.dax=true",
            "--set",
            r#"vars.file_opt="--file /mnt/pfs-chase.bin""#,
            "--set",
            r#"sweep.daemon.device.cache.policy=["fifo","2q"]"#,
            "--set",
            r#"sweep.daemon.access_sampling=["off"]"#,
            "--set",
            r#"sweep.daemon.access_bits=["off","on"]"#,
        ],
    );
    let row = |policy: &str, bits: &str| pfs_row(&rows, policy, "off", bits);
    // The chase's file pages alone (the replay's misses are the chase's):
    // not `device_misses(r)`, which adds the guest kernel's CXL-node pages.
    let misses = |r: &Value| f(r, "device_misses");
    let (off, on) = (row("2q", "off"), row("2q", "on"));
    let predicted = f(off, "device_misses.replay") - f(off, "device_misses.replay_visible");
    let fell = misses(off) - misses(on);
    assert!(predicted > 0.0, "{off:#}");
    assert!(
        fell >= 0.90 * predicted,
        "2Q's misses fell by {fell} with the bits, {:.0} % of the {predicted} \
         its replay predicts: blind {off:#}, bits {on:#}",
        100.0 * fell / predicted
    );
    let (fifo_off, fifo_on) = (misses(row("fifo", "off")), misses(row("fifo", "on")));
    assert!(
        (fifo_on - fifo_off).abs() <= 0.02 * fifo_off,
        "FIFO ignores hits, yet with the bits: {fifo_off} -> {fifo_on}"
    );
}

#[test]
fn demo_counts_the_hit_share_its_replay_counts() {
    let _serial = exclusive();
    // The demo at 100 % on the CXL-SSD, at full size (`--quick` undone:
    // its 1 MiB cache is too small for the replay, below), its guests' fio
    // logging their I/O: the hit share the daemon counted from the
    // accessed bits (hits + references over those and misses) against the
    // replay of both logs counted the same way. The target is 10 points;
    // 5 runs here were within 0.4.
    //
    // Both guests read the same offsets (fio's `randrepeat`), and in the
    // full system the one behind catches up and reads the pages the other
    // just faulted in; the replay merges the logs by each job's own clock,
    // whose start differs by tens of ms, and cannot place them that close.
    // With a 1 MiB cache that costs the replay up to twice the misses (in
    // 5 runs the daemon counted 0.5 points under to 12.1 over its
    // replay); with a seed per guest the two agreed within 0.6 points at
    // that size too (3 runs).
    let (_dir, rows) = run_spec_with(
        "demo",
        &[
            "--set",
            "quick.size_divisor=1",
            "--set",
            "quick.max_runtime=4s",
            "--set",
            "replay_iolog=true",
            "--set",
            "sweep.daemon.cxl_ratio=[100]",
        ],
    );
    for phase in ["first-touch", "second-touch"] {
        let all = of(&rows, "all", phase);
        assert_eq!(all.len(), 1, "{phase}: {rows:#?}");
        let r = all[0];
        // The logs hold every read fio made (one 4 KiB page each).
        let (logged, read) = (f(r, "replay.page_accesses"), f(r, "read_ios"));
        assert!(
            (logged - read).abs() <= 0.01 * read + 2.0,
            "{phase}: the logs hold {logged} page reads, fio made {read}: {r:#}"
        );
        assert!(f(r, "daemon.references") > 0.0, "{phase}: {r:#}");
        assert!(f(r, "replay.references") > 0.0, "{phase}: {r:#}");
        assert!(f(r, "device_misses") > 0.0, "{phase}: {r:#}");
        let (full, replay) = (f(r, "counted_hit_share"), f(r, "replay.counted_hit_share"));
        assert!(
            (f(r, "replay.diff_points") - 100.0 * (full - replay)).abs() < 1e-3,
            "{r:#}"
        );
        assert!(
            (full - replay).abs() <= 0.10,
            "{phase}: the daemon counted {:.1} %, its replay {:.1} %: {r:#}",
            100.0 * full,
            100.0 * replay
        );
    }
}
