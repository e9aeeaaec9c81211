//! The DAX window with real guests: two TCG guests on the patched QEMU
//! mount the share with `-o dax=always`, so file pages are reached through
//! each VM's window, which maps the one shared pool.
//!
//! * `two_vms_share_the_pool_through_their_windows`: both VMs read one
//!   64 MiB file; they see the host's bytes, send no FUSE_READ, and the pool
//!   holds the file once (one trap per page, ~64 MiB resident, not 128).
//!   Then fio `ioengine=mmap` with verify in each VM, and a file VM0 writes
//!   (an extending write, then in-place stores through the window, fsync) is
//!   read back by VM1 and by the host while both guests still run.
//! * `misses_trap_and_are_charged`: a device cache smaller than the file;
//!   every trap is a device miss (the model's count equals the pool's
//!   FUSE_READs), evicted pages trap again on the next pass, residency stays
//!   at the cache size, the traps come through FUSE over io_uring where the
//!   kernel offers it; then the daemon is SIGKILLed while the guest faults
//!   and must still exit (the pool's exit guard aborts the connection).
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{
    exclusive, handshake, offset_pattern, sha256_hex, Daemon, Metrics, VmOptions, GUEST_PRELUDE,
};
use std::fs;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// Whether the host kernel offers FUSE over io_uring to new FUSE servers.
fn fuse_uring_offered() -> bool {
    fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|s| s.trim() == "Y")
}

fn m_text(m: &Metrics) -> String {
    format!("{m:?}")
}

