//! The job every soak guest runs until the host says stop: a loop of
//! checksummed file writes, `cxlfs-fsx`, a checksummed buffer on the CXL
//! node (memory mode), reads of the file all guests share and of the file
//! the host truncates and deletes, namespace churn and a timed page chase
//! on node 1 — each lap's figures and every error
//! appended to files under `/mnt/soak/$CXLFS_VM/` that the host reads.
//!
//! A written file is named after its own SHA-256 (`w.SLOT.SUM.bin`, renamed
//! into place after an fsync), so a file is either whole and checkable or
//! not there: a guest killed mid-write leaves at most a `.tmp` the host
//! ignores. Errors are lines `UPTIME KIND DETAIL` in `errors`; `ENOSPC` is
//! its own kind (the host injects it).

/// Where the job keeps its state in the share (`share/soak`).
pub const SOAK_DIR: &str = "soak";

/// The file the host creates to end every guest's loop.
pub const STOP_FILE: &str = ".cxlfs/soak-stop";

/// The file all guests read and check, relative to the share, and its size.
pub const SHARED_FILE: &str = "soak/shared.bin";
/// Bytes of [`SHARED_FILE`].
pub const SHARED_BYTES: usize = 4 << 20;

/// The file the host truncates and deletes while guests map it.
pub const VICTIM_FILE: &str = "soak/victim.bin";

/// The guest script (`.cxlfs/run.sh`): `shared_sum` is the SHA-256 of
/// [`SHARED_FILE`].
pub fn guest_job(shared_sum: &str) -> String {
    format!(
        r#"set -u
v=$CXLFS_VM
d=/mnt/{SOAK_DIR}/$v
mkdir -p $d/ns
up() {{ cut -d' ' -f1 /proc/uptime; }}
err() {{ echo "$(up) $*" >>$d/errors; }}
# A failed write: ENOSPC is the host's injected fault, anything else an error.
write_err() {{
    if grep -q 'No space left' /tmp/werr 2>/dev/null; then echo "$(up) ENOSPC $1" >>$d/errors
    else err "IO $1: $(head -c 200 /tmp/werr 2>/dev/null)"; fi
}}
echo "$(up) BOOT $(cat /proc/sys/kernel/random/boot_id)" >>$d/laps
# 8 MiB on node 1, written once per boot, checked every lap.
numactl --membind=1 sh -c 'dd if=/dev/urandom of=/dev/shm/node1 bs=1M count=8 2>/dev/null'
msum=$(numactl --membind=1 sha256sum </dev/shm/node1 | cut -d' ' -f1)
i=0
while [ ! -e /mnt/{STOP_FILE} ]; do
    i=$((i + 1))
    slot=$((i % 8))
    # Files: write, fsync, rename to the name that carries the sum.
    dd if=/dev/urandom of=/tmp/w bs=64k count=4 2>/dev/null
    s=$(sha256sum </tmp/w | cut -d' ' -f1)
    if dd if=/tmp/w of=$d/w.$slot.tmp bs=64k conv=fsync 2>/tmp/werr \
        && mv $d/w.$slot.tmp $d/w.$slot.$s.bin 2>/tmp/werr; then
        for old in $d/w.$slot.*.bin; do [ "$old" = "$d/w.$slot.$s.bin" ] || rm -f "$old"; done
        got=$(sha256sum <$d/w.$slot.$s.bin | cut -d' ' -f1)
        [ "$got" = "$s" ] || err "FILE w.$slot.$s.bin read back $got"
    else
        write_err "w.$slot"; rm -f $d/w.$slot.tmp
    fi
    # fsx on a file of this VM's own (its own checks; ENOSPC is not a loss).
    if ! cxlfs-fsx -N 300 -S $i -l 262144 -o 65536 $d/fsx.dat >/tmp/fsx.out 2>&1; then
        if grep -q 'No space left' /tmp/fsx.out; then echo "$(up) ENOSPC fsx" >>$d/errors
        else err "FSX $(grep -m3 -i 'mismatch\|fail\|error' /tmp/fsx.out | tr '\n' ' ')"; fi
    fi
    # The buffer on node 1 still holds what was written.
    got=$(numactl --membind=1 sha256sum </dev/shm/node1 | cut -d' ' -f1)
    [ "$got" = "$msum" ] || err "MEMORY node1 read back $got, wrote $msum"
    # The shared file (every VM reads it through its DAX window).
    got=$(sha256sum </mnt/{SHARED_FILE} | cut -d' ' -f1)
    [ "$got" = "{shared_sum}" ] || err "SHARED read back $got"
    # A file the host truncates and deletes now and then, read through the
    # DAX window (the guest kernel maps its ranges); a short read or a
    # missing file is the injected fault, not an error.
    dd if=/mnt/{VICTIM_FILE} of=/dev/null bs=64k 2>/dev/null || echo "$(up) VICTIM $?" >>$d/errors
    # Namespace churn.
    n=$d/ns/$((i % 4)); mkdir -p $n 2>/dev/null
    : >$n/a 2>/dev/null && mv $n/a $n/b 2>/dev/null && ln $n/b $n/c 2>/dev/null
    rm -rf $n 2>/dev/null
    # A timed page chase on node 1: this lap's felt latency.
    lat=$(numactl --membind=1 cxlfs-memlat --size 2m --stride 4096 --laps 1 2>/dev/null)
    p50=$(echo "$lat" | sed -n 's/.*"p50_ns":\([0-9.]*\).*/\1/p')
    p99=$(echo "$lat" | sed -n 's/.*"p99_ns":\([0-9.]*\).*/\1/p')
    echo "$(up) LAP $i ${{p50:-0}} ${{p99:-0}}" >>$d/laps
done
echo "$(up) STOP $i" >>$d/laps
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_names_the_shared_sum_and_the_stop_file() {
        let s = guest_job("abc123");
        assert!(s.contains("[ \"$got\" = \"abc123\" ]"));
        assert!(s.contains("/mnt/.cxlfs/soak-stop"));
        assert!(s.contains("/mnt/soak/shared.bin"));
        assert!(!s.contains("{SOAK_DIR}"));
    }
}
