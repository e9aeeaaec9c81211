//! Two guests on one `cxlfsd` at the same time: both read (and verify) one
//! shared file that the host prepared, each writes and verifies its own
//! private file; the host checks the data, and the metrics show each VM
//! separately, with the amounts each of them moved.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{exclusive, offset_pattern, sha256_hex, Daemon, VmOptions, GUEST_PRELUDE};
use std::fs;

const MIB: u64 = 1 << 20;
const SHARED_SIZE: u64 = 16 * MIB;
const SHARED_BS: u64 = 64 * 1024;
/// (VM, private file size, fio passes over the shared file).
const VMS: [(&str, u64, u64); 2] = [("vm0", 8 * MIB, 1), ("vm1", 12 * MIB, 2)];
/// Reads that are not part of the workload: `.cxlfs/run.sh`, `shared.sha256`.
const READ_SLACK: u64 = 64 * 1024;

#[test]
fn two_vms_shared_and_private_files_with_per_vm_metrics() {
    let _serial = exclusive();
    let shared = offset_pattern(SHARED_SIZE, SHARED_BS);
    let mut d = Daemon::start(&["vm0", "vm1"], &["--cache", "never"], |share| {
        fs::write(share.join("shared.bin"), &shared).unwrap();
    });
    let shared_sum = sha256_hex(&d.share().join("shared.bin"));
    fs::write(
        d.share().join(".cxlfs/shared.sha256"),
        format!("{shared_sum}\n"),
    )
    .unwrap();
    let (p0, p1) = (VMS[0].1, VMS[1].1);
    let (l0, l1) = (VMS[0].2, VMS[1].2);
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
case "$CXLFS_VM" in
    vm0) size={p0}; loops={l0} ;;
    vm1) size={p1}; loops={l1} ;;
    *) echo "unknown VM $CXLFS_VM"; exit 1 ;;
esac
# barrier: both guests are up before either starts (they really run at once)
: >/mnt/.cxlfs/up-$CXLFS_VM
n=0
while [ ! -e /mnt/.cxlfs/up-vm0 ] || [ ! -e /mnt/.cxlfs/up-vm1 ]; do
    n=$((n + 1)); [ $n -lt 3000 ] || {{ echo "the other VM never came up"; exit 1; }}
    sleep 0.02
done
# the shared file: every 64 KiB block must hold its own offset
i=0
while [ $i -lt $loops ]; do
    run fio --name=shared --filename=/mnt/shared.bin --rw=read --bs={SHARED_BS} \
        --ioengine=psync --verify=pattern --verify_pattern=%o
    i=$((i + 1))
done
sum=$(sha256sum /mnt/shared.bin | cut -d' ' -f1)
[ "$sum" = "$(cat /mnt/.cxlfs/shared.sha256)" ] || {{ echo "shared.bin: SHA-256 $sum"; exit 1; }}
# the private file: written at random offsets, verified, then verified again
f=/mnt/private-$CXLFS_VM.bin
run fio --name=priv --filename=$f --rw=randwrite --bs=16k --size=$size --ioengine=psync \
    --verify=crc32c --do_verify=1
run fio --name=priv --filename=$f --rw=randwrite --bs=16k --size=$size --ioengine=psync \
    --verify=crc32c --verify_only=1
