#!/usr/bin/env bash
# `make test`, stage by stage, with a clock on each: lint, unit (the release
# build of cxlfsd and cxlfs beside them), the e2e set-up (guest image, QEMU,
# fonts, Slurm cluster, the test binaries compiled), then each e2e test
# binary in turn. At the end, pass or
# fail, it prints a table of what each stage took and the slowest e2e tests
# (from the harness's `exclusive()` guard, `$CXLFS_E2E_TIMES`), so the cost is
# in every run's log and in CI's.
#
# Lint, unit and the set-up stop the suite at their first failure; the e2e
# binaries all run (one failing binary does not hide another's result) and
# the suite fails if any of them did.
#
#   tests/timed-suite.sh            # what `make test` runs
#   E2E_ONLY=seed_specs,slurm tests/timed-suite.sh   # only these e2e binaries, no lint/unit
set -uo pipefail
cd "$(dirname "$0")/.."
MAKE=${MAKE:-make}
CARGO=${CARGO:-cargo}

times=$(mktemp -t cxlfs-suite-times.XXXXXX)
export CXLFS_E2E_TIMES=$times
stages=()      # "name<TAB>seconds<TAB>status"
failed=()
suite_start=$(date +%s)

report() {
    local total=$(($(date +%s) - suite_start))
    # A release build still running beside a stage that failed.
    if [ -n "${release_pid:-}" ] && kill -0 "$release_pid" 2>/dev/null; then
        pkill -TERM -P "$release_pid" 2>/dev/null
        kill "$release_pid" 2>/dev/null
    fi
    echo
    echo "== make test: time per stage (this run) =="
    printf '%-34s %9s  %s\n' stage seconds status
    local row
    for row in "${stages[@]}"; do
        IFS=$'\t' read -r name secs status <<<"$row"
        printf '%-34s %9s  %s\n' "$name" "$secs" "$status"
    done
    printf '%-34s %9s\n' total "$total"
    if [ -s "$times" ]; then
        echo
        echo "== slowest e2e tests (seconds, from exclusive() to its end) =="
        sort -t$'\t' -k3,3 -g -r "$times" | head -n "${SLOWEST:-15}" |
            awk -F'\t' '{ printf "%-16s %-64s %8s  %s\n", $1, $2, $3, $4 }'
    fi
    rm -f "$times"
}
trap report EXIT

# Records a stage's row: its name, seconds and exit status.
record() {
    if [ "$3" -eq 0 ]; then
        stages+=("$1"$'\t'"$2"$'\t'ok)
    else
        stages+=("$1"$'\t'"$2"$'\t'"FAILED ($3)")
        failed+=("$1")
    fi
}

# Runs one stage: its name, then the command; records seconds and status.
stage() {
    local name=$1
    shift
    echo "== $name: $*"
    local t0=$(date +%s) rc=0
    "$@" || rc=$?
    record "$name" $(($(date +%s) - t0)) $rc
    return $rc
}

# The release binaries the e2e tests run, built in one cargo invocation
# (their common dependencies compiled once) and handed to the harness as
# $CXLFSD and $CXLFS, so that it builds nothing itself.
target_dir=$(realpath -m "${CARGO_TARGET_DIR:-target}")
export CXLFSD=$target_dir/release/cxlfsd CXLFS=$target_dir/release/cxlfs
release_build() {
    $CARGO build --release --locked -p cxlfsd --bin cxlfsd -p cxlfs --bin cxlfs
}

release_log=$(mktemp -t cxlfs-suite-release.XXXXXX)
release_pid=
if [ -z "${E2E_ONLY:-}" ]; then
    stage "toolchain, fuse-uring" $MAKE -s toolchain fuse-uring || exit 1
    # The release build runs beside lint and unit (target/release has its
    # own lock): it fills the cores those leave idle (links, single test
    # binaries, the tail of each build).
    (
        t0=$(date +%s)
        release_build >"$release_log" 2>&1
        rc=$?
        echo "release build: $(($(date +%s) - t0)) s, exit $rc" >>"$release_log"
        exit $rc
    ) &
    release_pid=$!
    stage lint $MAKE -s lint || exit 1
    stage unit $MAKE -s unit || exit 1
fi

