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

# Runs one stage: its name, then the command; records seconds and status.
stage() {
    local name=$1
    shift
    echo "== $name: $*"
    local t0=$(date +%s) rc=0
    "$@" || rc=$?
    local secs=$(($(date +%s) - t0))
    if [ $rc -eq 0 ]; then
        stages+=("$name"$'\t'"$secs"$'\t'ok)
    else
        stages+=("$name"$'\t'"$secs"$'\t'"FAILED ($rc)")
        failed+=("$name")
    fi
    return $rc
}

# The release binaries the e2e tests run, each built as the harness builds
# it (one package at a time: built together, cargo could unify features
# differently and build again).
release_build() {
    $CARGO build --release --locked -p cxlfsd &&
        $CARGO build --release --locked -p cxlfs --bin cxlfs
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
stage "e2e build (test binaries)" $CARGO test --locked -p cxlfs-e2e --no-run || exit 1
rm -f "$release_log"

if [ -n "${E2E_ONLY:-}" ]; then
    IFS=, read -r -a binaries <<<"$E2E_ONLY"
else
    binaries=()
    for f in tests/tests/*.rs; do
        binaries+=("$(basename "$f" .rs)")
    done
fi
for b in "${binaries[@]}"; do
    stage "e2e $b" $CARGO test --locked -p cxlfs-e2e --test "$b" -- --test-threads=1
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "make test: FAILED: ${failed[*]}"
    exit 1
fi
echo "make test: all stages passed"
