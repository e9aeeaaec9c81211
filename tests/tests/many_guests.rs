//! Many guests on one daemon: `CXLFS_MANY_VMS` (default 16) VMs, each with
//! a DAX window and a small CXL node, all on one `cxlfsd`, one device.
//!
//! `sixteen_guests_share_one_daemon_and_one_device`: every guest runs
//! `cxlfs-fsx` on its own file through its window at once (reads, writes,
//! mapped reads and writes, truncates, fallocate, punch, zero range,
//! copies), a pointer chase on its CPU-less CXL node beside it, and reads
//! one file all of them share. The window (4 MiB: two ranges) holds fewer
//! ranges than a guest's files need, and the device cache (8 MiB) a
//! fraction of the guests' pages: both are under pressure throughout.
//! Checked: every fsx clean, the host's bytes of every file equal what its
//! guest read, the shared file as the host has it in every guest, every VM
//! with its own metrics (traps, device hits and misses, its region's
//! traps), and the device's totals equal to what the VMs and regions were
//! charged plus the few traps no VMM thread made. Printed: the daemon's
//! threads, descriptors and resident memory at start and with every VM
//! connected, per VM added.
//!
//! Knobs: `CXLFS_MANY_VMS`, `CXLFS_MANY_OPS` (fsx operations per guest).
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{env_knob, exclusive, sha256_hex, Daemon, VmOptions, GUEST_PRELUDE};
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

/// The shared file every guest reads.
const SHARED: u64 = 8 << 20;
/// Each fsx file's largest size (its copy source is as large).
const FSX_MAXLEN: u64 = 2 << 20;

/// The daemon's threads, open descriptors and resident KiB.
#[derive(Debug, Clone, Copy)]
struct ProcFigures {
    threads: u64,
    fds: u64,
    rss_kib: u64,
}

fn proc_figures(pid: u32) -> ProcFigures {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    ProcFigures {
        threads: field("Threads:"),
        fds: fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as u64,
        rss_kib: field("VmRSS:"),
    }
}

