//! The DAX window under pressure: more files in use at once than the window
//! has ranges, so the guest's FUSE DAX code keeps taking ranges back from one
//! file (REMOVEMAPPING) and handing them to another (SETUPMAPPING).
//!
//! * `four_writers_share_a_small_window`: four `cxlfs-fsx` at once, each on
//!   its own 4 MiB file (reads, writes, mmap reads and writes, truncates,
//!   fallocate, punch, zero range, copies, fsync, reopen), through an 8 MiB
//!   window (4 ranges of 2 MiB) with a 4 MiB device cache: thousands of
//!   remaps a minute.
//! * `one_writer_through_a_two_range_window`: one `cxlfs-fsx` with the same
//!   mix through a 4 MiB window (2 ranges, the smallest `cxlfsd` accepts):
//!   its file and its copy source need three ranges, and its mapped stores
//!   cross the 2 MiB boundary, where one access needs both ranges at once.
//!
//! In both, every syscall must succeed (an application never sees EBUSY on
//! a regular file), every writer must keep making progress (a guest
//! watchdog fails the run when one prints no progress line for a minute,
//! after dumping the blocked tasks, every file-system task's stack, samples
//! of the writers' stacks and CPU time, and a second of the `fs_dax`
//! trace) and finish within the bound, each exerciser's shadow copy must
//! match its file, the host's bytes must equal what the guest read through
//! its window, the window must really have changed hands but not thrashed
//! (at most [`MAX_MAPS_PER_OP`] mappings per operation), the daemon must
//! have refused no mapping, and the guest's range reclaim must never have
//! failed.
//!
//! The stock guest kernel fails the first (Debian's 6.1 and 6.12 alike):
//! its range reclaim gets -EBUSY from `invalidate_inode_pages2_range` on a
//! range whose file was written through mmap, hands that EBUSY to
//! read()/write(), and once fewer ranges are left than a fault needs the
//! fault waits forever (`guest-kernel-patches/fuse-dax-reclaim.patch`).
//! Without `fuse-dax-reclaim-on-demand.patch` the second thrashes: the
//! guest's background reclaim keeps one of the two ranges free, so it takes
//! back whatever a fault just mapped (12-21 mappings per operation, 3-5
//! minutes instead of one and a half; docs/dax-window.md).
//!
//! Knobs, for reruns of the other scenarios of docs/dax-window.md (each
//! test's own values are the defaults): `CXLFS_PRESSURE_WRITERS`,
//! `_OPS`, `_MAXLEN_MIB`, `_WINDOW_MIB`, `_BOUND_S`, `_WATCHDOG_S`,
//! `_STALL_S`, `_SEED` (writer s runs seed SEED + s - 1), `_SMP` (vCPUs),
//! `_NAND_READ` (e.g. `40us`), `_MMAP=0` (no mmap), `_FSX` (the host path
//! of another exerciser taking fsx's flags, e.g. a static build of
//! xfstests' `ltp/fsx.c`), `_STRADDLE=1` (`cxlfs-fsx util straddle`: `_OPS`
//! stores across the 2 MiB boundary); `CXLFS_GUEST_IMAGE` boots another image (an
//! older build in the cache, to compare with).
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{env_knob, exclusive, sha256_hex, Daemon, GuestRun, VmOptions, GUEST_PRELUDE};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Each exerciser prints a progress line every this many operations.
const PROGRESS_EVERY: u64 = 50;
/// A window that holds its writers' ranges remaps a few times per
/// operation at most (0.1-1 here); one whose ranges are taken back as soon
/// as they are mapped remaps 12-21 times.
const MAX_MAPS_PER_OP: u64 = 4;

/// One run: writers, window and bounds.
#[derive(Debug)]
struct Scenario {
    /// Exercisers at once, one file each.
    writers: u64,
    /// Operations per exerciser.
    ops: u64,
    /// Each file's largest size, MiB.
    maxlen_mib: u64,
    /// The DAX window, MiB (a multiple of 2).
    window_mib: u64,
    /// The bound on the guest's run.
    bound_s: u64,
    /// The guest reports writers still running after this long...
    watchdog_s: u64,
    /// ...or one that printed no progress line for this long.
    stall_s: u64,
}

