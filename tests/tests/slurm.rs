//! `cxlfs run --slurm` on a real one-node Slurm cluster
//! (`tests/slurm/start-cluster.sh`, which `make e2e` runs first; the test
//! runs it too, it is idempotent): the demo sweep (`experiments/demo.toml
//! --quick`, real TCG guests) run locally and through the cluster side by
//! side must give the same (run, phase, vm) rows and columns, all `ok`,
//! one array task per run, plots drawn, and a per-run overhead (submission,
//! scheduling, collect) of at most 10 s; a task cancelled with `scancel`
//! while it runs must be a `failed` row with Slurm's state, and `--resume`
//! must rerun that run alone.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{cxlfs_cli, cxlfsd, exclusive, guest_image, repo_root, run_experiment};
use serde_json::Value;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts the cluster; false (after saying why) when it cannot be had
/// here, which fails the test under `CI=true`.
fn cluster() -> bool {
    let script = repo_root().join("tests/slurm/start-cluster.sh");
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    if out.status.success() {
        return true;
    }
    let why = format!(
        "{} failed ({}): {}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("no Slurm cluster: {why}");
    }
    eprintln!("SKIPPED: no Slurm cluster: {why}");
    false
}

fn results(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap()
}

fn rows(dir: &Path) -> Vec<Value> {
    results(dir)["rows"].as_array().unwrap().clone()
}

