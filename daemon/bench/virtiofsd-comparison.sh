#!/usr/bin/env bash
# cxlfsd (device latencies zero) against stock virtiofsd, under the same QEMU,
# the same guest image and the same fio jobs, in one run; then the pacing error
# of cxlfsd's data path with real NAND-miss latencies.
#
#   daemon/bench/virtiofsd-comparison.sh
#
# Part 1, throughput. One prepared file (BENCH_FILE_MB, default 256 MiB) in a
# fresh share. Each boot runs, in the guest, with O_DIRECT (and the daemon at
# cache=never, so every read reaches the daemon):
#   (a) seqread : 1 MiB sequential reads,  psync, iodepth 1, BENCH_RUNTIME s
#   (b) randread: 4 KiB random reads,       psync, iodepth 1, BENCH_RUNTIME s
# The daemons alternate boot by boot (virtiofsd, cxlfsd, virtiofsd, cxlfsd, ...;
# BENCH_REPEATS pairs) so slow drift of the machine cancels; each daemon's
# result is the mean over its boots. fio writes JSON into the share.
#   virtiofsd: --cache=never --sandbox=none --seccomp=none, default thread pool
#              (--thread-pool-size 0: requests are served on the queue thread)
#   cxlfsd:    --cache never, device latencies zero (nand.read_ns, program_ns,
#              erase_ns, cache.hit_latency_ns, link.latency_ns = 0)
#
# Part 2, pacing. cxlfsd with NAND reads of BENCH_PACING_READ_NS (default 30 µs)
# and a 4 MiB device cache (the 256 MiB file misses almost always), fio 4 KiB
# random reads, O_DIRECT, for BENCH_RUNTIME s; prints the daemon's pacing-error
# histogram (replies modeled at >= 20 µs) from its metrics endpoint.
#
# A benchmark: it measures and prints; it asserts nothing (exit 0 unless a
# step could not run at all).
#
# Environment:
#   BENCH_REPEATS (3)  BENCH_RUNTIME (12)  BENCH_FILE_MB (256)  BENCH_SMP (2)
#   BENCH_PACING_READ_NS (30us)  BENCH_SKIP_PACING=1  BENCH_SKIP_THROUGHPUT=1
#   BENCH_KEEP=1 (keep the work dir)  CXLFSD (a prebuilt cxlfsd: skip the build)
#   CXLFSD_B (a second cxlfsd build, alternated as a third daemon "cxlfsd-b":
#   to compare two builds in one run)
#   CARGO, CARGO_TARGET_DIR, QEMU, CXLFS_CACHE_DIR as elsewhere
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
qc="$repo/qemu-configs"
log() { printf 'bench: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

repeats="${BENCH_REPEATS:-3}"
runtime="${BENCH_RUNTIME:-12}"
file_mb="${BENCH_FILE_MB:-256}"
smp="${BENCH_SMP:-2}"
pacing_read="${BENCH_PACING_READ_NS:-30us}"
metrics_port="${BENCH_METRICS_PORT:-19640}"

# ------------------------------------------------------------ prerequisites
if [[ -n "${CXLFSD:-}" ]]; then
    cxlfsd="$CXLFSD"
else
    log "building cxlfsd (release)"
    (cd "$repo" && "${CARGO:-cargo}" build --release --locked -p cxlfsd >&2)
    cxlfsd="${CARGO_TARGET_DIR:-$repo/target}/release/cxlfsd"
fi
[[ -x "$cxlfsd" ]] || die "no cxlfsd binary at $cxlfsd"
vfsd="$("$qc/install-virtiofsd.sh" | tail -n1)" || die "installing virtiofsd"
[[ -x "$vfsd" ]] || die "no virtiofsd at '$vfsd'"
image="$("$qc/build-guest-image.sh" | tail -n1)" || die "building the guest image"
for t in jq curl; do
    command -v "$t" >/dev/null || { apt-get install -y -qq "$t" >/dev/null || die "needs $t"; }
done

work="$(mktemp -d /tmp/cxlfs-bench.XXXXXX)"
share="$work/share"
mkdir -p "$share/.cxlfs" "$share/results"
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

log "preparing a ${file_mb} MiB file"
head -c "$((file_mb << 20))" /dev/urandom >"$share/data.bin"

# start_daemon NAME SOCK [extra args]: NAME is virtiofsd or cxlfsd.
start_daemon() {
    local which="$1" sock="$2"
    shift 2
    rm -f "$sock"
    local bin="$cxlfsd"
    [[ "$which" == cxlfsd-b ]] && bin="$CXLFSD_B"
    if [[ "$which" == virtiofsd ]]; then
        "$vfsd" --socket-path "$sock" --shared-dir "$share" --cache=never \
            --sandbox=none --seccomp=none "$@" >"$work/$which.log" 2>&1 &
    else
        RUST_LOG="${RUST_LOG:-warn}" "$bin" --shared-dir "$share" --vm "vm0=$sock" \
            --cache never "$@" >>"$work/$which.log" 2>&1 &
    fi
    daemon_pid=$!
    local i
    for ((i = 0; i < 100; i++)); do
        [[ -S "$sock" ]] && return 0
        kill -0 "$daemon_pid" 2>/dev/null || die "$which exited at start: $(tail -n 5 "$work/$which.log")"
        sleep 0.1
    done
    die "$which made no socket within 10 s"
}

# cpu_s: CPU seconds (user + system) the daemon has used so far.
cpu_s() {
    local f
    f="$(cat "/proc/$daemon_pid/stat" 2>/dev/null)" || { echo 0; return; }
    f="${f##*) }" # fields from 3 on; the command name may hold spaces
    awk -v t="$(getconf CLK_TCK)" '{printf "%.3f\n", ($12 + $13) / t}' <<<"$f"
}

# wait_quiet: up to BENCH_QUIET_WAIT s (default 60) for the host to be idle
# (>= 85 % idle over 1 s): other work on this machine skews TCG guests badly.
wait_quiet() {
    local i a b
    for ((i = 0; i < ${BENCH_QUIET_WAIT:-60}; i++)); do
        a="$(head -n1 /proc/stat)"
        sleep 1
        b="$(head -n1 /proc/stat)"
        awk -v a="$a" -v b="$b" 'BEGIN {
            n = split(a, x, " "); split(b, y, " "); tot = 0
            for (k = 2; k <= n; k++) tot += y[k] - x[k]
            idle = (y[5] - x[5]) + (y[6] - x[6])
            exit !(tot > 0 && idle / tot >= 0.85) }' && return 0
    done
    log "host still busy after ${BENCH_QUIET_WAIT:-60} s: $(cut -d' ' -f1-3 /proc/loadavg); going on"
}

