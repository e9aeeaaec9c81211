//! One guest lists a tree of 20 000 files (every file looked up: the daemon
//! holds an fd per inode for that VM) while another guest keeps reading a
//! file: the lister sees every file (no EMFILE: the daemon raised its fd
//! limit, and one VM's cap is far above 20 000), and the reader finishes
//! its fixed work in bounded time and with the right data.
#![allow(clippy::unwrap_used)]

use cxlfs_e2e::{exclusive, offset_pattern, sha256_hex, Daemon, VmOptions, GUEST_PRELUDE};
use std::fs;
use std::time::Duration;

const DIRS: usize = 200;
const PER_DIR: usize = 100;
const DATA_SIZE: u64 = 4 << 20;
/// Passes of the reader over `data.bin`.
const PASSES: u32 = 20;
/// The reader's fixed work must end within this long (TCG guests; the
/// whole guest run is killed after 240 s anyway).
const READER_LIMIT_S: u64 = 150;

#[test]
fn one_vm_lists_20000_files_while_another_keeps_reading() {
    let _serial = exclusive();
    let data = offset_pattern(DATA_SIZE, 64 * 1024);
    let d = Daemon::start(&["lister", "reader"], &["--cache", "never"], |share| {
        fs::write(share.join("data.bin"), &data).unwrap();
        for i in 0..DIRS {
            let dir = share.join(format!("tree/d{i:03}"));
            fs::create_dir_all(&dir).unwrap();
            for j in 0..PER_DIR {
                fs::write(dir.join(format!("f{j:03}")), b"x").unwrap();
            }
        }
    });
    let sum = sha256_hex(&d.share().join("data.bin"));
    fs::write(d.share().join(".cxlfs/data.sha256"), format!("{sum}\n")).unwrap();
    // `find` prints the tree's root, its DIRS directories and their files.
    let want = 1 + DIRS + DIRS * PER_DIR;
    d.write_guest_script(&format!(
        r#"{GUEST_PRELUDE}
: >/mnt/.cxlfs/up-$CXLFS_VM
n=0
while [ ! -e /mnt/.cxlfs/up-lister ] || [ ! -e /mnt/.cxlfs/up-reader ]; do
    n=$((n + 1)); [ $n -lt 3000 ] || {{ echo "the other VM never came up"; exit 1; }}
    sleep 0.02
done
case "$CXLFS_VM" in
lister)
    # find lstat()s every entry: one LOOKUP (one daemon fd) per file
    count=$(find /mnt/tree 2>/tmp/find.err | wc -l)
    errs=$(wc -l </tmp/find.err)
    echo "listed=$count errors=$errs"
    [ "$errs" -eq 0 ] || {{ head -5 /tmp/find.err; exit 1; }}
    [ "$count" -eq {want} ] || {{ echo "E2E-FAILED listed $count of {want}"; exit 1; }}
    : >/mnt/.cxlfs/listed
    ;;
reader)
    start=$(date +%s)
    i=0
    while [ $i -lt {PASSES} ]; do
        s=$(sha256sum /mnt/data.bin | cut -d' ' -f1)
        [ "$s" = "$(cat /mnt/.cxlfs/data.sha256)" ] || {{ echo "E2E-FAILED data.bin: $s"; exit 1; }}
        i=$((i + 1))
    done
    end=$(date +%s)
    overlap=no
    [ -e /mnt/.cxlfs/listed ] || overlap=yes
    echo "reader-seconds=$((end - start)) overlapped=$overlap"
    ;;
esac
echo guest-done
"#
    ));
    let opts = VmOptions {
        timeout: Duration::from_secs(240),
        ..VmOptions::default()
    };
    let lister = d.boot("lister", &opts);
    let reader = d.boot("reader", &opts);
    let runs = [lister.wait(), reader.wait()];
    for run in &runs {
        assert!(run.ok(), "{}\n{}", run.describe(), d.diagnostics());
        assert!(run.serial.contains("guest-done"), "{}", run.describe());
    }
    assert!(
        runs[0].serial.contains(&format!("listed={want} errors=0")),
        "{}",
        runs[0].describe()
    );
    let secs: u64 = runs[1]
        .serial
        .lines()
        .find_map(|l| l.split("reader-seconds=").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no reader time\n{}", runs[1].describe()));
    eprintln!(
        "reader: {PASSES} passes over {DATA_SIZE} bytes in {secs} s; {}",
        runs[1]
            .serial
            .lines()
            .find(|l| l.contains("overlapped="))
            .unwrap_or("")
    );
    assert!(
        secs <= READER_LIMIT_S,
        "the reader took {secs} s while the other VM listed 20 000 files"
    );
    // The daemon served both to the end and logged no fd exhaustion.
    let log =
        fs::read_to_string(d.share().parent().unwrap().join("daemon.log")).unwrap_or_default();
    assert!(
        !log.contains("Too many open files") && !log.contains("EMFILE"),
        "{}",
        d.diagnostics()
    );
}
