//! The patched QEMU's accessed bits
//! (`qemu-configs/patches/qemu-7.2-tcg-accessed-bits.patch`), on a real TCG
//! guest with no daemon: a CXL node backed by a plain file and a bit area
//! the test wrote (`--cxl-abits`). A page's bit is set when a vCPU's TLB
//! entry for it is filled; QEMU drops the node's TLB entries every period,
//! so a page touched again shows again once its bit was cleared. An area
//! that does not match the node is refused at start, naming both.
#![allow(clippy::unwrap_used)]

use cxlfs_api::abits::{AreaHeader, HEADER_BYTES};
use cxlfs_e2e::{exclusive, guest_image, patched_qemu, repo_root};
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The CXL node's size and pages.
const NODE_MIB: u64 = 64;
const PAGES: u64 = NODE_MIB << 8;
/// The pages the guest chases (8 MiB).
const CHASED: u64 = 2048;
/// QEMU's re-arm period the area asks for.
const PERIOD_US: u32 = 50_000;
/// Bytes of the area's header: its bits start there.
const HEADER: u64 = HEADER_BYTES as u64;

/// Writes a bit area for `pages` pages, every bit clear, as the daemon
/// does (the layout is `cxlfs_api::abits`, the one QEMU reads).
fn write_area(path: &Path, pages: u64) {
    let f = File::create(path).unwrap();
    f.write_all_at(AreaHeader::new(pages, PERIOD_US).bytes(), 0)
        .unwrap();
    f.set_len(AreaHeader::area_bytes(pages)).unwrap();
}

/// The area's header fields QEMU writes and its bits set.
#[derive(Debug, Clone, Copy)]
struct Seen {
    active: u32,
    rearms: u64,
    bits_set: u64,
    set_now: u64,
}

fn read_area(path: &Path) -> Seen {
    let b = fs::read(path).unwrap();
    let h = AreaHeader::read(&b).unwrap();
    Seen {
        active: h.active,
        rearms: h.rearms,
        bits_set: h.bits_set,
        set_now: b[HEADER as usize..]
            .iter()
            .map(|x| u64::from(x.count_ones()))
            .sum(),
    }
}

/// Clears every bit (as the daemon does after a scan).
fn clear_bits(path: &Path) {
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    let bits = AreaHeader::bits_bytes(PAGES);
    f.write_all_at(&vec![0u8; bits as usize], HEADER).unwrap();
}

/// `run-vm.sh` for a guest with a 64 MiB CXL node on `dir/cxl.mem` and the
/// bit area `area`, running `cmd`.
fn run_vm(dir: &Path, area: &Path, cmd: &str) -> Command {
    let mut c = Command::new(repo_root().join("qemu-configs/run-vm.sh"));
    c.env("QEMU", patched_qemu())
        .arg("--image")
        .arg(guest_image())
        .args(["--name", "abits", "--smp", "1", "--mem", "512M"])
        .args(["--cxl-memory", &format!("{NODE_MIB}M"), "--cxl-memory-path"])
        .arg(dir.join("cxl.mem"))
        .arg("--cxl-abits")
        .arg(area)
        .arg("--serial")
        .arg(dir.join("serial.log"))
        .args(["--timeout", "180", "--cmd", cmd])
        .stdin(Stdio::null());
    c
}

/// Polls the area until `done` holds, `limit` passes or the guest's
/// QEMU is gone; the last reading.
fn wait_for(area: &Path, vm: &mut Child, limit: Duration, done: impl Fn(&Seen) -> bool) -> Seen {
    let t = Instant::now();
    loop {
        let s = read_area(area);
        let gone = !matches!(vm.try_wait(), Ok(None));
        if done(&s) || gone || t.elapsed() > limit {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_guest_sets_the_bits_of_the_cxl_pages_it_touches_and_again_once_cleared() {
    let _serial = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("abits");
    write_area(&area, PAGES);
    // 8 MiB on node 1, chased page by page for 30 s (ended by timeout:
    // busybox's exits 143, GNU's 124).
    let cmd = "timeout 30 numactl --membind=1 cxlfs-memlat --size 8m --stride 4096 \
               --laps 1000000 >/dev/null; rc=$?; [ $rc = 143 ] || [ $rc = 124 ]";
    let mut vm = run_vm(dir.path(), &area, cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = wait_for(&area, &mut vm, Duration::from_secs(120), |s| {
        s.active == 1 && s.set_now >= CHASED
    });
    if started.active != 1 {
        let out = vm.wait_with_output().unwrap();
        panic!(
            "QEMU did not mark the area active: {started:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        started.set_now >= CHASED && started.set_now <= PAGES,
        "the chased pages' bits: {started:?}"
    );
    // Cleared, every chased page shows again within a few periods: QEMU
    // drops the node's TLB entries each period, and the next load fills.
    let mut rounds = Vec::new();
    for _ in 0..3 {
        clear_bits(&area);
        let cleared = Instant::now();
        let again = wait_for(&area, &mut vm, Duration::from_secs(10), |s| {
            s.set_now >= CHASED
        });
        rounds.push((again.set_now, cleared.elapsed()));
    }
    let end = read_area(&area);
    eprintln!("accessed bits: start {started:?}; after each clear {rounds:?}; end {end:?}");
    for (set, took) in &rounds {
        assert!(
            *set >= CHASED,
            "only {set} of the {CHASED} chased pages showed again ({took:?} after the clear)"
        );
    }
    assert!(
        end.rearms > started.rearms,
        "no re-arm counted: {started:?} then {end:?}"
    );
    assert!(
        end.bits_set >= started.bits_set + 3 * CHASED,
        "QEMU's count of bits it set: {started:?} then {end:?}"
    );
    let out = vm.wait_with_output().unwrap();
    let serial = fs::read_to_string(dir.path().join("serial.log")).unwrap_or_default();
    assert!(
        out.status.success() && serial.contains("CXLFS-EXIT=0"),
        "the guest's chase did not run its 30 s: {:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        serial
    );
}

#[test]
fn an_area_that_does_not_match_the_node_is_refused_naming_both() {
    let _serial = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("abits");
    write_area(&area, 100);
    let out = run_vm(dir.path(), &area, "true").output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "QEMU started with a wrong area:\n{text}"
    );
    assert!(
        text.contains(&format!(
            "accessed-bit area {} has 100 pages",
            area.display()
        )) && text.contains(&format!("has {PAGES}")),
        "the error names the area and the node's pages:\n{text}"
    );
}
