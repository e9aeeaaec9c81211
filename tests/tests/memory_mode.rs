//! Memory mode (issue 12) with real TCG guests: the VM's CXL memory region
//! is a CPU-less NUMA node backed by `cxlfsd`'s pool plane, handed to QEMU
//! as a descriptor (`cxlfs ctl memory-fd`).
//!
//! * `a_guest_writes_and_verifies_twice_the_cache_on_the_cxl_node`: the
//!   guest sees two nodes (node 1 without CPUs, the region's size); a
//!   writer bound to node 1 (`numactl --membind=1`) stores 16 MiB of
//!   random bytes through an 8 MiB device cache and reads them back with
//!   the same SHA-256 after the evictions; traps and write-backs are
//!   counted for the region; the guest powers off with dirty CXL pages —
//!   the sequence that wedged both processes before the plane was split —
//!   and QEMU is gone within 30 s, the daemon keeps serving, releases the
//!   region (device and plane empty), and stops cleanly.
//! * `a_sigkilled_vmm_with_dirty_cxl_pages_leaves_and_its_region_is_released`:
//!   QEMU is SIGKILLed while its guest keeps storing to node 1: it is gone
//!   within 30 s and the region is released.
//! * `prefetched_region_pages_are_pushed_and_guest_stores_survive_them`:
//!   with the device's prefetcher on, region pages it fills are pushed into
//!   the plane (read through the region file, never written over); a guest
//!   writing and re-reading 16 MiB on node 1 meanwhile gets its bytes back.
//! * `region_write_backs_go_through_the_device_write_log`: with the
//!   device's write log on (`cache.write_log_bytes`), the region's
//!   write-backs are charged through it (the region's and the device's log
//!   counters) and 16 MiB written on node 1 read back intact.
//! * `the_cxl_node_is_a_lower_memory_tier_than_dram`: the backports kernel
//!   (6.12) reads the HMAT `run-vm.sh` gives memory mode and puts node 1 in
//!   a lower memory tier than node 0 (without the HMAT both share one).
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{exclusive, Daemon, VmOptions, GUEST_PRELUDE};
use std::fs;
use std::time::{Duration, Instant};

/// Device cache of these runs: 8 MiB, where faults reading QEMU's
/// `MADV_HUGEPAGE` readahead windows (2–4 MiB each) livelocked two vCPUs
/// before the plane refused readahead; the writer stores twice that.
const CACHE: &str = "8MiB";
const CACHE_PAGES: u64 = 8 * 256;

fn daemon() -> Daemon {
    Daemon::start(
        &["vm0"],
        &[
            "--cxl-memory",
            "vm0=128MiB",
            "--set",
            &format!("cache.size_bytes={CACHE}"),
        ],
        |_| {},
    )
}

fn cxl_vm() -> VmOptions {
    VmOptions {
        smp: 2,
        cxl_memory: Some("128M".into()),
        timeout: Duration::from_secs(300),
        ..VmOptions::default()
    }
}

