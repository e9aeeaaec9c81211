#!/usr/bin/env bash
# The daemon's resident memory under memory-mode traffic, without a guest:
# a real cxlfsd with REGIONS CXL memory regions (64 MiB each) and no VM on
# their sockets; one process per region maps the region through
# `cxlfs ctl memory-fd` and stores to and loads from random pages of it for
# the whole run (each miss traps into the daemon, which charges the device
# model: evictions, write-backs, NAND programs); with STORM=1 a control
# storm (every policy, evictions of every region, CXL ratios, pins) every
# few seconds. Prints the daemon's anonymous RSS (KiB) every STEP seconds.
#
#   tests/e2e/region-rss.sh                       # the default device
#   tests/e2e/region-rss.sh --set nand.blocks_per_plane=97 ...   # any daemon flag
#
# Environment: SECONDS_RUN (default 120), STEP (5), REGIONS (4), STORM (0),
# CXLFSD and CXLFS (default: target/release/cxlfsd and target/release/cxlfs;
# `cargo build --release --locked -p cxlfsd -p cxlfs` makes them). Root
# (the daemon mounts its residency planes with FUSE). Not a test: it prints.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cxlfsd=${CXLFSD:-$root/target/release/cxlfsd}
cxlfs=${CXLFS:-$root/target/release/cxlfs}
run_for=${SECONDS_RUN:-120}
step=${STEP:-5}
regions=${REGIONS:-4}
work=$(mktemp -d /tmp/cxlfs-region-rss.XXXXXX)
mkdir -p "$work/share"
head -c 8M /dev/urandom >"$work/share/shared.bin"

args=(--shared-dir "$work/share" --control-socket "$work/control.sock"
	--set cache.size_bytes=8MiB)
for i in $(seq 0 $((regions - 1))); do
	args+=(--vm "vm$i=$work/vm$i.sock" --cxl-memory "vm$i=64MiB")
done
"$cxlfsd" "${args[@]}" "$@" >"$work/daemon.log" 2>&1 &
daemon=$!
pids=()
cleanup() {
	kill "${pids[@]}" 2>/dev/null || true
	kill "$daemon" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$work/control.sock" ] && break; sleep 0.1; done
[ -S "$work/control.sock" ] || { cat "$work/daemon.log"; exit 1; }

# A refused request is printed, and the run goes on.
ctl() { "$cxlfs" ctl --timeout 60 --socket "$work/control.sock" "$@" >/dev/null || echo "ctl $1: failed" >&2; }
toucher='
import mmap, random, sys, time
fd, size, until = int(sys.argv[1]), 64 << 20, time.time() + float(sys.argv[2])
m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
r, n = random.Random(fd), 0
while time.time() < until:
    p = r.randrange(size >> 12) << 12
    m[p:p + 8] = n.to_bytes(8, "little")
    n += 1
    m[r.randrange(size >> 12) << 12]
print("touches", n, file=sys.stderr)
'
for i in $(seq 0 $((regions - 1))); do
	ctl memory-fd "vm$i" -- python3 -c "$toucher" '{fd}' "$((run_for + 5))" &
	pids+=($!)
done
storm() {
	for p in lru fifo clock 2q s3fifo; do ctl set-policy "$p"; done
	for i in $(seq 0 $((regions - 1))); do
		ctl evict --vm "vm$i" --memory-offset 0 --len 64MiB
	done
	ctl evict --file shared.bin
	for r in 0 50 100 0; do ctl set-cxl-ratio "$r"; done
	ctl pin --file shared.bin
	ctl unpin --file shared.bin
}
start=$SECONDS
echo "seconds rss_anon_kib"
while [ $((SECONDS - start)) -lt "$run_for" ]; do
	[ "${STORM:-0}" = 1 ] && storm
	sleep "$step"
	echo "$((SECONDS - start)) $(awk '/RssAnon/{print $2}' "/proc/$daemon/status")"
done