# Waits for the release build started beside lint and unit, or builds now.
release_ready() {
    if [ -z "$release_pid" ]; then
        release_build
        return
    fi
    local rc=0
    wait "$release_pid" || rc=$?
    cat "$release_log"
    return $rc
}

# The set-up every e2e binary shares, done once up front.
stage "e2e set-up (image, qemu, slurm)" $MAKE -s toolchain image qemu fonts slurm || exit 1
stage "e2e build (release: rest of it)" release_ready || exit 1
# The e2e test binaries, compiled once; cargo names each one's executable.
build_log=$(mktemp -t cxlfs-suite-build.XXXXXX)
build_tests() {
    local rc=0
    $CARGO test --locked -p cxlfs-e2e --no-run >"$build_log" 2>&1 || rc=$?
    cat "$build_log"
    return $rc
}
stage "e2e build (test binaries)" build_tests || exit 1
declare -A exe=()
while read -r name path; do
    exe[$name]=$(realpath "$path")
done < <(sed -n 's/^ *Executable tests\/\([a-z_0-9]*\)\.rs (\(.*\))$/\1 \2/p' "$build_log")
rm -f "$release_log" "$build_log"

# E2E binaries whose assertions are data, counts and wide bounds (no
# latency or throughput compared across runs): they run two at a time,
# longest first. Their guests have one vCPU or wait on each other, so two
# binaries fill the 2 cores that one leaves half idle. Every other binary
# (latency, bandwidth, `placement`'s read times, Slurm's overhead, the
# soak's latency windows, and any new one) runs alone afterwards.
PAIRED=(fuse_ops dax_pressure memory_mode many_files experiment_run hit_sources access_bits dax
    two_vms one_vm control durability dax_window credentials)

if [ -n "${E2E_ONLY:-}" ]; then
    IFS=, read -r -a binaries <<<"$E2E_ONLY"
else
    binaries=()
    for f in tests/tests/*.rs; do
        binaries+=("$(basename "$f" .rs)")
    done
fi
paired=() alone=()
for b in "${binaries[@]}"; do
    if [ -z "${exe[$b]:-}" ]; then
        echo "no test binary for $b" >&2
        stages+=("e2e $b"$'\t'0$'\t'"FAILED (no binary)")
        failed+=("e2e $b")
        continue
    fi
    if [[ " ${PAIRED[*]} " == *" $b "* ]]; then paired+=("$b"); else alone+=("$b"); fi
done
# The PAIRED order (longest first), not the directory's.
ordered=()
for b in "${PAIRED[@]}"; do
    [[ " ${paired[*]} " == *" $b "* ]] && ordered+=("$b")
done
paired=("${ordered[@]}")

# One binary, as cargo test runs it (from the crate's directory).
run_binary() {
    (cd tests && "${exe[$1]}" --test-threads=1)
}

# The paired binaries, two at a time; each one's output is printed whole
# when it ends.
logs=$(mktemp -d -t cxlfs-suite-logs.XXXXXX)
declare -A started=() pid_of=()
group_t0=$(date +%s)
finish_one() {
    local done_pid rc=0 b
    wait -n -p done_pid || rc=$?
    for b in "${!pid_of[@]}"; do
        [ "${pid_of[$b]}" = "$done_pid" ] || continue
        local secs=$(($(date +%s) - started[$b]))
        echo "== e2e $b (beside another): exit $rc after $secs s"
        cat "$logs/$b.log"
        record "e2e $b (paired)" "$secs" $rc
        unset "pid_of[$b]"
    done
}
for b in "${paired[@]}"; do
    while [ ${#pid_of[@]} -ge 2 ]; do finish_one; done
    started[$b]=$(date +%s)
    run_binary "$b" >"$logs/$b.log" 2>&1 &
    pid_of[$b]=$!
done
while [ ${#pid_of[@]} -gt 0 ]; do finish_one; done
rm -rf "$logs"
[ ${#paired[@]} -gt 0 ] &&
    stages+=("e2e paired binaries, wall"$'\t'"$(($(date +%s) - group_t0))"$'\t'-)

for b in "${alone[@]}"; do
    stage "e2e $b" run_binary "$b"
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "make test: FAILED: ${failed[*]}"
    exit 1
fi
echo "make test: all stages passed"