/// Waits until the region of `vm` has been released `n` times.
fn wait_released(d: &Daemon, n: u64, limit: Duration) -> cxlfs_api::metrics::MemoryRegionSample {
    let t = Instant::now();
    loop {
        let r = d.snapshot().memory_regions.into_iter().next().unwrap();
        if r.releases >= n {
            return r;
        }
        assert!(
            t.elapsed() < limit,
            "the region was not released within {limit:?}: {r:?}\n{}",
            d.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_guest_writes_and_verifies_twice_the_cache_on_the_cxl_node() {
    let _serial = exclusive();
    let mut d = daemon();
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
out=/mnt/.cxlfs
numactl -H >$out/numa.txt
cat /run/cxlfs/cxl-nodes >$out/cxl-nodes
numactl --membind=1 sh -c "dd if=/dev/urandom bs=1M count=16 2>/dev/null | tee /dev/shm/a | sha256sum" >$out/written.sum
grep Shmem: /sys/devices/system/node/node1/meminfo >$out/shmem
numactl --membind=1 sha256sum </dev/shm/a >$out/read.sum
"#
    ));
    let run = d.boot("vm0", &cxl_vm()).wait();
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
    let out = d.share().join(".cxlfs");
    let numa = fs::read_to_string(out.join("numa.txt")).unwrap();
    assert!(numa.contains("available: 2 nodes"), "{numa}");
    let cpus = numa
        .lines()
        .find(|l| l.starts_with("node 1 cpus:"))
        .unwrap();
    assert_eq!(
        cpus.trim_end(),
        "node 1 cpus:",
        "node 1 has no CPUs\n{numa}"
    );
    let size: u64 = numa
        .lines()
        .find_map(|l| l.strip_prefix("node 1 size: "))
        .and_then(|v| v.trim_end_matches(" MB").parse().ok())
        .unwrap();
    assert!(
        (100..=128).contains(&size),
        "node 1 is the 128 MiB region: {size} MB"
    );
    assert_eq!(
        fs::read_to_string(out.join("cxl-nodes")).unwrap().trim(),
        "1"
    );
    let shmem = fs::read_to_string(out.join("shmem")).unwrap();
    let kib: u64 = shmem.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(
        kib >= 16 * 1024 - 64,
        "the writer's pages are on node 1: {shmem}"
    );
    let hash = |f: &str| {
        let t = fs::read_to_string(out.join(f)).unwrap();
        t.split_whitespace().next().unwrap().to_string()
    };
    assert_eq!(hash("written.sum").len(), 64);
    assert_eq!(
        hash("written.sum"),
        hash("read.sum"),
        "16 MiB read back intact"
    );
    // The guest powered off with dirty CXL pages and QEMU is gone (wait()
    // returned): the daemon still serves and releases the region.
    let r = wait_released(&d, 1, Duration::from_secs(30));
    assert!(r.traps > 0, "{r:?}");
    assert!(
        r.device_misses > 0,
        "trapped pages were read from NAND: {r:?}"
    );
    // Each trap reads its own page: a multi-page READ is served only when
    // it looks like the retry of a refused one (same thread, same offset,
    // within 100 ms), which a re-fault of a window can mimic now and then.
    // Before readahead was refused, a trap charged 32 pages.
    let pages = r.device_misses + r.device_hits;
    assert!(
        pages >= r.traps && pages <= r.traps + r.traps / 20,
        "each trap is about one page, charged once: {r:?}"
    );
    assert!(
        r.readahead_refused > 0,
        "QEMU's readahead windows were refused: {r:?}"
    );
    assert!(
        r.writeback_bytes >= 8 << 20,
        "2× the cache written: evicted dirty pages written back: {r:?}"
    );
    assert_eq!(
        r.device_resident_pages, 0,
        "released: no device page left {r:?}"
    );
    assert_eq!(
        r.plane_resident_bytes, 0,
        "released: no plane page left {r:?}"
    );
    let snap = d.snapshot();
    assert!(
        snap.device.resident_pages <= CACHE_PAGES,
        "one device cache"
    );
    // Nothing of the region ever appears in the share.
    let names: Vec<_> = fs::read_dir(d.share())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [".cxlfs"], "the share holds only the test's files");
    let t = Instant::now();
    let st = d.stop();
    assert!(st.success(), "clean shutdown: {st}\n{}", d.diagnostics());
    assert!(t.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_sigkilled_vmm_with_dirty_cxl_pages_leaves_and_its_region_is_released() {
    let _serial = exclusive();
    let mut d = daemon();
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
numactl --membind=1 sh -c '
    dd if=/dev/urandom of=/dev/shm/a bs=1M count=16 2>/dev/null
    : >/mnt/.cxlfs/writing
    while :; do dd if=/dev/urandom of=/dev/shm/a bs=1M count=16 conv=notrunc 2>/dev/null; done'
"#
    ));
    let mut vm = d.boot("vm0", &cxl_vm());
    let writing = d.share().join(".cxlfs/writing");
    assert!(
        vm.wait_for_file(&writing, Duration::from_secs(240)),
        "the guest never wrote to node 1\n{}",
        d.diagnostics()
    );
    // The host's range commands on the VM's memory (cxlfs ctl): pin 1 MiB
    // of the region, evict all of it; a range past the region is refused.
    let pinned = ctl(
        &d,
        &[
            "pin",
            "--vm",
            "vm0",
            "--memory-offset",
            "0",
            "--len",
            "1MiB",
        ],
    );
    assert_eq!(pinned["pages"], 256, "{pinned}");
    let evicted = ctl(
        &d,
        &[
            "evict",
            "--vm",
            "vm0",
            "--memory-offset",
            "0",
            "--len",
            "128MiB",
        ],
    );
    assert_eq!(evicted["pages"], 32768, "{evicted}");
    let past = std::process::Command::new(cxlfs_e2e::cxlfs_cli())
        .args(["ctl", "--socket"])
        .arg(d.work_dir().join("control.sock"))
        .args([
            "evict",
            "--vm",
            "vm0",
            "--memory-offset",
            "128MiB",
            "--len",
            "4KiB",
        ])
        .output()
        .unwrap();
    assert!(!past.status.success(), "a range past the region is refused");
    let qemu = cxlfs_e2e::qemu_pid(d.work_dir(), "vm0").expect("the VM's QEMU process");
    // SAFETY: a signal to the test's own QEMU.
    unsafe { libc::kill(qemu as i32, libc::SIGKILL) };
    let t = Instant::now();
    while gone(qemu).is_none() || vm.running() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the SIGKILLed VMM is still there after 30 s\n{}",
            d.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = wait_released(&d, 1, Duration::from_secs(40));
    assert!(r.traps > 0 && r.writeback_bytes > 0, "{r:?}");
    assert_eq!(r.device_resident_pages, 0, "{r:?}");
    let st = d.stop();
    assert!(st.success(), "clean shutdown: {st}\n{}", d.diagnostics());
}

