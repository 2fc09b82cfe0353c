"""Compiled loops over wire bytes: the columnar tf.Example encoder and TFRecord framing.

A tf.Example is Example{features: Features{map<string, Feature> feature}}, and a Feature holds
one of BytesList (field 1), FloatList (2, packed float32) or Int64List (3, packed varints).
Serialized, each row is
  0x0A len(features) | per feature: 0x0A len(entry) 0x0A len(name) name 0x12 len(feature)
                                    kind len(list) [0x0A len(packed values)] values
The encoder sizes every row's entries a column at a time (reading each column front to back),
then writes whole rows one after another (writing the output front to back: a column at a
time would visit every row's bytes once per column, a cache miss each).

Numba compiles these loops on first use and caches the machine code beside this file (or in
the user's cache folder when this one is read-only), so there is no build step to run.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_jit = numba.njit(cache=True, nogil=True)
# uint64 constants: comparing a uint64 with a plain (int64) literal goes through float64.
_SEVEN, _LOW_BITS, _MORE, _ONE_BYTE = np.uint64(7), np.uint64(0x7F), np.uint64(0x80), \
    np.uint64(128)


FLOAT_KIND, INT_KIND, BYTES_KIND = 0, 1, 2
_LIST_TAG = (0x12, 0x1A, 0x0A)  # Feature.float_list, int64_list, bytes_list (wire type 2)


def frozen(array):
    """A read-only view of `array`. The compiled loops are compiled once per argument type and
    read-only is part of an array's type; Arrow's buffers come either way, so every input is
    passed read-only and each loop is compiled (and cached) once."""
    view = array.view()
    view.flags.writeable = False
    return view


@_jit
def varint_size(value: np.uint64) -> int:
    size = 1
    while value >= _ONE_BYTE:
        value >>= _SEVEN
        size += 1
    return size


@_jit
def _put_varint(out, position: int, value: np.uint64) -> int:
    while value >= _ONE_BYTE:
        out[position] = np.uint8((value & _LOW_BITS) | _MORE)
        value >>= _SEVEN
        position += 1
    out[position] = np.uint8(value)
    return position + 1


@_jit
def payload_bytes(kind: int, offsets, present, ints, value_offsets):
    """Payload bytes per row of one list column, -1 where the row is absent: four per float,
    each int's varint (`ints` as uint64), or each bytes value as field 1 of the BytesList
    (`value_offsets` cut the data). The kind's unused arrays may be empty."""
    rows = len(present)
    payload = np.empty(rows, np.int64)
    for row in range(rows):
        if not present[row]:
            payload[row] = -1
            continue
        first, last = offsets[row], offsets[row + 1]
        if kind == FLOAT_KIND:
            payload[row] = 4 * (last - first)
            continue
        size = 0
        for i in range(first, last):
            if kind == INT_KIND:
                size += varint_size(ints[i])
            else:
                length = value_offsets[i + 1] - value_offsets[i]
                size += 1 + varint_size(np.uint64(length)) + length
        payload[row] = size
    return payload


@_jit
def _list_bytes(payload: int, packed: bool) -> int:
    # A number list is one packed field (0x0A, length, values), left out when empty.
    if packed and payload > 0:
        return payload + 1 + varint_size(np.uint64(payload))
    return payload


@_jit
def add_entry_sizes(totals, payload, packed: bool, key_size: int) -> None:
    """Adds each present row's whole map entry (tag and length included) to `totals`."""
    for row in range(len(payload)):
        if payload[row] < 0:
            continue
        list_bytes = _list_bytes(payload[row], packed)
        feature = 1 + varint_size(np.uint64(list_bytes)) + list_bytes
        entry = key_size + varint_size(np.uint64(feature)) + feature
        totals[row] += 1 + varint_size(np.uint64(entry)) + entry


