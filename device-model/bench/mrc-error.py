#!/usr/bin/env python3
"""Error of a `cxlfs mrc --json` curve against a reference (`--method replay --json`).

Usage: mrc-error.py CURVE.json REFERENCE.json [--mae 1.0 --max 2.0]
Prints, per policy, the mean and largest absolute error in points (%) over
the sizes both have; exits 1 if any policy misses the bounds.
"""
import argparse
import json
from collections import defaultdict

ap = argparse.ArgumentParser()
ap.add_argument("curve")
ap.add_argument("reference")
ap.add_argument("--mae", type=float, default=1.0)
ap.add_argument("--max", type=float, default=2.0)
args = ap.parse_args()


def load(path):
    points = defaultdict(dict)
    with open(path) as f:
        for line in f:
            if line.strip():
                p = json.loads(line)
                points[p["policy"]][p["size_bytes"]] = p
    return points


curve, ref = load(args.curve), load(args.reference)
ok = True
for policy, pts in curve.items():
    errs = [abs(p["miss_ratio"] - ref[policy][s]["miss_ratio"]) * 100
            for s, p in pts.items() if s in ref.get(policy, {})]
    if not errs:
        continue
    mae, mx = sum(errs) / len(errs), max(errs)
    method = next(iter(pts.values())).get("method", "")
    rate = next(iter(pts.values())).get("sampling_rate")
    good = mae <= args.mae and mx <= args.max
    ok &= good
    print(f"{policy:7} {method:8} R={rate if rate else 1:<8.5g} points {len(errs):3}  "
          f"MAE {mae:6.3f}  max {mx:6.3f}  {'ok' if good else 'MISSED'}")
raise SystemExit(0 if ok else 1)