/// `Some(())` once `pid` is gone or a zombie.
fn gone(pid: u32) -> Option<()> {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => Some(()),
        Ok(s) => {
            let state = s.rsplit(')').next()?.split_whitespace().next()?;
            (state == "Z" || state == "X").then_some(())
        }
    }
}

/// Both modes at once on one daemon: two VMs, each with its own CXL memory
/// region and the same shared file read through its DAX window. Each VM's
/// data on node 1 survives the evictions the other VM's traffic causes,
/// traps are attributed to the right VM and region, and the device cache
/// is one cache: the resident pages of both regions and the file never
/// exceed it.
#[test]
fn two_vms_with_cxl_memory_and_a_shared_dax_file_share_one_device_cache() {
    let _serial = exclusive();
    const FILE: usize = 16 << 20;
    let mut d = Daemon::start(
        &["vm0", "vm1"],
        &[
            "--cxl-memory",
            "vm0=64MiB",
            "--cxl-memory",
            "vm1=64MiB",
            "--dax-window",
            "64M",
            "--set",
            &format!("cache.size_bytes={CACHE}"),
        ],
        |share| {
            fs::write(
                share.join("shared.bin"),
                cxlfs_e2e::seeded_bytes(FILE as u64, 7),
            )
            .unwrap()
        },
    );
    let want = cxlfs_e2e::sha256_hex(&d.share().join("shared.bin"));
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
grep ' /mnt virtiofs ' /proc/mounts | grep -q dax=always || {{ echo "not a DAX mount"; exit 1; }}
out=/mnt/.cxlfs
numactl --membind=1 sh -c "dd if=/dev/urandom bs=1M count=16 2>/dev/null | tee /dev/shm/a | sha256sum" >/tmp/w
sha256sum /mnt/shared.bin | cut -d' ' -f1 >$out/shared-$CXLFS_VM
numactl --membind=1 sha256sum </dev/shm/a >/tmp/r
cut -d' ' -f1 /tmp/w >$out/written-$CXLFS_VM
cut -d' ' -f1 /tmp/r >$out/read-$CXLFS_VM
"#
    ));
    let opts = VmOptions {
        smp: 2,
        cxl_memory: Some("64M".into()),
        timeout: Duration::from_secs(300),
        ..VmOptions::dax("64M")
    };
    let vms = [d.boot("vm0", &opts), d.boot("vm1", &opts)];
    for vm in vms {
        let run = vm.wait();
        assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
    }
    let out = d.share().join(".cxlfs");
    let read = |f: String| fs::read_to_string(out.join(f)).unwrap().trim().to_string();
    for vm in ["vm0", "vm1"] {
        assert_eq!(
            read(format!("shared-{vm}")),
            want,
            "{vm} read the shared file through DAX"
        );
        assert_eq!(read(format!("written-{vm}")).len(), 64);
        assert_eq!(
            read(format!("written-{vm}")),
            read(format!("read-{vm}")),
            "{vm}'s 16 MiB on node 1 survived the other VM's traffic"
        );
    }
    let snap = d.snapshot();
    assert_eq!(snap.memory_regions.len(), 2);
    for r in &snap.memory_regions {
        assert!(r.traps > 0 && r.device_misses > 0, "{r:?}");
        assert!(
            r.vmm_traps * 10 >= r.traps * 9,
            "the region's traps are its own VMM's: {r:?}"
        );
    }
    for row in &snap.vms {
        assert!(row.traps > 0, "{} trapped on the DAX file: {row:?}", row.vm);
    }
    assert!(
        snap.device.resident_pages <= CACHE_PAGES,
        "one device cache for both regions and the file: {} pages",
        snap.device.resident_pages
    );
    let st = d.stop();
    assert!(st.success(), "clean shutdown: {st}\n{}", d.diagnostics());
}

