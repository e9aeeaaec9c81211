#!/usr/bin/env python3
"""Miss counts of the cxlfs cache model and of libCacheSim, side by side.

Generates page sequences (zipf and uniform over a footprint of pages), runs
each through libCacheSim's policies (the `libcachesim` Python bindings,
object-count mode: every object of size 1) and through the model's fully
associative cache (the `policy_misses` example of device-model: lookup →
hit, else insert; no timing, MSHRs or prefetch), with the same parameters on
both sides, and prints the miss counts per workload, cache size and policy.

    pip install libcachesim            # cp311 wheel; pulls numpy
    python3 device-model/bench/libcachesim-compare.py            # 1 Mi requests, 64 Ki pages
    python3 device-model/bench/libcachesim-compare.py --requests 100000 --markdown

Exit status 1 if any cell differs. Parameters: the model's defaults are
libCacheSim's (S3-FIFO small 0.10, ghost 0.90, move-to-main threshold 2; 2Q
Ain 0.25, Aout 0.50; CLOCK one reference bit, initial frequency 0); `--param
NAME=VALUE` (a `PolicyParams` field, e.g. `s3fifo_small_ratio=0.2`) changes
it on both sides.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import libcachesim as lcs
except ImportError:  # pragma: no cover - a message instead of a traceback
    sys.exit("libcachesim-compare: `pip install libcachesim` first (Python bindings of libCacheSim)")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# PolicyParams field -> (libCacheSim policy, keyword of its Python class).
PARAM_MAP = {
    "s3fifo_small_ratio": ("s3fifo", "small_size_ratio"),
    "s3fifo_ghost_ratio": ("s3fifo", "ghost_size_ratio"),
    "s3fifo_move_to_main_threshold": ("s3fifo", "move_to_main_threshold"),
    "twoq_kin_ratio": ("2q", "a_in_size_ratio"),
    "twoq_kout_ratio": ("2q", "a_out_size_ratio"),
}

# The model's defaults, spelled out for libCacheSim so that both sides run
# the same parameters even if a libCacheSim release changes its defaults.
DEFAULTS = {
    "s3fifo_small_ratio": 0.10,
    "s3fifo_ghost_ratio": 0.90,
    "s3fifo_move_to_main_threshold": 2,
    "twoq_kin_ratio": 0.25,
    "twoq_kout_ratio": 0.50,
}


def libcachesim_cache(policy: str, capacity: int, params: dict, hashpower: int):
    """A libCacheSim cache of `capacity` objects."""
    kw = {
        keyword: params[name]
        for name, (pol, keyword) in PARAM_MAP.items()
        if pol == policy
    }
    if policy == "fifo":
        return lcs.FIFO(capacity, hashpower=hashpower)
    if policy == "lru":
        return lcs.LRU(capacity, hashpower=hashpower)
    if policy == "clock":
        return lcs.Clock(capacity, hashpower=hashpower, init_freq=0, n_bit_counter=1)
    if policy == "s3fifo":
        return lcs.S3FIFO(capacity, hashpower=hashpower, **kw)
    if policy == "2q":
        return lcs.TwoQ(capacity, hashpower=hashpower, **kw)
    raise SystemExit(f"libcachesim-compare: no libCacheSim counterpart for policy `{policy}`")


def libcachesim_misses(policy: str, capacity: int, params: dict, pages: list[int]) -> int:
    hashpower = max(10, int(capacity).bit_length() + 1)
    cache = libcachesim_cache(policy, capacity, params, hashpower)
    get = cache._cache.get  # the C++ object: one call per request
    req = lcs.Request()
    req.obj_size = 1
    misses = 0
    for page in pages:
        req.obj_id = page
        if not get(req):
            misses += 1
    return misses


def model_misses(binary: str, trace: str, policy: str, capacities: list[int], params: dict) -> dict:
    args = [binary, trace, policy, ",".join(str(c) for c in capacities)]
    args += [f"{k}={v}" for k, v in params.items()]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    result = {}
    for line in out.splitlines():
        _name, cap, misses, _requests = line.split()
        result[int(cap)] = int(misses)
    return result


def sequence(kind: str, requests: int, pages: int, alpha: float, rng) -> np.ndarray:
    """Page numbers 1..=pages (0 is avoided as an object id)."""
    if kind == "uniform":
        ranks = rng.integers(0, pages, requests)
    elif kind == "zipf":
        weights = np.arange(1, pages + 1, dtype=np.float64) ** -alpha
        cdf = np.cumsum(weights)
        cdf /= cdf[-1]
        ranks = np.minimum(np.searchsorted(cdf, rng.random(requests), side="right"), pages - 1)
    else:
        raise SystemExit(f"libcachesim-compare: unknown workload `{kind}` (zipf, uniform)")
    # Popularity rank -> page: a fixed random permutation.
    perm = rng.permutation(pages)
    return (perm[ranks] + 1).astype(np.uint64)


def build_model(skip: bool) -> str:
    binary = os.path.join(REPO, "target", "release", "examples", "policy_misses")
    if not skip:
        subprocess.run(
            ["cargo", "build", "--release", "--quiet", "-p", "cxlfs-device-model", "--example", "policy_misses"],
            cwd=REPO,
            check=True,
        )
    if not os.path.exists(binary):
        raise SystemExit(f"libcachesim-compare: {binary} missing (drop --no-build)")
    return binary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1 << 20)
    ap.add_argument("--pages", type=int, default=1 << 16, help="footprint in pages")
    ap.add_argument("--alpha", type=float, default=0.99, help="zipf exponent")
    ap.add_argument("--sizes", default="1,5,10,25", help="cache sizes, %% of the footprint")
    ap.add_argument("--policies", default="fifo,lru,clock,s3fifo,2q")
    ap.add_argument("--workloads", default="zipf,uniform")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--no-build", action="store_true", help="use the built example as is")
    args = ap.parse_args()

    params = dict(DEFAULTS)
    for item in args.param:
        name, _, value = item.partition("=")
        if name not in PARAM_MAP:
            raise SystemExit(f"libcachesim-compare: unknown --param `{name}` (known: {', '.join(PARAM_MAP)})")
        params[name] = int(value) if name.endswith("threshold") else float(value)

    binary = build_model(args.no_build)
    policies = args.policies.split(",")
    sizes = [float(s) for s in args.sizes.split(",")]
    capacities = [max(1, int(args.pages * s / 100)) for s in sizes]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for w, kind in enumerate(args.workloads.split(",")):
            rng = np.random.default_rng(args.seed + w)
            seq = sequence(kind, args.requests, args.pages, args.alpha, rng)
            trace = os.path.join(tmp, f"{kind}.u64")
            seq.astype("<u8").tofile(trace)
            pages = seq.tolist()
            for policy in policies:
                t0 = time.perf_counter()
                ours = model_misses(binary, trace, policy, capacities, params)
                t_model = time.perf_counter() - t0
                for size, cap in zip(sizes, capacities):
                    t0 = time.perf_counter()
                    theirs = libcachesim_misses(policy, cap, params, pages)
                    t_lcs = time.perf_counter() - t0
                    rows.append((kind, size, cap, policy, theirs, ours[cap], args.requests))
                    print(
                        f"  {kind} {size:g}% {policy}: libCacheSim {theirs} ({t_lcs:.1f} s), "
                        f"cxlfs {ours[cap]} ({t_model / len(capacities):.2f} s)",
                        file=sys.stderr,
                    )

    print(
        f"# {args.requests} requests over {args.pages} pages, zipf alpha {args.alpha}, seed {args.seed}; "
        "params: " + ", ".join(f"{k}={v}" for k, v in params.items())
    )
    header = ("workload", "cache", "pages", "policy", "libCacheSim misses", "cxlfs misses", "diff", "miss ratio")
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header))
    else:
        print("{:<8} {:>6} {:>6} {:<7} {:>18} {:>13} {:>6} {:>10}".format(*header))
    differ = 0
    for kind, size, cap, policy, theirs, ours, n in rows:
        diff = ours - theirs
        differ += diff != 0
        cells = (kind, f"{size:g} %", str(cap), policy, str(theirs), str(ours), f"{diff:+d}", f"{100 * theirs / n:.2f} %")
        if args.markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print("{:<8} {:>6} {:>6} {:<7} {:>18} {:>13} {:>6} {:>10}".format(*cells))
    print(f"# {len(rows) - differ} of {len(rows)} cells equal")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
