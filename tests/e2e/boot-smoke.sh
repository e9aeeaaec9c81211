#!/usr/bin/env bash
# End-to-end smoke test of the real-guest chain: guest image -> QEMU (TCG here,
# KVM where it works) -> vhost-user-fs -> a virtio-fs daemon -> host directory.
#
#   tests/e2e/boot-smoke.sh
#
#   1. plain boot, no share: the guest runs `fio --version` from the command line;
#   2. with a share: the daemon exports a fresh temp dir, the guest runs
#      .cxlfs/run.sh from the share: fio writes 8 MiB with crc32c verify, drops its
#      page cache, reads the file back with verify_only, and hashes it; the host
#      checks CXLFS-EXIT=0, the exit file, the file's size and its SHA-256.
#
# Environment:
#   VIRTIOFS_DAEMON       daemon binary (default: stock virtiofsd, installed from
#                         crates.io by qemu-configs/install-virtiofsd.sh)
#   VIRTIOFS_DAEMON_ARGS  daemon arguments with @SOCK@, @DIR@ and @VM@ placeholders
#                         (default: by the binary's name: cxlfsd gets
#                         "--shared-dir @DIR@ --vm @VM@=@SOCK@", anything else the
#                         virtiofsd style "--socket-path @SOCK@ --shared-dir @DIR@")
#   QEMU, CXLFS_CACHE_DIR as in qemu-configs/run-vm.sh
#   SMOKE_TIMEOUT         seconds per guest (default: 300)
#   SMOKE_KEEP=1          keep the work directory (logs, share) even on success
# Exits non-zero on any failure and says which step failed.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
qc="$repo/qemu-configs"
log() { printf 'boot-smoke: %s\n' "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }
timeout_s="${SMOKE_TIMEOUT:-300}"
t0=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }

# ---------------------------------------------------------- prerequisites
t=$(date +%s.%N)
image="$("$qc/build-guest-image.sh" | tail -n1)" || fail "guest image build"
[[ -f "$image/vmlinuz" ]] || fail "guest image build printed '$image', which has no vmlinuz"
log "image $image ($(since "$t")s)"

daemon="${VIRTIOFS_DAEMON:-}"
if [[ -z "$daemon" ]]; then
    daemon="$("$qc/install-virtiofsd.sh" | tail -n1)" || fail "installing virtiofsd"
fi
[[ -x "$daemon" ]] || fail "VIRTIOFS_DAEMON '$daemon' is not an executable"
if [[ -n "${VIRTIOFS_DAEMON_ARGS:-}" ]]; then
    args_tmpl="$VIRTIOFS_DAEMON_ARGS"
elif [[ "$(basename "$daemon")" == cxlfsd* ]]; then
    args_tmpl="--shared-dir @DIR@ --vm @VM@=@SOCK@"
else
    args_tmpl="--socket-path @SOCK@ --shared-dir @DIR@ --cache auto"
    # virtiofsd's namespace sandbox needs root (or user namespaces).
    [[ $(id -u) -eq 0 ]] || args_tmpl+=" --sandbox none"
fi

work="$(mktemp -d /tmp/cxlfs-boot-smoke.XXXXXX)"
daemon_pid=""
ok=0
cleanup() {
    if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then
        kill "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    if ((ok)) && [[ -z "${SMOKE_KEEP:-}" ]]; then
        rm -rf "$work"
    else
        log "logs and share kept in $work"
    fi
}
trap cleanup EXIT

# ------------------------------------------------------- 1. plain boot
t=$(date +%s.%N)
rc=0
"$qc/run-vm.sh" --image "$image" --name plain --serial "$work/plain.serial.log" \
    --timeout "$timeout_s" --cmd 'fio --version && grep -q virtiofs /proc/modules' || rc=$?
