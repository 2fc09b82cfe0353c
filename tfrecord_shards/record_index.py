"""A record index for TFRecord files, plain or gzip: how many records a file holds and where
each one is, so a reader can go straight to record i. No TensorFlow.

- A plain file's index is each record's offset and framed length (header, data, footer), kept
  as a `.idx` text file of `offset length` lines: the format NVIDIA DALI's
  `readers.tfrecord` and the PyPI `tfrecord` package read, byte for byte what that package's
  `tfrecord2idx` writes.
- A gzip file cannot be entered in the middle of a member, so its index is its gzip members:
  each member's compressed offset and length, and the number of its first record and its
  record count. Our writer cuts shards into small members (96 KiB of records by default,
  `ShardingOptions.gzip_member_kib`) and records them in the manifest, so reaching any record
  inflates part of one small member: up to the record, checked by its own CRC-32C. A file
  gzipped as one member (as stock ExampleGen writes them) is indexed just as well, but reaching
  a record then inflates the file up to it (the open member is kept for the reads that
  follow).

An index lives beside the data but outside the `Split-*` folders that readers glob:
`<artifact>/index/Split-train/<shard>.idx` (or `.gzi.json`), or `<file>.idx` for a file
outside any split folder. `tfrp index PATH…` writes it for files we did not write, in one pass.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Optional, Sequence, Union

import numpy as np
from isal import igzip_lib

from tfrecord_shards import fileio, tfrecord_io

PLAIN_SUFFIX = ".idx"
GZIP_SUFFIX = ".gzi.json"
GZIP_FORMAT = "tfrp.gzip_members/1"
INDEX_FOLDER = "index"


@dataclasses.dataclass
class RecordIndex:
    """Where the records of one file are. For a plain file each entry is one record; for a
    gzip file each entry is one member holding `counts[k]` records from `firsts[k]` on.
    `offsets` and `lengths` are bytes of the file as stored (compressed for gzip)."""

    path: str
    gzip: bool
    file_bytes: int
    offsets: np.ndarray
    lengths: np.ndarray
    firsts: np.ndarray
    counts: np.ndarray

    @functools.cached_property
    def records(self) -> int:
        return int(self.counts.sum()) if len(self.counts) else 0

    def entry_of(self, record: int) -> int:
        """The entry (record or member) holding record number `record`."""
        if not 0 <= record < self.records:
            raise IndexError(f"{self.path}: record {record} of {self.records}")
        if not self.gzip:
            return record
        return int(np.searchsorted(self.firsts, record, side="right")) - 1

    def ranges(self, records: int) -> list[tfrecord_io.RecordRange]:
        """The file cut, in order, into ranges of whole entries (records, or gzip members)
        of at least `records` records each but the last: units of work that a worker
        reads without the rest of the file."""
        ranges, entry = [], 0
        ends = self.offsets + self.lengths
        while entry < len(self.counts):
            last = int(np.searchsorted(self.firsts, self.firsts[entry] + records, "left")) - 1
            last = min(max(last, entry), len(self.counts) - 1)
            first = int(self.firsts[entry])
            ranges.append(tfrecord_io.RecordRange(
                self.path, int(self.offsets[entry]), int(ends[last]), first,
                int(self.firsts[last] + self.counts[last]) - first))
            entry = last + 1
        return ranges

    # --- building ---------------------------------------------------------------------
    @classmethod
    def build(cls, path: str) -> "RecordIndex":
        """Reads `path` once: the framing of a plain file (checksums checked); a gzip file
        member by member. Damage raises CorruptRecordError naming the file and offset."""
        size = fileio.size(path)
        if tfrecord_io.is_gzip(path):
            return cls._of_members(path, size, list(_gzip_members(path)))
        offsets, lengths = [], []
        for block in tfrecord_io.iter_record_blocks(path):
            starts = block.offset + block.starts.astype(np.int64) - 12
            offsets.append(starts)
            lengths.append(block.ends.astype(np.int64) - block.starts + 16)
        offsets_all = np.concatenate(offsets) if offsets else np.zeros(0, np.int64)
        return cls(path, False, size, offsets_all,
                   np.concatenate(lengths) if lengths else np.zeros(0, np.int64),
                   np.arange(len(offsets_all), dtype=np.int64),
                   np.ones(len(offsets_all), np.int64))

    @classmethod
    def _of_members(cls, path: str, size: int, members: Sequence[tuple[int, int]]
                    ) -> "RecordIndex":
        """From (compressed offset, records) per member: what our manifest keeps."""
        offsets = np.array([m[0] for m in members], np.int64)
        counts = np.array([m[1] for m in members], np.int64)
        ends = np.append(offsets[1:], size) if len(offsets) else offsets
        firsts = np.cumsum(counts) - counts if len(counts) else counts
        return cls(path, True, size, offsets, ends - offsets, firsts, counts)

    # --- storing ----------------------------------------------------------------------
    def idx_text(self) -> str:
        """The `.idx` text of a plain file: `offset length` a line, as tfrecord2idx writes."""
        if self.gzip:
            raise ValueError(f"{self.path}: a gzip file has no .idx (its records have no "
                             f"file offsets); its index is its members")
        return "".join(f"{o} {n}\n" for o, n in zip(self.offsets.tolist(),
                                                     self.lengths.tolist()))

    def save(self, index_path: Optional[str] = None) -> str:
        index_path = index_path or default_index_path(self.path, self.gzip)
        fileio.makedirs(fileio.dirname(index_path))
        if self.gzip:
            text = json.dumps({"format": GZIP_FORMAT, "bytes": self.file_bytes,
                               "records": self.records,
                               "members": [[int(o), int(c)] for o, c in
                                           zip(self.offsets, self.counts)]})
        else:
            text = self.idx_text()
        # Written aside and renamed, so a killed run leaves no index that looks whole.
        fileio.write_text(index_path + ".part", text)
        fileio.rename(index_path + ".part", index_path)
        return index_path


def default_index_path(path: str, gzip: bool) -> str:
    """`<artifact>/index/Split-x/<shard><suffix>` for a shard in a `Split-*` folder (readers
    glob those folders, so nothing else may live there), else `<file><suffix>`."""
    suffix = GZIP_SUFFIX if gzip else PLAIN_SUFFIX
    folder, name = fileio.dirname(path), fileio.basename(path)
    split = fileio.basename(folder)
    if split.startswith("Split-"):
        return fileio.join(fileio.dirname(folder), INDEX_FOLDER, split, name + suffix)
    return path + suffix


def pieces(paths: Sequence[str], records: int) -> list[Union[str, tfrecord_io.RecordRange]]:
    """Files as ranges of about `records` records (`RecordIndex.ranges`), by their stored
    indexes: a Beam job's units of work, so that one large file spreads over its workers.
    A file without an index stays whole, as reading it to build one costs about what
    reading it for the work does."""
    return [piece for path, index in zip(paths, load_all(paths))
            for piece in (index.ranges(records) if index is not None and index.records
                          else [path])]


def load_all(paths: Sequence[str]) -> list[Optional[RecordIndex]]:
    """`load` of each of `paths`, each manifest above them read once."""
    manifests: dict = {}
    return [load(path, manifests) for path in paths]


def load(path: str, manifests: Optional[dict] = None) -> Optional[RecordIndex]:
    """The stored index of `path`: our manifest's gzip members, or an index file beside it
    (one whose file size no longer matches is ignored: the data changed). None if none.
    `manifests`: as `tfrecord_io.manifest_shard` takes it."""
    size = fileio.size(path)
    gzip = tfrecord_io.is_gzip(path)
    if gzip:
        members = tfrecord_io.gzip_member_index(path, size, manifests)
        if members:
            return RecordIndex._of_members(path, size, members)
        stored = fileio.read_json(default_index_path(path, True))
        if stored and stored.get("format") == GZIP_FORMAT and stored.get("bytes") == size:
            return RecordIndex._of_members(path, size, stored["members"])
        return None
    index_path = default_index_path(path, False)
    if not fileio.exists(index_path):
        return None
    with fileio.open_file(index_path, "rb") as f:
        text = f.read()
    try:
        pairs = _idx_pairs(text)
    except ValueError as error:
        raise ValueError(f"{index_path}: not an index of `offset length` lines ({error})") \
            from None
    offsets, lengths = pairs[:, 0].copy(), pairs[:, 1].copy()
    if len(offsets) and offsets[-1] + lengths[-1] != size or not len(offsets) and size:
        return None
    return RecordIndex(path, False, size, offsets, lengths,
                       np.arange(len(offsets), dtype=np.int64), np.ones(len(offsets), np.int64))


def _idx_pairs(text: bytes) -> np.ndarray:
    """The (offset, length) rows of an `.idx` text, by numpy's C parser (2M lines in 0.11 s
    against 1.0 s split into Python bytes first), checked against the text's lines; a text it
    does not read whole (a bad token, no last newline) goes the strict way, which names what
    it could not read."""
    with warnings.catch_warnings():
        # numpy warns, and stops, where it meets a token that is not a number.
        warnings.simplefilter("ignore", DeprecationWarning)
        values = np.fromstring(text.decode("ascii", "replace"), dtype=np.int64, sep=" ")
    if values.size != 2 * text.count(b"\n") or not text.endswith(b"\n"):
        values = np.array(text.split(), np.int64)
    return values.reshape(-1, 2)


def load_or_build(path: str) -> RecordIndex:
    return load(path) or RecordIndex.build(path)


def _gzip_members(path: str) -> Iterator[tuple[int, int]]:
    """(compressed offset, records) of each member, inflating each once."""
    with fileio.open_file(path, "rb") as f:
        raw = memoryview(f.read())
    position = 0
    while position < len(raw):
        try:
            data, end = tfrecord_io._inflate_member(raw, position)
        except tfrecord_io.GZIP_ERRORS as error:
            raise tfrecord_io.CorruptRecordError(
                path, position, f"gzip member damaged ({error})") from error
        yield position, len(_member_records(path, position, data)[1])
        position = end


def _member_records(path: str, offset: int, data: bytes):
    """(buffer, record starts, record ends) of a gzip member's inflated `data`, checksums
    checked; damage is an error naming the file and the member's offset."""
    # codec.framing (numba): 0.3 s to import; only checking a member's records needs it
    from tfrecord_shards.codec import framing, wire

    buffer = np.frombuffer(data, np.uint8)
    starts, ends, used, damaged = framing.unframe_records(wire.frozen(buffer),
                                                          wire.frozen(framing.CRC32C_TABLE))
    if damaged >= 0 or used != len(buffer):
        raise tfrecord_io.CorruptRecordError(path, offset, "damaged record in a gzip member")
    return buffer, starts, ends


