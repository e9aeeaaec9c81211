//! The FUSE operations beyond plain read/write, with real guests on `cxlfsd`:
//!
//! * `posix_suite_cache_never`, `posix_suite_cache_auto`, `posix_suite_dax`:
//!   the conformance runner `cxlfs-posix run` in one guest per caching mode
//!   (`--cache never`, `--cache auto`, a DAX window with a small device
//!   cache); the host reads its JSON, prints the failures, and wants none
//!   (and at least [`POSIX_MIN_CASES`] cases). The same guest also makes a
//!   hard-link pair, a FIFO, a character device, extended attributes (a
//!   `user.` one and a `security.` one, which the daemon keeps on the host
//!   as `user.cxlfs.security.*`), a file with a punched hole and a file
//!   copied with copy_file_range(2); the host checks each of them after the
//!   guest exits.
//! * `fsx_dax_small_cache`: `cxlfs-fsx` (random reads, writes, mmap
//!   reads/writes, truncates, fallocate, punch/zero range, copy_file_range,
//!   all checked against a shadow copy) on a DAX mount whose device cache
//!   (1 MiB) is far smaller than the file (up to 8 MiB), so pages are evicted
//!   and refault all the time; no operation may be turned off as unsupported.
//!   Then `cxlfs-fsx --self-test-corrupt` on the same mount must fail: its
//!   checks do catch a byte changed behind its back.
//! * `fsx_dax_small_cache_with_a_write_log`: the same fsx run with the
//!   device's write log on (`cache.write_log_bytes`): every write-back goes
//!   through the log; fsx's checks hold and the log took lines.
//! * `locks_between_two_vms`: POSIX locks across VMs on one daemon: VM1 sees
//!   VM0's write lock (F_GETLK, F_SETLK = EAGAIN) and its F_SETLKW waits until
//!   VM0 lets go.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{env_knob, exclusive, Daemon, GuestRun, VmOptions, GUEST_PRELUDE};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The fewest cases a `cxlfs-posix run` must have run.
const POSIX_MIN_CASES: u64 = 100;

