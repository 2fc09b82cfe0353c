"""How big a gzip member should be for random access: size against single-record read speed.

`python -m bench.gzip_members [--levels 1,2,3] FILE…` reads plain TFRecord files, re-gzips
their records as members of 16 KiB to 8 MiB (uncompressed, cut at record boundaries, at each
level given; our default level 1 alone by default), and for each level and member size reports
the compressed size against 8 MiB members at level 1 (the layout of our writer before it cut
small members) and the rate of single-record reads at random: inflate the member holding the
record (ISA-L, stopping at the record) and take the record. One process, warm data, no
TensorFlow."""
from __future__ import annotations

import json
import os
import random
import sys
import time

import numpy as np
from isal import isal_zlib

from tfrecord_shards import shards, tfrecord_io

MEMBER_KIB = (16, 32, 64, 96, 128, 256, 8192)
READS = 5000


def _members(data: bytes, ends: np.ndarray, limit: int, level: int
             ) -> list[tuple[bytes, int, int]]:
    """(gzip member, first record, uncompressed start) per member, cut as our writer cuts."""
    return [(shards.gzip_member(data[start:end], level), first, start)
            for first, _, start, end in shards.member_bounds(ends, limit)]


def measure(paths: list[str], levels: tuple = (1,)) -> dict:
    data = b"".join(open(p, "rb").read() for p in paths)
    ends = np.concatenate([[0]] + [
        block.offset + block.ends.astype(np.int64) + 4
        for path_offset, path in _offsets(paths)
        for block in _shifted(tfrecord_io.iter_record_blocks(path, 1 << 30), path_offset)])[1:]
    rng = random.Random(0)
    picks = [rng.randrange(len(ends)) for _ in range(READS)]
    results = {}
    for level, kib in [(level, kib) for level in levels for kib in MEMBER_KIB]:
        members = _members(data, ends, kib << 10, level)
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
        results[f"{level}/{kib}"] = {
            "level": level, "kib": kib, "members": len(members),
            "bytes": sum(len(m[0]) for m in members), "reads_per_second": READS / seconds}
    reference = sum(len(m[0]) for m in _members(data, ends, MEMBER_KIB[-1] << 10, 1))
    for entry in results.values():
        entry["size_vs_8mib"] = entry["bytes"] / reference - 1
    return {"records": int(len(ends)), "uncompressed_bytes": len(data), "members": results}


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
    arguments = sys.argv[1:]
    chosen = (1,)
    if arguments[:1] == ["--levels"]:
        chosen, arguments = tuple(int(v) for v in arguments[1].split(",")), arguments[2:]
    result = measure(arguments, chosen)
    print(json.dumps(result, indent=1))
    for entry in result["members"].values():
        print(f"level {entry['level']}, {entry['kib']:>5} KiB members: {entry['members']:>6} "
              f"members, size {entry['size_vs_8mib']:+.1%} vs 8 MiB members at level 1, "
              f"{entry['reads_per_second']:,.0f} random single-record reads/s", file=sys.stderr)