impl Scenario {
    /// `self` with the `CXLFS_PRESSURE_*` knobs applied.
    fn with_env(self) -> Self {
        Scenario {
            writers: env_knob("CXLFS_PRESSURE_WRITERS", self.writers),
            ops: env_knob("CXLFS_PRESSURE_OPS", self.ops),
            maxlen_mib: env_knob("CXLFS_PRESSURE_MAXLEN_MIB", self.maxlen_mib),
            window_mib: env_knob("CXLFS_PRESSURE_WINDOW_MIB", self.window_mib),
            bound_s: env_knob("CXLFS_PRESSURE_BOUND_S", self.bound_s),
            watchdog_s: env_knob("CXLFS_PRESSURE_WATCHDOG_S", self.watchdog_s),
            stall_s: env_knob("CXLFS_PRESSURE_STALL_S", self.stall_s),
        }
    }
}

#[test]
fn four_writers_share_a_small_window() {
    // Four at once took 75-80 s of guest time here on one day, 190-250 s
    // on another (TCG, 2 cores), at 5 000 operations each; at 3 000 the
    // four 4 MiB files still need twice the window for most of the run,
    // at 60 % of the time. A
    // stall is caught by the progress watchdog within a minute, so the
    // bound on the whole run can be wide.
    run(Scenario {
        writers: 4,
        ops: 3_000,
        maxlen_mib: 4,
        window_mib: 8,
        bound_s: 600,
        watchdog_s: 560,
        stall_s: 60,
    }
    .with_env());
}

#[test]
fn one_writer_through_a_two_range_window() {
    // 42-48 s of guest time here alone, 90 s beside another guest (3-4
    // minutes without fuse-dax-reclaim-on-demand.patch).
    run(Scenario {
        writers: 1,
        ops: 5_000,
        maxlen_mib: 4,
        window_mib: 4,
        bound_s: 420,
        watchdog_s: 400,
        stall_s: 60,
    }
    .with_env());
}

/// What each writer runs in the guest.
enum Exerciser {
    /// The image's `cxlfs-fsx` (`--no-mmap` with `CXLFS_PRESSURE_MMAP=0`).
    Fsx { mmap: bool },
    /// Another exerciser taking fsx's flags, copied in from its host path
    /// (`CXLFS_PRESSURE_FSX`, e.g. a static build of xfstests' fsx).
    External { host: PathBuf, mmap: bool },
    /// `cxlfs-fsx util straddle` (`CXLFS_PRESSURE_STRADDLE=1`): stores
    /// across the 2 MiB boundary, each needing two window ranges at once.
    Straddle,
}

impl Exerciser {
    fn from_env() -> Self {
        let mmap = std::env::var("CXLFS_PRESSURE_MMAP").as_deref() != Ok("0");
        if std::env::var("CXLFS_PRESSURE_STRADDLE").as_deref() == Ok("1") {
            return Exerciser::Straddle;
        }
        match std::env::var_os("CXLFS_PRESSURE_FSX") {
            Some(host) => Exerciser::External {
                host: PathBuf::from(host),
                mmap,
            },
            None => Exerciser::Fsx { mmap },
        }
    }

    /// The host file to copy into the share as `fsx-bin`, if any.
    fn external(&self) -> Option<&PathBuf> {
        match self {
            Exerciser::External { host, .. } => Some(host),
            _ => None,
        }
    }

    /// Writer `$s`'s command line (shell; `$s` is the writer's number).
    fn command(&self, sc: &Scenario, seed0: u64) -> String {
        let (ops, maxlen, every) = (sc.ops, sc.maxlen_mib << 20, PROGRESS_EVERY);
        let fsx_args = format!(
            "-N {ops} -S $((s + {seed0} - 1)) -l {maxlen} -o 1048576 -p {every} /mnt/fsx/f$s"
        );
        match self {
            Exerciser::Fsx { mmap: true } => format!("cxlfs-fsx {fsx_args}"),
            Exerciser::Fsx { mmap: false } => format!("cxlfs-fsx --no-mmap {fsx_args}"),
            Exerciser::External { mmap: true, .. } => format!("/tmp/fsx -P /tmp {fsx_args}"),
            Exerciser::External { mmap: false, .. } => {
                format!("/tmp/fsx -P /tmp -R -W {fsx_args}")
            }
            Exerciser::Straddle => format!("cxlfs-fsx util straddle /mnt/fsx/f$s {ops}"),
        }
    }

    /// The line a successful run of writer `seed` ends with.
    fn summary(&self, ops: u64, seed: u64) -> String {
        match self {
            Exerciser::Fsx { .. } => format!("cxlfs-fsx: ops={ops} seed={seed} "),
            Exerciser::External { .. } => format!("All {ops} operations completed A-OK!"),
            Exerciser::Straddle => format!("straddle: {ops} stores across "),
        }
    }
}

