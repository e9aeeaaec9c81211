#!/usr/bin/env python3
"""`cxlfs mrc` against libCacheSim's `mrcProfiler`, side by side: the same
traces, the same 64 sizes, time and error of each.

For each trace (zipf 0.99 and uniform, 10 M accesses over 4 Mi pages, from
`cxlfs trace gen`; optionally a real trace, `--real FILE` in a format
`cxlfs replay` reads) it writes the accesses also as libCacheSim's
oracleGeneral trace, one request per page touched, object id = page, object
size 4096 bytes, so that mrcProfiler's byte sizes are cxlfs's `--sizes`.
The sizes are 64 log-spaced from 1/64 to 2x the working set (the 4 Mi
pages of the synthetic traces, the distinct pages of a real one), taken
from cxlfs's reference output and handed to mrcProfiler as an explicit
list in KiB.

The reference is one full replay per size (`cxlfs mrc --method replay`;
libCacheSim's FIFO, LRU, CLOCK, S3-FIFO and 2Q give the same miss counts as
the model's: see "S3-FIFO and 2Q, as libCacheSim runs them" in
docs/device-model.md). Then, alternating the order every round, each
policy's curve from `cxlfs mrc` (its defaults: exact LRU, the others
sampled; LRU also `--method sampled`, SHARDS' sampled stack distances, at
the default rate and at the rates `--lru-cx-rates` adds; the others also at
`--cx-rate-factor` times the default rate) and from mrcProfiler (SHARDS for LRU, MINISIM with
`--lcs-threads` threads for the others) at its default rate 0.01, at
cxlfs's default rate (`--lcs-at-cx-rate`), at the rates `--lcs-rates` adds
and, for SHARDS, `--lru-rates` (default 1: no sampling, exact). Each is its
own process, timed from its own resource usage (`wait4`: user and system
seconds to the microsecond, where `/usr/bin/time` prints hundredths, too
coarse for curves of 0.06 s), wall seconds and peak RSS,
and the mean and largest absolute error in points against the reference.

A sampled curve's error depends on which pages the hash happens to
sample: one seed is one sample of it. Round k samples with seed k in both
tools (`cxlfs mrc --sampling-seed k`; SHARDS' hash salt 42 + k; MINISIM
takes no seed), and the summary gives each method's errors as the mean
over the rounds, with the worst round's beside them (`--same-seed` keeps
seed 0 and salt 42 in every round).

    # libCacheSim, outside the repo (docs/device-model.md gives the steps:
    # MINISIM needs mrcProfiler relinked with the policies in it)
    cmake -G Ninja .. && ninja mrcProfiler
    cargo build --release -p cxlfs
    python3 device-model/bench/mrc-vs-libcachesim.py --mrcprofiler PATH/bin/mrcProfiler

`MRCPROFILER` and `CXLFS` may name the binaries instead. A benchmark: it
measures and prints (and appends every run to WORK/runs.jsonl); it asserts
nothing. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import oracle_general

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = 4096
POINTS = 64
SYNTH_PAGES = 4 << 20
SETTINGS = ["--set", "cache.ways=0", "--set", "cache.hits_visible=true", "--set", "nand.enabled=false"]
# cxlfs policy -> (libCacheSim algorithm, mrcProfiler profiler)
POLICIES = {
    "lru": ("LRU", "SHARDS"),
    "fifo": ("FIFO", "MINISIM"),
    "clock": ("Clock", "MINISIM"),
    "s3fifo": ("S3FIFO", "MINISIM"),
    "2q": ("TwoQ", "MINISIM"),
}
LCS_DEFAULT_RATE = 0.01
SHARDS_SALT = 42


def trace_pages(cxlfs: str, path: str, work: str):
    """The pages each access of a trace `cxlfs replay` reads touches, in
    order: `cxlfs trace convert` writes it as CSV (its reader, not a second
    decoder of the binary format), read here line by line."""
    csv_path = os.path.join(work, "pages.tmp.csv")
    subprocess.run([cxlfs, "trace", "convert", "--to", "csv", path, csv_path],
                   check=True, capture_output=True)
    try:
        with open(csv_path) as f:
            for line in f:
                if line.startswith("#") or line.startswith("time_ns"):
                    continue
                _t, _op, addr, length = line.rstrip("\n").split(",")
                first = int(addr, 0)
                last = first + max(int(length), 1) - 1
                yield from range(first // PAGE, last // PAGE + 1)
    finally:
        os.unlink(csv_path)


def prepare(cxlfs: str, work: str, name: str, real: str | None, accesses: int, seed: int):
    """(binary trace, oracleGeneral trace, working-set bytes, requests)."""
    bin_path = os.path.join(work, f"{name}.bin")
    og_path = os.path.join(work, f"{name}.oracleGeneral")
    meta_path = os.path.join(work, f"{name}.meta.json")
    if not os.path.exists(bin_path):
        if real:
            cmd = [cxlfs, "trace", "convert", "--to", "bin", real, bin_path]
        else:
            workload = "zipf:0.99" if name == "zipf" else "uniform"
            cmd = [cxlfs, "trace", "gen", "--workload", workload, "--wss", f"{SYNTH_PAGES * PAGE}",
                   "--accesses", str(accesses), "--seed", str(seed), "--out", bin_path]
        subprocess.run(cmd, check=True, capture_output=True)
    if not os.path.exists(meta_path) or not os.path.exists(og_path):
        seen: set[int] = set()

        def pages():
            for p in trace_pages(cxlfs, bin_path, work):
                seen.add(p)
                yield p

        n = oracle_general.write(og_path, pages(), PAGE)
        with open(meta_path, "w") as f:
            json.dump({"requests": n, "distinct_pages": len(seen)}, f)
    with open(meta_path) as f:
        meta = json.load(f)
    wss = (meta["distinct_pages"] if real else SYNTH_PAGES) * PAGE
    # Both traces into the page cache (the host reclaims idle file pages).
    for path in (bin_path, og_path):
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    return bin_path, og_path, wss, meta["requests"]


def load_json_points(text: str):
    """{policy: {size: point}} from `cxlfs mrc --json` output."""
    pts: dict[str, dict[int, dict]] = defaultdict(dict)
    for line in text.splitlines():
        if line.startswith("{"):
            p = json.loads(line)
            pts[p["policy"]][p["size_bytes"]] = p
    return pts


def timed(cmd: list[str]) -> tuple[str, dict]:
    """stdout of one process, and its wall/user/sys seconds and peak RSS (MiB),
    from its own `wait4` resource usage (microseconds)."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - start
        # Reaped here: the Popen object must not wait for it again.
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{stderr[-2000:]}")
    user, system = usage.ru_utime, usage.ru_stime
    return stdout, {"wall": wall, "cpu": user + system, "user": user, "sys": system,
                    "rss_mib": usage.ru_maxrss / 1024, "load": load}