# guest_run TAG JOBS...: boots one guest that runs the fio JOBS (seqread,
# randread) and leaves results/TAG-JOB.json in the share.
guest_run() {
    local tag="$1"
    shift
    {
        echo 'set -e'
        for job in "$@"; do
            case "$job" in
                seqread) args="--rw=read --bs=1M" ;;
                randread) args="--rw=randread --bs=4k" ;;
                *) die "unknown job $job" ;;
            esac
            echo "fio --name=$job --filename=/mnt/data.bin --size=${file_mb}M $args" \
                "--direct=1 --ioengine=psync --iodepth=1 --time_based --runtime=$runtime" \
                "--ramp_time=1 --output-format=json --output=/mnt/results/$tag-$job.json"
        done
    } >"$share/.cxlfs/run.sh"
    local rc=0 vm_pid prev job
    wait_quiet
    prev="$(cpu_s)"
    "$qc/run-vm.sh" --image "$image" --name vm0 --socket "$work/vm0.sock" --smp "$smp" \
        --serial "$work/$tag.serial.log" --timeout $((runtime * 4 + 120)) &
    vm_pid=$!
    # The daemon's CPU time per job: sampled when each job's JSON appears.
    for job in "$@"; do
        while kill -0 "$vm_pid" 2>/dev/null && [[ ! -s "$share/results/$tag-$job.json" ]]; do
            sleep 0.1
        done
        local now
        now="$(cpu_s)"
        # virtiofsd exits when its guest goes: a sample taken after that
        # reads 0, and the job's CPU time is unknown, not negative.
        awk -v a="$prev" -v b="$now" 'BEGIN {if (b >= a) printf "%.3f\n", b - a; else print "nan"}' >"$work/cpu-$tag-$job"
        prev="$now"
    done
    wait "$vm_pid" || rc=$?
    ((rc == 0)) || log "guest $tag exited $rc (serial log $work/$tag.serial.log)"
    log "$tag: $(for job in "$@"; do printf '%s %s (daemon CPU %s s)  ' "$job" "$(value "$tag" "$job")" "$(cat "$work/cpu-$tag-$job")"; done)load $(cut -d' ' -f1 /proc/loadavg)"
    return "$rc"
}

