//! End-to-end tests of the `cxlfs` binary.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use common::{cxlfs, SMALL};

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn ok(args: &[&str]) -> String {
    let out = cxlfs(args);
    assert!(
        out.status.success(),
        "cxlfs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = cxlfs(args);
    assert!(!out.status.success(), "cxlfs {args:?} succeeded");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

fn json(args: &[&str]) -> Value {
    let mut all = SMALL.to_vec();
    all.extend_from_slice(args);
    all.push("--json");
    serde_json::from_str(&ok(&["replay"]
        .iter()
        .chain(&all)
        .copied()
        .collect::<Vec<_>>()))
    .unwrap()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn json_reproducible_is_byte_identical() {
    let args = [
        "replay",
        "--preset",
        "femu",
        "--set",
        "cache.size_bytes=4MiB",
        "--workload",
        "zipf:0.9",
        "--wss",
        "64MiB",
        "--accesses",
        "20000",
        "--write-ratio",
        "0.3",
        "--json",
        "--reproducible",
    ];
    let a = ok(&args);
    assert_eq!(a, ok(&args));
    assert_eq!(a.lines().count(), 1);
    let v: Value = serde_json::from_str(&a).unwrap();
    assert!(v.get("sim_accesses_per_sec").is_none());
    for key in [
        "accesses", "hits", "misses", "hit_rate", "config", "workload", "arrival",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    for key in ["p50", "p90", "p99", "p999", "mean"] {
        assert!(v["latency_ns"].get(key).is_some(), "missing latency {key}");
    }
    for key in [
        "reads",
        "programs",
        "erases",
        "gc_runs",
        "write_amplification",
    ] {
        assert!(v["nand"].get(key).is_some(), "missing nand {key}");
    }
    for key in ["issued", "used"] {
        assert!(v["prefetch"].get(key).is_some(), "missing prefetch {key}");
    }
    assert_eq!(v["accesses"], 20000);
    assert_eq!(v["config"]["preset"], "femu");
    assert_eq!(v["config"]["overrides"][0], "cache.size_bytes=4MiB");
    assert_eq!(v["workload"]["kind"], "zipf:0.9");
}

#[test]
fn without_reproducible_only_the_throughput_differs() {
    let args = [
        "--workload",
        "uniform",
        "--wss",
        "64MiB",
        "--accesses",
        "20000",
    ];
    let mut a = json(&args);
    let mut b = json(&args);
    let a_rate = a.as_object_mut().unwrap().remove("sim_accesses_per_sec");
    let b_rate = b.as_object_mut().unwrap().remove("sim_accesses_per_sec");
    assert!(a_rate.unwrap().as_f64().unwrap() > 0.0);
    assert!(b_rate.is_some());
    assert_eq!(a, b);
}

#[test]
fn hit_visibility_changes_lru_results() {
    let run = |visible: &str| {
        json(&[
            "--set",
            "cache.policy=lru",
            "--set",
            &format!("cache.hits_visible={visible}"),
            "--workload",
            "zipf:0.99",
            "--wss",
            "64MiB",
            "--accesses",
            "50000",
            "--reproducible",
        ])
    };
    let seen = run("true");
    let blind = run("false");
    assert_eq!(seen["config"]["hits_visible"], true);
    assert_eq!(blind["config"]["hits_visible"], false);
    let (hs, hb) = (
        seen["hit_rate"].as_f64().unwrap(),
        blind["hit_rate"].as_f64().unwrap(),
    );
    assert!(
        hs > hb,
        "LRU that sees hits should beat blind LRU on zipf: {hs} vs {hb}"
    );
}

#[test]
fn stride_1024_cold_pass_with_fifo_hits_three_quarters() {
    // Cylon's anchor: 64-byte loads 1 KiB apart touch each 4 KiB page four times.
    let v = json(&[
        "--set",
        "cache.policy=fifo",
        "--workload",
        "stride:1024",
        "--wss",
        "64MiB",
        "--access-size",
        "64",
        "--reproducible",
    ]);
    assert_eq!(v["accesses"], 65536);
    assert_eq!(v["hit_rate"].as_f64().unwrap(), 0.75);
}

#[test]
fn seq_second_pass_fits_in_cache() {
    let v = json(&[
        "--workload",
        "seq",
        "--wss",
        "1MiB",
        "--passes",
        "2",
        "--warmup",
        "16384",
        "--reproducible",
    ]);
    assert_eq!(v["accesses"], 16384);
    assert!(v["hit_rate"].as_f64().unwrap() > 0.999);
    assert_eq!(v["nand"]["reads"], 0);
    assert_eq!(v["warmup"], 16384);
}

#[test]
fn sweep_prints_one_row_or_line_per_point() {
    let policies = ["fifo", "lifo", "lru", "clock", "s3fifo", "2q", "lfru"];
    let sweep = format!("cache.policy={}", policies.join(","));
    let base = [
        "replay",
        "--preset",
        "femu",
        "--set",
        "cache.size_bytes=4MiB",
        "--workload",
        "zipf:0.9",
        "--wss",
        "32MiB",
        "--accesses",
        "10000",
        "--sweep",
        &sweep,
    ];
    let table = ok(&base);
    for p in policies {
        let rows = table
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(p))
            .count();
        assert_eq!(rows, 1, "{p}:\n{table}");
    }
    assert!(
        table.contains("hit rate") && table.contains("Macc/s"),
        "{table}"
    );
    let mut with_json = base.to_vec();
    with_json.extend(["--json", "--reproducible"]);
    let out = ok(&with_json);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), policies.len());
    for (line, p) in lines.iter().zip(policies) {
        assert_eq!(line["params"]["cache.policy"], p);
        assert_eq!(line["policy"], p);
    }
    // Two sweeps: the cartesian product.
    let mut two = base.to_vec();
    two.extend([
        "--sweep",
        "cache.hits_visible=true,false",
        "--json",
        "--reproducible",
    ]);
    assert_eq!(ok(&two).lines().count(), 2 * policies.len());
}

#[test]
fn trace_convert_round_trip_is_identical_and_replays_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let bin = dir.path().join("t.bin");
    let back = dir.path().join("back.csv");
    ok(&[
        "trace",
        "gen",
        "--workload",
        "zipf:0.8",
        "--wss",
        "16MiB",
        "--accesses",
        "5000",
        "--write-ratio",
        "0.25",
        "--interval",
        "100ns",
        "--out",
        path_str(&csv),
    ]);
    ok(&["trace", "convert", path_str(&csv), path_str(&bin)]);
    ok(&["trace", "convert", path_str(&bin), path_str(&back)]);
    let original = std::fs::read(&csv).unwrap();
    assert_eq!(original, std::fs::read(&back).unwrap());
    assert_eq!(std::fs::read(&bin).unwrap().len(), 32 + 20 * 5000);
    // `# arrival: fixed:100` (what --interval records), the header, the records.
    let text = String::from_utf8(original).unwrap();
    assert_eq!(text.lines().count(), 5002);
    assert!(
        text.starts_with("# arrival: fixed:100\ntime_ns,op,addr,len\n"),
        "{text:.60}"
    );
    let a = json(&["--trace", path_str(&csv), "--reproducible"]);
    let b = json(&["--trace", path_str(&bin), "--reproducible"]);
    assert_eq!(a["accesses"], 5000);
    assert_eq!(a["writes"], b["writes"]);
    for key in ["hits", "misses", "latency_ns", "nand", "sim_time_ns"] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert_eq!(a["workload"]["format"], "csv");
    assert_eq!(b["workload"]["format"], "bin");
    assert_eq!(a["arrival"], "fixed:100");
    assert_eq!(b["arrival"], "fixed:100");
    // --to forces the format (csv -> csv normalises).
    let copy = dir.path().join("copy.csv");
    ok(&[
        "trace",
        "convert",
        "--to",
        "csv",
        path_str(&csv),
        path_str(&copy),
    ]);
    assert_eq!(std::fs::read(&csv).unwrap(), std::fs::read(&copy).unwrap());
}

