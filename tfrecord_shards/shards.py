"""The sharding writer shared by ExampleGen and Transform.

Workers append framed records to small chunk files and report only each chunk's size. With
gzip, each chunk file is a run of small gzip members (`gzip_member_kib` of records each, cut at
record boundaries), compressed by the worker that wrote it: the compression runs where the
encoding runs, on every worker at once, and the staging folder holds about the output's size
rather than several times it. Small members make a gzip shard seekable, in the spirit of BGZF:
the manifest lists every member's offset and record count, so reaching any record inflates one
small member, while any gzip reader (TensorFlow's included) still reads the file as one
stream. A planner then cuts every
(partition, split) stream into shards at record boundaries: equal parts for a shard count, or
consecutive parts of the target size (the last takes the remainder) for a shard size. Shard
writers copy whole chunk files; only a chunk that a cut falls inside is inflated and its two
parts deflated again. Memory holds chunk metadata, never the data, so it stays flat as the
input grows.

Everything is written under a staging folder (`staged_output`, `commit.py`) and moved into
place at the end, manifest (`manifest.py`) last: a run that fails leaves no manifest, and so
nothing that looks complete. Both are imported here too, for callers that use them as
`shards.X`.

This module is engine-neutral: Beam's transform over it is `tfrecord_shards/beam_shards.py`, and
any other engine calls the same plan, write and manifest functions.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import urllib.parse
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Optional

import numpy as np
from isal import igzip, isal_zlib

from tfrecord_shards import fileio, record_index, tfrecord_io
# The staged output and the manifest, as callers have them from here (`shards.staged_output`).
from tfrecord_shards.commit import (COMMITTING_FILE, STAGING_PREFIX, IncompleteOutputError,
                                    check_committed, check_output_dir, clear_earlier_attempt,
                                    commit, discard, new_staging_dir, staged_output)
from tfrecord_shards.manifest import (MANIFEST_FILE, Shard, build_manifest,
                                      check_row_accounting, read_manifest, split_names,
                                      write_manifest)
from tfrecord_shards.options import JsonOptions, SettingError, setting

DEFAULT_SHARD_SIZE_MB = 128.0
QUARANTINE_DIR = "quarantine"
# Inside the staging folder, where a shard is written before it is moved into place; like
# every `_` name there, never committed.
ATTEMPTS_DIR = "_attempts"
_MB = 1 << 20
# A chunk is at most this share of a shard, so cutting at chunk-internal record boundaries
# needs only the one chunk's record index.
_MAX_CHUNK_BYTES = 8 * _MB
_MIN_CHUNK_BYTES = 64 << 10


@dataclasses.dataclass(frozen=True)
class ShardingOptions(JsonOptions):
    num_shards: Optional[int] = setting(None, "Shards per split.", minimum=1)
    shard_size_mb: Optional[float] = setting(
        None, f"Target shard size on disk in MB (default {DEFAULT_SHARD_SIZE_MB:g}; small data "
        "gets one shard).", above=0)
    compression: str = setting("gzip", "Shard compression.", choices=("gzip", "none"))
    # Level 1: on taxi rows level 6 (stock ExampleGen's, through Beam) is 15 % smaller and
    # makes the run itself a third longer (bench/RESULTS.md, "ExampleGen as whole processes").
    # Levels 1-3 deflate with ISA-L, 4-9 with zlib (`gzip_member`).
    compression_level: int = setting(1, "Gzip level (stock ExampleGen writes at 6).",
                                     minimum=1, maximum=9)
    # 96 KiB: on taxi rows at level 1, the smallest member within 5 % of one 8 MiB member's
    # size (+4.6 %) that reads over 20,000 random records a second (24,057); 64 KiB members
    # read faster but cost +7.0 % (bench/RESULTS.md, "Seekable gzip").
    gzip_member_kib: int = setting(
        96, "Records per gzip member, in KiB before compression: reaching any record inflates "
        "at most one member (larger: smaller files, slower random reads).", minimum=4)

    def __post_init__(self):
        super().__post_init__()
        if self.num_shards is not None and self.shard_size_mb is not None:
            raise SettingError(["num_shards", "shard_size_mb"], "give {0} or {1}, not both")

    @property
    def target_bytes(self) -> float:
        return (self.shard_size_mb or DEFAULT_SHARD_SIZE_MB) * _MB

    @property
    def chunk_bytes(self) -> int:
        return int(min(_MAX_CHUNK_BYTES, max(_MIN_CHUNK_BYTES, self.target_bytes / 16)))


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One chunk file: a run of framed records of one (partition, split), plain or as gzip
    members (listed in its `.members` file)."""

    partition: str  # "" or "col=value"
    split: str
    order: tuple  # sorts chunks into a deterministic stream order
    path: str
    rows: int
    nbytes: int  # framed record bytes, which the plan and the record index count in
    stored_bytes: int  # the file's size
    gzipped: bool = False


