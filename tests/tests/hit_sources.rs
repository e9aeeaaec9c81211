//! The daemon's hit sources end to end, on real TCG guests and the
//! patched QEMU: with `--access-bits on` (the default) the daemon makes an
//! accessed-bit area beside each VM's socket; a guest whose QEMU attaches
//! it (`run-vm.sh --dax-abits` / `--cxl-abits`) has its hits on resident
//! pages — reads through its DAX window, loads from its CXL node — told to
//! the device's policy as references, with no trap. A guest whose QEMU does
//! not attach it is served by access sampling, and the daemon says so.
#![allow(clippy::unwrap_used)]

use cxlfs_api::hits::HitSourceKind;
use cxlfs_api::metrics::{HitSourceSample, MetricsSnapshot};
use cxlfs_e2e::{exclusive, handshake, Daemon, VmOptions, GUEST_PRELUDE};
use std::fs;
use std::time::Duration;

/// The row of VM `vm`'s `region` from the accessed-bit source.
fn bits_row(snap: &MetricsSnapshot, vm: &str, region: &str) -> HitSourceSample {
    snap.hit_sources
        .iter()
        .find(|r| {
            r.vm == vm && r.region.as_str() == region && r.source == HitSourceKind::AccessBits
        })
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no accessed-bit row for {vm} {region}: {:?}",
                snap.hit_sources
            )
        })
}

fn daemon_log(d: &Daemon) -> String {
    fs::read_to_string(d.work_dir().join("daemon.log")).unwrap_or_default()
}

/// Starts a daemon with `args` (a share holding `data` of `data_bytes`
/// bytes when not 0), runs `script` in one guest booted with `opts`, and
/// returns the stopped daemon, its snapshot while the guest is still
/// connected (one more scan after the script's end) and its last one
/// (the guest gone).
fn run_guest(
    args: &[&str],
    data_bytes: usize,
    script: &str,
    opts: &VmOptions,
) -> (Daemon, MetricsSnapshot, MetricsSnapshot) {
    let mut d = Daemon::start(&["vm0"], args, |share| {
        if data_bytes > 0 {
            fs::write(share.join("data"), vec![0x5a; data_bytes]).unwrap();
        }
    });
    d.write_guest_script(&format!("{GUEST_PRELUDE}\n{script}\nhandshake 1\n"));
    let mut vm = d.boot("vm0", opts);
    let live = handshake(&d, &mut vm, 1, || {
        std::thread::sleep(Duration::from_millis(300));
        d.snapshot()
    });
    let run = vm.wait();
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
    std::thread::sleep(Duration::from_millis(300));
    let last = d.snapshot();
    d.stop();
    (d, live, last)
}

/// 16 MiB read three times through a 64 MiB DAX window, a 32 MiB device
/// cache: the first read misses every page, the next two find them
/// resident and mapped, and reach the device only through the bits.
#[test]
fn a_dax_windows_hits_reach_the_policy_as_references() {
    let _serial = exclusive();
    const PAGES: u64 = 16 * 256;
    let opts = VmOptions {
        access_bits: true,
        ..VmOptions::dax("64M")
    };
    let (d, live, snap) = run_guest(
        &[
            "--dax",
            "on",
            "--dax-window",
            "64MiB",
            "--set",
            "cache.size_bytes=32MiB",
            "--access-bits",
            "on",
        ],
        (PAGES * 4096) as usize,
        "for i in 1 2 3; do run cat /mnt/data >/dev/null; sleep 1; done",
        &opts,
    );
    let row = bits_row(&snap, "vm0", "file");
    let vm = snap.vms.iter().find(|v| v.vm == "vm0").unwrap();
    let misses = vm.counter("device_misses");
    eprintln!(
        "window bits: {row:?}; device misses {misses}, hits {}; device references {}",
        vm.counter("device_hits"),
        snap.device.references
    );
    let serving = bits_row(&live, "vm0", "file").serving;
    assert_eq!(
        serving,
        HitSourceKind::AccessBits,
        "while connected: {row:?}"
    );
    // Its QEMU gone (the area still marked active), the bits serve nothing.
    assert_eq!(row.serving, HitSourceKind::None, "the VM left: {row:?}");
    assert!(row.rearms > 0 && row.vmm_bits_set >= PAGES, "{row:?}");
    // The second and third reads: every page referenced, at most once a
    // period (a read of 16 MiB spans a few periods under TCG).
    assert!(
        row.references >= PAGES && row.references <= row.bits_read,
        "references of the re-read pages: {row:?}"
    );
    assert!(
        misses <= PAGES + PAGES / 4,
        "the re-reads missed: {misses} misses for {PAGES} pages"
    );
    let log = daemon_log(&d);
    assert!(
        log.contains("hits through accessed bits"),
        "the daemon did not say which source serves vm0:\n{log}"
    );
}

/// A guest chases 4 MiB of its CXL node (an 8 MiB device cache) for 10 s:
/// after the first lap every load hits a resident, mapped page, seen only
/// through the bits.
#[test]
fn a_cxl_regions_hits_reach_the_policy_as_references() {
    let _serial = exclusive();
    let opts = VmOptions {
        cxl_memory: Some("64M".into()),
        access_bits: true,
        qemu: Some(cxlfs_e2e::patched_qemu().to_path_buf()),
        timeout: Duration::from_secs(240),
        ..VmOptions::default()
    };
    let (_d, live, snap) = run_guest(
        &[
            "--cxl-memory",
            "vm0=64MiB",
            "--set",
            "cache.size_bytes=8MiB",
        ],
        0,
        "rc=0\ntimeout 10 numactl --membind=1 cxlfs-memlat --size 4m --stride 4096 \
         --laps 1000000 >/dev/null || rc=$?\n[ $rc = 143 ] || [ $rc = 124 ]",
        &opts,
    );
    let row = bits_row(&snap, "vm0", "memory");
    let region = snap.memory_regions[0].clone();
    eprintln!("region bits: {row:?}; region {region:?}");
    let serving = bits_row(&live, "vm0", "memory").serving;
    assert_eq!(
        serving,
        HitSourceKind::AccessBits,
        "while connected: {row:?}"
    );
    // 1024 chased pages, seen again period after period for ~10 s.
    assert!(
        row.references >= 4 * 1024,
        "references of the chased pages: {row:?}"
    );
    assert!(
        region.device_misses < row.references,
        "the chase's hits outnumber its misses: {region:?} {row:?}"
    );
}

/// A guest whose QEMU is not given its area: after the grace the daemon
/// says so, and access sampling serves its window.
#[test]
fn a_vm_without_the_bits_is_served_by_sampling_and_the_daemon_says_so() {
    let _serial = exclusive();
    let (d, live, snap) = run_guest(
        &[
            "--dax",
            "on",
            "--dax-window",
            "64MiB",
            "--access-sampling",
            "2000/s",
        ],
        1 << 20,
        "run cat /mnt/data >/dev/null\nsleep 8",
        &VmOptions::dax("64M"),
    );
    let row = bits_row(&snap, "vm0", "file");
    let serving = bits_row(&live, "vm0", "file").serving;
    assert_eq!(serving, HitSourceKind::Sampling, "while connected: {row:?}");
    assert_eq!((row.bits_read, row.references), (0, 0), "{row:?}");
    let log = daemon_log(&d);
    assert!(
        log.contains("did not attach its accessed-bit area")
            && log.contains("access sampling (hinting faults)"),
        "the daemon did not say vm0 has no bits and what serves it:\n{log}"
    );
}