/// The summary line of `cxlfs-fsx` (its last line on stdout), as key=value
/// pairs.
fn fsx_summary(text: &str) -> Option<Vec<(String, String)>> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with("cxlfs-fsx: ops="))?;
    Some(
        line.trim_start_matches("cxlfs-fsx: ")
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn check_guest(run: &GuestRun, d: &Daemon, t: Instant) {
    eprintln!(
        "guest {} exited {:?} after {:.1?} (test {:.1?})",
        run.name,
        run.code,
        run.elapsed,
        t.elapsed()
    );
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
    assert!(run.serial.contains("guest-done"), "{}", run.describe());
}

/// fsx operations in `fsx_dax_small_cache` (`CXLFS_FSX_OPS` overrides;
/// `CXLFS_FSX_SEED` sets the seed, default 1). 50 000 took 44-64 s in the
/// guest (TCG, 2 host cores), so the full count fits well inside the budget.
const FSX_OPS: u64 = 50_000;
/// fsx operations in the variants that add one daemon feature to that run
/// (access sampling, a write log): enough for every operation kind many
/// times over and for the feature to act (each asserts it did), at a third
/// of the time; `CXLFS_FSX_OPS` overrides these too.
const FSX_VARIANT_OPS: u64 = 15_000;
const FSX_MAXLEN: u64 = 8 << 20;

/// With the window's accessed bits on (the daemon's default, QEMU given
/// the area): every resident page fsx reaches is referenced while it maps,
/// writes, punches and truncates them.
#[test]
fn fsx_dax_small_cache() {
    let m = fsx_dax(&[], FSX_OPS, true);
    let refs = m.count(
        "cxlfs_references_total",
        &[("vm", "vm0"), ("region", "file")],
    );
    let read = m.count(
        "cxlfs_access_bits_region_read_total",
        &[("vm", "vm0"), ("region", "file")],
    );
    eprintln!("accessed bits: {read} read, {refs} references");
    assert!(read > 0 && refs > 0, "the window's bits were never read");
}

/// `fsx_dax_small_cache` with access sampling at its highest rate: resident
/// pool pages keep leaving the window (dirty ones written back with their
/// programs deferred) while fsx maps, writes and punches them.
#[test]
fn fsx_dax_small_cache_with_access_sampling() {
    // Sampling serves what the bits do not: the bits off.
    let m = fsx_dax(
        &["--access-sampling", "1000000/s", "--access-bits", "off"],
        FSX_VARIANT_OPS,
        false,
    );
    let sampled = m.count(
        "cxlfs_sampled_accesses_total",
        &[("vm", "vm0"), ("region", "file")],
    );
    let armed = m.count("cxlfs_sampling_armed_pages_total", &[]);
    eprintln!("sampling: {armed} pages armed, {sampled} sampled accesses");
    assert!(armed > 0 && sampled > 0, "sampling caught nothing");
}

#[test]
fn fsx_dax_small_cache_with_a_write_log() {
    // Every write-back of the run lands in a 256 KiB log (64-byte lines,
    // cleaned at 51 % full): fsx's checks hold, and the log was used.
    let m = fsx_dax(
        &["--set", "cache.write_log_bytes=256KiB"],
        FSX_VARIANT_OPS,
        true,
    );
    let lines = m.count("cxlfs_log_writes_all_total", &[]);
    let cleanings = m.count("cxlfs_log_cleanings_total", &[]);
    eprintln!("write log: {lines} lines written, {cleanings} cleanings");
    assert!(lines > 0, "no write-back went through the write log");
}

/// The fsx run of the DAX tests over a 1 MiB device cache, with `extra`
/// daemon flags and `ops` operations, QEMU given the window's bit area if
/// `bits`; returns the daemon's last metrics.
fn fsx_dax(extra: &[&str], ops: u64, bits: bool) -> cxlfs_e2e::Metrics {
    let _serial = exclusive();
    let t = Instant::now();
    let ops: u64 = env_knob("CXLFS_FSX_OPS", ops);
    let seed: u64 = env_knob("CXLFS_FSX_SEED", 1);
    let mut args = vec![
        "--cache",
        "never",
        "--dax-window",
        "64MiB",
        "--set",
        "cache.size_bytes=1MiB",
        "--set",
        "nand.read_ns=5us",
    ];
    args.extend_from_slice(extra);
    let mut d = Daemon::start(&["vm0"], &args, |_| {});
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
grep ' /mnt virtiofs ' /proc/mounts | grep -q dax=always || {{ echo "not a DAX mount"; cat /proc/mounts; exit 1; }}
rc=0
cxlfs-fsx -N {ops} -S {seed} -l {FSX_MAXLEN} /mnt/fsx.bin >/tmp/fsx.out 2>/tmp/fsx.err || rc=$?
tail -n 60 /tmp/fsx.err
cat /tmp/fsx.out
cat /tmp/fsx.out /tmp/fsx.err >/mnt/.cxlfs/fsx.log || true
echo "FSX-RC=$rc"
[ "$rc" = 0 ] || exit "$rc"
# The checker itself: a byte changed behind fsx's back must fail the run.
rc=0
cxlfs-fsx -N 2000 -l 1048576 --self-test-corrupt /mnt/fsx-corrupt.bin >/tmp/st.out 2>/tmp/st.err || rc=$?
grep -m1 MISMATCH /tmp/st.err || true
echo "SELF-TEST-RC=$rc"
[ "$rc" = 1 ] && grep -q MISMATCH /tmp/st.err || {{ tail -n 40 /tmp/st.err; echo "fsx missed a corrupted byte"; exit 1; }}
echo guest-done
"#
    ));
    let mut opts = VmOptions::dax("64M");
    opts.timeout = Duration::from_secs(900);
    opts.access_bits = bits;
    let run = d.boot("vm0", &opts).wait();
    check_guest(&run, &d, t);
    assert!(run.serial.contains("SELF-TEST-RC=1"), "{}", run.describe());
    let summary = fsx_summary(&run.serial)
        .unwrap_or_else(|| panic!("no cxlfs-fsx summary line\n{}", run.describe()));
    eprintln!("fsx summary: {summary:?}");
    let get = |k: &str| {
        summary
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {k}= in the fsx summary {summary:?}"))
    };
    assert_eq!(get("ops"), ops.to_string());
    assert_eq!(
        get("disabled"),
        "[]",
        "fsx turned operations off as unsupported\n{}",
        run.describe()
    );
    for k in [
        "reads",
        "writes",
        "mapreads",
        "mapwrites",
        "truncates",
        "fallocs",
        "punches",
        "zeroes",
        "copies",
    ] {
        let n: u64 = get(k).parse().unwrap();
        assert!(n > 0, "fsx did no {k}: {summary:?}");
    }
    let m = d.scrape();
    for op in ["fallocate", "copy_file_range"] {
        let c = m.count(
            "cxlfs_fuse_requests_total",
            &[("vm", "vm0"), ("opcode", op)],
        );
        assert!(c > 0, "no FUSE {op} request reached the daemon");
    }
    let evictions = m.count("cxlfs_pool_evictions_total", &[]);
    let traps = m.count("cxlfs_pool_traps_total", &[("vm", "vm0")]);
    eprintln!("pool traps {traps}, evictions {evictions}");
    assert!(
        evictions > 0,
        "a 1 MiB device cache under an 8 MiB file evicted nothing"
    );
    assert!(d.stop().success(), "{}", d.diagnostics());
    eprintln!("fsx over DAX {extra:?}: {ops} ops, {:.1?}", t.elapsed());
    m
}