#[test]
fn generated_workload_trace_replays_like_the_workload() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("w.trace");
    let shape = [
        "--workload",
        "pointer-chase",
        "--wss",
        "8MiB",
        "--accesses",
        "30000",
        "--seed",
        "7",
    ];
    let mut gen = vec!["trace", "gen", "--out", path_str(&bin)];
    gen.extend(shape);
    ok(&gen);
    let mut direct = shape.to_vec();
    direct.push("--reproducible");
    let w = json(&direct);
    let t = json(&[
        "--trace",
        path_str(&bin),
        "--arrival",
        "closed",
        "--reproducible",
    ]);
    for key in [
        "accesses",
        "hits",
        "misses",
        "latency_ns",
        "nand",
        "sim_time_ns",
    ] {
        assert_eq!(w[key], t[key], "{key}");
    }
}

#[test]
fn bad_trace_line_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("trace.csv");
    std::fs::write(
        &csv,
        "# demo\ntime_ns,op,addr,len\n0,R,0x0,64\n10,R,0xzz,64\n",
    )
    .unwrap();
    let err = fails(&["replay", "--preset", "femu", "--trace", path_str(&csv)]);
    assert!(
        err.contains("trace.csv:4: field 3 (addr): `0xzz` is not a number"),
        "{err}"
    );
    std::fs::write(&csv, "0,R,0x0,64\n1,X,0,64\n").unwrap();
    let err = fails(&["replay", "--preset", "femu", "--trace", path_str(&csv)]);
    assert!(
        err.contains("trace.csv:2: field 2 (op): op must be R or W"),
        "{err}"
    );
    std::fs::write(&csv, "0,R,0x0\n").unwrap();
    let err = fails(&["replay", "--preset", "femu", "--trace", path_str(&csv)]);
    assert!(
        err.contains("trace.csv:1: expected 4 fields, got 3"),
        "{err}"
    );
    std::fs::write(&csv, "5,R,0,64\n4,R,0,64\n").unwrap();
    let err = fails(&["replay", "--preset", "femu", "--trace", path_str(&csv)]);
    assert!(
        err.contains("trace.csv:2: access 1: time 4 ns is before"),
        "{err}"
    );
}