sha256sum $f | cut -d' ' -f1 >/tmp/sum
cp /tmp/sum /mnt/.cxlfs/private-$CXLFS_VM.sha256
echo guest-done
"#
    ));
    let opts = VmOptions::default();
    let vm0 = d.boot("vm0", &opts);
    let vm1 = d.boot("vm1", &opts);
    let runs = [vm0.wait(), vm1.wait()];
    for run in &runs {
        assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
        assert!(run.serial.contains("guest-done"), "{}", run.describe());
    }
    // (The guests' barrier proves they ran at the same time.)
    let share = d.share().to_path_buf();
    assert_eq!(
        fs::read(share.join("shared.bin")).unwrap(),
        shared,
        "shared.bin changed"
    );
    for (vm, size, _) in VMS {
        let f = share.join(format!("private-{vm}.bin"));
        assert_eq!(
            fs::metadata(&f).unwrap().len(),
            size,
            "{vm}: private file size"
        );
        let guest = fs::read_to_string(share.join(format!(".cxlfs/private-{vm}.sha256"))).unwrap();
        assert_eq!(
            guest.trim(),
            sha256_hex(&f),
            "{vm}: private file hashes differ"
        );
    }

    // Metrics, per VM. With --cache never every read reaches the daemon, so
    // the bytes each VM read are known: the shared file `loops` times by fio
    // and once by sha256sum, its private file three times (do_verify,
    // verify_only, sha256sum).
    let m = d.scrape();
    let mut misses = 0;
    for (vm, size, loops) in VMS {
        let l = [("vm", vm)];
        let read = m.count("cxlfs_read_bytes_total", &l);
        let want = SHARED_SIZE * (loops + 1) + 3 * size;
        assert!(
            (want..=want + READ_SLACK).contains(&read),
            "{vm}: cxlfs_read_bytes_total = {read}, want {want} (+ at most {READ_SLACK})\n{}",
            m_text(&m)
        );
        let written = m.count("cxlfs_write_bytes_total", &l);
        assert!(
            (size..=size + READ_SLACK).contains(&written),
            "{vm}: cxlfs_write_bytes_total = {written}, want {size}"
        );
        let op = |o: &str| m.count("cxlfs_fuse_requests_total", &[("vm", vm), ("opcode", o)]);
        assert_eq!(op("init"), 1, "{vm}: one INIT");
        assert_eq!(
            m.count("cxlfs_vm_connections_total", &l),
            1,
            "{vm}: one connection"
        );
        // 16 KiB fio writes, one FUSE WRITE each (direct I/O), plus the hash file.
        assert!(
            (size / (16 * 1024)..=size / (16 * 1024) + 16).contains(&op("write")),
            "{vm}: {} WRITE requests for {size} bytes in 16 KiB writes",
            op("write")
        );
        // No READ carries more than the guest's max_read (1 MiB at most).
        assert!(
            op("read") * MIB >= read && op("read") > 0,
            "{vm}: {} READs for {read} bytes",
            op("read")
        );
        misses += m.count("cxlfs_device_misses_total", &l);
    }
    let r0 = m.count("cxlfs_read_bytes_total", &[("vm", "vm0")]);
    let r1 = m.count("cxlfs_read_bytes_total", &[("vm", "vm1")]);
    assert!(
        r1 > r0 + SHARED_SIZE,
        "vm1 read more than vm0: {r1} vs {r0}"
    );
    // One device for both: the model counts exactly the VMs' misses, and the
    // shared file's pages were read from NAND at most once between the two
    // VMs. (Misses themselves may exceed that: a VM that reads a page while
    // the other VM's fill of it is in flight waits for that fill, and the
    // model counts it as a coalesced miss, not a hit. Aligned 16 KiB writes
    // need no fill.)
    assert_eq!(
        misses,
        m.count("cxlfs_device_misses_all_total", &[]),
        "per-VM misses vs the device model's"
    );
    let pages = |b: u64| b.div_ceil(4096);
    let max_fills = pages(SHARED_SIZE) + pages(p0) + pages(p1) + 16;
    let fills = m.count("cxlfs_nand_reads_total", &[]);
    assert!(
        fills <= max_fills && fills >= pages(SHARED_SIZE),
        "{fills} NAND page reads, want {} ..= {max_fills}\n{}",
        pages(SHARED_SIZE),
        m_text(&m)
    );
    let hits = m.count("cxlfs_device_hits_total", &[]);
    assert!(
        hits >= pages(SHARED_SIZE) * (l0 + l1 + 2) - pages(SHARED_SIZE),
        "{hits} device hits: the second VM's reads of shared.bin should hit"
    );

    let st = d.stop();
    assert!(st.success(), "cxlfsd exited with {st}\n{}", d.diagnostics());
    eprintln!(
        "two_vms: guests {:.1?} / {:.1?}",
        runs[0].elapsed, runs[1].elapsed
    );
}

fn m_text(m: &cxlfs_e2e::Metrics) -> String {
    m.samples
        .iter()
        .filter(|s| s.name.starts_with("cxlfs_") && !s.name.contains("pacing"))
        .map(|s| format!("{} {:?} {}", s.name, s.labels, s.value))
        .collect::<Vec<_>>()
        .join("\n")
}
