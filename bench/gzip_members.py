"""How big a gzip member should be for random access: size against single-record read speed.

`python -m bench.gzip_members FILE…` reads plain TFRecord files, re-gzips their records as
members of 16 KiB to 8 MiB (uncompressed, cut at record boundaries, at our default level 1),
and for each member size reports the compressed size against 8 MiB members and the rate of
single-record reads at random: inflate the member holding the record (ISA-L, stopping at the
record) and take the record. One process, warm data, no TensorFlow."""
from __future__ import annotations

import json
import os
import random
import sys
import time

import numpy as np
from isal import isal_zlib

from components import shards, tfrecord_io

MEMBER_KIB = (16, 32, 64, 128, 256, 8192)
READS = 5000
LEVEL = 1


def _members(data: bytes, ends: np.ndarray, limit: int) -> list[tuple[bytes, int, int]]:
    """(gzip member, first record, uncompressed start) per member of at most `limit` bytes."""
    members, first, start = [], 0, 0
    while first < len(ends):
        last = int(np.searchsorted(ends, start + limit, side="right")) - 1
        last = min(max(last, first), len(ends) - 1)
        members.append((shards.gzip_member(data[start:int(ends[last])], LEVEL), first, start))
        first, start = last + 1, int(ends[last])
    return members


def measure(paths: list[str]) -> dict:
    data = b"".join(open(p, "rb").read() for p in paths)
    ends = np.concatenate([[0]] + [
        block.offset + block.ends.astype(np.int64) + 4
        for path_offset, path in _offsets(paths)
        for block in _shifted(tfrecord_io.iter_record_blocks(path, 1 << 30), path_offset)])[1:]
    rng = random.Random(0)
    picks = [rng.randrange(len(ends)) for _ in range(READS)]
    results = {}
    for kib in MEMBER_KIB:
        members = _members(data, ends, kib << 10)
        firsts = np.array([m[1] for m in members])
        started = time.perf_counter()
        for record in picks:
            k = int(np.searchsorted(firsts, record, side="right")) - 1
            member, first, start = members[k]
            need = int(ends[record]) - start
            raw = isal_zlib.decompressobj(31).decompress(member, need)
            begin = int(ends[record - 1]) - start if record > first else 0
            length = int.from_bytes(raw[begin:begin + 8], "little")
            assert len(raw[begin + 12:begin + 12 + length]) == length
        seconds = time.perf_counter() - started
        results[kib] = {"members": len(members), "bytes": sum(len(m[0]) for m in members),
                        "reads_per_second": READS / seconds}
    reference = results[MEMBER_KIB[-1]]["bytes"]
    for entry in results.values():
        entry["size_vs_8mib"] = entry["bytes"] / reference - 1
    return {"records": int(len(ends)), "uncompressed_bytes": len(data), "level": LEVEL,
            "members": results}


def _offsets(paths: list[str]):
    offset = 0
    for path in paths:
        yield offset, path
        offset += os.path.getsize(path)


def _shifted(blocks, offset: int):
    for block in blocks:
        block.offset += offset
        yield block


if __name__ == "__main__":
    result = measure(sys.argv[1:])
    print(json.dumps(result, indent=1))
    for kib, entry in result["members"].items():
        print(f"{kib:>5} KiB members: {entry['members']:>6} members, size "
              f"{entry['size_vs_8mib']:+.1%} vs 8 MiB members, "
              f"{entry['reads_per_second']:,.0f} random single-record reads/s", file=sys.stderr)
