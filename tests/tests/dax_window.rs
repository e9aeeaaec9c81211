//! One DAX window size, agreed by both sides: the patched QEMU asks the
//! back-end for its window (`VHOST_USER_GET_SHMEM_CONFIG`) and refuses to
//! start when `cache-size` is another size.
//!
//! * `a_cache_size_other_than_the_daemons_window_is_refused_at_start`: a
//!   daemon with an 8 MiB window; QEMU with `cache-size=16M` (the guest
//!   would map past the daemon's window) and with `cache-size=4M` exits at
//!   start, before the guest boots, with an error that names both sizes,
//!   the socket and the VM. Then, on the same daemon, `cache-size=8M`
//!   boots and reads a 12 MiB file through the window (every slot reused):
//!   the host's bytes, no mapping refused, no window overrun.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{exclusive, sha256_hex, Daemon, GuestRun, VmOptions, GUEST_PRELUDE};
use std::fs;
use std::time::Duration;

const MIB: usize = 1 << 20;

/// The guest job: the file's checksum through the window, to the share.
const READ_THROUGH_THE_WINDOW: &str = r#"
grep ' /mnt virtiofs ' /proc/mounts | grep -q dax=always || { echo "not a DAX mount"; cat /proc/mounts; exit 1; }
sha256sum /mnt/data.bin | cut -d' ' -f1 >/tmp/sum
cp /tmp/sum /mnt/.cxlfs/sum-$CXLFS_VM
echo guest-done
"#;

/// Boots `vm` on `d` with a window of `cache_size` and waits for it.
fn boot(d: &Daemon, vm: &str, cache_size: &str, timeout: Duration) -> GuestRun {
    let opts = VmOptions {
        timeout,
        ..VmOptions::dax(cache_size)
    };
    d.boot(vm, &opts).wait()
}

/// Asserts that QEMU refused `cache-size` = `ours` against the daemon's
/// `theirs` at start: run-vm.sh's status 125 (QEMU exited without the
/// guest's exit line), the guest never ran, and QEMU's error names both
/// sizes, the daemon's socket and the VM.
fn assert_refused(d: &Daemon, run: &GuestRun, ours: &str, theirs: &str) {
    let socket = d.socket(&run.name).display().to_string();
    let overruns = d
        .scrape()
        .count("cxlfs_dax_window_overruns_total", &[("vm", &run.name)]);
    let warns: Vec<String> = fs::read_to_string(d.work_dir().join("daemon.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("past the end of the DAX window"))
        .map(str::to_string)
        .collect();
    assert!(
        run.code == Some(125) && !run.serial.contains("CXLFS-EXIT="),
        "QEMU with cache-size {ours} on a daemon with a {theirs} window started a guest \
         (status {:?}; the daemon counted {overruns} window overruns, WARN lines: {warns:#?})\n{}",
        run.code,
        run.describe()
    );
    for part in [
        format!("cache-size is {ours}"),
        format!("has a DAX window of {theirs}"),
        format!("({socket})"),
        format!("of VM '{}'", run.name),
        "the two sizes must be equal".to_string(),
    ] {
        assert!(
            run.runner.contains(&part),
            "QEMU's error does not say {part:?}\n{}",
            run.describe()
        );
    }
    // The guest never ran: nothing was mapped, nothing overran.
    let m = d.scrape();
    let l = [("vm", run.name.as_str())];
    assert_eq!(m.count("cxlfs_dax_maps_total", &l), 0, "{}", run.name);
    assert_eq!(overruns, 0, "{}", run.name);
}

#[test]
fn a_cache_size_other_than_the_daemons_window_is_refused_at_start() {
    let _serial = exclusive();
    const FILE: usize = 12 * MIB;
    let data = cxlfs_e2e::seeded_bytes(FILE as u64, 43);
    let d = Daemon::start(
        &["big", "small", "same"],
        &[
            "--cache",
            "never",
            "--dax-window",
            "8MiB",
            "--set",
            "cache.size_bytes=4MiB",
            "--set",
            "nand.read_ns=5us",
        ],
        |share| fs::write(share.join("data.bin"), &data).unwrap(),
    );
    let want = sha256_hex(&d.share().join("data.bin"));
    d.write_guest_script(&format!("{GUEST_PRELUDE}{READ_THROUGH_THE_WINDOW}"));

    // A larger window than the daemon's: the guest would map past its end.
    let big = boot(&d, "big", "16M", Duration::from_secs(120));
    assert_refused(&d, &big, "16 MiB", "8 MiB");
    // A smaller one: refused too (one size, both sides).
    let small = boot(&d, "small", "4M", Duration::from_secs(120));
    assert_refused(&d, &small, "4 MiB", "8 MiB");

    // The same size boots on the same daemon and reads the file through
    // the window, 12 MiB through 8: every slot is mapped and reused.
    let same = boot(&d, "same", "8M", Duration::from_secs(240));
    assert!(same.ok(), "{}\n{}", same.describe(), d.diagnostics());
    assert!(same.serial.contains("guest-done"), "{}", same.describe());
    let got = fs::read_to_string(d.share().join(".cxlfs/sum-same")).unwrap();
    assert_eq!(got.trim(), want, "the file read through the window");
    let m = d.scrape();
    let l = [("vm", "same")];
    let maps = m.count("cxlfs_dax_maps_total", &l);
    assert!(
        maps >= (FILE / (2 * MIB)) as u64,
        "{maps} slots mapped for a 12 MiB file through 2 MiB slots\n{}",
        d.diagnostics()
    );
    assert!(
        m.has("cxlfs_dax_window_overruns_total"),
        "no overrun counter"
    );
    assert_eq!(m.count("cxlfs_dax_window_overruns_total", &l), 0);
    assert_eq!(m.count("cxlfs_dax_map_refusals_total", &l), 0);
}