@dataclasses.dataclass(frozen=True)
class Piece:
    """Records start:end (framed record bytes) of one chunk file."""

    path: str
    start: int
    end: int
    rows: int
    gzipped: bool = False
    whole: bool = False  # the whole chunk: a gzipped one is copied as it is


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    partition: str
    split: str
    index: int
    count: int
    pieces: tuple

    def relative_path(self, compression: str) -> str:
        name = f"data_tfrecord-{self.index:05d}-of-{self.count:05d}"
        if compression == "gzip":
            name += ".gz"
        return posixpath.join(self.partition, f"Split-{self.split}", name)


# The folder names of a null and of an empty partition value (Hive writes
# __HIVE_DEFAULT_PARTITION__ for both; keeping them apart loses less).
NULL_PARTITION, EMPTY_PARTITION = "__null__", "__empty__"


def partition_dir(column: str, value) -> str:
    """`column=value`, made safe for every filesystem: no separator, `..` or NUL gets through.

    Values are percent-encoded like Hive/Spark partition paths; dots are encoded too, so `.` and
    `..` cannot become path components. Over-long values keep a readable prefix plus a hash.
    """
    if value is None:
        text = NULL_PARTITION
    else:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "backslashreplace")
        text = urllib.parse.quote(str(value), safe="-_") or EMPTY_PARTITION
        text = text.replace(".", "%2E")
        if str(value) in (NULL_PARTITION, EMPTY_PARTITION):
            # The literal strings must not land in the null or empty value's folder.
            text = text.replace("_", "%5F")
    if len(text) > 120:
        text = text[:80] + "~" + hashlib.sha1(text.encode()).hexdigest()[:16]
    safe_column = urllib.parse.quote(column, safe="-_").replace(".", "%2E")
    return f"{safe_column}={text}"


