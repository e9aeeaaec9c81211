//! The DAX window under pressure: more files in use at once than the window
//! has ranges, so the guest's FUSE DAX code keeps taking ranges back from one
//! file (REMOVEMAPPING) and handing them to another (SETUPMAPPING).
//!
//! * `four_writers_share_a_small_window`: four `cxlfs-fsx` at once, each on
//!   its own 4 MiB file (reads, writes, mmap reads and writes, truncates,
//!   fallocate, punch, zero range, copies, fsync, reopen), through an 8 MiB
//!   window (4 ranges of 2 MiB) with a 4 MiB device cache: thousands of
//!   remaps a minute. Every syscall must succeed (an application never sees
//!   EBUSY on a regular file), all four must finish within the bound, each
//!   exerciser's shadow copy must match its file, the host's bytes must
//!   equal what the guest read through its window, the window must really
//!   have changed hands, the daemon must have refused no mapping, and the
//!   guest's range reclaim must never have failed.
//!
//! The stock guest kernel fails this (Debian's 6.1 and 6.12 alike): its
//! range reclaim gets -EBUSY from `invalidate_inode_pages2_range` on a range
//! whose file was written through mmap, hands that EBUSY to read()/write(),
//! and once fewer ranges are left than a fault needs the fault waits
//! forever. The image's fuse module carries the fix
//! (`guest-kernel-patches/fuse-dax-reclaim.patch`); `CXLFS_PRESSURE_MMAP=0`
//! runs the exercisers without mmap. On a stall the guest prints its blocked
//! tasks and the first reclaim failures.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{env_knob, exclusive, sha256_hex, Daemon, VmOptions, GUEST_PRELUDE};
use std::time::{Duration, Instant};

/// Operations per exerciser (`CXLFS_PRESSURE_OPS` overrides).
const OPS: u64 = 5_000;
/// Exercisers at once (`CXLFS_PRESSURE_WRITERS`), each one's largest file
/// in MiB (`CXLFS_PRESSURE_MAXLEN_MIB`), the window in MiB
/// (`CXLFS_PRESSURE_WINDOW_MIB`, a multiple of 2) and the bound on the
/// guest's run in seconds (`CXLFS_PRESSURE_BOUND_S`): the knobs rerun the
/// other window-pressure scenarios of docs/dax-window.md.
const WRITERS: u64 = 4;
const MAXLEN_MIB: u64 = 4;
const WINDOW_MIB: u64 = 8;
const BOUND_S: u64 = 330;
/// Seconds the guest lets its writers run before it reports a stall
/// (`CXLFS_PRESSURE_WATCHDOG_S` overrides).
const WATCHDOG_S: u64 = 300;