class RecordReader:
    """Record `i` of one file by its index: a plain record is one read at its offset; a gzip
    record is inflated from the start of its member up to the record's end, and no further
    (the open member is kept, so reads that follow each other in one member inflate it once).
    Safe to share between threads (tf.data's parallel map): the file's position and the open
    member are used under a lock."""

    def __init__(self, index: RecordIndex):
        self.index = index
        self._file = None
        self._member: Optional[_OpenMember] = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.index.records

    def __getitem__(self, record: int) -> bytes:
        with self._lock:
            return self._record(record)

    def _record(self, record: int) -> bytes:
        entry = self.index.entry_of(record)
        offset = int(self.index.offsets[entry])
        if not self.index.gzip:
            return _unframe_one(self.index.path, offset,
                                self._read(offset, int(self.index.lengths[entry])))
        if self._member is None or self._member.entry != entry:
            self._member = _OpenMember(self.index, entry,
                                       self._read(offset, int(self.index.lengths[entry])))
        return self._member.record(record - int(self.index.firsts[entry]))

    def _handle(self):
        """The file, opened unbuffered on first use (positional reads need no position)."""
        if self._file is None:
            self._file = fileio.open_file(self.index.path, "rb", buffered=False)
        return self._file

    def _read(self, offset: int, length: int) -> bytes:
        return fileio.pread(self._handle(), self.index.path, offset, length)

    def read_many(self, records: Sequence[int]) -> list[bytes]:
        """The records numbered `records`, in that order: each record's entry (a plain
        record, or a gzip member inflated once however many of its records are asked for)
        fetched in one `fileio.read_ranges` call, which coalesces them on an object store."""
        records = np.asarray(records, np.int64)
        if len(records) and (records.min() < 0 or records.max() >= self.index.records):
            raise IndexError(f"{self.index.path}: records {records.min()}..{records.max()} "
                             f"of {self.index.records}")
        entries = records if not self.index.gzip else \
            np.searchsorted(self.index.firsts, records, side="right") - 1
        needed = np.unique(entries).tolist()
        with self._lock:
            handle = self._handle()
        fetched = dict(zip(needed, fileio.read_ranges(
            self.index.path, [(int(self.index.offsets[e]), int(self.index.lengths[e]))
                              for e in needed], handle)))
        if not self.index.gzip:
            return [_unframe_one(self.index.path, int(self.index.offsets[e]), fetched[e])
                    for e in entries.tolist()]
        members: dict[int, _OpenMember] = {}
        out = []
        for record, entry in zip(records.tolist(), entries.tolist()):
            if entry not in members:
                members[entry] = _OpenMember(self.index, entry, fetched[entry])
            out.append(members[entry].record(record - int(self.index.firsts[entry])))
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __getstate__(self):  # open files and locks do not pickle (DataLoader workers, Grain)
        return {"index": self.index}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["index"])