class ChunkWriter:
    """Appends framed records per (partition, split) and rolls chunk files at a size."""

    def __init__(self, folder: str, writer_id: int, sharding: "ShardingOptions"):
        """`writer_id` names this writer's chunk files and orders its chunks among all
        writers' (ExampleGen uses the source file's index, so the output order is the input
        order). With gzip shards the chunks are gzipped at the shards' level."""
        # A folder of its own per writer and attempt: an engine that runs a task again (a
        # retry, a speculative copy) never writes over another attempt's files, and only the
        # chunks of the attempt the engine kept are planned; the others go with the staging.
        self.folder = fileio.join(folder, f"{writer_id:06d}-{uuid.uuid4().hex[:8]}")
        self._writer_id = writer_id
        self._limit = sharding.chunk_bytes
        self._level = sharding.compression_level if sharding.compression == "gzip" else None
        self._member_bytes = sharding.gzip_member_kib << 10
        # Per (partition, split): framed byte runs and their record ends, not yet written.
        self._pending: dict[tuple, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._sizes: dict[tuple, int] = {}
        self._sequence = 0
        self.chunks: list[Chunk] = []
        fileio.makedirs(self.folder)

    def add(self, partition: str, split: str, records) -> None:
        """`records`: serialized records, as a pyarrow binary array or a list of bytes."""
        framed, ends = tfrecord_io.frame_records(records)
        key = (partition, split)
        first, start = 0, 0
        while first < len(ends):
            size = self._sizes.get(key, 0)
            # Take records up to and including the one that reaches the chunk size.
            last = min(int(np.searchsorted(ends, start + self._limit - size)), len(ends) - 1)
            end = int(ends[last])
            self._pending.setdefault(key, []).append((framed[start:end],
                                                      ends[first:last + 1] - start))
            self._sizes[key] = size + end - start
            first, start = last + 1, end
            if self._sizes[key] >= self._limit:
                self._flush(key)

    def _flush(self, key: tuple) -> None:
        runs = self._pending.pop(key, [])
        self._sizes[key] = 0
        if not runs:
            return
        self._sequence += 1
        path = fileio.join(self.folder, f"{self._writer_id:06d}-{self._sequence:06d}.rec")
        bases = np.cumsum([0] + [len(data) for data, _ in runs[:-1]])
        ends = np.concatenate([run_ends + base for (_, run_ends), base in zip(runs, bases)])
        with fileio.open_file(path, "wb") as f:
            if self._level is None:
                for data, _ in runs:
                    f.write(data.tobytes())
                stored = int(ends[-1])
            else:
                # Member by member from the runs' own buffers: joining the runs first would
                # hold a second copy of the chunk.
                members = []
                for _, records, start, end in member_bounds(ends, self._member_bytes):
                    members.append((f.tell(), records))
                    f.write(gzip_member(_slice_runs(runs, bases, start, end), self._level))
                stored = f.tell()
                _write_members(path, members)
        with fileio.open_file(path + ".idx", "wb") as f:
            f.write(ends.astype(np.int64).tobytes())
        self.chunks.append(Chunk(key[0], key[1], (self._writer_id, self._sequence), path,
                                 len(ends), int(ends[-1]), stored, self._level is not None))

    def close(self) -> list[Chunk]:
        for key in sorted(self._pending):
            self._flush(key)
        return self.chunks


def member_bounds(ends: np.ndarray, member_bytes: int
                  ) -> Iterator[tuple[int, int, int, int]]:
    """(first record, records, start byte, end byte) of each gzip member over records ending
    at `ends` (framed bytes from 0): records up to `member_bytes` a member, cut at record
    boundaries; a record larger than that is a member of its own."""
    first, start = 0, 0
    while first < len(ends):
        last = int(np.searchsorted(ends, start + member_bytes, side="right")) - 1
        last = min(max(last, first), len(ends) - 1)
        yield first, last - first + 1, start, int(ends[last])
        first, start = last + 1, int(ends[last])


def _slice_runs(runs: list, bases: np.ndarray, start: int, end: int) -> bytes:
    """Bytes start:end of the runs' concatenation, without concatenating them."""
    parts = []
    for (data, _), base in zip(runs, bases):
        lo, hi = max(start - int(base), 0), min(end - int(base), len(data))
        if lo < hi:
            parts.append(data[lo:hi])
    return parts[0].tobytes() if len(parts) == 1 else b"".join(p.tobytes() for p in parts)


def _write_members(path: str, members: list[tuple[int, int]]) -> None:
    with fileio.open_file(path + ".members", "wb") as f:
        f.write(np.array(members, np.int64).reshape(-1, 2).tobytes())


def _read_members(path: str) -> np.ndarray:
    """(compressed offset, records) rows of a gzipped chunk's members."""
    with fileio.open_file(path + ".members", "rb") as f:
        return np.frombuffer(f.read(), dtype=np.int64).reshape(-1, 2)


def _record_ends(path: str) -> np.ndarray:
    """A chunk file's record ends (framed bytes), from its `.idx` file."""
    with fileio.open_file(path + ".idx", "rb") as f:
        return np.frombuffer(f.read(), dtype=np.int64)


def plan_shards(chunks: list[Chunk], options: ShardingOptions) -> list[ShardSpec]:
    """Cuts each (partition, split) stream of chunks into shards at record boundaries."""
    streams: dict[tuple, list[Chunk]] = {}
    for chunk in chunks:
        streams.setdefault((chunk.partition, chunk.split), []).append(chunk)
    specs = []
    for (partition, split), stream in sorted(streams.items()):
        stream.sort(key=lambda c: c.order)
        total = sum(c.nbytes for c in stream)
        rows = sum(c.rows for c in stream)
        # Shard sizes are what users see on disk. Gzipped chunks say exactly how far their
        # records shrink, so cutting at `target / ratio` record bytes gets there.
        ratio = (max(sum(c.stored_bytes for c in stream), 1) / max(total, 1)
                 if options.compression == "gzip" else 1.0)
        cuts = _cut_points(total, rows, options, ratio)
        cuts = _snap_to_records(stream, cuts)
        bounds = [0] + cuts + [total]
        count = len(bounds) - 1
        for index in range(count):
            pieces = _pieces(stream, bounds[index], bounds[index + 1])
            specs.append(ShardSpec(partition, split, index, count, tuple(pieces)))
    return specs


def _cut_points(total: int, rows: int, options: ShardingOptions,
                ratio: float = 1.0) -> list[float]:
    if options.num_shards:
        count = max(1, min(options.num_shards, rows))
        return [total * k / count for k in range(1, count)]
    target = options.target_bytes / ratio
    count = int(total // target)
    # A remainder under a quarter of the target rides with the previous shard (≤ 1.25×).
    if count and total - count * target < 0.25 * target:
        count -= 1
    return [target * k for k in range(1, count + 1)]


def _snap_to_records(stream: list[Chunk], cuts: list[float]) -> list[int]:
    snapped, start, position = [], 0, 0
    for chunk in stream:
        end = position + chunk.nbytes
        inside = [c for c in cuts[start:] if c < end]
        if inside:
            ends = position + _record_ends(chunk.path)
            for cut in inside:
                i = int(np.searchsorted(ends, cut))
                candidates = [ends[j] for j in (i - 1, i) if 0 <= j < len(ends)]
                best = int(min(candidates, key=lambda e: abs(e - cut)))
                if (not snapped or best > snapped[-1]) and best < position + chunk.nbytes + 1:
                    snapped.append(best)
            start += len(inside)
        position = end
    total = position
    return [s for s in snapped if 0 < s < total]


def _pieces(stream: list[Chunk], begin: int, finish: int) -> list[Piece]:
    pieces, position = [], 0
    for chunk in stream:
        end = position + chunk.nbytes
        lo, hi = max(begin, position), min(finish, end)
        if lo < hi:
            whole = lo == position and hi == end
            if whole:
                rows = chunk.rows
            else:
                ends = position + _record_ends(chunk.path)
                rows = int(np.count_nonzero((ends > lo) & (ends <= hi)))
            pieces.append(Piece(chunk.path, lo - position, hi - position, rows,
                                chunk.gzipped, whole))
        position = end
    return pieces


def write_shard(spec: ShardSpec, staging: str, sharding: ShardingOptions) -> Shard:
    """Copies the spec's pieces into one shard file.

    With gzip each piece is a run of small gzip members: a whole gzipped chunk is copied as it
    is, with its members, and any other piece is cut into members and deflated here, on a
    thread pool (ISA-L and zlib release the GIL). Concatenated members are one valid gzip
    stream, which TensorFlow's and Beam's readers both read through.
    """
    compression = sharding.compression
    relative = spec.relative_path(compression)
    # Written under a name of this attempt's own, then moved into place whole: a retried or
    # speculative attempt of the same shard never interleaves with another's bytes.
    path = fileio.join(staging, ATTEMPTS_DIR, uuid.uuid4().hex[:12], relative)
    fileio.makedirs(fileio.dirname(path))

    def compress_piece(piece: Piece) -> tuple[bytes, list[tuple[int, int]]]:
        """The piece as gzip members, and each member's (offset in them, records)."""
        if piece.gzipped and piece.whole:
            with fileio.open_file(piece.path, "rb") as f:
                return f.read(), [tuple(m) for m in _read_members(piece.path).tolist()]
        data = _piece_records(piece)
        parts, members, written = [], [], 0
        for _, records, start, end in member_bounds(_piece_record_ends(piece),
                                                    sharding.gzip_member_kib << 10):
            parts.append(gzip_member(data[start:end], sharding.compression_level))
            members.append((written, records))
            written += len(parts[-1])
        return b"".join(parts), members

    members = []
    with fileio.open_file(path, "wb") as out:
        if compression == "gzip":
            workers = os.cpu_count() or 1
            written = 0

            def append(piece_members: tuple[bytes, list[tuple[int, int]]]) -> None:
                nonlocal written
                data, within = piece_members
                members.extend((written + offset, rows) for offset, rows in within)
                out.write(data)
                written += len(data)

            with ThreadPoolExecutor(workers) as pool:
                # Bounded look-ahead keeps at most 2 x workers pieces in memory.
                pending = []
                for piece in spec.pieces:
                    pending.append(pool.submit(compress_piece, piece))
                    if len(pending) >= 2 * workers:
                        append(pending.pop(0).result())
                for future in pending:
                    append(future.result())
        else:
            record_ends, written = [], 0
            for piece in spec.pieces:
                if piece.gzipped:
                    out.write(_piece_records(piece))
                else:
                    fileio.append_range(piece.path, piece.start, piece.end - piece.start, out)
                record_ends.append(_piece_record_ends(piece) + written)
                written += piece.end - piece.start
    nbytes = fileio.size(path)
    moves = [(path, relative)]
    if compression != "gzip":  # a plain shard's record index, as it is written
        moves.append(_write_plain_index(path, relative, nbytes, record_ends))
    for written_path, final_relative in moves:
        final = fileio.join(staging, final_relative)
        fileio.makedirs(fileio.dirname(final))
        fileio.rename(written_path, final)
    return Shard(spec.partition, spec.split, relative, sum(p.rows for p in spec.pieces),
                 nbytes, tuple(members))


def _write_plain_index(path: str, relative: str, nbytes: int, record_ends: list
                       ) -> tuple[str, str]:
    """Writes the `.idx` of the plain shard at `path` (each record's offset and framed
    length, the text DALI and the `tfrecord` package read) beside it; returns (where it is,
    where it goes relative to the output: the artifact's `index/Split-x/` folder)."""
    ends = np.concatenate(record_ends) if record_ends else np.zeros(0, np.int64)
    offsets = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    index = record_index.RecordIndex(path, False, nbytes, offsets, ends - offsets,
                                     np.arange(len(ends), dtype=np.int64),
                                     np.ones(len(ends), np.int64))
    written = index.save(path + record_index.PLAIN_SUFFIX)
    return written, record_index.default_index_path(relative, gzip=False)


def _piece_record_ends(piece: Piece) -> np.ndarray:
    """The piece's record ends, in framed bytes from its start."""
    chunk_ends = _record_ends(piece.path)
    return chunk_ends[(chunk_ends > piece.start) & (chunk_ends <= piece.end)] - piece.start


def _piece_records(piece: Piece) -> bytes:
    """The piece's framed records, inflating its chunk first when that is gzipped."""
    with fileio.open_file(piece.path, "rb") as f:
        if piece.gzipped:
            return igzip.decompress(f.read())[piece.start:piece.end]
        f.seek(piece.start)
        return f.read(piece.end - piece.start)


_GZIP_WBITS = 16 + 15  # a gzip header and trailer around a 32 KB window
# ISA-L's deflate has levels 0-3. On our records its level 1 is about 4.5x zlib's level 1
# and a little smaller; levels above 3 use zlib's. Both release the GIL.
_ISAL_LEVELS = range(1, 4)


def gzip_member(data: bytes, level: int) -> bytes:
    """`data` as one gzip member (mtime 0, so equal data gives equal bytes). One call, no
    compressor object: a shard is thousands of small members, and a compressor object a
    member (ISA-L's holds its level buffers) raised ExampleGen's peak memory by half."""
    if level in _ISAL_LEVELS:
        return isal_zlib.compress(data, level, wbits=_GZIP_WBITS)
    return zlib.compress(data, level, wbits=_GZIP_WBITS)
