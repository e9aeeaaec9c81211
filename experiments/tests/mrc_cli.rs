//! `cxlfs mrc` end to end: the exact LRU curve equals `cxlfs replay
//! --sweep cache.size_bytes=…` point for point; every policy gets a curve;
//! knobs a method cannot honour are refused with the reason; `--plot`
//! writes a PNG and an SVG.

#![allow(clippy::unwrap_used)]

mod common;

use common::{cxlfs, SMALL};
use serde_json::Value;

/// The small device's preset and a fully associative LRU with hits seen.
const DEVICE: [&str; 10] = [
    SMALL[0],
    SMALL[1],
    "--set",
    "cache.ways=0",
    "--set",
    "cache.hits_visible=true",
    "--set",
    "nand.enabled=false",
    "--set",
    "cache.policy=lru",
];
const INPUT: [&str; 8] = [
    "--workload",
    "zipf:0.99",
    "--wss",
    "8MiB",
    "--accesses",
    "30000",
    "--warmup",
    "2000",
];
const SIZES: &str = "64KiB,256KiB,1MiB,4MiB,16MiB";

fn run(cmd: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec![cmd];
    args.extend(DEVICE);
    args.extend(INPUT);
    args.extend(extra);
    args.push("--json");
    json_lines(&ok(&args))
}

/// Runs `cxlfs args`, which must succeed; its standard output.
fn ok(args: &[&str]) -> Vec<u8> {
    let out = cxlfs(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// One JSON value per line.
fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_exact_lru_curve_equals_a_replay_sweep_of_the_sizes() {
    let curve = run("mrc", &["--sizes", SIZES]);
    let sweep = run("replay", &["--sweep", &format!("cache.size_bytes={SIZES}")]);
    assert_eq!(curve.len(), 5);
    for (c, r) in curve.iter().zip(&sweep) {
        assert_eq!(c["method"], "exact");
        assert_eq!(c["policy"], "lru");
        assert_eq!(c["size_bytes"], r["config"]["cache_bytes"]);
        assert_eq!(c["misses"], r["misses"], "{c} {r}");
        assert_eq!(c["page_accesses"], r["page_accesses"]);
    }
}

#[test]
fn every_policy_gets_a_sampled_curve_with_its_rate() {
    let all = "fifo,lifo,lru,clock,s3fifo,2q,lfru";
    let curve = run(
        "mrc",
        &[
            "--sizes",
            "64KiB..16MiB:6",
            "--policy",
            all,
            "--method",
            "sampled",
            "--sampling",
            "0.5",
        ],
    );
    assert_eq!(curve.len(), 7 * 6);
    for p in &curve {
        assert_eq!(p["method"], "sampled");
        assert_eq!(p["sampling_rate"], 0.5);
        assert!(p["sampled_pages"].as_u64().unwrap() > 0);
        let m = p["miss_ratio"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&m), "{p}");
    }
}

#[test]
fn each_sampling_seed_gives_its_own_reproducible_curve() {
    let curve = |seed: &str| {
        let args = [
            "--sizes",
            SIZES,
            "--sampling",
            "0.25",
            "--sampling-seed",
            seed,
        ];
        run("mrc", &args)
            .into_iter()
            .map(|p| {
                assert_eq!(p["sampling_seed"].to_string(), seed, "{p}");
                (p["sampled_pages"].as_u64(), p["miss_ratio"].as_f64())
            })
            .collect::<Vec<_>>()
    };
    let (a, again, b) = (curve("0"), curve("0"), curve("7"));
    assert_eq!(a.len(), 5);
    assert_eq!(a, again);
    assert_ne!(a, b);
}

#[test]
fn knobs_that_rule_a_method_out_are_named() {
    let mut args = vec!["mrc"];
    args.extend(DEVICE);
    args.extend(INPUT);
    args.extend([
        "--set",
        "prefetch.degree=2",
        "--sizes",
        SIZES,
        "--method",
        "sampled",
    ]);
    let out = cxlfs(&args);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("prefetch.degree = 2"), "{err}");
    // auto: one replay per size, and a note that says why.
    args.truncate(args.len() - 2);
    args.push("--json");
    let out = cxlfs(&args);
    assert!(out.status.success());
    let note = String::from_utf8(out.stderr).unwrap();
    assert!(note.contains("one replay per size"), "{note}");
}

