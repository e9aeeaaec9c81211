#!/usr/bin/env bash
# The POSIX conformance runner (qemu-configs/probes/cxlfs-posix) in the same
# guest image under the same QEMU, on stock virtiofsd and on cxlfsd, side by
# side in one run; prints each configuration's passed / failed / total and
# the cases that failed.
#
#   daemon/bench/posix-conformance.sh
#
# Configurations (each one boot; the runner works as root and, in forked
# children, as uid/gid 65534):
#   virtiofsd           --cache=never --sandbox=none --seccomp=none (its defaults: no xattrs)
#   virtiofsd-xattr     the same with --xattr
#   cxlfsd-never        --cache never
#   cxlfsd-auto         --cache auto
#   cxlfsd-dax          --cache auto with a 64 MiB DAX window, 4 MiB device cache
#                       (needs the patched QEMU of build-qemu.sh; skipped with a
#                       note when it is missing)
# A benchmark: it measures and prints; it asserts nothing (exit 0 unless a
# step could not run at all). The e2e test tests/tests/fuse_ops.rs asserts
# cxlfsd's results.
#
# Environment: POSIX_CONFIGS (space-separated subset of the names above),
# BENCH_KEEP=1 (keep the work dir), CXLFSD (a prebuilt cxlfsd), CARGO,
# CARGO_TARGET_DIR, QEMU, CXLFS_CACHE_DIR as elsewhere.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
qc="$repo/qemu-configs"
log() { printf 'posix: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

configs="${POSIX_CONFIGS:-virtiofsd virtiofsd-xattr cxlfsd-never cxlfsd-auto cxlfsd-dax}"

if [[ -n "${CXLFSD:-}" ]]; then
    cxlfsd="$CXLFSD"
else
    log "building cxlfsd (release)"
    (cd "$repo" && "${CARGO:-cargo}" build --release --locked -p cxlfsd >&2)
    cxlfsd="${CARGO_TARGET_DIR:-$repo/target}/release/cxlfsd"
fi
[[ -x "$cxlfsd" ]] || die "no cxlfsd binary at $cxlfsd"
vfsd="$("$qc/install-virtiofsd.sh" | tail -n1)" || die "installing virtiofsd"
image="$("$qc/build-guest-image.sh" | tail -n1)" || die "building the guest image"
command -v jq >/dev/null || { apt-get install -y -qq jq >/dev/null || die "needs jq"; }
patched_qemu=""
if [[ " $configs " == *" cxlfsd-dax "* ]]; then
    patched_qemu="$("$qc/build-qemu.sh" 2>/dev/null | tail -n1)" || patched_qemu=""
fi

work="$(mktemp -d /tmp/cxlfs-posix.XXXXXX)"
daemon_pid=""
stop_daemon() {
    if [[ -n "$daemon_pid" ]]; then
        kill -TERM "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
        daemon_pid=""
    fi
}
cleanup() {
    stop_daemon
    if [[ -n "${BENCH_KEEP:-}" ]]; then log "work dir kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# run_config NAME: a fresh share, the daemon, one guest running the suite.
run_config() {
    local name="$1" share="$work/$1/share" sock="$work/$1/vm0.sock"
    mkdir -p "$share/.cxlfs" "$share/results"
    local vm_args=()
    case "$name" in
        virtiofsd | virtiofsd-xattr)
            local extra=()
            [[ "$name" == virtiofsd-xattr ]] && extra=(--xattr)
            "$vfsd" --socket-path "$sock" --shared-dir "$share" --cache=never \
                --sandbox=none --seccomp=none "${extra[@]}" >"$work/$name.log" 2>&1 &
            ;;
        cxlfsd-never | cxlfsd-auto | cxlfsd-dax)
            local mode=never dax=(--dax off)
            [[ "$name" != cxlfsd-never ]] && mode=auto
            if [[ "$name" == cxlfsd-dax ]]; then
                [[ -n "$patched_qemu" ]] || { log "$name: skipped (no patched QEMU)"; return 0; }
                dax=(--set cache.size_bytes=4MiB --dax-window 64MiB)
                vm_args=(--cache-size 64M --mountopts dax=always)
            fi
            RUST_LOG="${RUST_LOG:-warn}" "$cxlfsd" --shared-dir "$share" --vm "vm0=$sock" \
                --cache "$mode" "${dax[@]}" >"$work/$name.log" 2>&1 &
            ;;
        *) die "unknown configuration $name" ;;
    esac
    daemon_pid=$!
    local i
    for ((i = 0; i < 100; i++)); do
        [[ -S "$sock" ]] && break
        kill -0 "$daemon_pid" 2>/dev/null || die "$name: daemon exited: $(tail -n 5 "$work/$name.log")"
        sleep 0.1
    done
    [[ -S "$sock" ]] || die "$name: no socket within 10 s"
    cat >"$share/.cxlfs/run.sh" <<EOF
mkdir -p /mnt/posix
cxlfs-posix run /mnt/posix --json /mnt/results/posix.json >/mnt/results/posix.txt 2>&1 || true
EOF
    local qemu_env=()
    [[ "$name" == cxlfsd-dax ]] && qemu_env=(env "QEMU=$patched_qemu")
    "${qemu_env[@]}" "$qc/run-vm.sh" --image "$image" --name vm0 --socket "$sock" \
        "${vm_args[@]}" --serial "$work/$name.serial.log" --timeout 900 ||
        log "$name: guest exited $? (serial log $work/$name.serial.log)"
    stop_daemon
    local json="$share/results/posix.json"
    if [[ ! -s "$json" ]]; then
        log "$name: no results (serial: $(tail -n 3 "$work/$name.serial.log" | tr '\n' ' '))"
        printf '%-16s %6s %6s %6s\n' "$name" - - - >>"$work/table"
        return 0
    fi
    printf '%-16s %6s %6s %6s\n' "$name" "$(jq .passed "$json")" "$(jq .failed "$json")" \
        "$(jq .total "$json")" >>"$work/table"
    jq -r --arg n "$name" '.failures[] | "  \($n): \(.)"' "$json" >>"$work/failures"
}

: >"$work/table"
: >"$work/failures"
for c in $configs; do
    log "running $c"
    run_config "$c"
done
printf '%-16s %6s %6s %6s\n' configuration passed failed total
cat "$work/table"
if [[ -s "$work/failures" ]]; then
    echo "failed cases:"
    cat "$work/failures"
fi