def error(curve: dict[int, float], ref: dict[int, float]) -> tuple[float, float]:
    errs = [abs(curve[s] - ref[s]) * 100 for s in ref]
    return sum(errs) / len(errs), max(errs)


def lcs_curve(stdout: str) -> dict[int, float]:
    """mrcProfiler's table: `SIZEB<TAB>miss_rate<TAB>byte_miss_rate`."""
    return {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"^(\d+)B\t([\d.]+)\t", stdout, re.M)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mrcprofiler", default=os.environ.get("MRCPROFILER"),
                    help="libCacheSim's bin/mrcProfiler (or $MRCPROFILER)")
    ap.add_argument("--cxlfs", default=os.environ.get("CXLFS", os.path.join(REPO, "target", "release", "cxlfs")))
    ap.add_argument("--work", default="/dev/shm/cxlfs-mrc-vs-lcs", help="traces and results (tmpfs)")
    ap.add_argument("--workloads", default="zipf,uniform")
    ap.add_argument("--real", help="a real trace (CSV or binary) to add as workload `real`")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--accesses", type=int, default=10_000_000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lcs-rates", default="", help="more mrcProfiler rates to time, comma-separated")
    ap.add_argument("--lru-rates", default="1", help="more SHARDS rates for LRU (1: no sampling, exact)")
    ap.add_argument("--lru-cx-rates", default="0.01",
                    help="more rates for cxlfs's sampled LRU (`--method sampled --sampling R`), comma-separated")
    ap.add_argument("--lcs-at-cx-rate", type=int, default=1,
                    help="also time mrcProfiler at cxlfs's default rate (0: not)")
    ap.add_argument("--cx-rate-factor", type=float, default=4,
                    help="also time cxlfs's sampled curves at this multiple of its default rate (1: not)")
    ap.add_argument("--lcs-threads", type=int, default=1, help="MINISIM threads")
    ap.add_argument("--same-seed", action="store_true",
                    help="sample with one seed in every round (else round k: seed k, SHARDS salt 42 + k)")
    args = ap.parse_args()
    if not args.mrcprofiler or not os.access(args.mrcprofiler, os.X_OK):
        sys.exit("no mrcProfiler: --mrcprofiler PATH or MRCPROFILER=PATH")
    if not os.access(args.cxlfs, os.X_OK):
        sys.exit(f"no {args.cxlfs}: cargo build --release -p cxlfs (or CXLFS=PATH)")
    os.makedirs(args.work, exist_ok=True)
    policies = [p for p in args.policies.split(",") if p]
    workloads = [w for w in args.workloads.split(",") if w] + (["real"] if args.real else [])
    extra_rates = [float(r) for r in args.lcs_rates.split(",") if r]
    lru_rates = [float(r) for r in args.lru_rates.split(",") if r]
    lru_cx_rates = [float(r) for r in args.lru_cx_rates.split(",") if r]
    log = open(os.path.join(args.work, "runs.jsonl"), "a")
    print(f"cxlfs {args.cxlfs}\nmrcProfiler {args.mrcprofiler} (MINISIM threads {args.lcs_threads})\n"
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")

    results: dict[tuple, list[dict]] = defaultdict(list)
    errors: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for name in workloads:
        bin_path, og_path, wss, n = prepare(args.cxlfs, args.work, name, args.real if name == "real" else None,
                                            args.accesses, args.seed)
        spec = f"{wss // POINTS}..{2 * wss}:{POINTS}"
        ref_path = os.path.join(args.work, f"{name}.ref.json")
        if not os.path.exists(ref_path):
            print(f"{name}: reference, {POINTS} replays per policy ...", flush=True)
            out = subprocess.run([args.cxlfs, "mrc", "--trace", bin_path, *SETTINGS, "--sizes", spec,
                                  "--policy", ",".join(POLICIES), "--method", "replay", "--json"],
                                 capture_output=True, text=True, check=True).stdout
            with open(ref_path, "w") as f:
                f.write(out)
        with open(ref_path) as f:
            ref = {p: {s: v["miss_ratio"] for s, v in pts.items()} for p, pts in load_json_points(f.read()).items()}
        sizes = sorted(ref["lru"])
        with open(ref_path) as f:
            lookups = next(iter(load_json_points(f.read())["lru"].values()))["page_accesses"]
        print(f"{name}: {n} requests (cxlfs page lookups {lookups}), working set {wss // PAGE} pages, "
              f"sizes {spec} ({sizes[0]}..{sizes[-1]} B)")
        lcs_sizes = ",".join(f"{s // 1024}K" for s in sizes)
        # cxlfs's default rate (the same for every sampled policy: it follows the smallest size)
        probe = subprocess.run([args.cxlfs, "mrc", "--trace", bin_path, *SETTINGS, "--sizes", spec,
                                "--policy", "fifo", "--json"], capture_output=True, text=True, check=True).stdout
        cx_rate = float(next(iter(load_json_points(probe)["fifo"].values()))["sampling_rate"])

        for rnd in range(args.rounds):
            seed = 0 if args.same_seed else rnd
            for policy in policies:
                algo, profiler = POLICIES[policy]
                cx_cmd = [args.cxlfs, "mrc", "--trace", bin_path, *SETTINGS, "--sizes", spec,
                          "--policy", policy, "--sampling-seed", str(seed), "--json"]
                runs = [("cxlfs", None, cx_cmd)]
                if policy == "lru":
                    # also sampled, as SHARDS is: at cxlfs's default rate and at more
                    runs.append(("cxlfs", None, cx_cmd + ["--method", "sampled"]))
                    runs += [("cxlfs", None, cx_cmd + ["--method", "sampled", "--sampling", f"{r:g}"])
                             for r in lru_cx_rates if r != cx_rate]
                elif args.cx_rate_factor > 1:
                    # and at a higher rate: cxlfs's error at a cost still below mrcProfiler's
                    runs.append(("cxlfs", None, cx_cmd + ["--sampling", f"{min(cx_rate * args.cx_rate_factor, 0.5):g}"]))
                rates = [LCS_DEFAULT_RATE] + ([cx_rate] if args.lcs_at_cx_rate and cx_rate != LCS_DEFAULT_RATE else [])
                rates += [r for r in extra_rates + (lru_rates if policy == "lru" else []) if r not in rates]
                for rate in rates:
                    third = SHARDS_SALT + seed if profiler == "SHARDS" else args.lcs_threads
                    runs.append(("mrcProfiler", rate,
                                 [args.mrcprofiler, og_path, "oracleGeneral", f"--algo={algo}",
                                  f"--profiler={profiler}", f"--profiler-params=FIX_RATE,{rate:g},{third}",
                                  f"--size={lcs_sizes}"]))
                if rnd % 2:
                    runs.reverse()
                for tool, rate, cmd in runs:
                    out, t = timed(cmd)
                    if tool == "cxlfs":
                        pts = load_json_points(out)[policy]
                        curve = {s: p["miss_ratio"] for s, p in pts.items()}
                        rate = next(iter(pts.values())).get("sampling_rate")
                        method = next(iter(pts.values()))["method"]
                    else:
                        curve = lcs_curve(out)
                        method = profiler
                    if set(curve) != set(sizes):
                        sys.exit(f"{tool} {policy}: sizes differ from the reference's")
                    mae, mx = error(curve, ref[policy])
                    key = (name, policy, tool, method, rate)
                    errors[key].append((mae, mx))
                    results[key].append(t)
                    rec = {"workload": name, "policy": policy, "tool": tool, "method": method, "rate": rate,
                           "round": rnd, "seed": seed, "mae": mae, "max": mx, **t}
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                    print(f"  r{rnd} {name:7} {policy:6} {tool:11} {method:8} R={rate or 1:<8.5g} "
                          f"wall {t['wall']:6.3f} s  cpu {t['cpu']:6.3f} s  rss {t['rss_mib']:6.0f} MiB  "
                          f"MAE {mae:6.3f}  max {mx:6.3f}  load {t['load']:.2f}", flush=True)

    print("\nworkload policy  tool        method   rate      MAE / max (pts: mean; worst round)   "
          "cpu s (each round)         wall s (each round)        "
          "cpu ratio, wall ratio (lCS min / cxlfs min, each cxlfs method); cpu ratio of the median rounds")
    for key, ts in results.items():
        name, policy, tool, method, rate = key
        errs = errors[key]
        mae = sum(e[0] for e in errs) / len(errs)
        mx = sum(e[1] for e in errs) / len(errs)
        worst = f"{max(e[0] for e in errs):.3f} / {max(e[1] for e in errs):.3f}"
        cpu = " ".join(f"{t['cpu']:.3f}" for t in ts)
        wall = " ".join(f"{t['wall']:.3f}" for t in ts)
        cx = [v for k, v in results.items() if k[:3] == (name, policy, "cxlfs")]
        ratio = ""
        if tool != "cxlfs" and cx:
            ratio = " ".join(f"{min(t['cpu'] for t in ts) / min(t['cpu'] for t in c):.2f}x" for c in cx)
            ratio += ", " + " ".join(
                f"{min(t['wall'] for t in ts) / max(min(t['wall'] for t in c), 0.001):.2f}x" for c in cx)
            # a sample's size, and so cxlfs's time, can depend on the round's seed
            ratio += "; median cpu " + " ".join(
                f"{statistics.median(t['cpu'] for t in ts) / statistics.median(t['cpu'] for t in c):.2f}x"
                for c in cx)
        print(f"{name:8} {policy:7} {tool:11} {method:8} {rate or 1:<8.5g} {mae:6.3f} / {mx:6.3f}; "
              f"{worst:15}   {cpu:26} {wall:26} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