#[test]
fn plot_writes_a_png_and_an_svg() {
    if !cxlfs_font_present() {
        eprintln!("skipped: no DejaVu font");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("curve.png");
    let mut args = vec!["mrc"];
    args.extend(DEVICE);
    args.extend(INPUT);
    args.extend([
        "--sizes",
        SIZES,
        "--policy",
        "lru,fifo",
        "--plot",
        file.to_str().unwrap(),
    ]);
    let out = cxlfs(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(file.exists() && file.with_extension("svg").exists());
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains("lru miss %") && table.contains("fifo miss %"),
        "{table}"
    );
}

fn cxlfs_font_present() -> bool {
    std::env::var_os("CXLFS_PLOT_FONT").is_some()
        || std::path::Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists()
}

/// A curve from a trace file: the binary trace (read a batch at a time)
/// and its CSV (an access at a time) give the same curve; a truncated
/// binary trace is refused naming the record.
#[test]
fn a_binary_trace_and_its_csv_give_one_curve_and_a_truncated_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("z.bin");
    let csv = dir.path().join("z.csv");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    // The workload of the other tests (less its warm-up), as a trace.
    let shown = path(&bin);
    let gen = [
        &["trace", "gen"][..],
        &INPUT[..6],
        &["--seed", "3", "--out", &shown],
    ]
    .concat();
    ok(&gen);
    ok(&["trace", "convert", "--to", "csv", &path(&bin), &path(&csv)]);
    let curve = |trace: &str, method: &[&str]| -> Vec<Value> {
        let mut args = vec!["mrc"];
        args.extend(DEVICE);
        args.extend(["--trace", trace, "--sizes", SIZES, "--json"]);
        args.extend(method);
        json_lines(&ok(&args))
    };
    for method in [&[][..], &["--sampling", "0.25"][..]] {
        let (b, c) = (curve(&path(&bin), method), curve(&path(&csv), method));
        assert_eq!(b.len(), 5, "{b:?}");
        assert_eq!(b, c, "{method:?}");
    }
    let refused = |method: &[&str]| -> String {
        let mut args = vec!["mrc"];
        args.extend(DEVICE);
        args.extend(["--trace", shown.as_str(), "--sizes", SIZES]);
        args.extend(method);
        let out = cxlfs(&args);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // A record of length 0 (the sampled pass reads records unchecked and
    // refuses it itself; the exact one decodes them).
    let bytes = std::fs::read(&bin).unwrap();
    let mut zero = bytes.clone();
    let word = zero.len() - (30_000 - 1_234) * 20 + 16;
    zero[word..word + 4].copy_from_slice(&0u32.to_le_bytes());
    std::fs::write(&bin, &zero).unwrap();
    for method in [&[][..], &["--sampling", "0.25"][..]] {
        let err = refused(method);
        assert!(
            err.contains("z.bin: record 1234") && err.contains("len"),
            "{method:?}: {err}"
        );
    }
    std::fs::write(&bin, &bytes[..bytes.len() - 5]).unwrap();
    let err = refused(&[]);
    assert!(
        err.contains("z.bin: record 29999: truncated record: 15 of 20 bytes"),
        "{err}"
    );
}

/// `--miniature-floor`: a size whose miniature at R holds fewer pages runs
/// at 2R, 4R, … (at most 1/2), the others at R; SHARDS' LRU curve stays at
/// R; the table's header says so.
#[test]
fn a_miniature_floor_raises_the_rate_of_the_small_sizes() {
    let args = [
        "--sizes",
        "64KiB,256KiB,1MiB,4MiB,16MiB",
        "--policy",
        "fifo,lru",
        "--method",
        "sampled",
        "--sampling",
        "0.015625",
        "--miniature-floor",
        "32",
    ];
    let curve = run("mrc", &args);
    assert_eq!(curve.len(), 10);
    let rates = |policy: &str| {
        curve
            .iter()
            .filter(|p| p["policy"] == policy)
            .map(|p| p["sampling_rate"].as_f64().unwrap())
            .collect::<Vec<_>>()
    };
    // 16 pages: 8 at the cap of 1/2; 64: 32 at 1/2; 256: 32 at 1/8;
    // 1 024: 32 at 1/32; 4 096: 64 at R.
    assert_eq!(rates("fifo"), [0.5, 0.5, 0.125, 0.03125, 0.015625]);
    assert_eq!(rates("lru"), [0.015625; 5]);
    let pages: Vec<u64> = curve
        .iter()
        .filter(|p| p["policy"] == "fifo")
        .map(|p| p["sampled_pages"].as_u64().unwrap())
        .collect();
    assert!(pages.windows(2).all(|w| w[0] >= w[1]), "{pages:?}");
    let mut text = vec!["mrc"];
    text.extend(DEVICE);
    text.extend(INPUT);
    text.extend(args);
    let table = String::from_utf8_lossy(&ok(&text)).into_owned();
    assert!(
        table.contains("up to R = 0.50000 at the smaller sizes"),
        "{table}"
    );
}
