//! `cxlfs run` end to end: a tiny experiment spec (two guests at once, three
//! sweep points, `--quick`) on the real `cxlfsd` with real TCG guests and
//! real fio. Two points must succeed with plausible numbers in
//! `results.csv`; the third has an fio option fio rejects and must be
//! recorded as failed, with fio's complaint, without stopping the sweep.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{exclusive, guest_image, run_experiment};
use std::collections::BTreeMap;
use std::ffi::OsStr;

const SPEC: &str = r#"
name = "e2e-tiny"
[daemon]
preset = "femu"
device.cache.size_bytes = "16MiB"
device.nand.read_ns = "20us"
[vms]
count = 2
memory = "512M"
timeout = "120s"
[[files]]
path = "shared.bin"
size = "16MiB"
[fio]
filename = "shared.bin"
ioengine = "psync"
bs = "4k"
runtime = "10s"
time_based = 1
[[phases]]
name = "p"
[sweep]
# The last point is not a valid fio rw mode: fio refuses it.
"fio.rw" = ["randread", "read", "no-such-mode"]
"#;

type Row = BTreeMap<String, String>;

fn read_csv(path: &std::path::Path) -> (Vec<String>, Vec<Row>) {
    // Our cells never hold quotes except in `error`, which comes last in no
    // row we parse by position: split on commas outside quotes.
    let text = std::fs::read_to_string(path).unwrap();
    let split = |line: &str| -> Vec<String> {
        let mut cells = vec![String::new()];
        let mut quoted = false;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '"' if quoted && chars.peek() == Some(&'"') => {
                    chars.next();
                    cells.last_mut().unwrap().push('"');
                }
                '"' => quoted = !quoted,
                ',' if !quoted => cells.push(String::new()),
                c => cells.last_mut().unwrap().push(c),
            }
        }
        cells
    };
    let mut lines = text.lines();
    let header = split(lines.next().unwrap());
    let rows = lines
        .map(|l| {
            let cells = split(l);
            assert_eq!(cells.len(), header.len(), "row length: {l}");
            header.iter().cloned().zip(cells).collect()
        })
        .collect();
    (header, rows)
}