#[test]
fn truncated_binary_trace_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let bin = dir.path().join("t.bin");
    std::fs::write(&csv, "0,R,0x0,64\n1,W,0x1000,64\n").unwrap();
    ok(&["trace", "convert", path_str(&csv), path_str(&bin)]);
    let bytes = std::fs::read(&bin).unwrap();
    std::fs::write(&bin, &bytes[..bytes.len() - 5]).unwrap();
    let err = fails(&["replay", "--preset", "femu", "--trace", path_str(&bin)]);
    assert!(
        err.contains("t.bin: record 1: truncated record: 15 of 20 bytes"),
        "{err}"
    );
}

#[test]
fn address_beyond_capacity_names_the_access_and_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("far.csv");
    std::fs::write(&csv, "0,R,0x0,64\n\n1,R,0xffffffffff00,64\n").unwrap();
    let err = fails(&["replay", "--preset", "femu", "--trace", path_str(&csv)]);
    assert!(err.contains("far.csv:3: access 1:"), "{err}");
    assert!(
        err.contains("beyond the device capacity of 15977275392 bytes"),
        "{err}"
    );
    let err = fails(&[
        "replay",
        "--preset",
        "femu",
        "--workload",
        "seq",
        "--wss",
        "64GiB",
    ]);
    assert!(err.contains("capacity of 15977275392 bytes"), "{err}");
}

