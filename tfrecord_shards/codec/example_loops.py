"""The compiled loops of the tf.Example codec: the columnar encoder under `serializer.py`
and the decoder under `parser.py`.

A tf.Example is Example{features: Features{map<string, Feature> feature}}, and a Feature holds
one of BytesList (field 1), FloatList (2, packed float32) or Int64List (3, packed varints).
Serialized, each row is
  0x0A len(features) | per feature: 0x0A len(entry) 0x0A len(name) name 0x12 len(feature)
                                    kind len(list) [0x0A len(packed values)] values
The encoder sizes every row's entries a column at a time (reading each column front to back),
then writes whole rows one after another (writing the output front to back: a column at a
time would visit every row's bytes once per column, a cache miss each).

The decoder reads tf.Example's wire bytes a feature at a time, in two passes over the
records: `locate_values` finds and counts each schema feature's value list, `fill_values`
stores the values in one array per kind. Malformed bytes never raise inside a loop: each
returns the index of the first record it could not read and the caller names file and
offset. The steps they share are in `wire.py`.
"""
from __future__ import annotations

import numba
import numpy as np

from tfrecord_shards.codec.wire import (
    BYTES_KIND, FLOAT_KIND, INT_KIND, copy_bytes, get_tag, get_varint, key_index, memcpy,
    message_end, next_message, put_varint, same_bytes, skip_field, varint_size)

_jit = numba.njit(cache=True, nogil=True)
# Inlined into their callers: a compiled call passes each array as its whole structure, which
# costs more than these helpers' work.
_inline = numba.njit(cache=True, nogil=True, inline="always")

_LIST_TAG = (0x12, 0x1A, 0x0A)  # Feature.float_list, int64_list, bytes_list (wire type 2)


# --- Encoding: Arrow columns to serialized rows ----------------------------------------------

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
    position = put_varint(out, position + 1, np.uint64(entry))
    position = copy_bytes(out, position, keys, key_start, key_end - key_start)
    position = put_varint(out, position, np.uint64(feature))
    out[position] = _LIST_TAG[kind]
    position = put_varint(out, position + 1, np.uint64(list_bytes))
    if packed and payload > 0:
        out[position] = 0x0A
        position = put_varint(out, position + 1, np.uint64(payload))
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
        position = put_varint(out, ends[at] + 1, np.uint64(totals[row]))
        for column in range(len(kinds)):
            size = payload[column, row]
            if size < 0:
                continue
            kind = kinds[column]
            position = _entry(out, position, size, kind, keys, key_offsets[column],
                              key_offsets[column + 1])
            first, last = offsets[column, row], offsets[column, row + 1]
            if kind == FLOAT_KIND:
                position = copy_bytes(out, position, float_bytes, 4 * first, size)
            elif kind == INT_KIND:
                for i in range(first, last):
                    position = put_varint(out, position, ints[i])
            else:
                for i in range(first, last):
                    start, end = value_offsets[i], value_offsets[i + 1]
                    out[position] = 0x0A
                    position = put_varint(out, position + 1, np.uint64(end - start))
                    position = copy_bytes(out, position, data, start, end - start)
    return out, ends


# --- Decoding: serialized rows to each feature's values ----------------------------------

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
        tag, position = get_tag(buffer, position, end)
        if position < 0:
            return -1, 0
        if tag == 0x0A:  # packed numbers, or a bytes value
            first, last = message_end(buffer, position, end)
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
            position = skip_field(buffer, position, end, tag & 7)
            if position < 0:
                return -1, 0
            count += 1
        else:
            position = skip_field(buffer, position, end, tag & 7)
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
            tag, start = get_tag(buffer, start, end)
            if tag == 0x0A:
                first, last = message_end(buffer, start, end)
                at = fill_packed(buffer, first, last, out, at)
                start = last
            elif tag == one_tag:
                start, at = fill_one(buffer, start, end, out, at)
            else:
                start = skip_field(buffer, start, end, tag & 7)
    return fill


@_inline
def _copy_floats(buffer, first: int, last: int, out, at: int) -> int:
    """Packed floats: their bytes as they are (out is float32 bytes; `at` counts bytes)."""
    memcpy(out, at, buffer, first, last - first)
    return at + last - first


@_inline
def _copy_float(buffer, start: int, end: int, out, at: int):
    memcpy(out, at, buffer, start, 4)
    return start + 4, at + 4


@_inline
def _read_varints(buffer, first: int, last: int, out, at: int) -> int:
    while first < last:
        value, first = get_varint(buffer, first, last)
        out[at] = np.int64(value)
        at += 1
    return at


@_inline
def _read_varint(buffer, start: int, end: int, out, at: int):
    value, start = get_varint(buffer, start, end)
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
        tag, start = get_tag(buffer, start, end)
        if tag == 0x0A:
            first, last = message_end(buffer, start, end)
            memcpy(data, data_at, buffer, first, last - first)
            data_at += last - first
            at += 1
            value_offsets[at] = data_at
            start = last
        else:
            start = skip_field(buffer, start, end, tag & 7)
    return data_at


@_inline
def _map_entry(buffer, field, entry_end):
    """The bounds of the key and of the Feature message in the Features.feature map entry
    buffer[field:entry_end], as (key_start, key_end, value_start, value_end); all 0 where a
    part is missing (an empty entry matches no feature), key_start -1 when malformed."""
    key_start = key_end = value_start = value_end = 0
    while field < entry_end:
        tag, field = get_tag(buffer, field, entry_end)
        if field < 0:
            return -1, 0, 0, 0
        if tag == 0x0A or tag == 0x12:
            inner, inner_end = message_end(buffer, field, entry_end)
            if inner < 0:
                return -1, 0, 0, 0
            if tag == 0x0A:
                key_start, key_end = inner, inner_end
            else:
                value_start, value_end = inner, inner_end
            field = inner_end
        else:
            field = skip_field(buffer, field, entry_end, tag & 7)
            if field < 0:
                return -1, 0, 0, 0
    return key_start, key_end, value_start, value_end


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
            entry, features_end = next_message(buffer, position, end)  # Example.features
            if entry < 0:
                return r, -1, MALFORMED
            while entry < features_end:
                # A Features.feature map entry; an empty one when only other fields are left,
                # which matches no feature's value below.
                field, entry_end = next_message(buffer, entry, features_end)
                if field < 0:
                    return r, -1, MALFORMED
                key_start, key_end, value_start, value_end = _map_entry(buffer, field,
                                                                        entry_end)
                if key_start < 0:
                    return r, -1, MALFORMED
                entry = entry_end
                f = follows[previous]
                if key_offsets[f + 1] - key_offsets[f] != key_end - key_start or not \
                        same_bytes(keys, key_offsets[f], buffer, key_start,
                                    key_end - key_start):
                    f = key_index(buffer, key_start, key_end, keys, key_offsets, f)
                if f < 0:
                    continue
                follows[previous] = f
                previous = f
                kind = -1
                list_start = list_end = 0
                value = value_start
                while value < value_end:
                    tag, value = get_tag(buffer, value, value_end)
                    if value < 0:
                        return r, f, MALFORMED
                    if tag == 0x0A or tag == 0x12 or tag == 0x1A:  # bytes, float, int64 list
                        list_start, list_end = message_end(buffer, value, value_end)
                        if list_start < 0:
                            return r, f, MALFORMED
                        kind = BYTES_KIND if tag == 0x0A else \
                            FLOAT_KIND if tag == 0x12 else INT_KIND
                        value = list_end
                    else:
                        value = skip_field(buffer, value, value_end, tag & 7)
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
