//! Cache control at run time with a real guest: the host drives a real
//! `cxlfsd` through `cxlfs ctl` (its control socket), and the guest
//! through `cxlfs-hint` (`CXLFS_IOC_HINT`, forwarded by the stock Debian
//! 6.1 kernel as FUSE_IOCTL). Device: 4 MiB fully associative FIFO cache,
//! 50 µs NAND reads, no prefetcher, `--cache never` (every guest read reaches
//! the device), per-VM pin quota 512 KiB.
//!
//! * host `prefetch` of a file turns the guest's reads of it into hits;
//! * host `pin` of half a file: after an 8 MiB scan (twice the cache) the
//!   pinned half still hits, the other half misses;
//! * guest `pin` within the quota works; over the quota it fails with
//!   EDQUOT; `nobody` cannot pin a root-only file (it cannot open it);
//!   a guest `set-policy` is refused (no `--guest-device-control`);
//!   guest `evict` turns hits back into misses;
//! * `set-policy` through every policy while the guest reads and checks an
//!   8 MiB file three times: no error, no changed byte;
//! * `cxlfs ctl stats --json` agrees with the Prometheus counters.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{
    cxlfs_cli, exclusive, handshake, seeded_bytes, Daemon, Metrics, VmOptions, GUEST_PRELUDE,
};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