#[test]
fn config_errors_name_the_key_or_preset() {
    let err = fails(&[
        "replay",
        "--set",
        "cache.sise_bytes=4MiB",
        "--workload",
        "seq",
    ]);
    assert!(
        err.contains("unknown config key `cache.sise_bytes`"),
        "{err}"
    );
    let err = fails(&["replay", "--set", "cache.policy=mru", "--workload", "seq"]);
    assert!(err.contains("cache.policy") && err.contains("mru"), "{err}");
    let err = fails(&["replay", "--preset", "nope", "--workload", "seq"]);
    assert!(err.contains("unknown preset `nope`"), "{err}");
    let err = fails(&["replay", "--workload", "seq", "--sweep", "cache.bogus=1,2"]);
    assert!(err.contains("cache.bogus"), "{err}");
    let err = fails(&["replay", "--trace", "/nonexistent/t.csv"]);
    assert!(
        err.contains("cannot open trace /nonexistent/t.csv"),
        "{err}"
    );
    let err = fails(&[
        "replay",
        "--config",
        "/nonexistent/dev.toml",
        "--workload",
        "seq",
    ]);
    assert!(err.contains("/nonexistent/dev.toml"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("dev.toml");
    std::fs::write(&toml, "[nand]\nread_nss = 3\n").unwrap();
    let err = fails(&["config", "--config", path_str(&toml)]);
    assert!(err.contains("nand.read_nss"), "{err}");
}

#[test]
fn printed_config_loads_back() {
    let printed = ok(&[
        "replay",
        "--preset",
        "skybyte",
        "--set",
        "cache.policy=s3fifo",
        "--print-config",
    ]);
    assert!(printed.contains("policy = \"s3fifo\""), "{printed}");
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("dev.toml");
    std::fs::write(&toml, &printed).unwrap();
    assert_eq!(ok(&["config", "--config", path_str(&toml)]), printed);
    let presets = ok(&["presets"]);
    for name in ["cylon", "cmm-h", "skybyte", "femu"] {
        assert!(presets.lines().any(|l| l.starts_with(name)), "{presets}");
    }
}

#[test]
fn workload_options_need_a_workload() {
    let err = fails(&["replay", "--trace", "x.csv", "--wss", "1GiB"]);
    assert!(err.contains("--wss"), "{err}");
}

#[test]
fn table_output_has_the_main_rows() {
    let out = ok(&[
        "replay",
        "--preset",
        "femu",
        "--set",
        "cache.size_bytes=4MiB",
        "--workload",
        "uniform",
        "--wss",
        "16MiB",
        "--accesses",
        "10000",
    ]);
    for row in [
        "device:",
        "input:",
        "hit rate",
        "latency",
        "NAND",
        "prefetch",
        "throughput",
    ] {
        assert!(out.contains(row), "missing {row}:\n{out}");
    }
}

/// A fake checkout whose `qemu-configs/build-guest-image.sh` logs to stderr,
/// records its arguments and prints `last` as its last line.
fn fake_repo(last: &str, status: i32) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let repo = tempfile::tempdir().unwrap();
    let qc = repo.path().join("qemu-configs");
    std::fs::create_dir_all(&qc).unwrap();
    let img = repo.path().join("img");
    std::fs::create_dir_all(&img).unwrap();
    std::fs::write(img.join("vmlinuz"), b"kernel").unwrap();
    let script = qc.join("build-guest-image.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$@\" >\"$(dirname \"$0\")/args\"\necho 'building...' >&2\necho noise\necho '{}'\nexit {status}\n",
            last.replace("@IMG@", path_str(&img))
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    repo
}

fn cxlfs_in(repo: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cxlfs"))
        .args(args)
        .env("CXLFS_REPO", repo)
        .output()
        .expect("run cxlfs")
}

#[test]
fn image_build_runs_the_builder_and_prints_the_image_dir() {
    let repo = fake_repo("@IMG@", 0);
    let out = cxlfs_in(repo.path(), &["image", "build", "--force"]);
    assert!(out.status.success(), "{out:?}");
    let img = repo.path().join("img");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{}\n", img.display())
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("building..."));
    let args = std::fs::read_to_string(repo.path().join("qemu-configs/args")).unwrap();
    assert_eq!(args.trim(), "--force");

    let out = cxlfs_in(repo.path(), &["image", "build"]);
    assert!(out.status.success(), "{out:?}");
    let args = std::fs::read_to_string(repo.path().join("qemu-configs/args")).unwrap();
    assert_eq!(args.trim(), "");
}

#[test]
fn image_build_reports_failures() {
    let repo = fake_repo("@IMG@", 3);
    let out = cxlfs_in(repo.path(), &["image", "build"]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("error: ") && err.contains("failed"), "{err}");

    let repo = fake_repo("/nonexistent/image", 0);
    let out = cxlfs_in(repo.path(), &["image", "build"]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("not an image directory"), "{err}");

    let empty = tempfile::tempdir().unwrap();
    let out = cxlfs_in(empty.path(), &["image", "build"]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("set CXLFS_REPO"), "{err}");
}

/// Shipped replay-only experiments: read by `cxlfs replay --plots`, not `cxlfs run`.
const REPLAY_ONLY_SPECS: [&str; 1] = ["write-log.toml"];

/// `experiments/write-log.toml` through `cxlfs replay --out --plots`, at a
/// small size: a results directory with one row per point and its plots.
#[test]
fn replay_only_spec_writes_results_and_plots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    let spec = dir.join(REPLAY_ONLY_SPECS[0]);
    ok(&[
        "replay",
        "--set",
        "cache.size_bytes=1MiB",
        "--workload",
        "uniform",
        "--wss",
        "2MiB",
        "--access-size",
        "64",
        "--write-ratio",
        "1",
        "--accesses",
        "20000",
        "--reproducible",
        "--no-progress",
        "--sweep",
        "cache.write_log_bytes=0,65536",
        "--out",
        out.path().to_str().unwrap(),
        "--plots",
        spec.to_str().unwrap(),
    ]);
    let json = std::fs::read_to_string(out.path().join("results.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["log_writes"], 0);
    assert!(rows[1]["log_writes"].as_u64().unwrap() > 0);
    assert!(out.path().join("nand-programs-vs-log.png").exists());
    assert!(out.path().join("write-latency-vs-log.png").exists());
}

/// Every shipped experiment spec (every `*.toml` beside this crate's
/// manifest) parses, and expands with and without `--quick` to the same
/// sweep points (`--quick` may run fewer repeats of each).
#[test]
fn shipped_experiment_specs_expand() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // (spec, runs, runs under --quick)
    let specs = [
        ("access-bits-cost.toml", 2 * 3, 2),
        ("bandwidth-vs-wss-memory.toml", 5, 5),
        ("bandwidth-vs-wss.toml", 5, 5),
        ("cmm-h-interleave.toml", 4, 4),
        ("cylon-latency.toml", 1, 1),
        ("demo.toml", 3, 3),
        ("guest-clock.toml", 2 * 3, 2),
        ("miss-latency.toml", 3 * 2 * 3, 3 * 2 * 3),
        ("policy-full-system.toml", 5 * 2 * 2 * 3, 5 * 2 * 2),
        ("policy-hit-rate.toml", 7, 7),
        ("prefetch-degree.toml", 5, 5),
        ("redis.toml", 3, 3),
        ("sharing.toml", 5 * 3, 3 * 3),
        ("tiering.toml", 12, 4),
        ("virtiofs-cxl-ratio.toml", 8 * 2, 8 * 2),
    ];
    // Their `[quick] set` narrows a sweep: the quick points are some of
    // the full ones (sharing.toml stops at 4 guests).
    const NARROWED: &[&str] = &["sharing.toml"];
    let mut shipped: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml") && n != "Cargo.toml")
        .filter(|n| !REPLAY_ONLY_SPECS.contains(&n.as_str()))
        .collect();
    shipped.sort();
    let listed: Vec<&str> = specs.iter().map(|s| s.0).collect();
    assert_eq!(shipped, listed, "a shipped spec is missing from this test");
    for (name, runs, quick_runs) in specs {
        let path = dir.join(name);
        let p = path.to_str().unwrap();
        let full = ok(&["run", p, "--out", "/nonexistent", "--dry-run"]);
        let quick = ok(&["run", p, "--out", "/nonexistent", "--dry-run", "--quick"]);
        let heads = |s: &str| -> Vec<String> {
            s.lines()
                .filter(|l| l.starts_with("run "))
                .map(|l| l.split(" | ").next().unwrap().to_string())
                .collect()
        };
        // "run N (point P, repeat R): PARAMS" -> "P: PARAMS", once per point.
        let points = |s: &str| -> Vec<String> {
            let mut v: Vec<String> = heads(s)
                .iter()
                .map(|h| {
                    let (point, rest) = h.split_once(", repeat ").unwrap();
                    let params = rest.split_once("): ").map_or("", |r| r.1);
                    format!("{}: {params}", point.split_once("(point ").unwrap().1)
                })
                .collect();
            v.dedup();
            v
        };
        assert_eq!(heads(&full).len(), runs, "{name}:\n{full}");
        assert_eq!(heads(&quick).len(), quick_runs, "{name} --quick:\n{quick}");
        if NARROWED.contains(&name) {
            let params = |v: Vec<String>| -> Vec<String> {
                v.iter()
                    .map(|p| p.split_once(": ").map_or(p.as_str(), |x| x.1).to_string())
                    .collect()
            };
            let (f, q) = (params(points(&full)), params(points(&quick)));
            assert!(
                q.len() < f.len() && q.iter().all(|p| f.contains(p)),
                "{name}: --quick points {q:?} are not fewer of {f:?}"
            );
        } else {
            assert_eq!(
                points(&full),
                points(&quick),
                "{name}: --quick changed the points"
            );
        }
        assert_ne!(full, quick, "{name}: --quick changed nothing");
    }
}

#[test]
fn run_rejects_bad_specs_by_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("bad.toml");
    std::fs::write(
        &spec,
        "name = \"x\"\n[vms]\ncount = 2\nmemroy = \"1G\"\n[[phases]]\nname = \"p\"\n",
    )
    .unwrap();
    let p = spec.to_str().unwrap();
    let e = fails(&["run", p, "--out", "/nonexistent", "--dry-run"]);
    assert!(
        e.contains("bad.toml: vms.memroy: unknown field `memroy`"),
        "{e}"
    );
    std::fs::write(&spec, "name = \"x\"\n[[phases]]\nname = \"p\"\n").unwrap();
    let e = fails(&[
        "run",
        p,
        "--out",
        "/nonexistent",
        "--dry-run",
        "--set",
        "daemon.device.cache.polcy=lru",
    ]);
    assert!(
        e.contains("bad.toml: daemon.device") && e.contains("polcy"),
        "{e}"
    );
    let out = ok(&[
        "run",
        p,
        "--out",
        "/nonexistent",
        "--dry-run",
        "--set",
        "sweep.vms.count=[1,2]",
    ]);
    assert!(
        out.contains("run 2 (point 1, repeat 0): vms.count=2 | 2 VM(s)"),
        "{out}"
    );
}

