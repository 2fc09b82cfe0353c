"""TFRecord framing with byte offsets, so every corrupt record can be named by file and offset.

A record is: uint64 length, uint32 masked CRC32C of the length, the data, uint32 masked CRC32C
of the data. TensorFlow's own readers stop at the first bad record without saying which file
it was in; this reader says where, and can resynchronise past the damage.
"""
from __future__ import annotations

import dataclasses
import gzip
import io
import struct
import zlib
from typing import TYPE_CHECKING, BinaryIO, Iterator, Optional, Union

import google_crc32c
from isal import igzip, isal_zlib

from tfrecord_shards import fileio

if TYPE_CHECKING:
    import numpy as np

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
GZIP_MAGIC = b"\x1f\x8b"


class CorruptRecordError(ValueError):
    def __init__(self, path: str, offset: int, reason: str):
        self.path, self.offset, self.reason = path, offset, reason
        super().__init__(f"{path}: corrupt TFRecord at byte offset {offset}: {reason}")


@dataclasses.dataclass
class CorruptRegion:
    """Bytes skipped while resynchronising: [offset, offset + length) held no valid record.

    In a gzip file the region is a damaged gzip member and its offsets are compressed bytes;
    `records_lost` is exact when the shard's manifest indexes its members, else None."""

    offset: int
    length: int
    reason: str
    records_lost: Optional[int] = None

    @property
    def loss(self) -> str:
        return f"{self.records_lost} records lost" if self.records_lost is not None \
            else "record count unknown"

    def describe(self) -> str:
        return f"{self.length} bytes skipped at offset {self.offset} ({self.reason}; {self.loss})"


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_records(records) -> tuple:
    """TFRecord framing of a whole batch: (framed bytes as a uint8 array, end offset of each
    framed record). `records` is a pyarrow binary array or a list of bytes; the framing and
    both checksums are one compiled pass over the batch (codec/framing.py)."""
    # numpy + pyarrow: 0.25 s to import; plain record reads and writes need neither
    import numpy as np
    import pyarrow as pa

    # codec.framing (numba): 0.4 s to import; plain record reads and writes need none
    from tfrecord_shards.codec import framing, wire

    if not isinstance(records, (pa.Array, pa.ChunkedArray)):
        records = pa.array(records, pa.binary())
    if isinstance(records, pa.ChunkedArray):
        records = records.combine_chunks()
    if records.null_count:
        raise ValueError("a TFRecord cannot hold a null record")
    if not len(records):
        return np.zeros(0, np.uint8), np.zeros(0, np.int64)
    width = np.int64 if pa.types.is_large_binary(records.type) else np.int32
    offsets = np.frombuffer(records.buffers()[1], width)[
        records.offset:records.offset + len(records) + 1].astype(np.int64)
    data = np.frombuffer(records.buffers()[2], np.uint8) if records.buffers()[2] is not None \
        else np.zeros(0, np.uint8)
    return framing.frame_records(wire.frozen(data), wire.frozen(offsets),
                                 wire.frozen(framing.CRC32C_TABLE))