/// The guest's report on a stalled or slow run (a shell function; the
/// script sets `writers`): the writers' last output, the blocked tasks
/// (sysrq w), every task in the file system or the writers whatever its
/// state, samples of the writers' stacks and CPU time, a second of the
/// `fs_dax` trace, and the kernel's first failures.
const STALL_REPORT: &str = r#"stall_report() {
    for s in $(seq 1 $writers); do [ -e /tmp/fsx$s.rc ] || { echo "fsx $s:"; tail -n 3 /tmp/fsx$s.out; tail -n 5 /tmp/fsx$s.err; }; done
    echo w >/proc/sysrq-trigger; sleep 2
    # Every task in the file system or the writers, whatever its state
    # (sysrq w shows only D): name, pid, state, stack.
    for p in /proc/[0-9]*; do
        c=$(cat $p/comm 2>/dev/null) || continue
        if grep -q -e fuse -e dax -e virtio "$p/stack" 2>/dev/null || [ "$c" = cxlfs-fsx ] || [ "$c" = fsx ]; then
            echo "== $c ${p#/proc/} $(cut -d' ' -f3 $p/stat) wchan=$(cat $p/wchan 2>/dev/null)"; cat "$p/stack"
        fi
    done
    # Is a writer spinning? Its stack and CPU time, sampled.
    for i in 1 2 3 4 5; do
        for p in /proc/[0-9]*; do
            case "$(cat $p/comm 2>/dev/null)" in cxlfs-fsx|fsx) ;; *) continue;; esac
            echo "-- sample $i: $(cut -d' ' -f3,14,15 $p/stat) $(head -n 3 $p/stack | tr '\n' ' ')"
        done
        sleep 0.3
    done
    t=/sys/kernel/tracing; [ -e $t/events ] || { mount -t tracefs none $t 2>/dev/null || t=/sys/kernel/debug/tracing; }
    if [ -e $t/events/fs_dax ]; then
        echo 1 >$t/events/fs_dax/enable; sleep 1; echo 0 >$t/events/fs_dax/enable
        echo "-- fs_dax trace, 1 s: $(grep -vc '^#' $t/trace) events"; grep -v '^#' $t/trace | head -n 20
    fi
    for f in /sys/kernel/debug/virtio-fs* /sys/fs/fuse/connections/*/waiting; do [ -e "$f" ] && echo "$f: $(cat $f 2>/dev/null)"; done
    grep -m 30 -e failed -e WARN -e 'Call Trace' -e RIP -e 'Failed' /tmp/kmsg || true
}
"#;

/// The guest's script: the writers, their watchdog, the checksums.
fn guest_script(sc: &Scenario, fsx: &Exerciser, seed0: u64) -> String {
    let Scenario {
        writers,
        watchdog_s,
        stall_s,
        ..
    } = *sc;
    let (command, progress_every) = (fsx.command(sc, seed0), PROGRESS_EVERY);
    format!(
        r#"{GUEST_PRELUDE}{STALL_REPORT}writers={writers}
grep ' /mnt virtiofs ' /proc/mounts | grep -q dax=always || {{ echo "not a DAX mount"; cat /proc/mounts; exit 1; }}
mount -t debugfs none /sys/kernel/debug 2>/dev/null || true
echo 'module fuse format failed +p' >/sys/kernel/debug/dynamic_debug/control 2>/dev/null || true
# The guest kernel's messages from here on (its DAX range reclaim failures).
cat /proc/kmsg >/tmp/kmsg &
kmsg=$!
[ -e /mnt/fsx-bin ] && cp /mnt/fsx-bin /tmp/fsx && chmod +x /tmp/fsx
pids=
for s in $(seq 1 {writers}); do
    ( rc=0; {command} >/tmp/fsx$s.out 2>/tmp/fsx$s.err || rc=$?
      echo $rc >/tmp/fsx$s.rc ) &
    pids="$pids $!"
    echo 0 >/tmp/moved$s; echo 0 >/tmp/size$s
done
# A watchdog: a writer that printed no progress line (one every
# {progress_every} operations) for {stall_s} s has stalled; writers still
# running after {watchdog_s} s are too slow. Either is reported with the
# guest kernel's blocked tasks (sysrq w), then the script fails.
t=0
while [ "$(ls /tmp/fsx*.rc 2>/dev/null | wc -l)" -lt {writers} ]; do
    sleep 5; t=$((t + 5))
    why=
    for s in $(seq 1 {writers}); do
        [ -e /tmp/fsx$s.rc ] && continue
        n=$(cat /tmp/fsx$s.out /tmp/fsx$s.err | wc -c)
        if [ "$n" != "$(cat /tmp/size$s)" ]; then echo "$n" >/tmp/size$s; echo $t >/tmp/moved$s; fi
        [ $((t - $(cat /tmp/moved$s))) -ge {stall_s} ] && why="writer $s made no progress for {stall_s} s"
    done
    [ "$t" -ge {watchdog_s} ] && why="writers still running after $t s"
    if [ -n "$why" ]; then
        echo "STALLED: $why"
        stall_report
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
    )
}

fn run(sc: Scenario) {
    let _serial = exclusive();
    let t = Instant::now();
    let seed0: u64 = env_knob("CXLFS_PRESSURE_SEED", 1);
    let nand_read = std::env::var("CXLFS_PRESSURE_NAND_READ").unwrap_or_else(|_| "5us".into());
    let fsx = Exerciser::from_env();
    let mut d = Daemon::start(
        &["vm0"],
        &[
            "--dax-window",
            &format!("{}MiB", sc.window_mib),
            "--set",
            "cache.size_bytes=4MiB",
            "--set",
            &format!("nand.read_ns={nand_read}"),
        ],
        |share| {
            std::fs::create_dir_all(share.join("fsx")).unwrap();
            if let Some(bin) = fsx.external() {
                std::fs::copy(bin, share.join("fsx-bin")).unwrap();
            }
        },
    );
    d.write_guest_script(&guest_script(&sc, &fsx, seed0));
    let bound = Duration::from_secs(sc.bound_s);
    let mut opts = VmOptions::dax(&format!("{}M", sc.window_mib));
    opts.timeout = bound + Duration::from_secs(270);
    opts.smp = env_knob("CXLFS_PRESSURE_SMP", 1);
    let run = d.boot("vm0", &opts).wait();
    eprintln!(
        "{} writers: guest {:.1?}, test {:.1?}",
        sc.writers,
        run.elapsed,
        t.elapsed()
    );
    check_guest(&sc, &fsx, seed0, &run, &d);
    check_window(&sc, &d);
    assert!(d.stop().success(), "{}", d.diagnostics());
    // After a clean stop the host files hold every store the guest made.
    for s in 1..=sc.writers {
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

/// What the guest said: no stall, no EBUSY, every writer done in time,
/// no reclaim failure.
fn check_guest(sc: &Scenario, fsx: &Exerciser, seed0: u64, run: &GuestRun, d: &Daemon) {
    assert!(
        !run.serial.contains("STALLED"),
        "a writer stalled or ran too long\n{}\n{}",
        run.describe(),
        d.diagnostics()
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
    for s in 1..=sc.writers {
        assert!(
            run.serial.contains(&format!("FSX-{s}-RC=0")),
            "exerciser {s} failed\n{}",
            run.describe()
        );
        assert!(
            run.serial.contains(&fsx.summary(sc.ops, s + seed0 - 1)),
            "exerciser {s} did not finish its {} operations\n{}",
            sc.ops,
            run.describe()
        );
    }
    let bound = Duration::from_secs(sc.bound_s);
    assert!(
        run.elapsed < bound,
        "{} exercisers took {:.1?} (bound {bound:?})\n{}",
        sc.writers,
        run.elapsed,
        run.describe()
    );
    assert!(
        run.serial.contains("RECLAIM-FAILURES=0"),
        "the guest's DAX range reclaim failed (or the guest did not say)\n{}",
        run.describe()
    );
}

/// The daemon's window figures: under pressure, not thrashing, nothing
/// refused.
fn check_window(sc: &Scenario, d: &Daemon) {
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
    // More file ranges in use than the window holds: ranges changed hands.
    assert!(
        reuses > 10 * sc.writers,
        "only {reuses} slot reuses: the window was never under pressure"
    );
    let ops = sc.ops * sc.writers;
    assert!(
        maps <= MAX_MAPS_PER_OP * ops,
        "{maps} mappings for {ops} operations: the guest's reclaim takes back ranges in use \
         (more than {MAX_MAPS_PER_OP} per operation)"
    );
    assert_eq!(
        refusals,
        0,
        "the daemon refused a mapping\n{}",
        d.diagnostics()
    );
}