@intrinsic
def _memcpy(typingctx, out, position, source, start, count):
    """memcpy(&out[position], &source[start], count): numba's own slice copy and a byte loop
    both cost about 1 ns a byte; this is one call to libc."""
    def codegen(context, builder, signature, args):
        out_type, _, source_type, _, _ = signature.args
        out_array, position_value, source_array, start_value, count_value = args
        destination = builder.gep(context.make_array(out_type)(context, builder, out_array).data,
                                  [position_value])
        origin = builder.gep(context.make_array(source_type)(context, builder, source_array)
                             .data, [start_value])
        cgutils.raw_memcpy(builder, destination, origin, count_value, 1)
        return context.get_dummy_value()

    return types.void(out, types.int64, source, types.int64, types.int64), codegen


@_jit
def _copy(out, position: int, source, start: int, count: int) -> int:
    """Copies source[start:start + count] to out[position:], which the caller has sized."""
    _memcpy(out, position, source, start, count)
    return position + count


@_jit
def _entry(out, position: int, payload: int, kind: int, keys, key_start: int, key_end: int
           ) -> int:
    """Writes a map entry's headers (and the packed field's header); returns the position of
    its values."""
    packed = kind != BYTES_KIND
    list_bytes = _list_bytes(payload, packed)
    feature = 1 + varint_size(np.uint64(list_bytes)) + list_bytes
    entry = key_end - key_start + varint_size(np.uint64(feature)) + feature
    out[position] = 0x0A
    position = _put_varint(out, position + 1, np.uint64(entry))
    position = _copy(out, position, keys, key_start, key_end - key_start)
    position = _put_varint(out, position, np.uint64(feature))
    out[position] = _LIST_TAG[kind]
    position = _put_varint(out, position + 1, np.uint64(list_bytes))
    if packed and payload > 0:
        out[position] = 0x0A
        position = _put_varint(out, position + 1, np.uint64(payload))
    return position


@_jit
def write_rows(totals, kinds, payload, offsets, float_bytes, ints, value_offsets, data, keys,
               key_offsets):
    """(serialized rows, row end offsets from 0), written a row at a time so the output is
    written front to back.

    Column c's values of row r are [offsets[c, r], offsets[c, r + 1]) of the float32 bytes
    (in floats), of `ints` (as uint64) or of `value_offsets` (cutting `data`); `payload[c, r]`
    is -1 where the row has no entry, and `keys` holds each column's entry key bytes
    (0x0A, name length, name, 0x12) at key_offsets[c]:key_offsets[c + 1]."""
    rows = len(totals)
    ends = np.zeros(rows + 1, np.int64)
    for row in range(rows):
        ends[row + 1] = ends[row] + 1 + varint_size(np.uint64(totals[row])) + totals[row]
    out = np.empty(ends[rows], np.uint8)
    for row in range(rows):
        out[ends[row]] = 0x0A
        position = _put_varint(out, ends[row] + 1, np.uint64(totals[row]))
        for column in range(len(kinds)):
            size = payload[column, row]
            if size < 0:
                continue
            kind = kinds[column]
            position = _entry(out, position, size, kind, keys, key_offsets[column],
                              key_offsets[column + 1])
            first, last = offsets[column, row], offsets[column, row + 1]
            if kind == FLOAT_KIND:
                position = _copy(out, position, float_bytes, 4 * first, size)
            elif kind == INT_KIND:
                for i in range(first, last):
                    position = _put_varint(out, position, ints[i])
            else:
                for i in range(first, last):
                    start, end = value_offsets[i], value_offsets[i + 1]
                    out[position] = 0x0A
                    position = _put_varint(out, position + 1, np.uint64(end - start))
                    position = _copy(out, position, data, start, end - start)
    return out, ends


# ---------------------------------------------------------------------------------------------
# TFRecord framing: uint64 length, masked CRC-32C of the length, data, masked CRC-32C of data.
# ---------------------------------------------------------------------------------------------
def _has_crc32_instruction() -> bool:
    """Whether the machine code numba makes may use SSE 4.2's CRC32 instruction: the CPU
    features it targets (the host's, or NUMBA_CPU_FEATURES) include sse4.2."""
    from numba.core import codegen

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
        _copy(out, position + 12, data, offsets[r], length)
        position += 12 + length
        _put_le(out, position, _masked_crc32c(data, offsets[r], length, table), 4)
        position += 4
        ends[r] = position
    return out, ends
