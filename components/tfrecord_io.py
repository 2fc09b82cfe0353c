"""TFRecord framing with byte offsets, so every corrupt record can be named by file and offset.

A record is: uint64 length, uint32 masked CRC32C of the length, the data, uint32 masked CRC32C
of the data. TensorFlow's own readers stop at the first bad record without saying which file
it was in; this reader says where, and can resynchronise past the damage.
"""
from __future__ import annotations

import dataclasses
import gzip
import struct
from typing import BinaryIO, Iterator, Union

import google_crc32c
import tensorflow as tf

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
    """Bytes skipped while resynchronising: [offset, offset + length) held no valid record."""

    offset: int
    length: int
    reason: str


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def is_gzip(path: str) -> bool:
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_records(path: str) -> BinaryIO:
    """A binary stream of the file's framed records, gunzipped when the file is gzip."""
    raw = tf.io.gfile.GFile(path, "rb")
    if raw.read(2) == GZIP_MAGIC:
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb")
    raw.seek(0)
    return raw


def iter_records(path: str, resync: bool = False
                 ) -> Iterator[tuple[int, Union[bytes, CorruptRegion]]]:
    """Yields (offset, record) in file order; offsets count uncompressed bytes.

    Without `resync` the first damage raises CorruptRecordError naming the file and offset.
    With it, the damaged bytes are yielded as one CorruptRegion and reading goes on from the
    next position where a length, its CRC and the data CRC all check out.
    """
    with open_records(path) as stream:
        offset = 0
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
