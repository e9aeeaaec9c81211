#!/usr/bin/env python3
"""A real memory trace in cxlfs's CSV format, from valgrind's lackey.

Usage: valgrind --tool=lackey --trace-mem=yes CMD 2>&1 >/dev/null |
         python3 device-model/bench/lackey-trace.py --max N > trace.csv

Each load, store or modify lackey prints (`L`/`S`/`M addr,size`; `I`
instruction fetches skipped) becomes one access; its 4 KiB page is renamed
to a compact page number (pages numbered in order of first touch, the
offset within the page kept), so the trace fits any device and keeps every
page's identity. Consecutive accesses to the same page are collapsed into
the first (they hit in any cache of one page or more, for every policy).
Stops after N accesses. Records `# arrival: closed`: the times are 0.
"""
import argparse
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--max", type=int, default=50000)
ap.add_argument("--skip", type=int, default=0, help="skip this many collapsed accesses first")
args = ap.parse_args()

pages = {}
last = None
n = 0
skipped = 0
out = sys.stdout
out.write("# arrival: closed\ntime_ns,op,addr,len\n")
for line in sys.stdin:
    if len(line) < 4 or line[0] == "I" or line[0] == "=":
        continue
    kind = line[1]
    if kind not in "LSM" or line[0] != " ":
        continue
    try:
        addr_s, size_s = line[3:].strip().split(",")
        addr, size = int(addr_s, 16), int(size_s)
    except ValueError:
        continue
    page = addr >> 12
    if page == last:
        continue
    last = page
    if skipped < args.skip:
        skipped += 1
        pages.setdefault(page, len(pages))
        continue
    p = pages.setdefault(page, len(pages))
    size = max(1, min(size, 4096 - (addr & 4095)))
    op = "W" if kind == "S" else "R"
    out.write(f"0,{op},{(p << 12) | (addr & 4095)},{size}\n")
    n += 1
    if n >= args.max:
        break
