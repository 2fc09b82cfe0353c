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
# Inlined into their callers: a compiled call passes each array as its whole structure, which
# costs more than these helpers' work.
_inline = numba.njit(cache=True, nogil=True, inline="always")
# uint64 constants: comparing a uint64 with a plain (int64) literal goes through float64.
_SEVEN, _LOW_BITS, _MORE, _ONE_BYTE = np.uint64(7), np.uint64(0x7F), np.uint64(0x80), \
    np.uint64(128)
_LOW_BITS_32 = np.uint64(0xFFFFFFFF)


FLOAT_KIND, INT_KIND, BYTES_KIND = 0, 1, 2
_LIST_TAG = (0x12, 0x1A, 0x0A)  # Feature.float_list, int64_list, bytes_list (wire type 2)


def frozen(array):
    """A read-only view of `array`. The compiled loops are compiled once per argument type and
    read-only is part of an array's type; Arrow's buffers come either way, so every input is
    passed read-only and each loop is compiled (and cached) once."""
    view = array.view()
    view.flags.writeable = False
    return view


@_inline
def varint_size(value: np.uint64) -> int:
    size = 1
    while value >= _ONE_BYTE:
        value >>= _SEVEN
        size += 1
    return size


@_inline
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


@_inline
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


@_inline
def _copy(out, position: int, source, start: int, count: int) -> int:
    """Copies source[start:start + count] to out[position:], which the caller has sized."""
    _memcpy(out, position, source, start, count)
    return position + count


@_inline
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
               key_offsets, order):
    """(serialized rows, row end offsets from 0), written a row at a time so the output is
    written front to back, rows in `order` (so rows bound for one split come out together,
    with no second copy to group them).

    Column c's values of row r are [offsets[c, r], offsets[c, r + 1]) of the float32 bytes
    (in floats), of `ints` (as uint64) or of `value_offsets` (cutting `data`); `payload[c, r]`
    is -1 where the row has no entry, and `keys` holds each column's entry key bytes
    (0x0A, name length, name, 0x12) at key_offsets[c]:key_offsets[c + 1]."""
    rows = len(totals)
    ends = np.zeros(rows + 1, np.int64)
    for at in range(rows):
        total = totals[order[at]]
        ends[at + 1] = ends[at] + 1 + varint_size(np.uint64(total)) + total
    out = np.empty(ends[rows], np.uint8)
    for at in range(rows):
        row = order[at]
        out[ends[at]] = 0x0A
        position = _put_varint(out, ends[at] + 1, np.uint64(totals[row]))
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


# ---------------------------------------------------------------------------------------------
# Reading: whole records out of a buffer of framed ones, and tf.Example's wire bytes a feature
# at a time. Malformed bytes never raise inside a loop: each loop returns the index of the
# first record it could not read (-1 when all were read) and the caller names file and offset.
# ---------------------------------------------------------------------------------------------
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


