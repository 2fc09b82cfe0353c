"""The protobuf wire format's building blocks, for the compiled loops of the codec
(`example_loops.py`: the tf.Example encoder and decoder; `framing.py`: TFRecord framing) and
of StatisticsGen's schema inference: the value kinds of a Feature's lists, varints written
and read, tags, fields skipped, length-delimited messages found, bytes copied (one libc
memcpy) and compared (eight bytes at a time), and a feature name looked up among the
schema's.

Reading never raises inside a loop: a malformed field makes these steps return -1 as its
position, and the loops return the index of the first record they could not read, for the
caller to name file and offset.

Numba compiles these loops on first use and caches the machine code beside each module (or
in the user's cache folder when it is read-only), so there is no build step to run. numba
caches a loop by its own source file: a loop that calls or inlines one of these steps is not
recompiled when only this file changes, so clear the `__pycache__` folders' `*.nbi`/`*.nbc`
files (or set NUMBA_CACHE_DIR afresh) after editing a step here.
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
def put_varint(out, position: int, value: np.uint64) -> int:
    while value >= _ONE_BYTE:
        out[position] = np.uint8((value & _LOW_BITS) | _MORE)
        value >>= _SEVEN
        position += 1
    out[position] = np.uint8(value)
    return position + 1


@intrinsic
def memcpy(typingctx, out, position, source, start, count):
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
def copy_bytes(out, position: int, source, start: int, count: int) -> int:
    """Copies source[start:start + count] to out[position:], which the caller has sized."""
    memcpy(out, position, source, start, count)
    return position + count


# --- Reading ------------------------------------------------------------------------------

@_jit
def get_varint(buffer, position: int, end: int):
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
def get_tag(buffer, position: int, end: int):
    """(field number << 3 | wire type, position after it), or (0, -1)."""
    tag, position = get_varint(buffer, position, end)
    return np.int64(tag & _LOW_BITS_32), position


@_jit
def skip_field(buffer, position: int, end: int, wire_type: int) -> int:
    """The position after a field's value, -1 when it is malformed."""
    if wire_type == 0:
        return get_varint(buffer, position, end)[1]
    if wire_type == 1:
        position += 8
    elif wire_type == 5:
        position += 4
    elif wire_type == 2:
        length, position = get_varint(buffer, position, end)
        if position < 0:
            return -1
        position += np.int64(length)
    else:
        return -1
    return position if position <= end else -1


@_jit
def message_end(buffer, position: int, end: int):
    """(start, end) of a length-delimited value at `position`, or (-1, -1)."""
    length, start = get_varint(buffer, position, end)
    if start < 0 or length > np.uint64(end - start):
        return -1, -1
    return start, start + np.int64(length)


@_inline
def next_message(buffer, position: int, end: int):
    """(start, end) of the next field-1 message (tag 0x0A) from `position`, skipping other
    fields; (end, end) when there is none, (-1, -1) when a field is malformed."""
    while position < end:
        tag, position = get_tag(buffer, position, end)
        if position < 0:
            return -1, -1
        if tag == 0x0A:
            return message_end(buffer, position, end)
        position = skip_field(buffer, position, end, tag & 7)
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
def same_bytes(a, a_start: int, b, b_start: int, count: int) -> bool:
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
def key_index(buffer, start: int, end: int, keys, key_offsets, guess: int) -> int:
    """The schema feature whose name is buffer[start:end], from `guess` on, or -1."""
    features = len(key_offsets) - 1
    for step in range(features):
        f = (guess + step) % features
        first, last = key_offsets[f], key_offsets[f + 1]
        if last - first != end - start:
            continue
        if same_bytes(keys, first, buffer, start, last - first):
            return f
    return -1
