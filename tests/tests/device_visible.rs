//! The emulated device is visible to a real guest: with `--cache never`
//! (every read reaches the daemon), a device DRAM cache of 8 MiB, NAND reads
//! of 50 µs and no prefetch, a guest reads a 6 MiB file (a cache-sized
//! working set) twice with 4 KiB O_DIRECT reads, then an 8 MiB file, then the
//! first file again (14 MiB in all: more than the cache).
//!
//! * pass 1 misses every page of the file (and every read is held at least
//!   the NAND read time), pass 2 hits every page and is measurably faster,
//!   pass 3 misses every page of the second file and evicts the first (FIFO),
//!   so pass 4 misses it all again;
//! * at every step the per-VM miss counters add up to the device model's own
//!   miss count, and each miss is one NAND read.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{
    exclusive, fio_stats, handshake, seeded_bytes, Daemon, FioStats, Metrics, VmOptions,
    GUEST_PRELUDE,
};
use std::fs;

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
const PAGE: u64 = 4 * KIB;
const CACHE: u64 = 8 * MIB;
const FILE_A: u64 = 6 * MIB;
const FILE_B: u64 = 8 * MIB;
const NAND_READ_NS: u64 = 90_000;

fn device_args() -> Vec<String> {
    [
        "--cache",
        "never",
        "--preset",
        "femu",
        "--set",
        &format!("cache.size_bytes={CACHE}"),
        "--set",
        "cache.policy=fifo",
        "--set",
        "cache.ways=0",
        "--set",
        "prefetch.degree=0",
        "--set",
        &format!("nand.read_ns={NAND_READ_NS}ns"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// (misses summed over VMs, the model's misses, NAND reads).
fn misses(m: &Metrics) -> (u64, u64, u64) {
    (
        m.count("cxlfs_device_misses_total", &[]),
        m.count("cxlfs_device_misses_all_total", &[]),
        m.count("cxlfs_nand_reads_total", &[]),
    )
}

fn read_pass(n: u32, file: &str) -> String {
    format!(
        "run fio --name=pass{n} --filename=/mnt/{file} --rw=read --bs=4k --direct=1 --ioengine=psync \
         --output-format=json --output=/tmp/pass{n}.json\nhandshake {n}\n"
    )
}

#[test]
fn second_pass_hits_the_device_cache_and_misses_agree_with_the_model() {
    let _serial = exclusive();
    let args = device_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(&["vm0"], &args, |share| {
        // Written on the host, not through the daemon: the device has never seen them.
        fs::write(share.join("a.bin"), seeded_bytes(FILE_A, 1)).unwrap();
        fs::write(share.join("b.bin"), seeded_bytes(FILE_B, 2)).unwrap();
    });
    let mut script = format!(
        "{GUEST_PRELUDE}
# Hold both files open for the whole job: the daemon gives a file device
# addresses only while some guest holds its inode.
exec 3</mnt/a.bin 4</mnt/b.bin
handshake 0
"
    );
    for (n, f) in [(1, "a.bin"), (2, "a.bin"), (3, "b.bin"), (4, "a.bin")] {
        script += &read_pass(n, f);
    }
    script += "cp /tmp/pass1.json /tmp/pass2.json /tmp/pass3.json /tmp/pass4.json /mnt/.cxlfs/\n";
    d.write_guest_script(&script);

    let mut vm = d.boot("vm0", &VmOptions::default());
    let mut at = Vec::new();
    for n in 0..=4 {
        at.push(handshake(&d, &mut vm, n, || d.scrape()));
    }
    let run = vm.wait();
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());

    let pages = |b: u64| b / PAGE;
    let mut per_pass = Vec::new();
    for (n, m) in at.iter().enumerate() {
        let (vm_sum, model, nand) = misses(m);
        assert_eq!(
            vm_sum, model,
            "after pass {n}: misses summed over VMs {vm_sum} != the device model's {model}"
        );
        if n > 0 {
            let (p_vm, _, p_nand) = misses(&at[n - 1]);
            per_pass.push((vm_sum - p_vm, nand - p_nand));
        }
    }
    let stats: Vec<FioStats> = (1..=4)
        .map(|n| {
            fio_stats(&d.share().join(format!(".cxlfs/pass{n}.json")), "read")
                .unwrap_or_else(|e| panic!("pass {n}: {e}\n{}", run.describe()))
        })
        .collect();
    let report = format!(
        "per pass (misses, NAND reads): {per_pass:?}\nfio: {stats:#?}\n{}",
        d.diagnostics()
    );
    for (i, (file, size)) in [("a", FILE_A), ("a", FILE_A), ("b", FILE_B), ("a", FILE_A)]
        .into_iter()
        .enumerate()
    {
        assert_eq!(
            stats[i].io_bytes,
            size,
            "pass {}: read {file}.bin whole\n{report}",
            i + 1
        );
        assert_eq!(stats[i].errors, 0, "pass {}: fio errors\n{report}", i + 1);
    }
    // A few pages of slack: the guest also reads its script, and the daemon
    // recycles the device addresses of a file no guest holds any more (the
    // script's) for the next file, whose first page then "hits".
    let near = |got: u64, want: u64| got.abs_diff(want) <= 4;
    let (m1, n1) = per_pass[0];
    assert!(
        near(m1, pages(FILE_A)),
        "pass 1: {m1} misses, want {}\n{report}",
        pages(FILE_A)
    );
    assert_eq!(n1, m1, "pass 1: every miss is one NAND read\n{report}");
    let (m2, _) = per_pass[1];
    assert!(
        m2 <= 2,
        "pass 2: {m2} misses over a cache-sized working set\n{report}"
    );
    let (m3, _) = per_pass[2];
    assert!(
        near(m3, pages(FILE_B)),
        "pass 3: {m3} misses, want {}\n{report}",
        pages(FILE_B)
    );
    let (m4, _) = per_pass[3];
    assert!(
        near(m4, pages(FILE_A)),
        "pass 4: {m4} misses: the first file should have been evicted\n{report}"
    );

    // In the guest: every pass-1 read waited at least for the NAND, and
    // pass 2 is faster; pass 4 (evicted again) is slow again. Compared at
    // the fast end of each pass (minimum and 5th percentile: the reads no
    // other host work got in the way of), by at least a quarter of tR —
    // under TCG the modeled wait overlaps part of the path a hit pays in
    // full (CI saw 37–70 µs of a 90 µs tR there). Not the median: a busy
    // host moved pass 2's median by 100 µs in one CI run.
    let (p1, p2, p4) = (&stats[0], &stats[1], &stats[3]);
    let quarter = NAND_READ_NS / 4;
    assert!(
        p1.clat_min_ns >= NAND_READ_NS,
        "pass 1: a read completed in {} ns < tR\n{report}",
        p1.clat_min_ns
    );
    assert!(
        p1.clat_min_ns >= p2.clat_min_ns + quarter && p1.clat_p5_ns >= p2.clat_p5_ns + quarter,
        "pass 2's reads are not faster than pass 1's (min and p5 by tR/4)\n{report}"
    );
    assert!(
        p1.runtime_ms > p2.runtime_ms,
        "pass 2 took longer than pass 1\n{report}"
    );
    assert!(
        p4.clat_min_ns >= p2.clat_min_ns + quarter && p4.clat_p5_ns >= p2.clat_p5_ns + quarter,
        "pass 4 (evicted) is not slower than pass 2\n{report}"
    );

    let st = d.stop();
    assert!(st.success(), "cxlfsd exited with {st}\n{}", d.diagnostics());
    eprintln!(
        "device_visible: clat min/p5/p50 µs: pass1 {:.0}/{:.0}/{:.0}, pass2 {:.0}/{:.0}/{:.0}, pass4 {:.0}/{:.0}/{:.0}; runtime {} / {} ms; misses {per_pass:?}; guest {:.1?}",
        p1.clat_min_ns as f64 / 1e3,
        p1.clat_p5_ns as f64 / 1e3,
        p1.clat_p50_ns as f64 / 1e3,
        p2.clat_min_ns as f64 / 1e3,
        p2.clat_p5_ns as f64 / 1e3,
        p2.clat_p50_ns as f64 / 1e3,
        p4.clat_min_ns as f64 / 1e3,
        p4.clat_p5_ns as f64 / 1e3,
        p4.clat_p50_ns as f64 / 1e3,
        p1.runtime_ms,
        p2.runtime_ms,
        run.elapsed
    );
}

/// A file's device addresses belong to that file: after a guest is done with
/// a file (closed, its inode forgotten), a *different* file must not hit the
/// device-cache pages the first one left behind. (It failed while the daemon
/// recycled a forgotten file's pool extents without invalidating them.)
#[test]
fn another_file_does_not_hit_a_forgotten_files_pages() {
    let _serial = exclusive();
    let args = device_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(&["vm0"], &args, |share| {
        fs::write(share.join("a.bin"), seeded_bytes(FILE_A, 1)).unwrap();
        fs::write(share.join("b.bin"), seeded_bytes(FILE_A, 2)).unwrap();
    });
    d.write_guest_script(&format!(
        "{GUEST_PRELUDE}
handshake 0
{}
# close it and make the guest forget its inode (FORGET to the daemon)
echo 2 >/proc/sys/vm/drop_caches
handshake 2
{}",
        read_pass(1, "a.bin"),
        read_pass(3, "b.bin")
    ));
    let mut vm = d.boot("vm0", &VmOptions::default());
    let mut at = Vec::new();
    for n in 0..=3 {
        at.push(handshake(&d, &mut vm, n, || d.scrape()));
    }
    let run = vm.wait();
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
    let m = |i: usize| misses(&at[i]).0;
    let (a, b) = (m(1) - m(0), m(3) - m(2));
    assert!(a.abs_diff(FILE_A / PAGE) <= 4, "a.bin: {a} misses");
    assert!(
        b.abs_diff(FILE_A / PAGE) <= 4,
        "b.bin was never read before, yet only {b} of its {} pages missed",
        FILE_A / PAGE
    );
    assert!(d.stop().success());
}
