//! Durability of stores made through the DAX window (issue 11, item 7).
//!
//! * `sigterm_loses_no_window_store`: a TCG guest on the patched QEMU
//!   stores a pattern into 64 KiB of a file through its DAX window (fio's mmap
//!   engine: plain stores, no msync, no FUSE WRITE or FSYNC reaches the
//!   daemon), then its VMM is frozen (SIGSTOP: it cannot unmap the window,
//!   which would make the host kernel write the pages back) and the daemon
//!   gets SIGTERM. After
//!   the daemon has exited, the host file holds the pattern: the shutdown
//!   wrote the pool's dirty pages back and fsynced the files. (Closing the
//!   daemon's own pool fd at unmount also writes them back — FUSE's flush
//!   runs `write_inode_now` — so the test guards the outcome; the explicit,
//!   ordered write-back is what adds the fsync and the device-model charge.) The periodic
//!   write-back is off (`--dax-writeback-interval 0`) so that only the
//!   shutdown path can have written the pages.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{exclusive, Daemon, VmOptions, GUEST_PRELUDE};
use std::fs;
use std::time::Duration;

const MIB: usize = 1 << 20;
const PATTERN: &[u8] = b"DAXSTORE";
/// Pages the guest stores into (64 KiB: few enough that the host kernel
/// leaves them dirty until the daemon writes them back).
const STORED: usize = 16;

#[test]
fn sigterm_loses_no_window_store() {
    let _serial = exclusive();
    const LEN: usize = 4 * MIB;
    let mut d = Daemon::start(
        &["vm0"],
        &[
            "--dax-writeback-interval",
            "0",
            "--dax-window",
            "64M",
            "--set",
            "nand.read_ns=1us",
        ],
        |share| fs::write(share.join("win.bin"), vec![0u8; LEN]).unwrap(),
    );
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
grep ' /mnt virtiofs ' /proc/mounts | grep -q dax=always || {{ echo "not a DAX mount"; cat /proc/mounts; exit 1; }}
# Keep the inode (and its DAX ranges) alive: REMOVEMAPPING makes QEMU
# munmap the slot, and the host kernel writes dirty pages back on munmap.
exec 3</mnt/win.bin
run fio --name=st --filename=/mnt/win.bin --ioengine=mmap --rw=write --bs=4k --size=64k \
    --buffer_pattern='"DAXSTORE"' --end_fsync=0 --fsync_on_close=0
handshake 1
sleep 600
"#
    ));
    let mut vm = d.boot("vm0", &VmOptions::dax("64M"));
    let share = d.share().to_path_buf();
    // The guest's `handshake 1`: its stores are done; it waits (and keeps
    // its window mapped) while the daemon is stopped.
    let ready = share.join(".cxlfs/ready-vm0-1");
    if !vm.wait_for_file(&ready, Duration::from_secs(300)) {
        panic!("the guest never finished its stores\n{}", d.diagnostics());
    }
    let metrics = d.scrape();
    let before = fs::read(share.join("win.bin")).unwrap();
    // Freeze the VMM: a live QEMU unmaps its window when the daemon goes,
    // and the host kernel writes dirty pages back on munmap. A frozen (or
    // hung) one does not, so only the daemon's shutdown can save the stores.
    let pgid = vm.process_group().expect("the guest runs") as libc::pid_t;
    // SAFETY: a plain system call on this test's own guest process group.
    assert_eq!(unsafe { libc::killpg(pgid, libc::SIGSTOP) }, 0);
    let status = d.stop();
    // SAFETY: as above; lets the guest be killed normally.
    unsafe { libc::killpg(pgid, libc::SIGCONT) };
    assert!(status.success(), "cxlfsd exit status {status}");
    let l = [("vm", "vm0"), ("opcode", "write")];
    assert_eq!(
        metrics.count("cxlfs_fuse_requests_total", &l),
        0,
        "the stores went through the window, not FUSE WRITE"
    );
    let l = [("vm", "vm0"), ("opcode", "fsync")];
    assert_eq!(
        metrics.count("cxlfs_fuse_requests_total", &l),
        0,
        "the guest never synced the file"
    );
    assert!(
        metrics.count("cxlfs_dax_maps_total", &[("vm", "vm0")]) >= 1,
        "the file was mapped through the window"
    );
    eprintln!(
        "window slots unmapped before SIGTERM: {}",
        metrics.count("cxlfs_dax_unmaps_total", &[("vm", "vm0")])
    );
    let pages = |b: &[u8]| {
        b.chunks(4096)
            .filter(|p| p.chunks(PATTERN.len()).all(|c| c == PATTERN))
            .count()
    };
    // The host kernel may already have written some back (FUSE's strict
    // dirty limits); a few pages usually stay dirty until the shutdown.
    eprintln!(
        "pages with the pattern on the host before SIGTERM: {} of {STORED}",
        pages(&before[..STORED * 4096])
    );
    let after = fs::read(share.join("win.bin")).unwrap();
    assert_eq!(after.len(), LEN, "the file keeps its size");
    assert_eq!(
        pages(&after[..STORED * 4096]),
        STORED,
        "every page stored through the window is in the host file after SIGTERM\n{}",
        d.diagnostics()
    );
    assert!(
        after[STORED * 4096..].iter().all(|&b| b == 0),
        "nothing else changed"
    );
    drop(vm);
}