/// `cxlfs ctl --json ARGS` against the test's daemon: the result.
fn ctl(d: &Daemon, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(cxlfs_e2e::cxlfs_cli())
        .args(["ctl", "--json", "--socket"])
        .arg(d.work_dir().join("control.sock"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cxlfs ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A daemon with a 128 MiB region for vm0, an 8 MiB cache and `settings`
/// (`--set` values) whose guest writes 16 MiB of random bytes on node 1
/// and reads them back `reads` times; every read must match. Returns the
/// daemon, still serving, for its metrics.
fn write_16mib_on_node1(settings: &[&str], reads: usize) -> Daemon {
    let mut args = vec![
        "--cxl-memory".to_string(),
        "vm0=128MiB".into(),
        "--set".into(),
        format!("cache.size_bytes={CACHE}"),
    ];
    for s in settings {
        args.extend(["--set".to_string(), s.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start(&["vm0"], &args, |_| {});
    let read_back: String = (0..reads)
        .map(|i| format!("numactl --membind=1 sha256sum </dev/shm/a >$out/read{i}.sum\n"))
        .collect();
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
out=/mnt/.cxlfs
numactl --membind=1 sh -c "dd if=/dev/urandom bs=1M count=16 2>/dev/null | tee /dev/shm/a | sha256sum" >$out/written.sum
{read_back}"#
    ));
    let run = d.boot("vm0", &cxl_vm()).wait();
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
    let out = d.share().join(".cxlfs");
    let hash = |f: &str| {
        let t = fs::read_to_string(out.join(f)).unwrap();
        t.split_whitespace().next().unwrap().to_string()
    };
    let written = hash("written.sum");
    assert_eq!(written.len(), 64);
    for i in 0..reads {
        assert_eq!(
            written,
            hash(&format!("read{i}.sum")),
            "16 MiB intact, read {i}"
        );
    }
    d
}

#[test]
fn prefetched_region_pages_are_pushed_and_guest_stores_survive_them() {
    let _serial = exclusive();
    let mut d = write_16mib_on_node1(&["prefetch.degree=8"], 2);
    let r = d.snapshot().memory_regions.into_iter().next().unwrap();
    assert!(
        r.prefetch_filled_pages > 0,
        "prefetched region pages were pushed into the plane: {r:?}\n{}",
        d.diagnostics()
    );
    let st = d.stop();
    assert!(st.success(), "clean shutdown: {st}\n{}", d.diagnostics());
}

#[test]
fn region_write_backs_go_through_the_device_write_log() {
    let _serial = exclusive();
    let mut d = write_16mib_on_node1(&["cache.write_log_bytes=1MiB"], 1);
    let r = d.snapshot().memory_regions.into_iter().next().unwrap();
    assert!(
        r.writeback_bytes >= 8 << 20,
        "2× the cache written: write-backs happened: {r:?}"
    );
    // A 4 KiB write-back is 64 lines of the log.
    assert!(
        r.log_writes >= r.writeback_bytes / 4096 * 64 / 2,
        "the region's write-backs were charged through the write log: {r:?}\n{}",
        d.diagnostics()
    );
    let st = d.stop();
    assert!(st.success(), "clean shutdown: {st}\n{}", d.diagnostics());
}

#[test]
fn the_cxl_node_is_a_lower_memory_tier_than_dram() {
    let _serial = exclusive();
    let mut d = daemon();
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
cat /run/cxlfs/memory-tiers >/mnt/.cxlfs/tiers 2>&1 || echo none >/mnt/.cxlfs/tiers
"#
    ));
    let opts = VmOptions {
        backports_kernel: true,
        ..cxl_vm()
    };
    let run = d.boot("vm0", &opts).wait();
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
    let tiers = fs::read_to_string(d.share().join(".cxlfs/tiers")).unwrap();
    // "<tier>:<nodes>;..." in tier order; a larger tier is slower.
    let of = |node: &str| {
        tiers.trim().split(';').find_map(|t| {
            let (tier, nodes) = t.split_once(':')?;
            nodes
                .split(',')
                .any(|n| n == node)
                .then(|| tier.parse::<u32>().ok())
                .flatten()
        })
    };
    let (dram, cxl) = (of("0"), of("1"));
    assert!(
        dram.is_some() && cxl.is_some() && cxl > dram,
        "node 1 in a lower tier than node 0: {tiers:?}\n{}",
        d.diagnostics()
    );
    let st = d.stop();
    assert!(st.success(), "clean shutdown: {st}\n{}", d.diagnostics());
}