class _OpenMember:
    """One gzip member inflated only as far as the records asked for: the inflated front is
    walked to record k by its lengths (a compiled loop), and record k's checksums are checked
    when it is read."""

    _STEP = 16 << 10

    def __init__(self, index: RecordIndex, entry: int, compressed: bytes):
        self.entry = entry
        self._path, self._offset = index.path, int(index.offsets[entry])
        self._records = int(index.counts[entry])
        # ISA-L's raw decompressor object: a third faster to start than a zlib-style one
        # (24 µs against 34 µs for half a 96 KiB member, measured here).
        self._inflater = igzip_lib.IgzipDecompressor(flag=igzip_lib.DECOMP_GZIP)
        self._pending = compressed
        self._data = np.zeros(0, np.uint8)
        # The member's inflated size, from its gzip trailer (ISIZE), guesses how far record k
        # lies, so most reads inflate once.
        self._inflated_size = int.from_bytes(compressed[-4:], "little") if \
            len(compressed) >= 18 else 0

    def record(self, at: int) -> bytes:
        # codec.framing (numba): 0.3 s to import; only reading a record by index needs it
        from tfrecord_shards.codec import framing

        if at >= self._records:
            raise self._damage("gzip member does not hold the records its index says")
        want = (at + 1) * self._inflated_size // self._records * 33 // 32 + 512
        while True:
            skipped, start = framing.skip_records(self._data, at)
            if skipped == at and start + 16 <= len(self._data):
                end = start + 16 + int.from_bytes(self._data[start:start + 8].tobytes(),
                                                  "little")
                if end <= len(self._data):
                    break
            self._inflate_more(max(want - len(self._data), self._STEP))
        framed = self._data[start:end].tobytes()
        if tfrecord_io._valid_at(framed, 0) != len(framed):
            raise self._damage("damaged record in a gzip member")
        return framed[12:-4]

    def _inflate_more(self, size: int) -> None:
        try:
            if self._inflater.eof:
                raise EOFError("gzip member ends before the records its index says")
            pending, self._pending = self._pending, b""  # the decompressor keeps the rest
            more = np.frombuffer(self._inflater.decompress(pending, size), np.uint8)
            if not len(more) and self._inflater.needs_input:
                raise EOFError("gzip member truncated")
        except tfrecord_io.GZIP_ERRORS as error:
            raise self._damage(f"gzip member damaged ({error})") from error
        self._data = np.concatenate([self._data, more]) if len(self._data) else more

    def _damage(self, reason: str) -> tfrecord_io.CorruptRecordError:
        return tfrecord_io.CorruptRecordError(self._path, self._offset, reason)


