#!/usr/bin/env bash
# Memory mode against the issue's targets, with real guests (TCG here, KVM on
# hosts where run-vm.sh picks it), in one run:
#
#   daemon/bench/memory-mode.sh
#
# 1. Hits: cxlfs-memlat (dependent loads, one per 4 KiB page and one per
#    64-byte line, random cyclic order) over a working set that fits the
#    device cache, on node 0 (DRAM) and on node 1 (the CXL region) in the
#    same guest; prints ns per load and the node1/node0 ratio (target <= 1.5).
# 2. Misses: the same probe over a working set 8x the device cache on node 1,
#    with NAND reads of 0 / 20 / 40 us; each load of the first pass is timed
#    alone in the guest. Prints its median and the daemon's mean modeled trap
#    time (cxlfs_region_trap_modeled_ns_total / traps): achieved - modeled
#    (target: the residency plane's miss floor + 3 us).
# 3. Boot: the guest's boot-to-exit time with a BENCH_BOOT_NODE (2G) CXL node
#    and without one (BENCH_REPEATS each, alternating), and the region traps
#    the boot itself took (pages the guest kernel touched on node 1).
#
# A benchmark: it measures and prints; it asserts nothing.
#
# Environment: BENCH_REPEATS (3)  BENCH_HIT_MB (16)  BENCH_BOOT_NODE (2G)
#   BENCH_KEEP=1 (keep the work dir)  CXLFSD, CXLFS (prebuilt binaries)
#   CARGO, CARGO_TARGET_DIR, QEMU, CXLFS_CACHE_DIR as elsewhere
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
qc="$repo/qemu-configs"
log() { printf 'bench: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
repeats="${BENCH_REPEATS:-3}"
hit_mb="${BENCH_HIT_MB:-16}"
boot_node="${BENCH_BOOT_NODE:-2G}"
port="${BENCH_METRICS_PORT:-19641}"

target="${CARGO_TARGET_DIR:-$repo/target}/release"
if [[ -z "${CXLFSD:-}" || -z "${CXLFS:-}" ]]; then
    log "building cxlfsd and cxlfs (release)"
    (cd "$repo" && "${CARGO:-cargo}" build --release --locked -p cxlfsd -p cxlfs >&2)
fi
cxlfsd="${CXLFSD:-$target/cxlfsd}"
cxlfs="${CXLFS:-$target/cxlfs}"
image="$("$qc/build-guest-image.sh" | tail -n1)"
work="$(mktemp -d /tmp/cxlfs-memory-bench.XXXXXX)"
daemon_pid=""
cleanup() {
    [[ -n "$daemon_pid" ]] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    [[ -n "${BENCH_KEEP:-}" ]] || rm -rf "$work"
}
trap cleanup EXIT

# start_daemon REGION CACHE NAND_READ: a fresh cxlfsd for vm0
start_daemon() {
    [[ -n "$daemon_pid" ]] && { kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null || true; }
    rm -rf "$work/share" "$work"/*.sock
    mkdir -p "$work/share"
    "$cxlfsd" --shared-dir "$work/share" --vm "vm0=$work/vm0.sock" --cxl-memory "vm0=$1" \
        --control-socket "$work/ctl.sock" --metrics-addr "127.0.0.1:$port" \
        --set "cache.size_bytes=$2" --set "nand.read_ns=$3" >"$work/daemon.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 100); do [[ -S "$work/ctl.sock" ]] && return; sleep 0.1; done
    die "cxlfsd did not start: $(tail -n 5 "$work/daemon.log")"
}

# guest CXL_SIZE CMD: boots vm0 with a CXL node of CXL_SIZE; prints the serial log
guest() {
    "$cxlfs" ctl --socket "$work/ctl.sock" memory-fd vm0 -- "$qc/run-vm.sh" --image "$image" \
        --socket "$work/vm0.sock" --cxl-memory "$1" --cxl-memory-fd '{fd}' --append movable_node \
        --serial "$work/vm0.serial" --timeout 600 --cmd "$2" >"$work/run.log" 2>&1 \
        || die "guest failed: $(tail -n 5 "$work/run.log")"
    tr -d '\r' <"$work/vm0.serial"
}

region() { # field of the region's row in /metrics.json
    curl -s "127.0.0.1:$port/metrics.json" | python3 -c \
        "import json,sys; print(json.load(sys.stdin)['memory_regions'][0]['$1'])"
}

json() { # key, from a JSON line on stdin
    python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['$1'])"
}

# ------------------------------------------------------------------ 1. hits
log "1. hits: ${hit_mb} MiB working set, node 0 vs node 1 (device cache 64 MiB)"
start_daemon 128MiB 64MiB 20us
out="$(guest 128M "for s in 4096 64; do numactl --membind=0 cxlfs-memlat $hit_mb \$s 5; numactl --membind=1 cxlfs-memlat $hit_mb \$s 5; done")"
mapfile -t lines < <(grep '^{"size_bytes"' <<<"$out")
((${#lines[@]} == 4)) || die "expected 4 probe lines, got: $out"
for i in 0 2; do
    stride="$(json stride <<<"${lines[i]}")"
    n0="$(json ns_per_load <<<"${lines[i]}")"
    n1="$(json ns_per_load <<<"${lines[i + 1]}")"
    printf 'hits  stride %5s B: node0 %8.1f ns/load  node1 %8.1f ns/load  ratio %.2f\n' \
        "$stride" "$n0" "$n1" "$(python3 -c "print($n1/$n0)")"
done

# ---------------------------------------------------------------- 2. misses
for nand in 0us 20us 40us; do
    start_daemon 128MiB 8MiB "$nand"
    out="$(guest 128M 'numactl --membind=1 cxlfs-memlat 64 4096 1')"
    line="$(grep '^{"size_bytes"' <<<"$out")"
    p50="$(json first_p50_ns <<<"$line")"
    traps="$(region traps)"
    modeled="$(region trap_modeled_ns_total)"
    mean_modeled=$((modeled / (traps > 0 ? traps : 1)))
    printf 'miss  nand.read %4s: guest p50 %7d ns  p90 %7d ns  modeled mean %7d ns  achieved-modeled %7d ns  (traps %d)\n' \
        "$nand" "$p50" "$(json first_p90_ns <<<"$line")" "$mean_modeled" $((p50 - mean_modeled)) "$traps"
done

# ------------------------------------------------------------------ 3. boot
log "3. boot with and without a $boot_node CXL node"
start_daemon "${boot_node}iB" 64MiB 20us
for r in $(seq "$repeats"); do
    t0=$(date +%s%N)
    "$qc/run-vm.sh" --image "$image" --socket "$work/vm0.sock" --serial "$work/plain.serial" \
        --timeout 600 --cmd true >"$work/run.log" 2>&1 || die "plain boot failed"
    t1=$(date +%s%N)
    before="$(region traps)"
    guest "$boot_node" true >/dev/null
    t2=$(date +%s%N)
    after="$(region traps)"
    printf 'boot  repeat %d: without %.2f s  with %s node %.2f s  (+%.2f s; %d region traps at boot)\n' \
        "$r" "$(python3 -c "print(($t1-$t0)/1e9)")" "$boot_node" "$(python3 -c "print(($t2-$t1)/1e9)")" \
        "$(python3 -c "print(($t2-$t1-($t1-$t0))/1e9)")" $((after - before))
done