def is_gzip(path: str) -> bool:
    with fileio.open_file(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_records(path: str, start: int = 0, end: Optional[int] = None) -> BinaryIO:
    """A binary stream of the file's framed records, gunzipped when the file is gzip (by
    ISA-L's inflate, about 3x zlib's on our shards), from byte `start` of the file: where a
    record (plain) or a gzip member begins; up to byte `end` (where one ends) when given."""
    raw = fileio.open_file(path, "rb")
    raw.seek(start)
    magic = raw.read(2)
    raw.seek(start)
    if end is not None:
        raw = io.BufferedReader(_BoundedStream(raw, end - start))
    if magic == GZIP_MAGIC:
        # ISA-L's reader needs readinto, which TensorFlow's GFile (remote paths) lacks.
        return (igzip if hasattr(raw, "readinto") else gzip).GzipFile(fileobj=raw, mode="rb")
    return raw


class _BoundedStream(io.RawIOBase):
    """The next `size` bytes of `raw`, then its end: a range of a file read as a whole one,
    so that inflating stops at the range's last gzip member."""

    def __init__(self, raw: BinaryIO, size: int):
        self._raw, self._left = raw, size

    def readable(self) -> bool:
        return True

    def readinto(self, view) -> int:
        view = memoryview(view)[:self._left]
        if hasattr(self._raw, "readinto"):
            count = self._raw.readinto(view)
        else:
            data = self._raw.read(len(view))
            count = len(data)
            view[:count] = data
        self._left -= count
        return count

    def close(self) -> None:
        self._raw.close()
        super().close()


# Damage inside a gzip stream surfaces as any of these, depending on where it hit.
GZIP_ERRORS = (zlib.error, isal_zlib.error, EOFError, gzip.BadGzipFile)
_GZIP_MEMBER_HEADER = b"\x1f\x8b\x08"
_INFLATE_CHUNK = 1 << 20
_MANIFEST_SEARCH_DEPTH = 3


def iter_records(path: str, resync: bool = False, start: int = 0
                 ) -> Iterator[tuple[int, Union[bytes, CorruptRegion]]]:
    """Yields (offset, record) in file order; offsets count uncompressed bytes.

    Without `resync` the first damage raises CorruptRecordError naming the file and offset.
    With it, the damaged bytes are yielded as one CorruptRegion and reading goes on: in a
    plain file from the next position where a length, its CRC and the data CRC all check out;
    in a gzip file from the next intact gzip member (`_iter_gzip_members`).

    `start` begins at that byte of the file, where a record or a gzip member begins (a record
    index's entry): a plain file's offsets are still the file's, a gzip file's count from the
    member there (its place in the whole uncompressed stream is not known without inflating
    the members before it).
    """
    if resync and is_gzip(path):
        if start:
            raise ValueError("resync reads a gzip file from its start")
        yield from _iter_gzip_members(path)
        return
    good_until = 0  # uncompressed end of the last intact record
    try:
        for offset, record in _iter_stream(path, resync, start):
            if isinstance(record, bytes):
                good_until = offset + _HEADER.size + len(record) + _FOOTER.size
            yield offset, record
    except GZIP_ERRORS as error:
        raise CorruptRecordError(path, good_until, f"gzip data damaged ({error})") from error


@dataclasses.dataclass
class RecordBlock:
    """Whole records of one file, read in one go: record i is
    buffer[starts[i]:ends[i]], and buffer[0] is at uncompressed byte `offset` of the file."""

    path: str
    offset: int
    buffer: "np.ndarray"
    starts: "np.ndarray"
    ends: "np.ndarray"

    def record_offset(self, index: int) -> int:
        """The file offset (uncompressed) of record `index`'s framing."""
        return self.offset + int(self.starts[index]) - _HEADER.size

    @classmethod
    def of_records(cls, path: str, offset: int, records: list[bytes]) -> "RecordBlock":
        """Records already read, as one block; `offset` is the first record's framing
        offset in `path`, so an error about the first record names the right place (and
        about a later one, too, when they followed each other in the file)."""
        # numpy: 0.1 s to import; plain record reads and writes need none
        import numpy as np

        sizes = np.array([len(r) for r in records], np.int64)
        gaps = _HEADER.size + _FOOTER.size
        starts = np.cumsum(sizes + gaps) - sizes - _FOOTER.size
        buffer = np.zeros(int(starts[-1] + sizes[-1] + _FOOTER.size) if records else 0,
                          np.uint8)
        for start, record in zip(starts.tolist(), records):
            buffer[start:start + len(record)] = np.frombuffer(record, np.uint8)
        return cls(path, offset, buffer, starts, starts + sizes)

    def parts(self, max_records: int) -> Iterator["RecordBlock"]:
        """This block as blocks of at most `max_records` records over the same buffer."""
        for first in range(0, len(self.starts), max(1, max_records)):
            yield RecordBlock(self.path, self.offset, self.buffer,
                              self.starts[first:first + max_records],
                              self.ends[first:first + max_records])


_BLOCK_BYTES = 1 << 24


@dataclasses.dataclass(frozen=True)
class RecordRange:
    """Records [first, first + records) of one file: bytes [start, end) of it, whole records
    of a plain file or whole gzip members. A unit of work smaller than a shard
    (`record_index.RecordIndex.ranges`)."""

    path: str
    start: int
    end: int  # the byte after its last record or member
    first: int
    records: int

    def describe(self) -> str:
        return f"{self.path} records {self.first:,}-{self.first + self.records - 1:,}"


def iter_record_blocks(source: Union[str, RecordRange], block_bytes: int = _BLOCK_BYTES
                       ) -> Iterator[RecordBlock]:
    """The records of a file (a path), or of a range of one, about `block_bytes` at a time,
    unframed (checksums checked) in one compiled pass a block (codec/framing.py) rather than
    a Python step a record. Damage raises CorruptRecordError naming the file and offset, as
    `iter_records` does.

    A range is read from its own bytes, which must hold exactly its records. Offsets then
    count from its start in a gzip file, as in `iter_records`; damage is named at its offset
    in the whole file (`_raise_first_damage` reads the file from its start)."""
    # numpy: 0.1 s to import; plain record reads and writes need none
    import numpy as np

    # codec.framing (numba): 0.4 s to import; plain record reads and writes need none
    from tfrecord_shards.codec import framing, wire

    piece = source if isinstance(source, RecordRange) else None
    path = piece.path if piece else source
    table = wire.frozen(framing.CRC32C_TABLE)
    left = piece.records if piece else None  # records still to read; None: to the end
    offset, rest = 0, np.zeros(0, np.uint8)
    with open_records(path, *((piece.start, piece.end) if piece else (0,))) as stream:
        if piece and not isinstance(stream, (gzip.GzipFile, igzip.GzipFile)):
            offset = piece.start
        while True:
            # Each block is a new buffer (a consumer may keep it), filled by one readinto
            # after the previous block's unfinished record.
            buffer = np.empty(max(block_bytes, 2 * len(rest)), np.uint8)
            buffer[:len(rest)] = rest
            try:
                filled = len(rest) + _read_into(stream, memoryview(buffer)[len(rest):])
            except GZIP_ERRORS:
                _raise_first_damage(path, offset)
            at_end = filled < len(buffer)
            buffer = buffer[:filled]
            starts, ends, used, damaged = framing.unframe_records(wire.frozen(buffer), table)
            if damaged >= 0 or (at_end and used < filled):
                _raise_first_damage(path, offset + used)
            if left is not None:
                if len(starts) > left or at_end and len(starts) < left:
                    raise CorruptRecordError(path, piece.start, f"{piece.describe()} are not "
                                             f"the records of bytes {piece.start:,}-{piece.end:,}")
                left -= len(starts)
            if len(starts):
                yield RecordBlock(path, offset, buffer, starts, ends)
            if at_end:
                return
            offset, rest = offset + used, buffer[used:]


def _read_into(stream: BinaryIO, view: memoryview) -> int:
    """Fills `view` unless the stream ends first; returns the bytes read. TensorFlow's GFile
    (remote paths) has no readinto, so that stream is read and copied."""
    filled = 0
    while filled < len(view):
        if hasattr(stream, "readinto"):
            count = stream.readinto(view[filled:])
        else:
            data = stream.read(len(view) - filled)
            count = len(data)
            view[filled:filled + count] = data
        if not count:
            break
        filled += count
    return filled


def _raise_first_damage(path: str, near: int):
    """Raises the framing reader's own error, which names the reason and the exact offset."""
    for _ in iter_records(path):
        pass
    raise CorruptRecordError(path, near, "damaged record")


def count_records(path: str) -> int:
    """The records in a TFRecord file, read from its own framing (checksums checked); damage
    raises CorruptRecordError naming the file and offset."""
    return sum(1 for _ in iter_records(path))


def _iter_stream(path: str, resync: bool, start: int = 0
                 ) -> Iterator[tuple[int, Union[bytes, CorruptRegion]]]:
    with open_records(path, start) as stream:
        offset = 0 if isinstance(stream, (gzip.GzipFile, igzip.GzipFile)) else start
        while True:
            header = stream.read(_HEADER.size)
            if not header:
                return
            problem = None
            if len(header) < _HEADER.size:
                problem = "truncated header"
            else:
                length, length_crc = _HEADER.unpack(header)
                if masked_crc(header[:8]) != length_crc:
                    problem = "length CRC mismatch"
                else:
                    body = stream.read(length + _FOOTER.size)
                    if len(body) < length + _FOOTER.size:
                        problem = "truncated record"
                    elif masked_crc(body[:length]) != _FOOTER.unpack(body[length:])[0]:
                        problem = "data CRC mismatch"
                    else:
                        yield offset, body[:length]
                        offset += _HEADER.size + len(body)
                        continue
            if not resync:
                raise CorruptRecordError(path, offset, problem)
            rest = header + stream.read()
            skipped = _next_valid_record(rest)
            yield offset, CorruptRegion(offset, skipped, problem)
            offset += skipped
            # Continue from the resync point on the in-memory remainder.
            for relative, record in _iter_buffer(rest[skipped:]):
                yield offset + relative, record
            return


def manifest_shard(path: str, size: Optional[int] = None,
                   manifests: Optional[dict] = None) -> Optional[dict]:
    """The entry the manifest.json our writer keeps above its shards has for the shard at
    `path` (its rows, bytes, gzip members); None for files without one (stock output), and
    for a file whose `size` is not the one the manifest recorded: a file cut short or with
    bytes inserted has moved its records and members.

    `manifests` ({folder: its manifest or None}, filled here) spares the calls for one
    artifact's shards a read of the same manifest each: at 30M rows a manifest lists about
    150,000 gzip members, 0.16 s to read and parse."""
    folder = fileio.dirname(fileio.absolute(path))
    for _ in range(_MANIFEST_SEARCH_DEPTH + 1):
        if manifests is None:
            manifest = fileio.read_json(fileio.join(folder, "manifest.json"))
        else:
            if folder not in manifests:
                manifests[folder] = fileio.read_json(fileio.join(folder, "manifest.json"))
            manifest = manifests[folder]
        if manifest is not None:
            relative = fileio.relpath(fileio.absolute(path), folder)
            for split in manifest.get("splits", {}).values():
                for shard in split["shards"]:
                    if shard["path"] == relative:
                        return shard if size is None or size == shard.get("bytes") else None
            return None
        folder = fileio.dirname(folder.rstrip("/"))
    return None


def gzip_member_index(path: str, size: Optional[int] = None,
                      manifests: Optional[dict] = None) -> Optional[list[tuple[int, int]]]:
    """(compressed offset, records) of each gzip member of `path`, from our manifest
    (`manifest_shard`, `manifests` as there); None without one."""
    shard = manifest_shard(path, size, manifests)
    members = shard.get("gzip_members") if shard else None
    return [tuple(m) for m in members] if members else None


def _inflate_member(raw: memoryview, start: int) -> tuple[bytes, int]:
    """(decompressed data, end offset) of the gzip member at `start`; raises a GZIP_ERRORS
    error when it is damaged (zlib checks the member's CRC-32 and length) or truncated."""
    inflater = zlib.decompressobj(wbits=31)
    parts, position = [], start
    while not inflater.eof:
        if position >= len(raw):
            raise EOFError("gzip member truncated")
        chunk = raw[position:position + _INFLATE_CHUNK]
        parts.append(inflater.decompress(chunk))
        position += len(chunk)
    return b"".join(parts), position - len(inflater.unused_data)


def _next_member(raw: memoryview, damaged: int, index: Optional[list[tuple[int, int]]]
                 ) -> tuple[int, Optional[int]]:
    """(where the next intact member starts, records lost in the damaged one). With the
    index both are known; without it, the next gzip member header that decompresses cleanly
    is taken, and the loss is unknown."""
    if index:
        starts = [offset for offset, _ in index]
        lost = dict(index).get(damaged)
        later = [offset for offset in starts if offset > damaged]
        return (later[0] if later else len(raw)), lost
    position = damaged + 1
    data = raw.obj if isinstance(raw.obj, bytes) else bytes(raw)
    while True:
        position = data.find(_GZIP_MEMBER_HEADER, position)
        if position < 0:
            return len(raw), None
        try:
            _inflate_member(raw, position)
            return position, None
        except GZIP_ERRORS:
            position += 1


def _iter_gzip_members(path: str) -> Iterator[tuple[int, Union[bytes, CorruptRegion]]]:
    """Reads a gzip file member by member, so damage costs only its own member.

    Offsets of records count uncompressed bytes of the intact members; a CorruptRegion's
    offsets are compressed bytes (where the damaged member starts, how far was skipped)."""
    with fileio.open_file(path, "rb") as f:
        raw = memoryview(f.read())
    index = gzip_member_index(path, len(raw))
    position = uncompressed = 0
    while position < len(raw):
        try:
            data, end = _inflate_member(raw, position)
        except GZIP_ERRORS as error:
            resume, lost = _next_member(raw, position, index)
            yield uncompressed, CorruptRegion(position, resume - position,
                                              f"gzip member damaged: {error}", lost)
            position = resume
            continue
        for relative, record in _iter_buffer(data):
            yield uncompressed + relative, record
        uncompressed += len(data)
        position = end


def _valid_at(buffer: bytes, position: int) -> int:
    """Length of the valid record starting at `position`, or -1."""
    if position + _HEADER.size > len(buffer):
        return -1
    length, length_crc = _HEADER.unpack_from(buffer, position)
    if masked_crc(buffer[position:position + 8]) != length_crc:
        return -1
    end = position + _HEADER.size + length
    if end + _FOOTER.size > len(buffer):
        return -1
    if masked_crc(buffer[position + _HEADER.size:end]) != _FOOTER.unpack_from(buffer, end)[0]:
        return -1
    return _HEADER.size + length + _FOOTER.size


def _next_valid_record(buffer: bytes) -> int:
    for position in range(1, len(buffer)):
        if _valid_at(buffer, position) > 0:
            return position
    return len(buffer)


def _iter_buffer(buffer: bytes) -> Iterator[tuple[int, Union[bytes, CorruptRegion]]]:
    position = 0
    while position < len(buffer):
        size = _valid_at(buffer, position)
        if size < 0:
            skipped = _next_valid_record(buffer[position:])
            yield position, CorruptRegion(position, skipped, "corrupt record")
            position += skipped
            continue
        yield position, buffer[position + _HEADER.size:position + size - _FOOTER.size]
        position += size