fn guest_script(ops: u64) -> String {
    format!(
        r#"{GUEST_PRELUDE}
grep ' /mnt virtiofs ' /proc/mounts | grep -q dax=always || {{ echo "not a DAX mount"; cat /proc/mounts; exit 1; }}
n=${{CXLFS_VM#vm}}
mkdir -p /mnt/$CXLFS_VM
handshake 1
# Beside fsx: a chase over 8 MiB of the CPU-less CXL node.
( rc=0; numactl --membind=1 cxlfs-memlat --size 8M --stride 4096 --laps 2 >/tmp/chase.json 2>/tmp/chase.err || rc=$?
  echo $rc >/tmp/chase.rc ) &
rc=0
cxlfs-fsx -N {ops} -S $((n + 1)) -l {FSX_MAXLEN} -o 262144 /mnt/$CXLFS_VM/fsx.bin >/tmp/fsx.out 2>/tmp/fsx.err || rc=$?
tail -n 1 /tmp/fsx.out
echo "FSX-RC=$rc"
[ "$rc" = 0 ] || {{ tail -n 40 /tmp/fsx.err; exit 1; }}
sum=$(sha256sum /mnt/shared.bin | cut -d' ' -f1)
[ "$sum" = "$(cat /mnt/.cxlfs/shared.sha256)" ] || {{ echo "shared.bin: SHA-256 $sum"; exit 1; }}
wait
[ "$(cat /tmp/chase.rc)" = 0 ] || {{ echo "the chase on node 1 failed"; cat /tmp/chase.err; exit 1; }}
sha256sum /mnt/$CXLFS_VM/fsx.bin | cut -d' ' -f1 >/tmp/sum
cp /tmp/sum /mnt/.cxlfs/$CXLFS_VM.sha256
echo guest-done
"#
    )
}

/// Waits until every guest reached its first handshake.
fn wait_ready(d: &Daemon, names: &[String], limit: Duration) {
    let t = Instant::now();
    while !names
        .iter()
        .all(|v| d.share().join(format!(".cxlfs/ready-{v}-1")).exists())
    {
        assert!(
            t.elapsed() < limit,
            "not every guest booted within {limit:?}\n{}",
            d.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn sixteen_guests_share_one_daemon_and_one_device() {
    let _serial = exclusive();
    let t = Instant::now();
    let count: usize = env_knob("CXLFS_MANY_VMS", 16);
    let ops: u64 = env_knob("CXLFS_MANY_OPS", 1_500);
    let names: Vec<String> = (0..count).map(|i| format!("vm{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut args: Vec<String> = [
        "--dax-window",
        "4MiB",
        "--set",
        "cache.size_bytes=8MiB",
        "--set",
        "nand.read_ns=5us",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    for v in &names {
        args.extend(["--cxl-memory".to_string(), format!("{v}=32MiB")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(&refs, &args, |share| {
        fs::write(
            share.join("shared.bin"),
            cxlfs_e2e::seeded_bytes(SHARED, 11),
        )
        .unwrap();
    });
    let shared_sum = sha256_hex(&d.share().join("shared.bin"));
    fs::write(
        d.share().join(".cxlfs/shared.sha256"),
        format!("{shared_sum}\n"),
    )
    .unwrap();
    d.write_guest_script(&guest_script(ops));
    let pid = d.pid().unwrap();
    let alone = proc_figures(pid);
    let opts = VmOptions {
        // The image unpacks into RAM (a 256 MiB guest cannot hold it).
        mem: "512M".into(),
        cxl_memory: Some("32M".into()),
        timeout: Duration::from_secs(900),
        access_bits: true,
        ..VmOptions::dax("4M")
    };
    let vms: Vec<_> = names.iter().map(|v| d.boot(v, &opts)).collect();
    wait_ready(&d, &names, Duration::from_secs(600));
    let all_in = proc_figures(pid);
    let per_vm = |a: u64, b: u64| (b as f64 - a as f64) / count as f64;
    eprintln!(
        "cxlfsd alone: {} threads, {} descriptors, {} KiB resident; with {count} VMs: {} / {} / {} KiB; \
         per VM added: {:.1} threads, {:.1} descriptors, {:.0} KiB",
        alone.threads,
        alone.fds,
        alone.rss_kib,
        all_in.threads,
        all_in.fds,
        all_in.rss_kib,
        per_vm(alone.threads, all_in.threads),
        per_vm(alone.fds, all_in.fds),
        per_vm(alone.rss_kib, all_in.rss_kib),
    );
    for v in &names {
        fs::write(d.share().join(format!(".cxlfs/go-{v}-1")), "").unwrap();
    }
    let runs: Vec<_> = vms.into_iter().map(|vm| vm.wait()).collect();
    for run in &runs {
        assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
        assert!(run.serial.contains("guest-done"), "{}", run.describe());
        assert!(
            run.serial.contains(&format!("cxlfs-fsx: ops={ops} ")),
            "{}: fsx did not finish its {ops} operations\n{}",
            run.name,
            run.describe()
        );
    }
    let slowest = runs.iter().map(|r| r.elapsed).max().unwrap_or_default();
    eprintln!(
        "{count} guests done: slowest {slowest:.1?}, test {:.1?}",
        t.elapsed()
    );
    check_metrics(&d, &names);
    assert!(d.stop().success(), "{}", d.diagnostics());
    // After a clean stop the host files hold every store the guests made.
    for v in &names {
        let guest = fs::read_to_string(d.share().join(format!(".cxlfs/{v}.sha256")))
            .unwrap_or_else(|e| panic!("no guest checksum of {v}'s file: {e}"));
        let host = sha256_hex(&d.share().join(format!("{v}/fsx.bin")));
        assert_eq!(
            guest.trim(),
            host,
            "{v}: the host's bytes differ from the guest's"
        );
    }
    assert_eq!(
        sha256_hex(&d.share().join("shared.bin")),
        shared_sum,
        "the shared file changed"
    );
    check_no_leftovers(d.share(), &names);
}

/// Every VM has its own figures, and what the VMs and their regions were
/// charged adds up to the device's own counts.
fn check_metrics(d: &Daemon, names: &[String]) {
    let snap = d.snapshot();
    let mut charged = (0u64, 0u64);
    let mut unknown_traps = 0;
    for row in &snap.vms {
        if row.vm == "unknown" {
            unknown_traps += row.traps;
            continue;
        }
        assert!(
            row.traps > 0 && row.counter("device_misses") > 0,
            "{} has no traps or device misses of its own: {row:?}",
            row.vm
        );
        charged.0 += row.counter("device_hits");
        charged.1 += row.counter("device_misses");
    }
    let in_rows: Vec<&str> = snap.vms.iter().map(|r| r.vm.as_str()).collect();
    for v in names {
        assert!(
            in_rows.contains(&v.as_str()),
            "no metrics row for {v}: {in_rows:?}"
        );
    }
    assert_eq!(snap.memory_regions.len(), names.len(), "one region per VM");
    for r in &snap.memory_regions {
        assert!(r.traps > 0 && r.device_misses > 0, "{r:?}");
        charged.0 += r.device_hits;
        charged.1 += r.device_misses;
    }
    let m = d.scrape();
    for v in names {
        let reuses = m.count("cxlfs_dax_slot_reuses_total", &[("vm", v)]);
        assert!(
            reuses > 0,
            "{v}'s window never changed hands: not under pressure"
        );
    }
    let evictions = m.count("cxlfs_pool_evictions_total", &[]);
    assert!(evictions > 0, "the device cache evicted no file page");
    let device = (snap.device.hits, snap.device.misses);
    eprintln!(
        "device hits {} / misses {}; charged to VMs and regions {} / {}; traps by no VMM {unknown_traps}",
        device.0, device.1, charged.0, charged.1
    );
    // A trap by a thread of no VMM (a kernel worker) is charged to no VM:
    // at most one page each.
    for (what, dev, vms) in [
        ("hits", device.0, charged.0),
        ("misses", device.1, charged.1),
    ] {
        assert!(
            vms <= dev && dev - vms <= unknown_traps,
            "device {what} {dev} against {vms} charged to the VMs and regions \
             ({unknown_traps} traps by no VMM)"
        );
    }
}

/// No guest's file went anywhere but its own directory.
fn check_no_leftovers(share: &Path, names: &[String]) {
    for v in names {
        let dir: Vec<String> = fs::read_dir(share.join(v))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            dir.iter().all(|f| f.starts_with("fsx.bin")),
            "{v}'s directory holds {dir:?}"
        );
    }
}