#[test]
fn table_and_plot_read_a_results_directory() {
    let dir = tempfile::tempdir().unwrap();
    let results = serde_json::json!({
        "experiment": "t",
        "param_columns": ["daemon.cxl_ratio"],
        "columns": [],
        "rows": [
            {"run": 1, "status": "ok", "vm": "all", "phase": "p", "vms": 2, "daemon.cxl_ratio": 0, "read_bw_bytes_per_sec": 2e8},
            {"run": 2, "status": "ok", "vm": "all", "phase": "p", "vms": 2, "daemon.cxl_ratio": 100, "read_bw_bytes_per_sec": 1e8},
        ]
    });
    std::fs::write(dir.path().join("results.json"), results.to_string()).unwrap();
    let d = dir.path().to_str().unwrap();
    let table = ok(&["table", d]);
    assert!(
        table.contains("cxl_ratio") && table.contains("200.0") && table.contains("100.0"),
        "{table}"
    );
    let files = ok(&["plot", d]);
    assert!(
        files.contains("read_bw_bytes_per_sec-vs-daemon_cxl_ratio.png"),
        "{files}"
    );
    let png = std::fs::read(
        dir.path()
            .join("read_bw_bytes_per_sec-vs-daemon_cxl_ratio.png"),
    )
    .unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 1000);
    let e = fails(&["table", "/nonexistent-results"]);
    assert!(e.contains("results.json"), "{e}");
}