/// The guest half of the posix tests: `cxlfs-posix run` on a directory of
/// the share (its JSON in `.cxlfs/posix-MODE.json`), then the objects the
/// host checks after the guest is gone, in `ops/`.
fn posix_guest_script(mode: &str) -> String {
    format!(
        r#"{GUEST_PRELUDE}
mkdir -p /mnt/posix /mnt/ops
if [ "{mode}" = dax ]; then
    grep ' /mnt virtiofs ' /proc/mounts | grep -q dax=always || {{ echo "not a DAX mount"; exit 1; }}
fi
if command -v cxlfs-posix >/dev/null 2>&1; then
    rc=0
    cxlfs-posix run /mnt/posix --json /mnt/.cxlfs/posix-{mode}.json >/tmp/posix.out 2>&1 || rc=$?
    tail -n 100 /tmp/posix.out
    echo "POSIX-RC=$rc"
else
    echo "NO-CXLFS-POSIX: the guest image has no cxlfs-posix"
fi
# For the host: a hard-link pair, a FIFO, /dev/null's device numbers,
# extended attributes, a punched hole, a copy_file_range copy.
echo linked >/mnt/ops/link-a
run ln /mnt/ops/link-a /mnt/ops/link-b
run mkfifo /mnt/ops/fifo
run mknod /mnt/ops/chardev c 1 3
: >/mnt/ops/xattrs
run cxlfs-fsx util setxattr /mnt/ops/xattrs user.cxlfs_test user-value
run cxlfs-fsx util setxattr /mnt/ops/xattrs security.test security-value
run cxlfs-fsx util setxattr /mnt/ops/xattrs trusted.test trusted-value
for a in user.cxlfs_test:user-value security.test:security-value trusted.test:trusted-value; do
    v=$(cxlfs-fsx util getxattr /mnt/ops/xattrs "${{a%%:*}}")
    [ "$v" = "${{a#*:}}" ] || {{ echo "guest getxattr ${{a%%:*}}: '$v'"; exit 1; }}
done
run dd if=/dev/urandom of=/mnt/ops/holes bs=64k count=16
run cxlfs-fsx util punch /mnt/ops/holes 512k 64k
cxlfs-fsx util holes /mnt/ops/holes >/tmp/holes
cp /tmp/holes /mnt/.cxlfs/holes-{mode}.txt
run dd if=/dev/urandom of=/mnt/ops/copy-src bs=64k count=20
cxlfs-fsx util copy /mnt/ops/copy-src /mnt/ops/copy-dst
cmp /mnt/ops/copy-src /mnt/ops/copy-dst || {{ echo "the guest's copy differs"; exit 1; }}
sync
echo guest-done
"#
    )
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// The value of extended attribute `name` of a host file (`None`: absent).
fn host_getxattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let (p, n) = (c_path(path), CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of the length given.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::ENODATA),
            "getxattr({}, {name}): {e}",
            path.display()
        );
        return None;
    }
    buf.truncate(r as usize);
    Some(buf)
}

