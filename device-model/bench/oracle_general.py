"""libCacheSim's oracleGeneral trace format, written with the standard library.

A record per request, 24 bytes, little-endian, packed: `u32` time, `u64`
object id, `u32` object size, `i64` virtual time of the object's next
request (-1: not recorded). libCacheSim's `cachesim` and `mrcProfiler` read
it as trace type `oracleGeneral`. Shared by the benchmarks that run
libCacheSim (`libcachesim-throughput.py`, `mrc-vs-libcachesim.py`).
"""

from __future__ import annotations

import struct
from typing import Iterable

# The record's fields (name, little-endian type), in order: the one
# description of the layout, for `struct` here and for numpy arrays
# (`numpy.dtype(FIELDS)`) where a benchmark writes millions at once.
FIELDS = [("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")]
RECORD = struct.Struct("<" + "".join({"<u4": "I", "<u8": "Q", "<i8": "q"}[t] for _, t in FIELDS))


def write(path: str, ids: Iterable[int], obj_size: int = 1) -> int:
    """Writes one request per id, times 0, 1, 2, …; returns the count."""
    pack = RECORD.pack
    n = 0
    buf: list[bytes] = []
    with open(path, "wb") as f:
        for obj in ids:
            buf.append(pack(n & 0xFFFF_FFFF, obj, obj_size, -1))
            n += 1
            if len(buf) == 1 << 16:
                f.write(b"".join(buf))
                buf.clear()
        f.write(b"".join(buf))
    return n
