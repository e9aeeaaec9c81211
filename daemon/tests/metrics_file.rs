//! The JSON-lines metrics time series of a real `cxlfsd` process (no VM: a
//! vhost-user front-end in this test drives it over its real socket).
//!
//! * periodic samples arrive at the configured interval, one object per VM
//!   and one `all` object per sample, with the fixed field names;
//! * once the daemon is idle, the latest sample's counters are those of the
//!   Prometheus endpoint and of `/metrics.json`;
//! * SIGTERM: the daemon exits 0 and the file ends with a `final` sample
//!   (after the device flush) whose counters match.
//! * a cxl_ratio of 50 shows in the sample: about half the pages are DRAM
//!   tier, none of them reached the device.
#![allow(clippy::unwrap_used)]

mod common;

use common::Guest;
use cxlfs_api::metrics::{MetricsSnapshot, SampleLine};
use serde::Deserialize;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const FILE_SIZE: usize = 1 << 20;
const READ_SIZE: u32 = 32 * 1024;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scrape(port: u16) -> String {
    get(port, "/metrics")
}

fn get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The value of the sample `name{labels}` (labels written exactly as rendered).
fn prom(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {sample}"))
        .parse()
        .unwrap()
}

/// The file's whole lines: one the daemon is still writing (no newline
/// yet; a sample can take more than one write) is left for the next read.
fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    whole
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l}: {e}")))
        .collect()
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

struct Killer(Child);
impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn last_sample(all: &[Value]) -> (Value, Value) {
    let seq = all.last().unwrap()["seq"].as_u64().unwrap();
    let of = |vm: &str| {
        all.iter()
            .rev()
            .find(|l| l["seq"] == seq && l["vm"] == vm)
            .cloned()
            .unwrap_or_else(|| panic!("sample {seq} has no {vm} object"))
    };
    (of("vm0"), of("all"))
}