#[test]
fn a_tiny_sweep_on_two_guests_with_one_failing_point() {
    let _serial = exclusive();
    let image = guest_image();
    let dir = tempfile::Builder::new()
        .prefix("cxlfs-e2e-run.")
        .tempdir()
        .unwrap();
    let spec = dir.path().join("tiny.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let out = dir.path().join("results");
    let run = run_experiment(&spec, &out, &[OsStr::new("--image"), image.as_os_str()]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    if !run.status.success() {
        let kept = dir.path().to_path_buf();
        std::mem::forget(dir);
        panic!("cxlfs run failed ({}); kept {}", run.status, kept.display());
    }

    let (header, rows) = read_csv(&out.join("results.csv"));
    for col in [
        "run",
        "status",
        "vm",
        "cxl_ratio",
        "policy",
        "read_bw_bytes_per_sec",
        "write_bw_bytes_per_sec",
        "device_hits",
        "device_misses",
        "fio.rw",
        "repeat",
        "phase",
        "read_iops",
        "read_clat_p99_ns",
        "daemon.read_bytes",
    ] {
        assert!(
            header.iter().any(|h| h == col),
            "no column {col} in {header:?}"
        );
    }
    // 3 runs x 1 phase x (2 VMs + all).
    assert_eq!(rows.len(), 9, "{rows:#?}");
    let f = |r: &Row, k: &str| {
        r[k].parse::<f64>()
            .unwrap_or_else(|_| panic!("{k} = {:?} in {r:?}", r[k]))
    };
    for run in ["1", "2"] {
        let of_run: Vec<&Row> = rows.iter().filter(|r| r["run"] == run).collect();
        assert_eq!(of_run.len(), 3);
        let vms: Vec<&str> = of_run.iter().map(|r| r["vm"].as_str()).collect();
        assert_eq!(vms, ["vm0", "vm1", "all"]);
        for r in &of_run {
            assert_eq!(r["status"], "ok", "{r:?}");
            assert_eq!(r["cxl_ratio"], "100");
            assert_eq!(r["policy"], "fifo", "femu's policy");
            let bw = f(r, "read_bw_bytes_per_sec");
            // TCG guests read at 5-500 MB/s here; 0 or absurd means a parsing bug.
            assert!((1e5..2e10).contains(&bw), "read bandwidth {bw} in {r:?}");
            assert_eq!(f(r, "write_bw_bytes_per_sec"), 0.0);
            let (hits, misses) = (f(r, "device_hits"), f(r, "device_misses"));
            // --cache never: every 4 KiB read reaches the device (+ a few
            // pages of the result files the guest writes back).
            let ios = f(r, "read_ios");
            assert!(
                hits + misses >= ios,
                "{hits} + {misses} < {ios} reads: {r:?}"
            );
            assert!(
                hits + misses <= ios + 200.0,
                "{hits} + {misses} >> {ios} reads: {r:?}"
            );
            assert!(misses >= 1.0, "{r:?}");
            let daemon_read = f(r, "daemon.read_bytes");
            assert!(daemon_read >= f(r, "read_io_bytes"), "{r:?}");
        }
        let sum = |k: &str| f(of_run[0], k) + f(of_run[1], k);
        for k in [
            "read_bw_bytes_per_sec",
            "device_hits",
            "device_misses",
            "read_ios",
        ] {
            assert!(
                (f(of_run[2], k) - sum(k)).abs() <= 1.0 + sum(k) * 1e-5,
                "all.{k} is not the sum: {of_run:?}"
            );
        }
        // The two guests read one 2 MiB file (16 MiB / 8) through one device
        // cache (2 MiB): together they miss each page about once, at most a few
        // times, far less than they read.
        assert!(
            f(of_run[2], "device_misses") < f(of_run[2], "read_ios") / 2.0,
            "one device for both VMs: {:?}",
            of_run[2]
        );
    }
    let failed: Vec<&Row> = rows.iter().filter(|r| r["run"] == "3").collect();
    assert_eq!(failed.len(), 3);
    for r in failed {
        assert_eq!(r["status"], "failed", "{r:?}");
        assert!(
            r["error"].contains("no-such-mode"),
            "fio's complaint: {r:?}"
        );
        assert_eq!(r["read_bw_bytes_per_sec"], "", "{r:?}");
    }
    // The rest of the results directory.
    let prov: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("provenance.json")).unwrap())
            .unwrap();
    assert_eq!(prov["runs_done"], 3);
    assert_eq!(prov["quick"], true);
    assert!(
        prov["machine"]["git"]["revision"]
            .as_str()
            .is_some_and(|r| r.len() == 40),
        "{prov}"
    );
    assert!(
        prov["guest"]["fio"]
            .as_str()
            .is_some_and(|v| v.starts_with("fio-")),
        "{prov}"
    );
    assert_eq!(prov["runs"].as_array().unwrap().len(), 3);
    for vm in ["vm0", "vm1"] {
        let fio = out.join(format!("runs/001/fio/{vm}-p.json"));
        assert!(
            std::fs::metadata(&fio).is_ok_and(|m| m.len() > 1000),
            "{}",
            fio.display()
        );
    }
    assert!(out.join("runs/003/daemon.log").is_file());
    let pngs: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".png"))
        .collect();
    assert!(!pngs.is_empty(), "no plots");
    for p in pngs {
        let b = std::fs::read(p.path()).unwrap();
        assert!(
            b.starts_with(b"\x89PNG") && b.len() > 1000,
            "{}",
            p.path().display()
        );
    }
    // The printed table names both outcomes.
    assert!(
        stdout.contains("randread") && stdout.contains("failed"),
        "{stdout}"
    );
}