/// `cxlfs ctl --socket S ARGS --json`: the result, or the error text.
fn ctl(sock: &Path, args: &[&str]) -> Result<Value, String> {
    let out = Command::new(cxlfs_cli())
        .arg("ctl")
        .arg("--socket")
        .arg(sock)
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// vm0's (hits, misses) in a scrape.
fn vm0(m: &Metrics) -> (u64, u64) {
    (
        m.count("cxlfs_device_hits_total", &[("vm", "vm0")]),
        m.count("cxlfs_device_misses_total", &[("vm", "vm0")]),
    )
}

#[test]
fn host_and_guest_cache_control_change_what_the_device_does() {
    let _serial = exclusive();
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("ctl.sock");
    let sock_arg = sock.display().to_string();
    let scan = seeded_bytes(8 * MIB, 3);
    let mut d = Daemon::start(
        &["vm0"],
        &[
            "--cache",
            "never",
            "--preset",
            "femu",
            "--set",
            "cache.size_bytes=4MiB",
            "--set",
            "cache.ways=0",
            "--set",
            "cache.policy=fifo",
            "--set",
            "prefetch.degree=0",
            "--set",
            "nand.read_ns=50us",
            "--pin-quota-bytes",
            "512KiB",
            "--control-socket",
            &sock_arg,
        ],
        |share| {
            fs::write(share.join("pf.bin"), seeded_bytes(MIB, 1)).unwrap();
            fs::write(share.join("hot.bin"), seeded_bytes(MIB, 2)).unwrap();
            fs::write(share.join("scan.bin"), &scan).unwrap();
            fs::write(share.join("g.bin"), seeded_bytes(MIB, 4)).unwrap();
            fs::write(share.join("secret.bin"), seeded_bytes(64 * KIB, 5)).unwrap();
            fs::set_permissions(share.join("secret.bin"), fs::Permissions::from_mode(0o600))
                .unwrap();
        },
    );
    let sha = cxlfs_e2e::sha256_hex(&d.share().join("scan.bin"));
    fs::write(d.share().join(".cxlfs/scan.sha"), format!("{sha}\n")).unwrap();
    // The script runs from /tmp: reading it from the share would charge the device.
    let script = format!(
        r#"[ -n "${{CXLFS_COPIED:-}}" ] || {{ cp /mnt/.cxlfs/run.sh /tmp/run.sh; CXLFS_COPIED=1 exec sh /tmp/run.sh; }}
{GUEST_PRELUDE}
rd() {{ dd if="/mnt/$1" of=/dev/null bs=64k 2>/dev/null; }}
fail() {{ cat /tmp/e 2>/dev/null; echo "E2E-FAILED: $*"; exit 1; }}
handshake 1
rd pf.bin
handshake 2
rd hot.bin
rd scan.bin
handshake 3
rd hot.bin
handshake 4
run cxlfs-hint pin /mnt/g.bin --len 256k
if cxlfs-hint pin /mnt/g.bin 2>/tmp/e; then fail "an over-quota pin succeeded"; fi
grep -q "quota" /tmp/e || fail "no quota error"
if su -s /bin/sh nobody -c "cxlfs-hint pin /mnt/secret.bin" 2>/tmp/e; then fail "nobody pinned a root-only file"; fi
grep -q "Permission denied" /tmp/e || fail "no permission error"
if cxlfs-hint set-policy /mnt lru 2>/tmp/e; then fail "a guest changed the policy"; fi
grep -q "not permitted" /tmp/e || fail "no EPERM"
cxlfs-hint stats /mnt/g.bin >/mnt/.cxlfs/hint-stats.txt 2>/tmp/e || fail "stats"
run cxlfs-hint evict /mnt/pf.bin
handshake 5
rd pf.bin
handshake 6
i=0
while [ $i -lt 3 ]; do
    sha256sum /mnt/scan.bin | cut -d' ' -f1 >/tmp/sum
    cmp -s /tmp/sum /mnt/.cxlfs/scan.sha || fail "scan.bin differs under set_policy (round $i)"
    i=$((i + 1))
done
: >/mnt/.cxlfs/load-done
handshake 7
"#
    );
    d.write_guest_script(&script);
    let mut vm = d.boot("vm0", &VmOptions::default());
    let fail = |d: &Daemon, msg: String| -> ! { panic!("{msg}\n{}", d.diagnostics()) };

    handshake(&d, &mut vm, 1, || {
        let pf = ctl(&sock, &["prefetch", "--file", "pf.bin"]).unwrap_or_else(|e| fail(&d, e));
        assert_eq!(
            (pf["pages"].as_u64(), pf["changed"].as_u64()),
            (Some(256), Some(256))
        );
        let pin = ctl(&sock, &["pin", "--file", "hot.bin", "--len", "512KiB"])
            .unwrap_or_else(|e| fail(&d, e));
        assert_eq!(pin["changed"].as_u64(), Some(128));
    });
    let m1 = d.scrape();
    let before = vm0(&m1);
    handshake(&d, &mut vm, 2, || {
        let now = vm0(&d.scrape());
        assert_eq!(
            (now.0 - before.0, now.1 - before.1),
            (256, 0),
            "the prefetched file is all hits\n{}",
            d.diagnostics()
        );
    });
    let mut mark = (0, 0);
    handshake(&d, &mut vm, 3, || mark = vm0(&d.scrape()));
    handshake(&d, &mut vm, 4, || {
        let now = vm0(&d.scrape());
        assert_eq!(
            (now.0 - mark.0, now.1 - mark.1),
            (128, 128),
            "after the scan: the pinned half hits, the other half misses\n{}",
            d.diagnostics()
        );
    });
    handshake(&d, &mut vm, 5, || {
        let st = ctl(&sock, &["stats"]).unwrap_or_else(|e| fail(&d, e));
        assert_eq!(
            st["vms"]["vm0"]["pinned_bytes"].as_u64(),
            Some(256 * KIB),
            "{st}"
        );
        assert_eq!(
            st["total"]["pinned_bytes"].as_u64(),
            Some(768 * KIB),
            "{st}"
        );
        assert_eq!(
            st["policy"], "fifo",
            "the guest could not change the policy"
        );
        let hint = fs::read_to_string(d.share().join(".cxlfs/hint-stats.txt")).unwrap();
        assert!(hint.contains("pinned_bytes=262144"), "{hint}");
        assert!(hint.contains("pin_quota_bytes=524288"), "{hint}");
        assert!(hint.contains("policy=fifo"), "{hint}");
        mark = vm0(&d.scrape());
    });
    handshake(&d, &mut vm, 6, || {
        let now = vm0(&d.scrape());
        assert_eq!(
            (now.0 - mark.0, now.1 - mark.1),
            (0, 256),
            "the guest's evict turned hits into misses\n{}",
            d.diagnostics()
        );
    });
    // set_policy under load, until the guest has checked the file 3 times.
    let names = ["lru", "clock", "s3fifo", "2q", "lfru", "lifo", "fifo"];
    let done = d.share().join(".cxlfs/load-done");
    let t = Instant::now();
    let mut switches = 0usize;
    let mut last = "fifo";
    while !done.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(240),
            "the guest's load never ended\n{}",
            d.diagnostics()
        );
        if !vm.running() {
            break;
        }
        let name = names[switches % names.len()];
        let r = ctl(&sock, &["set-policy", name]).unwrap_or_else(|e| fail(&d, e));
        assert_eq!(r["policy"], name);
        last = name;
        switches += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    handshake(&d, &mut vm, 7, || {
        let st = ctl(&sock, &["stats"]).unwrap_or_else(|e| fail(&d, e));
        let m = d.scrape();
        assert_eq!(st["policy"], last);
        let (hits, misses) = vm0(&m);
        assert_eq!(st["vms"]["vm0"]["hits"].as_u64(), Some(hits), "{st}");
        assert_eq!(st["vms"]["vm0"]["misses"].as_u64(), Some(misses), "{st}");
        assert_eq!(
            st["vms"]["vm0"]["traps"].as_u64(),
            Some(m.count("cxlfs_pool_traps_total", &[("vm", "vm0")]))
        );
        assert_eq!(
            st["total"]["hits"].as_u64(),
            Some(m.count("cxlfs_device_hits_all_total", &[]))
        );
        assert_eq!(
            st["total"]["misses"].as_u64(),
            Some(m.count("cxlfs_device_misses_all_total", &[]))
        );
        // Human output, and clear errors from the CLI.
        let out = Command::new(cxlfs_cli())
            .args(["ctl", "--socket"])
            .arg(&sock)
            .arg("stats")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success()
                && text.contains("vm0")
                && text.contains(&format!("policy {last}")),
            "{text}"
        );
        let err = ctl(&sock, &["pin", "--file", "../etc/passwd"]).unwrap_err();
        assert!(err.contains("forbidden"), "{err}");
        let err = ctl(&sock, &["set-cxl-ratio", "130"]).unwrap_err();
        assert!(err.contains("0..=100"), "{err}");
    });
    let run = vm.wait();
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
    assert!(
        switches >= 3,
        "only {switches} policy switches happened under load"
    );
    eprintln!("{switches} policy switches while the guest read and checked 24 MiB");
    assert!(d.stop().success());
}