#[test]
fn four_writers_share_a_small_window() {
    let _serial = exclusive();
    let t = Instant::now();
    let ops: u64 = env_knob("CXLFS_PRESSURE_OPS", OPS);
    let watchdog_s: u64 = env_knob("CXLFS_PRESSURE_WATCHDOG_S", WATCHDOG_S);
    let writers: u64 = env_knob("CXLFS_PRESSURE_WRITERS", WRITERS);
    let maxlen: u64 = env_knob("CXLFS_PRESSURE_MAXLEN_MIB", MAXLEN_MIB) << 20;
    let window_mib: u64 = env_knob("CXLFS_PRESSURE_WINDOW_MIB", WINDOW_MIB);
    let bound = Duration::from_secs(env_knob("CXLFS_PRESSURE_BOUND_S", BOUND_S));
    let window_arg = format!("{window_mib}MiB");
    let mmap = std::env::var("CXLFS_PRESSURE_MMAP").as_deref() != Ok("0");
    let fsx_flags = if mmap { "" } else { "--no-mmap" };
    let mut d = Daemon::start(
        &["vm0"],
        &[
            "--dax-window",
            &window_arg,
            "--set",
            "cache.size_bytes=4MiB",
            "--set",
            "nand.read_ns=5us",
        ],
        |share| std::fs::create_dir_all(share.join("fsx")).unwrap(),
    );
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
grep ' /mnt virtiofs ' /proc/mounts | grep -q dax=always || {{ echo "not a DAX mount"; cat /proc/mounts; exit 1; }}
mount -t debugfs none /sys/kernel/debug 2>/dev/null || true
echo 'module fuse format failed +p' >/sys/kernel/debug/dynamic_debug/control 2>/dev/null || true
# The guest kernel's messages from here on (its DAX range reclaim failures).
cat /proc/kmsg >/tmp/kmsg &
kmsg=$!
pids=
for s in $(seq 1 {writers}); do
    ( rc=0; cxlfs-fsx {fsx_flags} -N {ops} -S $s -l {maxlen} -o 1048576 /mnt/fsx/f$s >/tmp/fsx$s.out 2>/tmp/fsx$s.err || rc=$?
      echo $rc >/tmp/fsx$s.rc ) &
    pids="$pids $!"
done
# A watchdog: writers still running after {watchdog_s} s are reported with
# the guest kernel's blocked tasks (sysrq w), then the script fails.
t=0
while [ "$(ls /tmp/fsx*.rc 2>/dev/null | wc -l)" -lt {writers} ]; do
    sleep 5; t=$((t + 5))
    if [ "$t" -ge {watchdog_s} ]; then
        echo "STALLED: writers still running after $t s"
        for s in $(seq 1 {writers}); do [ -e /tmp/fsx$s.rc ] || {{ echo "fsx $s:"; tail -n 5 /tmp/fsx$s.err; }}; done
        echo w >/proc/sysrq-trigger; sleep 2
        for p in /proc/[0-9]*; do
            if grep -q -e fuse -e dax "$p/stack" 2>/dev/null; then echo "== $(cat $p/comm) ${{p#/proc/}} $(cut -d' ' -f3 $p/stat)"; cat "$p/stack"; fi
        done
        grep -m 30 -e failed -e WARN -e 'Call Trace' -e RIP -e 'Failed' /tmp/kmsg || true
        exit 1
    fi
done
wait $pids
kill $kmsg 2>/dev/null || true
echo "RECLAIM-FAILURES=$(grep -c 'invalidate_inode_pages2_range() failed' /tmp/kmsg)"
bad=0
for s in $(seq 1 {writers}); do
    rc=$(cat /tmp/fsx$s.rc)
    tail -n 1 /tmp/fsx$s.out
    echo "FSX-$s-RC=$rc"
    if [ "$rc" != 0 ]; then bad=1; tail -n 30 /tmp/fsx$s.err; fi
done
# What the guest reads through its window, for the host to compare.
for s in $(seq 1 {writers}); do
    sha256sum /mnt/fsx/f$s | cut -d' ' -f1 >/tmp/sum$s
    cp /tmp/sum$s /mnt/.cxlfs/f$s.sha256
done
[ "$bad" = 0 ] || exit 1
echo guest-done
"#
    ));
    let mut opts = VmOptions::dax(&format!("{window_mib}M"));
    opts.timeout = bound + Duration::from_secs(270);
    let run = d.boot("vm0", &opts).wait();
    eprintln!(
        "{writers} writers: guest {:.1?}, test {:.1?}",
        run.elapsed,
        t.elapsed()
    );
    let busy = run.serial.matches("Device or resource busy").count();
    assert_eq!(
        busy,
        0,
        "a guest read or write failed with EBUSY\n{}\n{}",
        run.describe(),
        d.diagnostics()
    );
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
    assert!(run.serial.contains("guest-done"), "{}", run.describe());
    for s in 1..=writers {
        assert!(
            run.serial.contains(&format!("FSX-{s}-RC=0")),
            "exerciser {s} failed\n{}",
            run.describe()
        );
        let summary = format!("cxlfs-fsx: ops={ops} seed={s} ");
        assert!(
            run.serial.contains(&summary),
            "exerciser {s} did not finish its {ops} operations\n{}",
            run.describe()
        );
    }
    // The bound: four at once take 75-80 s of guest time here (TCG, 2
    // cores); 4x that on a loaded 2-core machine.
    assert!(
        run.elapsed < bound,
        "{writers} exercisers took {:.1?} (bound {bound:?})\n{}",
        run.elapsed,
        run.describe()
    );
    let m = d.scrape();
    let vm = [("vm", "vm0")];
    let maps = m.count("cxlfs_dax_maps_total", &vm);
    let unmaps = m.count("cxlfs_dax_unmaps_total", &vm);
    let reuses = m.count("cxlfs_dax_slot_reuses_total", &vm);
    let waits = m.count("cxlfs_dax_map_waits_total", &vm);
    let refusals = m.count("cxlfs_dax_map_refusals_total", &vm);
    eprintln!(
        "window: {maps} maps, {unmaps} unmaps, {reuses} slot reuses, {waits} waits, {refusals} refusals"
    );
    // Four 4 MiB files through 4 ranges: ranges changed hands all the time.
    assert!(
        reuses > 10 * writers,
        "only {reuses} slot reuses: the window was never under pressure"
    );
    assert_eq!(
        refusals,
        0,
        "the daemon refused a mapping\n{}",
        d.diagnostics()
    );
    assert!(
        run.serial.contains("RECLAIM-FAILURES=0"),
        "the guest's DAX range reclaim failed (or the guest did not say)\n{}",
        run.describe()
    );
    assert!(d.stop().success(), "{}", d.diagnostics());
    // After a clean stop the host files hold every store the guest made.
    for s in 1..=writers {
        let guest = std::fs::read_to_string(d.share().join(format!(".cxlfs/f{s}.sha256")))
            .unwrap_or_else(|e| panic!("no guest checksum of f{s}: {e}\n{}", run.describe()));
        let host = sha256_hex(&d.share().join(format!("fsx/f{s}")));
        assert_eq!(
            guest.trim(),
            host,
            "f{s}: the host's bytes differ from the guest's"
        );
    }
}
