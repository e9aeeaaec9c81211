//! One guest on `cxlfsd`: mount, fio writes verified in the guest (crc32c,
//! after writing and again from the daemon after the guest's page cache is
//! dropped), and the files on the host match what the guest wrote, byte for
//! byte.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{
    exclusive, first_difference, offset_pattern, sha256_hex, Daemon, VmOptions, GUEST_PRELUDE,
};
use std::fs;

const MIB: u64 = 1 << 20;
const CRC_SIZE: u64 = 16 * MIB;
const PATTERN_SIZE: u64 = 8 * MIB;
const PATTERN_BS: u64 = 64 * 1024;

#[test]
fn one_vm_fio_verify_and_host_bytes_match() {
    let _serial = exclusive();
    let mut d = Daemon::start(&["vm0"], &[], |_| {});
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
mkdir -p /mnt/data
# random-offset writes of 4..64 KiB blocks, each with a crc32c header, read back and checked
run fio --name=crc --filename=/mnt/data/crc.bin --rw=randwrite --bsrange=4k-64k --size={CRC_SIZE} \
    --ioengine=psync --verify=crc32c --do_verify=1
# every 64 KiB block holds its own offset: the host can rebuild this file exactly
run fio --name=pat --filename=/mnt/data/pattern.bin --rw=write --bs={PATTERN_BS} --size={PATTERN_SIZE} \
    --ioengine=psync --verify=pattern --verify_pattern=%o --do_verify=1
sync
echo 3 >/proc/sys/vm/drop_caches
# read back from the daemon, not the guest page cache
run fio --name=crc --filename=/mnt/data/crc.bin --rw=randwrite --bsrange=4k-64k --size={CRC_SIZE} \
    --ioengine=psync --verify=crc32c --verify_only=1
run fio --name=pat --filename=/mnt/data/pattern.bin --rw=read --bs={PATTERN_BS} --size={PATTERN_SIZE} \
    --ioengine=psync --verify=pattern --verify_pattern=%o
sha256sum /mnt/data/crc.bin /mnt/data/pattern.bin >/mnt/.cxlfs/guest.sha256
echo guest-done
"#
    ));
    let run = d.boot("vm0", &VmOptions::default()).wait();
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
    assert!(run.serial.contains("CXLFS-MOUNT=ok"), "{}", run.describe());
    assert!(run.serial.contains("guest-done"), "{}", run.describe());
    let exit_file = fs::read_to_string(d.share().join(".cxlfs/exit-vm0")).unwrap_or_default();
    assert_eq!(exit_file.trim(), "0", "{}", run.describe());

    // The guest's hashes of its files against the host's.
    let sums = fs::read_to_string(d.share().join(".cxlfs/guest.sha256")).unwrap();
    let data = d.share().join("data");
    for (file, size) in [("crc.bin", CRC_SIZE), ("pattern.bin", PATTERN_SIZE)] {
        let host = data.join(file);
        assert_eq!(
            fs::metadata(&host).unwrap().len(),
            size,
            "{file}: size on the host"
        );
        let guest_sum = sums
            .lines()
            .find(|l| l.ends_with(&format!("/data/{file}")))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("no guest hash of {file} in {sums:?}"));
        assert_eq!(
            sha256_hex(&host),
            guest_sum,
            "{file}: host and guest SHA-256 differ"
        );
    }
    // The pattern file, rebuilt independently on the host, byte for byte.
    let host = fs::read(data.join("pattern.bin")).unwrap();
    let want = offset_pattern(PATTERN_SIZE, PATTERN_BS);
    if let Some(at) = first_difference(&host, &want) {
        panic!(
            "pattern.bin differs from fio's %o pattern at byte {at} (host has {} bytes)",
            host.len()
        );
    }

    // The daemon saw the data: every byte written once, and read back at least once.
    let m = d.scrape();
    let written = m.count("cxlfs_write_bytes_total", &[("vm", "vm0")]);
    assert!(
        (CRC_SIZE + PATTERN_SIZE..CRC_SIZE + PATTERN_SIZE + MIB).contains(&written),
        "cxlfs_write_bytes_total{{vm=vm0}} = {written}"
    );
    let read = m.count("cxlfs_read_bytes_total", &[("vm", "vm0")]);
    assert!(
        read >= CRC_SIZE + PATTERN_SIZE,
        "cxlfs_read_bytes_total{{vm=vm0}} = {read}"
    );
    assert_eq!(
        m.count(
            "cxlfs_fuse_requests_total",
            &[("vm", "vm0"), ("opcode", "init")]
        ),
        1
    );

    let st = d.stop();
    assert!(
        st.success(),
        "cxlfsd exited with {st} after SIGTERM\n{}",
        d.diagnostics()
    );
    eprintln!("one_vm: guest boot to exit {:.1?}", run.elapsed);
}