#[test]
fn two_vms_share_the_pool_through_their_windows() {
    let _serial = exclusive();
    const SHARED: u64 = 64 * MIB;
    let shared = offset_pattern(SHARED, 64 * 1024);
    let mut d = Daemon::start(
        &["vm0", "vm1"],
        &[
            "--cache",
            "never",
            "--dax-window",
            "256M",
            "--set",
            "cache.size_bytes=256MiB",
            "--set",
            "nand.read_ns=5us",
        ],
        |share| fs::write(share.join("shared.bin"), &shared).unwrap(),
    );
    let want = sha256_hex(&d.share().join("shared.bin"));
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
grep ' /mnt virtiofs ' /proc/mounts | grep -q dax=always || {{ echo "not a DAX mount"; cat /proc/mounts; exit 1; }}
# 1. both VMs read the shared file through their windows
sha256sum /mnt/shared.bin | cut -d' ' -f1 >/tmp/sum
cp /tmp/sum /mnt/.cxlfs/shared-$CXLFS_VM.sha256
handshake 1
# 2. mmap I/O through the window, verified
run fio --name=mm --filename=/mnt/mm-$CXLFS_VM.bin --ioengine=mmap --rw=randwrite --bs=4k \
    --size=8M --verify=crc32c --do_verify=1
run fio --name=mm --filename=/mnt/mm-$CXLFS_VM.bin --ioengine=mmap --rw=randwrite --bs=4k \
    --size=8M --verify=crc32c --verify_only=1
# 3. VM0 writes a file (extending write, then stores in place), VM1 reads it
if [ "$CXLFS_VM" = vm0 ]; then
    run dd if=/dev/urandom of=/tmp/w bs=1M count=4
    run dd if=/tmp/w of=/mnt/w.bin bs=1M conv=fsync
    run dd if=/dev/urandom of=/mnt/w.bin bs=4k seek=100 count=64 conv=notrunc,fsync
    sha256sum /mnt/w.bin | cut -d' ' -f1 >/tmp/wsum
    cp /tmp/wsum /mnt/.cxlfs/w-vm0.sha256
    : >/mnt/.cxlfs/w-written
    handshake 2
else
    while [ ! -e /mnt/.cxlfs/w-written ]; do sleep 0.05; done
    sha256sum /mnt/w.bin | cut -d' ' -f1 >/tmp/wsum
    cp /tmp/wsum /mnt/.cxlfs/w-vm1.sha256
fi
echo guest-done
"#
    ));
    let opts = VmOptions::dax("256M");
    let mut vm0 = d.boot("vm0", &opts);
    let mut vm1 = d.boot("vm1", &opts);
    let after_read = handshake(&d, &mut vm0, 1, || {
        handshake(&d, &mut vm1, 1, || d.scrape())
    });
    // The host checks VM0's file while VM0 is still up: its fsync must
    // have written the window's stores back to the host file.
    let host_w = handshake(&d, &mut vm0, 2, || sha256_hex(&d.share().join("w.bin")));
    let runs = [vm0.wait(), vm1.wait()];
    for run in &runs {
        assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
        assert!(run.serial.contains("guest-done"), "{}", run.describe());
    }
    let share = d.share().to_path_buf();
    let guest_sum = |name: &str| {
        fs::read_to_string(share.join(format!(".cxlfs/{name}.sha256")))
            .unwrap()
            .trim()
            .to_string()
    };

    // Data through the windows.
    for vm in ["vm0", "vm1"] {
        assert_eq!(guest_sum(&format!("shared-{vm}")), want, "{vm}: shared.bin");
    }
    let w0 = guest_sum("w-vm0");
    assert_eq!(guest_sum("w-vm1"), w0, "VM1 reads what VM0 wrote");
    assert_eq!(host_w, w0, "the host file after VM0's fsync");
    assert_eq!(
        sha256_hex(&share.join("w.bin")),
        w0,
        "the host file at the end"
    );

    // DAX was used, and reading the shared file sent no FUSE_READ.
    let m = &after_read;
    let mut traps = 0;
    for vm in ["vm0", "vm1"] {
        let l = [("vm", vm)];
        assert!(
            m.count("cxlfs_dax_maps_total", &l) >= SHARED / (2 * MIB),
            "{vm}: the 64 MiB file is mapped through 2 MiB slots\n{}",
            m_text(m)
        );
        let reads = m.count(
            "cxlfs_fuse_requests_total",
            &[("vm", vm), ("opcode", "read")],
        );
        assert_eq!(
            reads,
            0,
            "{vm}: FUSE_READs on the virtio-fs queue\n{}",
            m_text(m)
        );
        traps += m.count("cxlfs_pool_traps_total", &l);
    }
    // Shared: one trap per page of the file (plus the few pages of the guest
    // script), not one per page per VM; resident ~64 MiB, not 128.
    let pages = SHARED / PAGE;
    assert!(
        (pages..=pages + 64).contains(&traps),
        "pool traps {traps}, want {pages} (+ a few): each page faulted in once for both VMs\n{}",
        m_text(m)
    );
    let resident = m.count("cxlfs_pool_resident_bytes", &[]);
    assert!(
        (SHARED..=SHARED + MIB).contains(&resident),
        "pool resident bytes {resident}, want ~{SHARED}\n{}",
        m_text(m)
    );
    assert_eq!(
        m.count("cxlfs_pool_traps_total", &[("vm", "unknown")]),
        0,
        "every trap attributed to a VM"
    );
    let end = d.scrape();
    assert!(
        end.count("cxlfs_dax_unmaps_total", &[("vm", "vm0")])
            <= end.count("cxlfs_dax_maps_total", &[("vm", "vm0")])
    );
    assert!(d.stop().success(), "{}", d.diagnostics());
}