/// The host's view of what the guest script made in `ops/`.
fn check_host_objects(share: &Path, mode: &str) {
    let ops = share.join("ops");
    let (a, b) = (
        fs::symlink_metadata(ops.join("link-a")).unwrap(),
        fs::symlink_metadata(ops.join("link-b")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino(), "{mode}: the hard links are one inode");
    assert_eq!(a.nlink(), 2, "{mode}: nlink of a hard-linked file");
    assert_eq!(fs::read(ops.join("link-b")).unwrap(), b"linked\n");

    let fifo = fs::symlink_metadata(ops.join("fifo")).unwrap();
    assert!(fifo.file_type().is_fifo(), "{mode}: fifo is {fifo:?}");
    let dev = fs::symlink_metadata(ops.join("chardev")).unwrap();
    assert!(
        dev.file_type().is_char_device(),
        "{mode}: chardev is {dev:?}"
    );
    assert_eq!(dev.rdev(), libc::makedev(1, 3), "{mode}: chardev's rdev");

    let x = ops.join("xattrs");
    assert_eq!(
        host_getxattr(&x, "user.cxlfs_test").as_deref(),
        Some(&b"user-value"[..]),
        "{mode}: a guest user.* attribute is kept as it is"
    );
    for ns in ["security", "trusted"] {
        assert_eq!(
            host_getxattr(&x, &format!("user.cxlfs.{ns}.test")).as_deref(),
            Some(format!("{ns}-value").as_bytes()),
            "{mode}: the guest's {ns}.test is user.cxlfs.{ns}.test on the host"
        );
        assert_eq!(
            host_getxattr(&x, &format!("{ns}.test")),
            None,
            "{mode}: the guest's {ns}.test reached the host's {ns}.* namespace"
        );
    }

    // 1 MiB of data with 64 KiB punched out at 512 KiB.
    let holes = ops.join("holes");
    let data = fs::read(&holes).unwrap();
    assert_eq!(
        data.len() as u64,
        MIB,
        "{mode}: the punched file keeps its size"
    );
    let (h0, h1) = ((512 * KIB) as usize, (576 * KIB) as usize);
    assert!(
        data[h0..h1].iter().all(|&x| x == 0),
        "{mode}: the punched range reads as zeros on the host"
    );
    assert!(
        data[h0 - 4096..h0].iter().any(|&x| x != 0) && data[h1..h1 + 4096].iter().any(|&x| x != 0),
        "{mode}: the data around the hole is gone"
    );
    let f = fs::File::open(&holes).unwrap();
    let seek = |off: u64, whence: i32| {
        // SAFETY: lseek on an open descriptor.
        unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, whence) }
    };
    assert_eq!(
        seek(0, libc::SEEK_HOLE),
        h0 as i64,
        "{mode}: the host's first hole (SEEK_HOLE from 0)"
    );
    assert_eq!(
        seek(h0 as u64, libc::SEEK_DATA),
        h1 as i64,
        "{mode}: data again after the hole (SEEK_DATA)"
    );
    assert_eq!(seek(h1 as u64, libc::SEEK_HOLE), MIB as i64);
    let guest_holes = fs::read_to_string(share.join(format!(".cxlfs/holes-{mode}.txt"))).unwrap();
    assert_eq!(
        guest_holes,
        format!("data 0 {h0}\ndata {h1} {MIB}\n"),
        "{mode}: the guest's SEEK_DATA/SEEK_HOLE (LSEEK) view of the punched file"
    );

    assert_eq!(
        fs::read(ops.join("copy-dst")).unwrap(),
        fs::read(ops.join("copy-src")).unwrap(),
        "{mode}: the copy_file_range copy on the host"
    );
}

/// One guest runs the posix suite and makes the objects; the host checks
/// both.
/// A case that fails for a documented reason outside the daemon: its name
/// starts with `case` and its detail names `errno`.
struct Known {
    case: &'static str,
    errno: &'static str,
    why: &'static str,
}

/// In every mode: Linux takes `user.*` attributes (where a guest's
/// `trusted.*` / `security.*` live on the host) on regular files and
/// directories only (daemon/README.md, "FUSE operations").
const XATTR_ON_SYMLINK: Known = Known {
    case: "xattr on a symlink",
    errno: "EPERM",
    why: "the host refuses user.* attributes on symlinks",
};

/// `--cache never` only: guest kernel 6.1 refuses a shared mapping of a
/// FOPEN_DIRECT_IO file (ENODEV), as on virtiofsd `--cache=never`.
const MMAP_DIRECT_IO: Known = Known {
    case: "mmap ",
    errno: "ENODEV",
    why: "the guest kernel refuses MAP_SHARED on direct-I/O files",
};