# cpu_per_io TAG JOB: daemon CPU µs per fio I/O.
cpu_per_io() {
    local f="$share/results/$1-$2.json"
    [[ -s "$f" && -s "$work/cpu-$1-$2" ]] || { echo nan; return; }
    grep -q nan "$work/cpu-$1-$2" && { echo nan; return; }
    awk -v c="$(cat "$work/cpu-$1-$2")" -v n="$(jq '.jobs[0].read.total_ios' "$f")" \
        'BEGIN {if (n > 0) printf "%.1f\n", c * 1e6 / n; else print "nan"}'
}

# value TAG JOB: MB/s (seqread) or IOPS (randread) from fio's JSON.
value() {
    local f="$share/results/$1-$2.json"
    [[ -s "$f" ]] || { echo nan; return; }
    if [[ "$2" == seqread ]]; then
        jq '.jobs[0].read.bw_bytes / 1000000' "$f"
    else
        jq '.jobs[0].read.iops' "$f"
    fi
}

zero=(--set nand.read_ns=0 --set nand.program_ns=0 --set nand.erase_ns=0
    --set cache.hit_latency_ns=0 --set link.latency_ns=0)

# ----------------------------------------------------- part 1: throughput
if [[ -z "${BENCH_SKIP_THROUGHPUT:-}" ]]; then
    daemons=(virtiofsd cxlfsd)
    [[ -n "${CXLFSD_B:-}" ]] && daemons+=(cxlfsd-b)
    declare -A tags=([virtiofsd]="" [cxlfsd]="" [cxlfsd-b]="")
    for ((r = 1; r <= repeats; r++)); do
        for d in "${daemons[@]}"; do
            log "repeat $r/$repeats: $d"
            if [[ "$d" == virtiofsd ]]; then
                start_daemon virtiofsd "$work/vm0.sock"
            else
                start_daemon "$d" "$work/vm0.sock" "${zero[@]}"
            fi
            guest_run "$d-$r" seqread randread || true
            stop_daemon
            tags[$d]+=" $d-$r"
        done
    done

    mean() { # JOB TAGS...: mean of the values, "nan" if any is missing
        local job="$1"
        shift
        local vals=() t
        for t in "$@"; do vals+=("$(value "$t" "$job")"); done
        printf '%s\n' "${vals[@]}" | awk '/nan/ {bad = 1} {s += $1; n++}
            END {if (bad || n == 0) print "nan"; else printf "%.2f\n", s / n}'
    }
    mean_cpu() { # JOB TAGS...: mean daemon CPU µs per I/O over the boots sampled
        local job="$1" t
        shift
        for t in "$@"; do cpu_per_io "$t" "$job"; done | awk '/nan/ {missed++; next} {s += $1; n++}
            END {if (n == 0) print "nan"; else printf "%.1f%s\n", s / n, missed ? " (" n " boots)" : ""}'
    }
    per_run() { # JOB TAGS...: the individual values
        local job="$1" t out=""
        shift
        for t in "$@"; do out+="$(printf '%.0f' "$(value "$t" "$job")" 2>/dev/null || echo nan) "; done
        echo "${out% }"
    }
    echo
    echo "== throughput: same QEMU ($(qemu-system-x86_64 --version | head -n1 | awk '{print $4}'), TCG, -smp $smp), same guest, same file (${file_mb} MiB), fio psync iodepth 1, O_DIRECT, ${runtime} s per job, $repeats boots per daemon alternating =="
    printf '%-28s %14s %14s %8s   %s\n' job virtiofsd cxlfsd ratio "per boot (virtiofsd | cxlfsd)"
    # shellcheck disable=SC2086 # tag lists split on purpose
    for job in seqread randread; do
        v=$(mean "$job" ${tags[virtiofsd]})
        c=$(mean "$job" ${tags[cxlfsd]})
        ratio=$(awk -v v="$v" -v c="$c" 'BEGIN {if (v == "nan" || c == "nan" || v == 0) print "nan"; else printf "%.2fx", c / v}')
        if [[ "$job" == seqread ]]; then name="(a) 1 MiB seq read, MB/s"; else name="(b) 4 KiB rand read, IOPS"; fi
        printf '%-28s %14s %14s %8s   %s | %s\n' "$name" "$v" "$c" "$ratio" \
            "$(per_run "$job" ${tags[virtiofsd]})" "$(per_run "$job" ${tags[cxlfsd]})"
        if [[ -n "${CXLFSD_B:-}" ]]; then
            vb=$(mean "$job" ${tags[cxlfsd-b]})
            ratio=$(awk -v v="$v" -v c="$vb" 'BEGIN {if (v == "nan" || c == "nan" || v == 0) print "nan"; else printf "%.2fx", c / v}')
            printf '%-28s %14s %14s %8s   %s\n' "  cxlfsd-b ($CXLFSD_B)" "" "$vb" "$ratio" "$(per_run "$job" ${tags[cxlfsd-b]})"
        fi
    done
    echo "daemon CPU per I/O (us; includes the guest's boot for the first job), same order:"
    # shellcheck disable=SC2086 # tag lists split on purpose
    for job in seqread randread; do
        line="  $job: virtiofsd $(mean_cpu "$job" ${tags[virtiofsd]}), cxlfsd $(mean_cpu "$job" ${tags[cxlfsd]})"
        [[ -n "${CXLFSD_B:-}" ]] && line+=", cxlfsd-b $(mean_cpu "$job" ${tags[cxlfsd-b]})"
        echo "$line"
    done