#[test]
fn misses_trap_and_are_charged() {
    let _serial = exclusive();
    const FILE: u64 = 16 * MIB;
    const CACHE: u64 = 8 * MIB;
    let data = offset_pattern(FILE, 64 * 1024);
    let mut d = Daemon::start(
        &["vm0"],
        &[
            "--cache",
            "never",
            "--dax-window",
            "64M",
            "--set",
            "cache.size_bytes=8MiB",
            "--set",
            "cache.policy=fifo",
            "--set",
            "nand.read_ns=5us",
        ],
        |share| fs::write(share.join("data.bin"), &data).unwrap(),
    );
    let want = sha256_hex(&d.share().join("data.bin"));
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
sha256sum /mnt/data.bin | cut -d' ' -f1 >/tmp/sum1
handshake 1
sha256sum /mnt/data.bin | cut -d' ' -f1 >/tmp/sum2
handshake 2
# (written only now: a FUSE WRITE is a device access too)
cat /tmp/sum1 /tmp/sum2 >/tmp/sums
cp /tmp/sums /mnt/.cxlfs/sums
handshake 3
# keep faulting until the daemon is killed
while :; do sha256sum /mnt/data.bin >/dev/null 2>&1 || true; done
"#
    ));
    let mut vm = d.boot("vm0", &VmOptions::dax("64M"));
    let pass1 = handshake(&d, &mut vm, 1, || d.scrape());
    let pass2 = handshake(&d, &mut vm, 2, || d.scrape());
    let sums = handshake(&d, &mut vm, 3, || {
        fs::read_to_string(d.share().join(".cxlfs/sums")).unwrap()
    });
    let sums: Vec<&str> = sums.lines().collect();
    assert_eq!(
        sums,
        [want.as_str(), want.as_str()],
        "both passes read the host's bytes"
    );

    let pages = FILE / PAGE;
    for (what, m) in [("pass 1", &pass1), ("pass 2", &pass2)] {
        let traps = m.count("cxlfs_pool_traps_total", &[("vm", "vm0")]);
        let misses = m.count("cxlfs_device_misses_all_total", &[]);
        assert_eq!(
            misses,
            traps,
            "{what}: device misses == pool traps (FUSE_READs of the pool)\n{}",
            m_text(m)
        );
        assert_eq!(
            m.count(
                "cxlfs_fuse_requests_total",
                &[("vm", "vm0"), ("opcode", "read")]
            ),
            0
        );
        let resident = m.count("cxlfs_pool_resident_bytes", &[]);
        assert!(
            resident <= CACHE + MIB,
            "{what}: pool resident {resident} > the 8 MiB device cache\n{}",
            m_text(m)
        );
    }
    let t1 = pass1.count("cxlfs_pool_traps_total", &[("vm", "vm0")]);
    let t2 = pass2.count("cxlfs_pool_traps_total", &[("vm", "vm0")]);
    assert!(t1 >= pages, "pass 1: {t1} traps for {pages} pages");
    assert!(
        t2 - t1 >= pages,
        "pass 2: {} traps; a FIFO cache half the file's size must refault every page",
        t2 - t1
    );
    assert!(pass2.count("cxlfs_pool_evictions_total", &[]) > 0);
    // Where the host kernel offers FUSE over io_uring (`make test` turns it
    // on), the traps came through the ring, not /dev/fuse.
    let ring = pass2.count("cxlfs_pool_ring_requests_total", &[]);
    if fuse_uring_offered() {
        assert!(
            ring >= t2,
            "{ring} plane requests through io_uring for {t2} traps\n{}",
            m_text(&pass2)
        );
    } else if std::env::var("CI").as_deref() == Ok("true") {
        panic!("the kernel does not offer FUSE over io_uring (run `make fuse-uring` as root); CI=true, so the ring path may not go untested");
    } else {
        eprintln!("SKIPPED (ring check): the kernel does not offer FUSE over io_uring; the plane ran on /dev/fuse ({ring} ring requests)");
    }

    // SIGKILL while the guest is faulting: the daemon must still go away.
    std::thread::sleep(Duration::from_millis(500));
    let status = d.kill(Duration::from_secs(15));
    drop(vm);
    assert!(
        status.is_some(),
        "cxlfsd, SIGKILLed with the DAX pool in use, did not exit within 15 s\n{}",
        d.diagnostics()
    );
}