fn posix_suite(mode: &str, args: &[&str], opts: VmOptions, known: &[Known]) {
    let _serial = exclusive();
    let t = Instant::now();
    let mut d = Daemon::start(&["vm0"], args, |_| {});
    d.write_guest_script(&posix_guest_script(mode));
    let mut opts = opts;
    opts.timeout = Duration::from_secs(600);
    let run = d.boot("vm0", &opts).wait();
    check_guest(&run, &d, t);
    let share = d.share().to_path_buf();
    check_host_objects(&share, mode);
    // The guest kernel sent these requests (it has fallbacks of its own for
    // some: copy_file_range by splice, SEEK_DATA by the generic code).
    let m = d.scrape();
    for op in [
        "link",
        "mknod",
        "setxattr",
        "getxattr",
        "fallocate",
        "lseek",
        "copy_file_range",
    ] {
        let c = m.count(
            "cxlfs_fuse_requests_total",
            &[("vm", "vm0"), ("opcode", op)],
        );
        eprintln!("{mode}: FUSE {op} requests: {c}");
        assert!(c > 0, "{mode}: no FUSE {op} request reached the daemon");
    }
    assert!(
        !run.serial.contains("NO-CXLFS-POSIX"),
        "{mode}: the guest image has no cxlfs-posix (the host checks passed)"
    );
    let json_path = share.join(format!(".cxlfs/posix-{mode}.json"));
    let text = fs::read_to_string(&json_path).unwrap_or_else(|e| {
        panic!(
            "{mode}: no posix JSON {}: {e}\n{}",
            json_path.display(),
            run.describe()
        )
    });
    let v: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{mode}: bad posix JSON: {e}\n{text}"));
    let n = |k: &str| {
        v[k].as_u64()
            .unwrap_or_else(|| panic!("{mode}: no {k} in the posix JSON\n{text}"))
    };
    let (passed, failed, total) = (n("passed"), n("failed"), n("total"));
    let failures: Vec<String> = v["failures"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| f.as_str().map_or_else(|| f.to_string(), str::to_string))
                .collect()
        })
        .unwrap_or_default();
    eprintln!(
        "posix suite ({mode}): passed {passed}, failed {failed}, total {total}, {:.1?}",
        t.elapsed()
    );
    let mut unexplained = Vec::new();
    for f in &failures {
        match known
            .iter()
            .find(|k| f.starts_with(k.case) && f.contains(k.errno))
        {
            Some(k) => eprintln!("  known difference ({mode}): {f} — {}", k.why),
            None => {
                eprintln!("  FAILED ({mode}): {f}");
                unexplained.push(f.clone());
            }
        }
    }
    assert_eq!(
        failures.len() as u64,
        failed,
        "{mode}: the JSON lists every failure"
    );
    assert!(
        unexplained.is_empty(),
        "{mode}: posix cases failed:\n{}\n{}",
        unexplained.join("\n"),
        run.describe()
    );
    assert!(
        total >= POSIX_MIN_CASES,
        "{mode}: only {total} posix cases ran (want >= {POSIX_MIN_CASES})"
    );
    if failed == 0 {
        assert!(run.serial.contains("POSIX-RC=0"), "{}", run.describe());
    }
    assert!(d.stop().success(), "{}", d.diagnostics());
    eprintln!("posix_suite ({mode}): {:.1?}", t.elapsed());
}

#[test]
fn posix_suite_cache_never() {
    posix_suite(
        "never",
        &["--cache", "never"],
        VmOptions::default(),
        &[XATTR_ON_SYMLINK, MMAP_DIRECT_IO],
    );
}

#[test]
fn posix_suite_cache_auto() {
    posix_suite(
        "auto",
        &["--cache", "auto"],
        VmOptions::default(),
        &[XATTR_ON_SYMLINK],
    );
}

#[test]
fn posix_suite_dax() {
    posix_suite(
        "dax",
        &[
            "--cache",
            "never",
            "--dax-window",
            "64M",
            "--set",
            "cache.size_bytes=8MiB",
            "--set",
            "nand.read_ns=5us",
        ],
        VmOptions::dax("64M"),
        &[XATTR_ON_SYMLINK],
    );
}