@_jit
def _get_varint(buffer, position: int, end: int):
    """(value, position after it), or (0, -1) when the varint runs past `end`."""
    if position < end and buffer[position] < 0x80:  # most tags and lengths: one byte
        return np.uint64(buffer[position]), position + 1
    value = np.uint64(0)
    shift = np.uint64(0)
    while position < end and shift < np.uint64(64):
        byte = buffer[position]
        position += 1
        value |= np.uint64(byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += _SEVEN
    return np.uint64(0), -1


@_jit
def _get_tag(buffer, position: int, end: int):
    """(field number << 3 | wire type, position after it), or (0, -1)."""
    tag, position = _get_varint(buffer, position, end)
    return np.int64(tag & _LOW_BITS_32), position


@_jit
def _skip_field(buffer, position: int, end: int, wire_type: int) -> int:
    """The position after a field's value, -1 when it is malformed."""
    if wire_type == 0:
        return _get_varint(buffer, position, end)[1]
    if wire_type == 1:
        position += 8
    elif wire_type == 5:
        position += 4
    elif wire_type == 2:
        length, position = _get_varint(buffer, position, end)
        if position < 0:
            return -1
        position += np.int64(length)
    else:
        return -1
    return position if position <= end else -1


@_jit
def _message_end(buffer, position: int, end: int):
    """(start, end) of a length-delimited value at `position`, or (-1, -1)."""
    length, start = _get_varint(buffer, position, end)
    if start < 0 or length > np.uint64(end - start):
        return -1, -1
    return start, start + np.int64(length)


@_inline
def _next_message(buffer, position: int, end: int):
    """(start, end) of the next field-1 message (tag 0x0A) from `position`, skipping other
    fields; (end, end) when there is none, (-1, -1) when a field is malformed."""
    while position < end:
        tag, position = _get_tag(buffer, position, end)
        if position < 0:
            return -1, -1
        if tag == 0x0A:
            return _message_end(buffer, position, end)
        position = _skip_field(buffer, position, end, tag & 7)
        if position < 0:
            return -1, -1
    return end, end


@intrinsic
def _load_u64(typingctx, array, position):
    """The 8 bytes at array[position:] as a little-endian uint64, at any alignment."""
    def codegen(context, builder, signature, args):
        array_type, _ = signature.args
        data, position_value = args
        pointer = builder.gep(context.make_array(array_type)(context, builder, data).data,
                              [position_value])
        word = builder.bitcast(pointer, ir.IntType(64).as_pointer())
        return builder.load(word, align=1)

    return types.uint64(array, types.int64), codegen


@_inline
def _same_bytes(a, a_start: int, b, b_start: int, count: int) -> bool:
    """a[a_start:a_start + count] == b[b_start:b_start + count], eight bytes at a time."""
    if count < 8:
        for k in range(count):
            if a[a_start + k] != b[b_start + k]:
                return False
        return True
    for k in range(0, count - 7, 8):
        if _load_u64(a, a_start + k) != _load_u64(b, b_start + k):
            return False
    return _load_u64(a, a_start + count - 8) == _load_u64(b, b_start + count - 8)


@_jit
def _key_index(buffer, start: int, end: int, keys, key_offsets, guess: int) -> int:
    """The schema feature whose name is buffer[start:end], from `guess` on, or -1."""
    features = len(key_offsets) - 1
    for step in range(features):
        f = (guess + step) % features
        first, last = key_offsets[f], key_offsets[f + 1]
        if last - first != end - start:
            continue
        if _same_bytes(keys, first, buffer, start, last - first):
            return f
    return -1


MALFORMED, WRONG_KIND, REPEATED_KEY = 1, 2, 3


@_jit
def _count_values(buffer, start: int, end: int, kind: int):
    """(values, bytes of its values for a BytesList) of one FloatList, Int64List or
    BytesList (numbers packed, as every writer does, or a field each); values is -1 when the
    list is malformed."""
    count = 0
    size = 0
    position = start
    while position < end:
        tag, position = _get_tag(buffer, position, end)
        if position < 0:
            return -1, 0
        if tag == 0x0A:  # packed numbers, or a bytes value
            first, last = _message_end(buffer, position, end)
            if first < 0:
                return -1, 0
            if kind == FLOAT_KIND:
                if (last - first) % 4:
                    return -1, 0
                count += (last - first) // 4
            elif kind == INT_KIND:
                for i in range(first, last):
                    count += buffer[i] < 0x80
            else:
                count += 1
                size += last - first
            position = last
        elif (tag == 0x0D and kind == FLOAT_KIND) or (tag == 0x08 and kind == INT_KIND):
            position = _skip_field(buffer, position, end, tag & 7)
            if position < 0:
                return -1, 0
            count += 1
        else:
            position = _skip_field(buffer, position, end, tag & 7)
            if position < 0:
                return -1, 0
    return count, size


def _list_filler(fill_packed, fill_one, one_tag: int):
    """The loop over a (checked) FloatList or Int64List: each field is the packed values
    (tag 0x0A) or one value (`one_tag`), stored by the kind's own two steps. Built once per
    kind, so each compiles with its steps inlined, as if written out."""
    @_inline
    def fill(buffer, start: int, end: int, out, at: int) -> None:
        while start < end:
            tag, start = _get_tag(buffer, start, end)
            if tag == 0x0A:
                first, last = _message_end(buffer, start, end)
                at = fill_packed(buffer, first, last, out, at)
                start = last
            elif tag == one_tag:
                start, at = fill_one(buffer, start, end, out, at)
            else:
                start = _skip_field(buffer, start, end, tag & 7)
    return fill


@_inline
def _copy_floats(buffer, first: int, last: int, out, at: int) -> int:
    """Packed floats: their bytes as they are (out is float32 bytes; `at` counts bytes)."""
    _memcpy(out, at, buffer, first, last - first)
    return at + last - first


@_inline
def _copy_float(buffer, start: int, end: int, out, at: int):
    _memcpy(out, at, buffer, start, 4)
    return start + 4, at + 4


@_inline
def _read_varints(buffer, first: int, last: int, out, at: int) -> int:
    while first < last:
        value, first = _get_varint(buffer, first, last)
        out[at] = np.int64(value)
        at += 1
    return at


@_inline
def _read_varint(buffer, start: int, end: int, out, at: int):
    value, start = _get_varint(buffer, start, end)
    out[at] = np.int64(value)
    return start, at + 1


# Copies a FloatList's values to out (float32 bytes) from byte `at`.
_fill_floats = _list_filler(_copy_floats, _copy_float, 0x0D)
# Stores an Int64List's values in out from index `at`.
_fill_ints = _list_filler(_read_varints, _read_varint, 0x08)


@_inline
def _fill_bytes(buffer, start: int, end: int, value_offsets, at: int, data, data_at: int
                ) -> int:
    """Stores the (checked) BytesList's values: data from data_at, their ends in
    value_offsets from at + 1. Returns the data position after them."""
    while start < end:
        tag, start = _get_tag(buffer, start, end)
        if tag == 0x0A:
            first, last = _message_end(buffer, start, end)
            _memcpy(data, data_at, buffer, first, last - first)
            data_at += last - first
            at += 1
            value_offsets[at] = data_at
            start = last
        else:
            start = _skip_field(buffer, start, end, tag & 7)
    return data_at


@_jit
def locate_values(buffer, starts, ends, keys, key_offsets, feature_kinds, lengths,
                  list_starts, list_ends, byte_totals):
    """One pass over serialized tf.Examples buffer[starts[r]:ends[r]], a record at a time (the
    buffer is read front to back), that finds each schema feature's value list.

    For record r and schema feature f (named keys[key_offsets[f]:key_offsets[f + 1]], of kind
    feature_kinds[f]): lengths[r, f] = how many values it holds, -1 where it has none (or a
    Feature with no list set); its list message is buffer[list_starts[r, f]:list_ends[r, f]];
    byte_totals[f] adds up its bytes values' sizes. Features outside the schema are skipped.
    Returns (record, feature, problem) of the first problem (MALFORMED, WRONG_KIND,
    REPEATED_KEY), or (-1, -1, 0)."""
    features = len(key_offsets) - 1
    # Writers put a record's features in the same order every time, mostly not the
    # schema's: follows[p] is the feature that came after feature p (p = features: first) in
    # the record before, so a key is nearly always matched at the first try.
    follows = np.zeros(features + 1, np.int64)
    for r in range(len(starts)):
        position, end = starts[r], ends[r]
        previous = features
        while position < end:
            entry, features_end = _next_message(buffer, position, end)  # Example.features
            if entry < 0:
                return r, -1, MALFORMED
            while entry < features_end:
                # A Features.feature map entry; an empty one when only other fields are left,
                # which matches no feature's value below.
                field, entry_end = _next_message(buffer, entry, features_end)
                if field < 0:
                    return r, -1, MALFORMED
                key_start = key_end = value_start = value_end = 0
                while field < entry_end:
                    tag, field = _get_tag(buffer, field, entry_end)
                    if field < 0:
                        return r, -1, MALFORMED
                    if tag == 0x0A or tag == 0x12:
                        inner, inner_end = _message_end(buffer, field, entry_end)
                        if inner < 0:
                            return r, -1, MALFORMED
                        if tag == 0x0A:
                            key_start, key_end = inner, inner_end
                        else:
                            value_start, value_end = inner, inner_end
                        field = inner_end
                    else:
                        field = _skip_field(buffer, field, entry_end, tag & 7)
                        if field < 0:
                            return r, -1, MALFORMED
                entry = entry_end
                f = follows[previous]
                if key_offsets[f + 1] - key_offsets[f] != key_end - key_start or not \
                        _same_bytes(keys, key_offsets[f], buffer, key_start,
                                    key_end - key_start):
                    f = _key_index(buffer, key_start, key_end, keys, key_offsets, f)
                if f < 0:
                    continue
                follows[previous] = f
                previous = f
                kind = -1
                list_start = list_end = 0
                value = value_start
                while value < value_end:
                    tag, value = _get_tag(buffer, value, value_end)
                    if value < 0:
                        return r, f, MALFORMED
                    if tag == 0x0A or tag == 0x12 or tag == 0x1A:  # bytes, float, int64 list
                        list_start, list_end = _message_end(buffer, value, value_end)
                        if list_start < 0:
                            return r, f, MALFORMED
                        kind = BYTES_KIND if tag == 0x0A else \
                            FLOAT_KIND if tag == 0x12 else INT_KIND
                        value = list_end
                    else:
                        value = _skip_field(buffer, value, value_end, tag & 7)
                        if value < 0:
                            return r, f, MALFORMED
                if kind < 0:
                    continue
                if kind != feature_kinds[f]:
                    return r, f, WRONG_KIND
                if lengths[r, f] >= 0:
                    return r, f, REPEATED_KEY
                count, size = _count_values(buffer, list_start, list_end, kind)
                byte_totals[f] += size
                if count < 0:
                    return r, f, MALFORMED
                lengths[r, f] = count
                list_starts[r, f] = list_start
                list_ends[r, f] = list_end
            position = features_end
    return -1, -1, 0


@_jit
def fill_values(buffer, lengths, list_starts, list_ends, feature_kinds, floats, ints,
                value_offsets, data, cursors, byte_cursors) -> None:
    """Stores the values `locate_values` found, a record at a time: each feature's go to its
    slots of `floats`, `ints` or `value_offsets`/`data` from cursors[f] (values; a bytes
    feature's first value_offsets slot holds its data start already) and byte_cursors[f]
    (bytes), which move on."""
    float_bytes = floats.view(np.uint8)
    for r in range(lengths.shape[0]):
        for f in range(lengths.shape[1]):
            count = lengths[r, f]
            if count <= 0:
                continue
            kind = feature_kinds[f]
            if kind == FLOAT_KIND:
                _fill_floats(buffer, list_starts[r, f], list_ends[r, f], float_bytes,
                             4 * cursors[f])
            elif kind == INT_KIND:
                _fill_ints(buffer, list_starts[r, f], list_ends[r, f], ints, cursors[f])
            else:
                byte_cursors[f] = _fill_bytes(buffer, list_starts[r, f], list_ends[r, f],
                                              value_offsets, cursors[f], data,
                                              byte_cursors[f])
            cursors[f] += count


@_jit
def list_offsets(lengths):
    """Per feature, from lengths[record, feature] (-1: absent): the list offsets of its
    column ([feature, record + 1]), where it is absent ([feature, record]), and whether it is
    absent anywhere."""
    records, features = lengths.shape
    offsets = np.zeros((features, records + 1), np.int64)
    absent = np.zeros((features, records), np.bool_)
    any_absent = np.zeros(features, np.bool_)
    for r in range(records):
        for f in range(features):
            length = lengths[r, f]
            if length < 0:
                absent[f, r] = True
                any_absent[f] = True
                length = 0
            offsets[f, r + 1] = offsets[f, r] + length
    return offsets, absent, any_absent