fi

# -------------------------------------------------------- part 2: pacing
# pacing_run TAG LABEL [extra cxlfsd args]
pacing_run() {
    local tag="pacing-$1" label="$2"
    shift 2
    log "pacing run ($label): nand.read_ns=$pacing_read, 4 MiB device cache"
    start_daemon cxlfsd "$work/vm0.sock" --set nand.read_ns="$pacing_read" \
        --set cache.size_bytes=4MiB --metrics-addr "127.0.0.1:$metrics_port" "$@"
    guest_run "$tag" randread || true
    local metrics
    metrics="$(curl -s "http://127.0.0.1:$metrics_port/metrics" || true)"
    stop_daemon
    q() { # QUANTILE -> µs
        awk -v q="$1" -F'[ ]' 'index($1, "cxlfs_pacing_error_seconds{vm=\"vm0\",modeled=\"ge20us\",quantile=\"" q "\"}") == 1 {printf "%.2f", $2 * 1e6}' <<<"$metrics"
    }
    local count misses hits
    count=$(awk '/^cxlfs_pacing_error_seconds_count\{vm="vm0",modeled="ge20us"\}/ {print $2}' <<<"$metrics")
    misses=$(awk '/^cxlfs_device_misses_total\{vm="vm0"\}/ {print $2}' <<<"$metrics")
    hits=$(awk '/^cxlfs_device_hits_total\{vm="vm0"\}/ {print $2}' <<<"$metrics")
    printf '%-34s %8s %8s %8s %8s %9s %9s  %s\n' "$label" "$(q 0.5)" "$(q 0.9)" "$(q 0.99)" "$(q 0.999)" "$(q 1)" "${count:-0}" \
        "IOPS $(printf '%.0f' "$(value "$tag" randread)" 2>/dev/null || echo nan), page hits ${hits:-?} misses ${misses:-?}"
}

if [[ -z "${BENCH_SKIP_PACING:-}" ]]; then
    echo
    echo "== pacing error (release + compensation floor - modeled, us; --latency-compensation auto), data path: cxlfsd nand.read_ns=$pacing_read, 4 MiB device cache, fio 4 KiB randread O_DIRECT, ${runtime} s =="
    printf '%-34s %8s %8s %8s %8s %9s %9s\n' "replies modeled >= 20 us" p50 p90 p99 p99.9 max count
    pacing_run default "default scheduling"
    pacing_run rt "--realtime-priority 10" --realtime-priority 10
fi