#[test]
fn slurm_options_need_slurm_and_collect_needs_a_slurm_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("s.toml");
    std::fs::write(
        &spec,
        "name = \"s\"\n[vms]\ncount = 1\n[[phases]]\nname = \"p\"\n[sweep]\n\"fio.bs\" = [\"4k\", \"8k\"]\n",
    )
    .unwrap();
    let (p, d) = (spec.to_str().unwrap(), dir.path().to_str().unwrap());
    let e = fails(&["run", p, "--out", d, "--partition", "x", "--dry-run"]);
    assert!(e.contains("--slurm"), "{e}");
    let e = fails(&["run", p, "--out", d, "--only-run", "3"]);
    assert!(e.contains("--only-run 3: the sweep has runs 1 to 2"), "{e}");
    let e = fails(&["collect", d]);
    assert!(
        e.contains("not a `cxlfs run --slurm` results directory"),
        "{e}"
    );

    // A sweep whose job Slurm does not know: run 1 left its rows, run 2 none.
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join("slurm")).unwrap();
    std::fs::create_dir_all(out.join("runs/001")).unwrap();
    let sweep = serde_json::json!({"spec": spec, "sets": [], "quick": false,
        "jobs": [{"job_id": "999999999", "runs": [1, 2], "script": "slurm/job-1.sh", "submitted_unix_ms": 0}]});
    std::fs::write(out.join("slurm/sweep.json"), sweep.to_string()).unwrap();
    std::fs::write(out.join("provenance.json"), "{}").unwrap();
    let rows = serde_json::json!([
        {"run": 1, "point": 0, "repeat": 0, "phase": "p", "status": "ok", "vm": "vm0", "fio.bs": "4k"},
        {"run": 1, "point": 0, "repeat": 0, "phase": "p", "status": "ok", "vm": "all", "fio.bs": "4k"},
    ]);
    std::fs::write(out.join("runs/001/rows.json"), rows.to_string()).unwrap();
    let o = out.to_str().unwrap();
    ok(&["collect", o, "--no-plots"]);
    let res: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let got: Vec<(i64, &str, &str, &str)> = res["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run"].as_i64().unwrap(),
                r["vm"].as_str().unwrap(),
                r["status"].as_str().unwrap(),
                r["fio.bs"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, "vm0", "ok", "4k"),
            (1, "all", "ok", "4k"),
            (2, "vm0", "missing", "8k"),
            (2, "all", "missing", "8k")
        ]
    );
    assert!(std::fs::read_to_string(out.join("results.csv"))
        .unwrap()
        .contains(",slurm_state"));
    let prov: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("provenance.json")).unwrap())
            .unwrap();
    assert_eq!(prov["runs_done"], 1, "{prov}");
}