class FileRecords:
    """The records of several files as one sequence: record g is the g-th record of the files
    read in order, each file through its index (stored, or built in one pass)."""

    def __init__(self, files: Sequence[str]):
        self.readers = [RecordReader(load_or_build(f)) for f in files]
        self.starts = np.concatenate(
            [[0], np.cumsum([len(r) for r in self.readers])]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def remote(self) -> bool:
        """Whether the files are on an object store, where each read is a request."""
        return bool(self.readers) and fileio.is_remote(self.readers[0].index.path)

    def stored_bytes(self) -> int:
        """The bytes the records take in their files (a gzip file's: compressed)."""
        return sum(int(np.sum(r.index.lengths, dtype=np.int64)) for r in self.readers)

    def __getitem__(self, record: int) -> bytes:
        k = int(np.searchsorted(self.starts, record, side="right")) - 1
        return self.readers[k][record - int(self.starts[k])]

    def read(self, records: np.ndarray) -> np.ndarray:
        """The records numbered `records`, as a numpy array of bytes objects: each file's
        share read in one `RecordReader.read_many` (ranges coalesced on an object store)."""
        records = np.asarray(records, np.int64)
        files = np.searchsorted(self.starts, records, side="right") - 1
        out = np.empty(len(records), dtype=object)
        shares = [(k, np.flatnonzero(files == k)) for k in np.unique(files).tolist()]

        def read_share(share: tuple[int, np.ndarray]) -> None:
            k, at = share
            for i, record in zip(at.tolist(),
                                 self.readers[k].read_many(records[at] - int(self.starts[k]))):
                out[i] = record

        if len(shares) > 1 and self.remote:
            # Each file's requests wait on the network, not the CPU: all files at once.
            with ThreadPoolExecutor(min(len(shares), fileio.REMOTE_READERS)) as pool:
                list(pool.map(read_share, shares))
        else:
            for share in shares:
                read_share(share)
        return out


def _unframe_one(path: str, offset: int, framed: bytes) -> bytes:
    size = tfrecord_io._valid_at(framed, 0)
    if size != len(framed):
        raise tfrecord_io.CorruptRecordError(path, offset, "the index does not point at a "
                                             "whole record (was the file rewritten?)")
    return framed[12:-4]


def count(path: str) -> tuple[int, str]:
    """(records, how it was known) of a TFRecord file: from our manifest's shard entry or a
    stored index without reading the data ("manifest", "index"), else by reading its framing
    once ("read"). A packed file's records are its blocks."""
    shard = tfrecord_io.manifest_shard(path, fileio.size(path))
    if shard is not None:  # the writer's count of records framed into the shard
        return shard["rows"], "manifest"
    stored = load(path)
    if stored is not None:
        return stored.records, "index"
    return RecordIndex.build(path).records, "read"