/// Seconds VM0 holds its lock in `locks_between_two_vms`.
const LOCK_HOLD_S: u64 = 20;

#[test]
fn locks_between_two_vms() {
    let _serial = exclusive();
    let t = Instant::now();
    let mut d = Daemon::start(&["vm0", "vm1"], &["--cache", "never"], |share| {
        fs::write(share.join("lockfile"), b"lock me\n").unwrap();
    });
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
if [ "$CXLFS_VM" = vm0 ]; then
    rc=0
    cxlfs-posix lock-hold /mnt/lockfile {LOCK_HOLD_S} /mnt/held >/tmp/hold.out 2>&1 || rc=$?
    cat /tmp/hold.out
    echo "HOLD-RC=$rc"
    [ "$rc" = 0 ] || exit 1
else
    n=0
    while [ ! -e /mnt/held ]; do
        n=$((n + 1)); [ $n -lt 6000 ] || {{ echo "vm0 never held the lock"; exit 1; }}
        sleep 0.02
    done
    rc=0
    cxlfs-posix lock-probe /mnt/lockfile >/tmp/probe.out 2>&1 || rc=$?
    cat /tmp/probe.out
    echo "PROBE-RC=$rc"
    cp /tmp/probe.out /mnt/.cxlfs/probe.out
    rc=0
    cxlfs-posix lock-wait /mnt/lockfile >/tmp/wait.out 2>&1 || rc=$?
    cat /tmp/wait.out
    echo "WAIT-RC=$rc"
    cp /tmp/wait.out /mnt/.cxlfs/wait.out
fi
echo guest-done
"#
    ));
    let opts = VmOptions {
        timeout: Duration::from_secs(300),
        ..VmOptions::default()
    };
    let vm0 = d.boot("vm0", &opts);
    let vm1 = d.boot("vm1", &opts);
    let runs = [vm0.wait(), vm1.wait()];
    for run in &runs {
        check_guest(run, &d, t);
    }
    let (hold, other) = (&runs[0].serial, &runs[1].serial);
    assert!(hold.contains("HOLD-RC=0"), "{}", runs[0].describe());
    let probe = fs::read_to_string(d.share().join(".cxlfs/probe.out")).unwrap_or_default();
    eprintln!("vm1 lock-probe:\n{probe}");
    assert!(
        other.contains("PROBE-RC=0"),
        "lock-probe saw no conflict\n{}",
        runs[1].describe()
    );
    assert!(
        probe
            .lines()
            .any(|l| l.starts_with("conflict") && l.contains("type=wr")),
        "lock-probe: F_GETLK did not report vm0's write lock: {probe}"
    );
    assert!(
        probe.lines().any(|l| l.trim() == "setlk=EAGAIN"),
        "lock-probe: F_SETLK did not fail with EAGAIN: {probe}"
    );
    let wait = fs::read_to_string(d.share().join(".cxlfs/wait.out")).unwrap_or_default();
    eprintln!("vm1 lock-wait: {}", wait.trim());
    assert!(
        other.contains("WAIT-RC=0"),
        "lock-wait failed\n{}",
        runs[1].describe()
    );
    let waited: u64 = wait
        .lines()
        .find_map(|l| l.trim().strip_prefix("waited_ms="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("lock-wait printed no waited_ms=: {wait}"));
    assert!(
        waited > 1000,
        "F_SETLKW in vm1 returned after {waited} ms: it did not wait for vm0's lock ({LOCK_HOLD_S} s)"
    );
    assert!(
        waited < (LOCK_HOLD_S + 30) * 1000,
        "F_SETLKW waited {waited} ms, far longer than vm0 held the lock"
    );
    let m = d.scrape();
    let op = |o: &str| m.count("cxlfs_fuse_requests_total", &[("vm", "vm1"), ("opcode", o)]);
    eprintln!(
        "vm1: getlk {} setlk {} setlkw {}",
        op("getlk"),
        op("setlk"),
        op("setlkw")
    );
    assert!(
        op("getlk") > 0 && op("setlkw") > 0,
        "vm1's lock requests reached no daemon"
    );
    assert!(d.stop().success(), "{}", d.diagnostics());
    eprintln!("locks_between_two_vms: {:.1?}", t.elapsed());
}
