#!/usr/bin/env python3
"""Replay throughput and peak memory of `cxlfs replay --trace` against
libCacheSim, side by side on one machine in one run.

Both replay 10 M single-page requests, zipf(0.99) and uniform over 4 Mi
pages, through a 1 Mi-page fully associative cache (object-count mode on
the libCacheSim side), for the policies both have (FIFO, LRU, CLOCK,
S3-FIFO). libCacheSim runs its own C loop (`process_trace` of the Python
bindings, an oracleGeneral trace file, as its `cachesim` reads one); cxlfs
runs what a user runs (`cxlfs replay --trace` on a binary trace from
`cxlfs trace gen`, NAND off, hits visible). The two traces are drawn from
the same distributions, not the same sequence (their miss ratios are
printed; they agree to three digits). Each run is its own process, so
peak RSS is per run; libCacheSim's includes the trace file it maps
(printed separately).

    pip install libcachesim          # cp311 wheel; pulls numpy
    cargo build --release -p cxlfs
    python3 device-model/bench/libcachesim-throughput.py [--requests N]

A benchmark: it measures and prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import numpy as np

import oracle_general as oracle_general_trace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = 4 << 20
CACHE = 1 << 20
POLICIES = {"fifo": "FIFO", "lru": "LRU", "clock": "Clock", "s3fifo": "S3FIFO"}

# One libCacheSim run in a fresh interpreter: prints "rate maxrss_mib miss_ratio".
LCS_RUN = r"""
import resource, sys, time
import libcachesim as lcs
path, cls, cap, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
reader = lcs.TraceReader(path, trace_type=lcs.TraceType.ORACLE_GENERAL_TRACE)
cache = getattr(lcs, cls)(cache_size=cap)
t = time.perf_counter()
miss_ratio = cache.process_trace(reader)[0]
d = time.perf_counter() - t
print(n / d / 1e6, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, miss_ratio)
"""


def oracle_general(path: str, dist: str, n: int, seed: int) -> None:
    """The workload as libCacheSim's oracleGeneral trace (objects of size 1)."""
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        ids = rng.integers(0, PAGES, n, dtype=np.uint64)
    else:
        ranks = np.arange(1, PAGES + 1, dtype=np.float64)
        cdf = np.cumsum(ranks**-0.99)
        cdf /= cdf[-1]
        ids = rng.permutation(PAGES).astype(np.uint64)[np.searchsorted(cdf, rng.random(n))]
    a = np.zeros(n, dtype=np.dtype(oracle_general_trace.FIELDS))
    a["time"] = np.arange(n, dtype=np.uint32)
    a["id"] = ids
    a["size"] = 1
    a["next"] = -1
    a.tofile(path)


def cxlfs_run(cxlfs: str, trace: str, policy: str) -> tuple[float, float, float]:
    """(M accesses/s, peak RSS MiB, miss ratio) of one `cxlfs replay --trace`."""
    out = subprocess.run(
        ["/usr/bin/time", "-f", "maxrss %M", cxlfs, "replay", "--trace", trace,
         "--set", f"cache.size_bytes={CACHE * 4}KiB", "--set", "cache.ways=0",
         "--set", f"cache.policy={policy}", "--set", "cache.hits_visible=true",
         "--set", "nand.enabled=false", "--no-progress"],
        capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    rate = float(re.search(r"throughput\s+([\d.]+) M accesses/s", text).group(1))
    rss = int(re.search(r"maxrss (\d+)", text).group(1)) / 1024
    hit = float(re.search(r"hit rate\s+([\d.]+) %", text).group(1))
    return rate, rss, 1 - hit / 100


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--work", default="/tmp/cxlfs-lcs-throughput")
    args = ap.parse_args()
    cxlfs = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target")), "release", "cxlfs")
    if not os.access(cxlfs, os.X_OK):
        sys.exit(f"no {cxlfs}: cargo build --release -p cxlfs")
    os.makedirs(args.work, exist_ok=True)
    print(f"{args.requests} requests, {PAGES} pages, {CACHE}-page cache; load {os.getloadavg()[0]:.2f}")
    print(f"{'workload':8} {'policy':7} {'cxlfs M/s':>10} {'libCacheSim M/s':>16} {'ratio':>6} "
          f"{'cxlfs RSS':>10} {'lCS RSS (trace)':>16} {'miss ratios':>16}")
    for dist in ("zipf", "uniform"):
        lcs_trace = os.path.join(args.work, f"{dist}.oracleGeneral")
        cx_trace = os.path.join(args.work, f"{dist}.bin")
        if not os.path.exists(lcs_trace):
            oracle_general(lcs_trace, dist, args.requests, args.seed)
        if not os.path.exists(cx_trace):
            workload = "zipf:0.99" if dist == "zipf" else "uniform"
            subprocess.run([cxlfs, "trace", "gen", "--workload", workload, "--wss", f"{PAGES * 4}KiB",
                            "--accesses", str(args.requests), "--seed", str(args.seed), "--out", cx_trace],
                           check=True, capture_output=True)
        trace_mib = os.path.getsize(lcs_trace) / 2**20
        # Both traces into the page cache first: the host reclaims idle
        # file pages (DAMON), and a cold first run measured the disk.
        for path in (cx_trace, lcs_trace):
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass
        for policy, cls in POLICIES.items():
            rate, rss, miss = cxlfs_run(cxlfs, cx_trace, policy)
            lcs_out = subprocess.run([sys.executable, "-c", LCS_RUN, lcs_trace, cls, str(CACHE), str(args.requests)],
                                     capture_output=True, text=True, check=True).stdout.split()
            lrate, lrss, lmiss = float(lcs_out[0]), float(lcs_out[1]), float(lcs_out[2])
            print(f"{dist:8} {policy:7} {rate:10.2f} {lrate:16.2f} {rate / lrate:5.1f}x "
                  f"{rss:8.0f} Mi {lrss:8.0f} Mi ({trace_mib:.0f}) {miss:7.4f}/{lmiss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