((rc == 0)) || fail "plain boot: guest exit $rc (serial log $work/plain.serial.log)"
grep -aq 'CXLFS-MOUNT=none' "$work/plain.serial.log" || fail "plain boot: no CXLFS-MOUNT=none line"
grep -aq '^fio-' "$work/plain.serial.log" || fail "plain boot: fio did not run"
plain_s="$(since "$t")"
log "plain boot OK: boot to exit ${plain_s}s"

# --------------------------------------------- 2. virtio-fs share + fio
share="$work/share" sock="$work/vm0.sock"
mkdir -p "$share/.cxlfs"
cat >"$share/.cxlfs/run.sh" <<'EOF'
set -e
grep -q ' /mnt virtiofs ' /proc/mounts
fio --name=t --directory=/mnt --rw=write --size=8M --bs=64k --verify=crc32c --do_verify=1
sync
echo 3 >/proc/sys/vm/drop_caches
fio --name=t --directory=/mnt --rw=write --size=8M --bs=64k --verify=crc32c --verify_only=1
sha256sum /mnt/t.0.0 | cut -d' ' -f1 >/mnt/.cxlfs/guest-sha256
EOF
daemon_args="${args_tmpl//@SOCK@/$sock}"
daemon_args="${daemon_args//@DIR@/$share}"
daemon_args="${daemon_args//@VM@/vm0}"
log "daemon: $daemon $daemon_args"
# shellcheck disable=SC2086 # the argument template is split on purpose
"$daemon" $daemon_args >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for ((i = 0; i < 100; i++)); do
    [[ -S "$sock" ]] && break
    kill -0 "$daemon_pid" 2>/dev/null || fail "daemon exited at start: $(tail -n 5 "$work/daemon.log")"
    sleep 0.1
done
[[ -S "$sock" ]] || fail "daemon made no socket at $sock within 10 s"

t=$(date +%s.%N)
rc=0
"$qc/run-vm.sh" --image "$image" --name vm0 --socket "$sock" --serial "$work/vm0.serial.log" \
    --timeout "$timeout_s" || rc=$?
share_s="$(since "$t")"
((rc == 0)) || fail "share boot: guest exit $rc (serial log $work/vm0.serial.log, daemon log $work/daemon.log)"
grep -aq 'CXLFS-MOUNT=ok' "$work/vm0.serial.log" || fail "share boot: the share was not mounted"
grep -aq 'CXLFS-RUN=share' "$work/vm0.serial.log" || fail "share boot: .cxlfs/run.sh did not run"
grep -aq 'CXLFS-EXIT=0' "$work/vm0.serial.log" || fail "share boot: no CXLFS-EXIT=0 line"
[[ "$(cat "$share/.cxlfs/exit-vm0" 2>/dev/null)" == 0 ]] || fail "share boot: exit file .cxlfs/exit-vm0 missing or not 0"
[[ -f "$share/t.0.0" ]] || fail "share boot: fio's file t.0.0 is not on the host"
size="$(stat -c %s "$share/t.0.0")"
((size == 8 * 1024 * 1024)) || fail "share boot: t.0.0 is $size bytes on the host, not 8 MiB"
host_sum="$(sha256sum "$share/t.0.0" | cut -d' ' -f1)"
guest_sum="$(cat "$share/.cxlfs/guest-sha256" 2>/dev/null || true)"
[[ "$host_sum" == "$guest_sum" ]] || fail "share boot: SHA-256 differs (host $host_sum, guest ${guest_sum:-none})"
# virtiofsd exits by itself when its only guest disconnects; cxlfsd keeps running.
# Either way it must not have failed.
if ! kill -0 "$daemon_pid" 2>/dev/null; then
    drc=0
    wait "$daemon_pid" || drc=$?
    daemon_pid=""
    ((drc == 0)) || fail "the daemon exited with status $drc (daemon log $work/daemon.log)"
fi
log "share boot OK: fio write+verify, read-back verify, SHA-256 match; boot to exit ${share_s}s"

ok=1
log "PASS ($(since "$t0")s in all; daemon $daemon)"