/// (run, phase, vm) of every row, in order.
fn keys(rows: &[Value]) -> Vec<(u64, String, String)> {
    rows.iter()
        .map(|r| {
            (
                r["run"].as_u64().unwrap(),
                r["phase"].as_str().unwrap().to_string(),
                r["vm"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pngs(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".png"))
        .collect();
    v.sort();
    v
}

fn check_ran(what: &str, run: &std::process::Output, dir: &tempfile::TempDir) {
    if !run.status.success() {
        let kept = dir.path().to_path_buf();
        panic!("{what} failed ({}); kept {}", run.status, kept.display());
    }
}

fn cxlfs(args: &[&OsStr]) -> std::process::Output {
    let out = Command::new(cxlfs_cli())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    eprintln!(
        "cxlfs {args:?}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

#[test]
fn demo_sweep_through_slurm_matches_the_local_run() {
    let _serial = exclusive();
    if !cluster() {
        return;
    }
    let image = guest_image();
    let spec = repo_root().join("experiments/demo.toml");
    let dir = tempfile::Builder::new()
        .prefix("cxlfs-e2e-slurm.")
        .tempdir()
        .unwrap();
    let (local, slurm) = (dir.path().join("local"), dir.path().join("slurm"));
    let img = [OsStr::new("--image"), image.as_os_str()];

    let t = Instant::now();
    let run = run_experiment(&spec, &local, &img);
    let local_s = t.elapsed().as_secs_f64();
    check_ran("local cxlfs run", &run, &dir);
    let local_err = run.stderr;
    let t = Instant::now();
    let on_slurm: Vec<&OsStr> = img
        .iter()
        .copied()
        .chain(["--slurm", "--array-limit", "1"].map(OsStr::new))
        .collect();
    let run = run_experiment(&spec, &slurm, &on_slurm);
    let slurm_s = t.elapsed().as_secs_f64();
    check_ran("cxlfs run --slurm", &run, &dir);

    let (lr, sr) = (rows(&local), rows(&slurm));
    let runs = lr.iter().filter_map(|r| r["run"].as_u64()).max().unwrap();
    assert_eq!(runs, 3, "the demo sweeps three CXL ratios");
    for r in lr.iter().chain(&sr) {
        assert_eq!(r["status"], "ok", "{r:#}");
    }
    assert_eq!(keys(&lr), keys(&sr), "the same (run, phase, vm) rows");
    let columns = |d: &Path| -> Vec<String> {
        serde_json::from_value(results(d)["columns"].clone()).unwrap()
    };
    // A FUSE opcode counted in the daemon's final sample only when the
    // guest's unmount (DESTROY) beats it: present or not by chance, in two
    // local runs as well (measured: 1 of 2 local and 1 of 2 Slurm sweeps had
    // `metrics.fuse_ops.DESTROY`).
    let racy = |c: &String| c == "metrics.fuse_ops.DESTROY";
    let (mut lc, mut sc) = (columns(&local), columns(&slurm));
    lc.retain(|c| !racy(c));
    sc.retain(|c| !racy(c));
    let only = |a: &[String], b: &[String]| -> Vec<String> {
        a.iter().filter(|c| !b.contains(c)).cloned().collect()
    };
    assert_eq!(
        lc,
        sc,
        "not the same columns: only local {:?}, only Slurm {:?}",
        only(&lc, &sc),
        only(&sc, &lc)
    );
    let plots = pngs(&slurm);
    assert!(!plots.is_empty(), "no plots drawn from the Slurm sweep");
    assert_eq!(plots, pngs(&local));

    // One array task per run, each on this node, each with its provenance.
    let sweep: Value =
        serde_json::from_str(&std::fs::read_to_string(slurm.join("slurm/sweep.json")).unwrap())
            .unwrap();
    let jobs = sweep["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{sweep:#}");
    assert_eq!(jobs[0]["runs"], serde_json::json!([1, 2, 3]));
    let id = jobs[0]["job_id"].as_str().unwrap();
    let node = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    for n in 1..=3 {
        let out = slurm.join(format!("slurm/{id}_{n}.out"));
        assert!(out.is_file(), "no task output {}", out.display());
        let p: Value = serde_json::from_str(
            &std::fs::read_to_string(slurm.join(format!("runs/{n:03}/provenance.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(p["node"], node.as_str(), "{p:#}");
        assert_eq!(p["slurm"]["slurm_array_task_id"], n.to_string(), "{p:#}");
        assert_eq!(p["slurm"]["slurm_array_job_id"], id, "{p:#}");
        assert!(
            p["accel"]
                .as_str()
                .is_some_and(|a| a.starts_with("tcg") || a.starts_with("kvm")),
            "{p:#}"
        );
        assert!(
            p["host"]["cpu_model"].is_string() && p["kernel"].is_string(),
            "{p:#}"
        );
    }
    let prov: Value =
        serde_json::from_str(&std::fs::read_to_string(slurm.join("provenance.json")).unwrap())
            .unwrap();
    assert_eq!(prov["runs_done"], 3, "{prov:#}");
    assert!(prov["guest"]["fio"]
        .as_str()
        .is_some_and(|v| v.starts_with("fio-")));

    // Slurm's own cost: wall time outside the runs themselves (submission,
    // scheduling, task start, polling, collect), over the local sweep's; the
    // runs' own times swing with the load on this shared machine.
    let local_runs: f64 = run_times(&String::from_utf8_lossy(&local_err));
    let slurm_runs: f64 = (1..=3)
        .map(|n| {
            run_times(&std::fs::read_to_string(slurm.join(format!("slurm/{id}_{n}.out"))).unwrap())
        })
        .sum();
    let per_run = ((slurm_s - slurm_runs) - (local_s - local_runs)) / runs as f64;
    eprintln!(
        "side by side: local {local_s:.1} s (runs {local_runs:.1} s), Slurm {slurm_s:.1} s \
         (runs {slurm_runs:.1} s): Slurm adds {per_run:.2} s per run outside the runs, \
         {:+.1} s per run wall-clock",
        (slurm_s - local_s) / runs as f64
    );
    assert!(
        per_run <= 10.0,
        "Slurm's overhead {per_run:.1} s per run (local {local_s:.1} s, Slurm {slurm_s:.1} s)"
    );
}

/// The sum of `run N/M [...] STATUS in X.Ys` times in a `cxlfs run` log.
fn run_times(log: &str) -> f64 {
    log.lines()
        .filter_map(|l| {
            let after_label = l.split_once("] ")?.1;
            let took = after_label.split_once(" in ")?.1;
            took.split('s').next()?.parse::<f64>().ok()
        })
        .sum()
}

/// The tasks of job `id` still queued (`squeue` lines `TASK STATE`).
fn queued(id: &str) -> Vec<String> {
    let out = Command::new("squeue")
        .args(["-j", id, "-h", "-o", "%i %T"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_cancelled_task_is_a_failed_row_and_resume_reruns_only_it() {
    let _serial = exclusive();
    if !cluster() {
        return;
    }
    let image = guest_image();
    let spec = repo_root().join("experiments/demo.toml");
    let dir = tempfile::Builder::new()
        .prefix("cxlfs-e2e-slurm-resume.")
        .tempdir()
        .unwrap();
    let out: PathBuf = dir.path().join("results");
    let common: Vec<&OsStr> = [
        OsStr::new("run"),
        spec.as_os_str(),
        OsStr::new("--out"),
        out.as_os_str(),
        OsStr::new("--quick"),
        OsStr::new("--set"),
        OsStr::new("sweep.daemon.cxl_ratio=[0,100]"),
        OsStr::new("--cxlfsd"),
        cxlfsd().as_os_str(),
        OsStr::new("--image"),
        image.as_os_str(),
        OsStr::new("--slurm"),
        OsStr::new("--array-limit"),
        OsStr::new("1"),
    ]
    .to_vec();
    let mut submit = common.clone();
    submit.push(OsStr::new("--no-wait"));
    let run = cxlfs(&submit);
    check_ran("cxlfs run --slurm --no-wait", &run, &dir);
    let id = String::from_utf8(run.stdout).unwrap().trim().to_string();
    assert!(id.parse::<u64>().is_ok(), "job id {id:?}");

    // Run 1 is cancelled while it runs; run 2 goes on.
    let task1 = format!("{id}_1 RUNNING");
    wait_until("task 1 running", Duration::from_secs(120), || {
        queued(&id).contains(&task1)
    });
    std::thread::sleep(Duration::from_secs(3));
    let st = Command::new("scancel")
        .arg(format!("{id}_1"))
        .status()
        .unwrap();
    assert!(st.success());
    wait_until("the job done", Duration::from_secs(600), || {
        queued(&id).is_empty()
    });
    let run = cxlfs(&[OsStr::new("collect"), out.as_os_str()]);
    check_ran("cxlfs collect", &run, &dir);
    let rs = rows(&out);
    assert_eq!(rs.len(), 2 * 2 * 3, "2 runs x 2 phases x (2 VMs + all)");
    for r in &rs {
        match r["run"].as_u64().unwrap() {
            1 => {
                assert_eq!(r["status"], "failed", "{r:#}");
                assert_eq!(r["slurm_state"], "CANCELLED", "{r:#}");
                assert_eq!(r["slurm_job"], format!("{id}_1"), "{r:#}");
            }
            _ => assert_eq!(r["status"], "ok", "{r:#}"),
        }
    }
    let run2 = out.join("runs/002/rows.json");
    let before = std::fs::metadata(&run2).unwrap().modified().unwrap();

    let mut resume = common.clone();
    resume.push(OsStr::new("--resume"));
    let run = cxlfs(&resume);
    check_ran("cxlfs run --slurm --resume", &run, &dir);
    let sweep: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("slurm/sweep.json")).unwrap())
            .unwrap();
    assert_eq!(
        sweep["jobs"][1]["runs"],
        serde_json::json!([1]),
        "{sweep:#}"
    );
    assert_eq!(
        std::fs::metadata(&run2).unwrap().modified().unwrap(),
        before,
        "run 2 ran again"
    );
    let rs = rows(&out);
    assert_eq!(rs.len(), 12);
    for r in &rs {
        assert_eq!(r["status"], "ok", "{r:#}");
        assert!(r.get("slurm_state").is_none(), "{r:#}");
    }
    assert!(!pngs(&out).is_empty());
}
