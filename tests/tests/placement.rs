//! DRAM/CXL placement seen by a real guest: the same job at `--cxl-ratio`
//! 0, 50 and 100. `--cache never`, FEMU device with 500 µs NAND reads, an
//! 8 MiB device cache and no prefetch; the host writes a 4 MiB file into the
//! share (the device has never seen it); the guest reads it once with fio
//! (4 KiB, `--direct=1`) and the host scrapes `/metrics` at a handshake,
//! then the guest hashes the file.
//!
//! * device misses scale with the ratio: exactly 0 at 0 % (every page is
//!   DRAM tier), the file's page count at 100 %, half of it at 50 % (± a
//!   few pages: the guest also reads its script), and DRAM-tier page
//!   accesses are the rest;
//! * the guest's SHA-256 of the file is the host's at every ratio;
//! * the read gets faster as fewer pages sit on the CXL-SSD;
//! * the `--metrics-file` time series ends with a `final` sample whose
//!   achieved CXL share is the ratio.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{
    exclusive, fio_stats, handshake, seeded_bytes, sha256_hex, Daemon, VmOptions, GUEST_PRELUDE,
};
use std::fs;

const PAGE: u64 = 4096;
const FILE: u64 = 4 << 20;
const PAGES: u64 = FILE / PAGE;

struct Outcome {
    ratio: u8,
    misses: u64,
    dram_pages: u64,
    runtime_ms: u64,
}

fn run_at(ratio: u8) -> Outcome {
    let metrics_dir = tempfile::tempdir().unwrap();
    let metrics_file = metrics_dir.path().join("metrics.jsonl");
    let ratio_s = ratio.to_string();
    let mf = metrics_file.display().to_string();
    let args = [
        "--cache",
        "never",
        "--preset",
        "femu",
        "--set",
        "cache.size_bytes=8MiB",
        "--set",
        "cache.policy=fifo",
        "--set",
        "prefetch.degree=0",
        "--set",
        "nand.read_ns=500us",
        "--cxl-ratio",
        &ratio_s,
        "--metrics-file",
        &mf,
        "--metrics-interval",
        "500ms",
    ];
    let mut d = Daemon::start(&["vm0"], &args, |share| {
        fs::write(share.join("data.bin"), seeded_bytes(FILE, 7)).unwrap();
    });
    d.write_guest_script(&format!(
        "{GUEST_PRELUDE}
exec 3</mnt/data.bin
run fio --name=pass --filename=/mnt/data.bin --rw=read --bs=4k --direct=1 --ioengine=psync \
    --output-format=json --output=/tmp/pass.json
handshake 1
cp /tmp/pass.json /mnt/.cxlfs/pass.json
sha256sum /mnt/data.bin >/mnt/.cxlfs/guest.sha256
echo guest-done
"
    ));
    let mut vm = d.boot("vm0", &VmOptions::default());
    let m = handshake(&d, &mut vm, 1, || d.scrape());
    let run = vm.wait();
    assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());

    // Data intact.
    let sums = fs::read_to_string(d.share().join(".cxlfs/guest.sha256")).unwrap();
    let guest_sum = sums.split_whitespace().next().unwrap_or_default();
    assert_eq!(
        guest_sum,
        sha256_hex(&d.share().join("data.bin")),
        "ratio {ratio}: the guest read other bytes than the host file's"
    );
    let fio = fio_stats(&d.share().join(".cxlfs/pass.json"), "read").unwrap();
    assert_eq!(fio.io_bytes, FILE);
    assert_eq!(fio.errors, 0);

    let vm0 = [("vm", "vm0")];
    let misses = m.count("cxlfs_device_misses_total", &vm0);
    let hits = m.count("cxlfs_device_hits_total", &vm0);
    let dram_pages = m.count("cxlfs_dram_tier_pages_total", &vm0);
    assert_eq!(
        misses,
        m.count("cxlfs_device_misses_all_total", &[]),
        "per-VM misses are the model's"
    );
    assert_eq!(
        m.get("cxlfs_cxl_ratio_percent", &[]),
        Some(f64::from(ratio))
    );

    let st = d.stop();
    assert!(st.success(), "cxlfsd exited with {st}\n{}", d.diagnostics());
    let text = fs::read_to_string(&metrics_file).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["vm"], "all");
    assert_eq!(
        last["final"], true,
        "the time series ends with a final sample"
    );
    assert_eq!(last["cxl_ratio"], ratio);
    let share = last["achieved_cxl_share"].as_f64().unwrap();
    assert!(
        (share - f64::from(ratio) / 100.0).abs() < 0.02,
        "ratio {ratio}: achieved CXL share {share}"
    );
    eprintln!(
        "placement: cxl_ratio {ratio:3}: misses {misses:5} hits {hits:4} dram pages {dram_pages:5}, \
         fio 4 KiB read of 4 MiB: {} ms; final sample: placed dram {} cxl {}",
        fio.runtime_ms, last["placed_dram_pages"], last["placed_cxl_pages"]
    );
    Outcome {
        ratio,
        misses,
        dram_pages,
        runtime_ms: fio.runtime_ms,
    }
}

#[test]
fn device_misses_scale_with_cxl_ratio_and_data_is_intact() {
    let _serial = exclusive();
    let runs: Vec<Outcome> = [0u8, 50, 100].into_iter().map(run_at).collect();
    for o in &runs {
        let want_cxl = PAGES * u64::from(o.ratio) / 100;
        // The script (a few pages) is read through the daemon too, and the
        // file's two extents hold 256 ± 2 CXL pages each at 50 %.
        let slack = 8;
        assert!(
            o.misses + 4 >= want_cxl && o.misses <= want_cxl + slack,
            "ratio {}: {} device misses, want {want_cxl} (+ <= {slack})",
            o.ratio,
            o.misses
        );
        let want_dram = PAGES - want_cxl;
        assert!(
            o.dram_pages + 4 >= want_dram && o.dram_pages <= want_dram + slack,
            "ratio {}: {} DRAM-tier pages, want {want_dram} (+ <= {slack})",
            o.ratio,
            o.dram_pages
        );
    }
    assert_eq!(runs[0].misses, 0, "cxl_ratio 0: nothing reaches the device");
    // 1024 misses of 500 µs against none: the order is robust to TCG noise.
    assert!(
        runs[0].runtime_ms < runs[1].runtime_ms && runs[1].runtime_ms < runs[2].runtime_ms,
        "read time should grow with the ratio: {:?}",
        runs.iter()
            .map(|o| (o.ratio, o.runtime_ms))
            .collect::<Vec<_>>()
    );
}
