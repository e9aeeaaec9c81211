#!/usr/bin/env bash
# Boots a guest image again and again and counts the boots whose kernel
# crashed (oops, BUG, panic): how reliable a kernel boots under this QEMU.
#
#   qemu-configs/boot-loop.sh [--boots N] [--kernel default|backports]
#                             [--smp N] [--mem SIZE] [--cxl-memory SIZE]
#                             [--tcg-thread auto|single|multi] [--out DIR]
#
#   --boots N          boots (default 200)
#   --kernel K         the image's kernel, as build-guest-image.sh --kernel
#                      (default: default)
#   --smp N            vCPUs (default 2)
#   --mem SIZE         guest RAM (default 1G)
#   --cxl-memory SIZE  memory mode (SIZE in QEMU syntax, e.g. 512M): a cxlfsd with a CXL region for
#                      the guest, passed through `cxlfs ctl memory-fd` as
#                      node 1 (`movable_node`), as `cxlfs run` does
#   --tcg-thread T     run-vm.sh's --tcg-thread (default: auto)
#   --out DIR          where the crashed boots' serial logs are kept
#                      (default: a new directory under /tmp)
#
# Each boot runs `true` in the guest. QEMU is $QEMU or the system's (a
# wrapper there can change the accelerator's options). Prints a line every
# 20 boots and a last line `boot-loop: N boots: ok=A crashed=B other=C`;
# exits 1 if a boot crashed, 2 on a usage or set-up error. Needs
# target/release/cxlfsd and cxlfs for --cxl-memory (`cargo build --release`).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
boots=200 kernel=default smp=2 mem=1G cxl="" out="" tcg_thread=auto
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2; }
while (($#)); do
    case "$1" in
        --boots) boots="$2"; shift 2 ;;
        --kernel) kernel="$2"; shift 2 ;;
        --smp) smp="$2"; shift 2 ;;
        --mem) mem="$2"; shift 2 ;;
        --cxl-memory) cxl="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --tcg-thread) tcg_thread="$2"; shift 2 ;;
        -h | --help) usage ;;
        *) echo "boot-loop: unknown argument $1" >&2; usage ;;
    esac
done
[[ "$boots" =~ ^[1-9][0-9]*$ ]] || { echo "boot-loop: --boots must be a positive count" >&2; exit 2; }
[[ -n "$out" ]] || out="$(mktemp -d /tmp/boot-loop.XXXXXX)"
mkdir -p "$out"
image="$("$here/build-guest-image.sh" --kernel "$kernel" | tail -n1)"
echo "boot-loop: image $image, $smp vCPUs, $mem${cxl:+ + CXL node $cxl}, QEMU ${QEMU:-system}, logs in $out" >&2

daemon_pid=""
stop_daemon() { [[ -z "$daemon_pid" ]] || { kill "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null || true; }; }
trap stop_daemon EXIT
if [[ -n "$cxl" ]]; then
    bin="${CARGO_TARGET_DIR:-$root/target}/release"
    [[ -x "$bin/cxlfsd" && -x "$bin/cxlfs" ]] || { echo "boot-loop: build cxlfsd and cxlfs first (cargo build --release)" >&2; exit 2; }
    mkdir -p "$out/share"
    "$bin/cxlfsd" --shared-dir "$out/share" --vm "vm0=$out/vm0.sock" --cxl-memory "vm0=${cxl}iB" \
        --control-socket "$out/control.sock" >"$out/daemon.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 1 150); do [[ -S "$out/control.sock" && -S "$out/vm0.sock" ]] && break; sleep 0.1; done
    [[ -S "$out/control.sock" ]] || { echo "boot-loop: cxlfsd did not start (see $out/daemon.log)" >&2; exit 2; }
fi

ok=0 crashed=0 other=0
for i in $(seq 1 "$boots"); do
    serial="$out/serial-$i.log"
    vm=("$here/run-vm.sh" --image "$image" --smp "$smp" --mem "$mem" --timeout 120 --serial "$serial" --cmd true
        --tcg-thread "$tcg_thread")
    if [[ -n "$cxl" ]]; then
        vm=("$bin/cxlfs" ctl --socket "$out/control.sock" memory-fd vm0 -- "${vm[@]}"
            --socket "$out/vm0.sock" --cxl-memory "$cxl" --cxl-memory-fd '{fd}' --append movable_node)
    fi
    rc=0 t0=$(date +%s%N)
    timeout 300 "${vm[@]}" >"$out/run-$i.log" 2>&1 || rc=$?
    echo $((($(date +%s%N) - t0) / 1000000)) >>"$out/boot-ms.txt"
    if grep -aq -e 'Oops' -e 'Kernel panic' -e 'BUG:' -e 'general protection fault' "$serial" 2>/dev/null; then
        crashed=$((crashed + 1))
        grep -a -m1 -e 'Oops' -e 'Kernel panic' -e 'BUG:' -e 'general protection fault' "$serial" | sed "s/^/boot-loop: boot $i crashed: /" >&2
    elif ((rc == 0)); then
        ok=$((ok + 1))
        rm -f "$serial" "$out/run-$i.log"
    else
        other=$((other + 1))
    fi
    ((i % 20)) || echo "boot-loop: $i boots: ok=$ok crashed=$crashed other=$other" >&2
done
sort -n "$out/boot-ms.txt" | awk '{a[NR] = $1} END {
    printf "boot-loop: boot to exit (run-vm.sh wall time): median %.2f s, p90 %.2f s\n", a[int((NR + 1) / 2)] / 1000, a[int(NR * 0.9 + 0.5)] / 1000 }'
echo "boot-loop: $boots boots: ok=$ok crashed=$crashed other=$other"
((crashed == 0))
