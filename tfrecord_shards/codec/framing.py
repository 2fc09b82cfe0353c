"""TFRecord framing, compiled: a whole batch of records framed in one pass
(`frame_records`), the whole records at the front of a buffer unframed with both checksums
checked (`unframe_records`), and records skipped by their lengths alone (`skip_records`).
`tfrecord_io` and `record_index` call them.

A framed record is: uint64 length, masked CRC-32C of the length, data, masked CRC-32C of
data. CRC-32C runs eight bytes an instruction where the CPU has SSE 4.2's CRC32 (the CPU
features numba targets), else a byte at a time from a table. Damaged bytes never raise
inside a loop: the loop returns the offset of the first damaged record and the caller names
file and offset.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils, codegen
from numba.extending import intrinsic

from tfrecord_shards.codec.wire import copy_bytes

_jit = numba.njit(cache=True, nogil=True)


def _has_crc32_instruction() -> bool:
    """Whether the machine code numba makes may use SSE 4.2's CRC32 instruction: the CPU
    features it targets (the host's, or NUMBA_CPU_FEATURES) include sse4.2."""
    features = numba.config.CPU_FEATURES
    if features is None:
        if numba.config.CPU_NAME is not None:
            return False  # a named CPU (e.g. generic) with no features listed
        features = codegen.get_host_cpu_features()
    return "+sse4.2" in features.split(",")


def _crc32c_table():
    """The byte table of CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> np.uint32(1)) ^ np.uint32(0x82F63B78),
                         table >> np.uint32(1))
    return table.astype(np.uint32)


CRC32C_TABLE = _crc32c_table()


@intrinsic
def _crc32c_u64(typingctx, crc, value):
    def codegen(context, builder, signature, args):
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.IntType(64), [ir.IntType(64), ir.IntType(64)]), "llvm.x86.sse42.crc32.64.64")
        return builder.call(function, args)

    return types.uint64(types.uint64, types.uint64), codegen


@_jit
def _crc32c_bytes(crc: np.uint64, buffer, start: int, end: int, table) -> np.uint64:
    for i in range(start, end):
        crc = np.uint64(table[(crc ^ buffer[i]) & 0xFF]) ^ (crc >> np.uint64(8))
    return crc


@_jit
def _crc32c_by_instruction(buffer, start: int, count: int, table) -> np.uint64:
    """CRC-32C eight bytes per instruction; the tail a byte at a time."""
    crc = np.uint64(0xFFFFFFFF)
    words = count // 8
    view = buffer[start:start + 8 * words].view(np.uint64)
    for w in range(words):
        crc = _crc32c_u64(crc, view[w])
    crc = _crc32c_bytes(crc, buffer, start + 8 * words, start + count, table)
    return crc ^ np.uint64(0xFFFFFFFF)


@_jit
def crc32c_by_table(buffer, start: int, count: int, table) -> np.uint64:
    """CRC-32C a byte at a time: where the CPU has no CRC32 instruction."""
    crc = _crc32c_bytes(np.uint64(0xFFFFFFFF), buffer, start, start + count, table)
    return crc ^ np.uint64(0xFFFFFFFF)


_crc32c = _crc32c_by_instruction if _has_crc32_instruction() else crc32c_by_table


@_jit
def _masked_crc32c(buffer, start: int, count: int, table) -> np.uint64:
    crc = _crc32c(buffer, start, count, table)
    rotated = ((crc >> np.uint64(15)) | (crc << np.uint64(17))) & np.uint64(0xFFFFFFFF)
    return (rotated + np.uint64(0xA282EAD8)) & np.uint64(0xFFFFFFFF)


@_jit
def _put_le(out, position: int, value: np.uint64, count: int) -> None:
    for k in range(count):
        out[position + k] = np.uint8((value >> np.uint64(8 * k)) & np.uint64(0xFF))


@_jit
def frame_records(data, offsets, table):
    """(framed bytes, end offset of each framed record) for records data[offsets[i]:
    offsets[i + 1]]."""
    records = len(offsets) - 1
    ends = np.empty(records, np.int64)
    out = np.empty(offsets[records] - offsets[0] + 16 * records, np.uint8)
    position = 0
    for r in range(records):
        length = offsets[r + 1] - offsets[r]
        _put_le(out, position, np.uint64(length), 8)
        _put_le(out, position + 8, _masked_crc32c(out, position, 8, table), 4)
        copy_bytes(out, position + 12, data, offsets[r], length)
        position += 12 + length
        _put_le(out, position, _masked_crc32c(data, offsets[r], length, table), 4)
        position += 4
        ends[r] = position
    return out, ends


@_jit
def _get_le(buffer, position: int, count: int) -> np.uint64:
    value = np.uint64(0)
    for k in range(count):
        value |= np.uint64(buffer[position + k]) << np.uint64(8 * k)
    return value


@_jit
def unframe_records(buffer, table):
    """(data starts, data ends, bytes consumed, offset of the first damaged record or -1) for
    the whole records at the front of `buffer`; an incomplete record at its end is left for
    the next buffer. Both checksums of every record are checked."""
    starts = np.empty(1024, np.int64)
    ends = np.empty(1024, np.int64)
    count = 0
    position = 0
    size = len(buffer)
    while position + 16 <= size:
        if _masked_crc32c(buffer, position, 8, table) != _get_le(buffer, position + 8, 4):
            return starts[:count], ends[:count], position, position
        length = _get_le(buffer, position, 8)
        if length > np.uint64(size - position - 16):
            break  # the rest of this record is in the next buffer
        start = position + 12
        end = start + np.int64(length)
        if _masked_crc32c(buffer, start, end - start, table) != _get_le(buffer, end, 4):
            return starts[:count], ends[:count], position, position
        if count == len(starts):
            starts = np.concatenate((starts, np.empty(count, np.int64)))
            ends = np.concatenate((ends, np.empty(count, np.int64)))
        starts[count] = start
        ends[count] = end
        count += 1
        position = end + 4
    return starts[:count], ends[:count], position, -1


@_jit
def skip_records(buffer, count: int):
    """(records skipped, where the next one starts) after skipping up to `count` framed
    records from the front of `buffer`, stopping at one the buffer does not hold whole. Only
    the lengths are read: this finds record k of a gzip member's inflated front, whose own
    checksums are checked when it is read."""
    position, skipped, size = 0, 0, len(buffer)
    while skipped < count and position + 16 <= size:
        end = position + 16 + np.int64(_get_le(buffer, position, 8))
        if end > size or end < position:
            break
        position, skipped = end, skipped + 1
    return skipped, position