#[test]
fn periodic_samples_agree_with_prometheus_and_a_final_one_follows_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let content: Vec<u8> = (0..FILE_SIZE).map(|i| (i * 13 % 251) as u8).collect();
    std::fs::write(share.join("data.bin"), &content).unwrap();
    let sock = dir.path().join("vm0.sock");
    let file = dir.path().join("metrics.jsonl");
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_cxlfsd"))
        .arg("--shared-dir")
        .arg(&share)
        .arg("--vm")
        .arg(format!("vm0={}", sock.display()))
        .args(["--cache", "never", "--preset", "femu"])
        .args([
            "--set",
            "cache.size_bytes=4MiB",
            "--set",
            "nand.read_ns=20us",
        ])
        .args(["--cxl-ratio", "50"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .arg("--metrics-file")
        .arg(&file)
        .args(["--metrics-interval", "100ms"])
        .stdin(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.path().join("cxlfsd.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let mut daemon = Killer(child);
    assert!(
        wait_until(Duration::from_secs(20), || sock.exists()
            && TcpStream::connect(("127.0.0.1", port)).is_ok()),
        "cxlfsd did not come up"
    );

    let mut g = Guest::connect(&sock);
    g.init();
    let node = g.lookup("data.bin");
    let fh = g.open(node);
    let mut off = 0u64;
    while off < FILE_SIZE as u64 {
        let (data, _) = g.read(node, fh, off, READ_SIZE);
        let at = off as usize;
        assert_eq!(data, content[at..at + READ_SIZE as usize]);
        off += u64::from(READ_SIZE);
    }
    // A second pass: CXL pages now hit (the file fits the device cache).
    for k in 0..8u64 {
        g.read(node, fh, k * u64::from(READ_SIZE), READ_SIZE);
    }
    let reads = FILE_SIZE as u64 / u64::from(READ_SIZE) + 8;

    // Idle now: wait for two more samples, so the latest saw everything.
    let seen = lines(&file)
        .last()
        .map_or(0, |l| l["seq"].as_u64().unwrap());
    assert!(
        wait_until(Duration::from_secs(10), || lines(&file)
            .last()
            .is_some_and(|l| l["seq"].as_u64().unwrap() >= seen + 2)),
        "no periodic samples"
    );
    let text = scrape(port);
    let all_lines = lines(&file);
    let (vm0, all) = last_sample(&all_lines);

    // Periodic: every sample has a vm0 and an all object; 100 ms apart.
    let samples: Vec<&Value> = all_lines.iter().filter(|l| l["vm"] == "all").collect();
    assert!(samples.len() >= 3);
    assert!(samples.iter().all(|l| l["final"] == false));
    for w in samples.windows(2) {
        assert_eq!(
            w[1]["seq"].as_u64().unwrap(),
            w[0]["seq"].as_u64().unwrap() + 1
        );
        let dt = w[1]["elapsed_s"].as_f64().unwrap() - w[0]["elapsed_s"].as_f64().unwrap();
        assert!((0.05..0.5).contains(&dt), "samples {dt} s apart");
    }

    // The counters of the file and of the endpoint agree.
    let labels = "{vm=\"vm0\"}";
    assert_eq!(vm0["fuse_ops"]["READ"].as_u64().unwrap(), reads);
    assert_eq!(
        prom(
            &text,
            "cxlfs_fuse_requests_total{vm=\"vm0\",opcode=\"read\"}"
        ),
        reads as f64
    );
    for (field, family) in [
        ("read_bytes", "cxlfs_read_bytes_total"),
        ("device_hits", "cxlfs_device_hits_total"),
        ("device_misses", "cxlfs_device_misses_total"),
        ("dram_pages", "cxlfs_dram_tier_pages_total"),
        ("nand_reads", "cxlfs_vm_nand_reads_total"),
        ("prefetch_issued", "cxlfs_vm_prefetch_issued_total"),
    ] {
        assert_eq!(
            vm0[field].as_f64().unwrap(),
            prom(&text, &format!("{family}{labels}")),
            "{field}"
        );
    }
    for (field, family) in [
        ("nand_reads", "cxlfs_nand_reads_total"),
        ("nand_programs", "cxlfs_nand_programs_total"),
        ("device_misses", "cxlfs_device_misses_all_total"),
        ("gc_runs", "cxlfs_gc_runs_total"),
        ("resident_cxl_pages", "cxlfs_resident_pages{tier=\"cxl\"}"),
        ("resident_dram_pages", "cxlfs_resident_pages{tier=\"dram\"}"),
    ] {
        assert_eq!(all[field].as_f64().unwrap(), prom(&text, family), "{field}");
    }
    assert_eq!(
        vm0["fuse_latency_ns"]["count"].as_f64().unwrap(),
        prom(&text, "cxlfs_fuse_latency_seconds_count{vm=\"vm0\"}")
    );
    assert_eq!(
        vm0["fuse_latency_ns"]["p99"].as_f64().unwrap() / 1e9,
        prom(
            &text,
            "cxlfs_fuse_latency_seconds_quantiles{vm=\"vm0\",quantile=\"0.99\"}"
        )
    );

    // `/metrics.json` has the same numbers, as the daemon's own types, and
    // every line of the file reads as a `SampleLine`.
    let snap: MetricsSnapshot = serde_json::from_str(&get(port, "/metrics.json")).unwrap();
    let jvm0 = snap.vms.iter().find(|r| r.vm == "vm0").unwrap();
    assert_eq!(jvm0.fuse_ops["READ"], reads);
    assert!(!snap.counters.is_empty());
    for c in &snap.counters {
        assert_eq!(
            jvm0.counter(&c.field),
            vm0[c.field.as_str()].as_u64().unwrap(),
            "{}",
            c.field
        );
    }
    assert_eq!(snap.device.placed_dram_pages, 128);
    assert_eq!(snap.all.counter("device_misses"), snap.device.misses);
    for l in &all_lines {
        let line = SampleLine::deserialize(l).unwrap();
        assert_eq!(line.row.vm, l["vm"].as_str().unwrap());
    }

    // cxl_ratio 50: half the file's 256 pages are DRAM tier; a DRAM page
    // never reaches the device, so device hits + misses are the CXL page
    // accesses only.
    assert_eq!(vm0["cxl_ratio"], 50);
    assert_eq!(
        vm0["read_bytes"].as_u64().unwrap(),
        reads * u64::from(READ_SIZE)
    );
    let page_accesses = reads * u64::from(READ_SIZE) / 4096;
    let dram = vm0["dram_pages"].as_u64().unwrap();
    let cxl = vm0["device_hits"].as_u64().unwrap() + vm0["device_misses"].as_u64().unwrap();
    assert_eq!(dram + cxl, page_accesses);
    assert!(
        dram.abs_diff(page_accesses / 2) <= 6,
        "dram {dram} of {page_accesses}"
    );
    assert_eq!(all["placed_dram_pages"].as_u64().unwrap(), 128);
    assert_eq!(all["placed_cxl_pages"].as_u64().unwrap(), 128);
    assert_eq!(vm0["device_misses"].as_u64().unwrap(), 128, "first pass");
    assert!(vm0["fuse_latency_ns"]["p50"].as_u64().unwrap() > 0);

    // SIGTERM: clean exit and a final sample.
    drop(g);
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe {
        libc::kill(daemon.0.id() as i32, libc::SIGTERM);
    }
    let status = daemon.0.wait().unwrap();
    assert!(status.success(), "cxlfsd exited with {status}");
    let after = lines(&file);
    let finals: Vec<&Value> = after.iter().filter(|l| l["final"] == true).collect();
    assert_eq!(finals.len(), 2, "one final vm0 and one final all object");
    let n = after.len();
    assert!(
        after[n - 2..].iter().all(|l| l["final"] == true),
        "final is last"
    );
    let (fvm0, fall) = last_sample(&after);
    for field in ["read_bytes", "device_hits", "device_misses", "dram_pages"] {
        assert_eq!(fvm0[field], vm0[field], "{field}");
    }
    assert_eq!(fall["fuse_ops"]["READ"].as_u64().unwrap(), reads);
    assert!(
        fall["seq"].as_u64().unwrap() > all["seq"].as_u64().unwrap(),
        "the final sample comes after the periodic ones"
    );
}
