"""StatisticsGen's compiled loops (numba), each a pass over one block's arrays: the records'
features and list kinds for schema inference (`unlisted_feature`), a column's moments and
list lengths, and the sorting that orders a block's values for the quantiles sketch (11-bit
radix sorts: of wide-ranging integers, and of floats where numpy has no SIMD sort for them,
`sorted_numbers`).

Numba compiles them on first use and caches the machine code beside this file;
`pipeline/jit_cache.py` fills that cache at install time.
"""
from __future__ import annotations

import numba
import numpy as np

from tfrecord_shards.codec import wire


_jit = numba.njit(cache=True, nogil=True)


@_jit
def unlisted_feature(buffer, starts, ends, first: int, keys, key_offsets, kinds):
    """From record `first` on, the first Features map entry that the known features
    (named keys[key_offsets[f]:key_offsets[f + 1]], holding lists of wire kind kinds[f], -1
    while seen with no list) do not account for: a name not among them, or a list where
    none or one of another kind was seen. (record, key start, key end, its list's wire kind
    or -1); (-1, 0, 0, -1) when there is none; (record, -1, -1, -1) when the record is
    malformed."""
    features = len(key_offsets) - 1
    guess = 0
    for r in range(first, len(starts)):
        position, end = starts[r], ends[r]
        while position < end:
            entry, features_end = wire.next_message(buffer, position, end)
            if entry < 0:
                return r, -1, -1, -1
            while entry < features_end:
                field, entry_end = wire.next_message(buffer, entry, features_end)
                if field < 0:
                    return r, -1, -1, -1
                keyed = False
                key_start = key_end = value_start = value_end = 0
                while field < entry_end:
                    tag, field = wire.get_tag(buffer, field, entry_end)
                    if field < 0:
                        return r, -1, -1, -1
                    if tag == 0x0A or tag == 0x12:
                        inner, inner_end = wire.message_end(buffer, field, entry_end)
                        if inner < 0:
                            return r, -1, -1, -1
                        if tag == 0x0A:
                            keyed = True
                            key_start, key_end = inner, inner_end
                        else:
                            value_start, value_end = inner, inner_end
                        field = inner_end
                    else:
                        field = wire.skip_field(buffer, field, entry_end, tag & 7)
                        if field < 0:
                            return r, -1, -1, -1
                entry = entry_end
                if not keyed:
                    continue
                kind = -1
                value = value_start
                while value < value_end:
                    tag, value = wire.get_tag(buffer, value, value_end)
                    if value < 0:
                        return r, -1, -1, -1
                    if tag == 0x0A or tag == 0x12 or tag == 0x1A:  # bytes, float, int64 list
                        kind = wire.BYTES_KIND if tag == 0x0A else \
                            wire.FLOAT_KIND if tag == 0x12 else wire.INT_KIND
                        inner, value = wire.message_end(buffer, value, value_end)
                        if inner < 0:
                            return r, -1, -1, -1
                    else:
                        value = wire.skip_field(buffer, value, value_end, tag & 7)
                        if value < 0:
                            return r, -1, -1, -1
                f = wire.key_index(buffer, key_start, key_end, keys, key_offsets, guess)
                if f < 0 or (kind >= 0 and kinds[f] != kind):
                    return r, key_start, key_end, kind
                # Writers keep one order of features, so the next entry is nearly always
                # the next known feature.
                guess = f + 1 if f + 1 < features else 0
            position = features_end
    return -1, 0, 0, -1


@_jit
def moments(values):
    """Over the values that are not NaN: (NaN count, min, max, finite min, finite max,
    +inf count, zeros, count, mean, sum of squared deviations)."""
    nans = zeros = count = positive_infinite = 0
    low, high = np.inf, -np.inf
    finite_low, finite_high = np.inf, -np.inf
    total = 0.0
    for value in values:
        x = np.float64(value)
        if x != x:
            nans += 1
            continue
        count += 1
        total += x
        low = min(low, x)
        high = max(high, x)
        if x == 0.0:
            zeros += 1
        if np.isfinite(x):
            finite_low = min(finite_low, x)
            finite_high = max(finite_high, x)
        elif x > 0:
            positive_infinite += 1
    mean = total / count if count else 0.0
    squares = 0.0
    for value in values:
        x = np.float64(value)
        if x == x:
            squares += (x - mean) * (x - mean)
    return (nans, low, high, finite_low, finite_high, positive_infinite, zeros, count, mean,
            squares)


@_jit
def list_lengths(offsets, validity, first_bit: int):
    """Over the present lists (validity: Arrow's bitmap from bit `first_bit`, or empty when
    every list is present): (count, fewest values, most values, total values, how many lists
    hold 0, 1, 2, ... values)."""
    rows = len(offsets) - 1
    count = total = 0
    fewest, most = np.iinfo(np.int64).max, 0
    for row in range(rows):
        bit = first_bit + row
        if len(validity) and not (validity[bit >> 3] >> (bit & 7)) & 1:
            continue
        length = offsets[row + 1] - offsets[row]
        count += 1
        total += length
        fewest = min(fewest, length)
        most = max(most, length)
    tally = np.zeros(most + 1 if count else 0, np.int64)
    if count and fewest == most:  # every list the same length (scalar features)
        tally[most] = count
        return count, fewest, most, total, tally
    for row in range(rows):
        bit = first_bit + row
        if len(validity) and not (validity[bit >> 3] >> (bit & 7)) & 1:
            continue
        tally[offsets[row + 1] - offsets[row]] += 1
    return count, fewest, most, total, tally


@_jit
def int_range(values):
    low, high = values[0], values[0]
    for value in values:
        low = min(low, value)
        high = max(high, value)
    return low, high


@_jit
def radix_sort(keys, bits: int):
    """`keys` (uint64 below 2**bits) sorted, 11 bits a pass (least significant first), all
    passes counted in one read; a pass whose digit every key shares (the high bits of
    values in a narrow range) is skipped."""
    passes = max(1, (bits + 10) // 11)
    counts = np.zeros((passes, 2048), np.int64)
    for key in keys:
        for p in range(passes):
            counts[p, (key >> np.uint64(11 * p)) & np.uint64(2047)] += 1
    shifts = np.arange(passes).astype(np.uint64) * np.uint64(11)
    return _distributed(keys.copy(), counts, shifts, np.uint64(2047))


@_jit
def _distributed(source, counts, shifts, mask):
    """`source` (keys, overwritten) in order of the digits `(key >> shifts[p]) & mask`,
    least significant first, each pass placed by its `counts` of every digit (one row a
    pass, changed in place); a pass whose digit every key shares is skipped. The shifts and
    the mask are of the keys' own type: numba makes a uint64 shifted by an int a float."""
    target = np.empty_like(source)
    for p in range(len(shifts)):
        if counts[p].max() == len(source):
            continue
        start = 0
        for digit in range(counts.shape[1]):
            run = counts[p, digit]
            counts[p, digit] = start
            start += run
        shift = shifts[p]
        for key in source:
            digit = (key >> shift) & mask
            target[counts[p, digit]] = key
            counts[p, digit] += 1
        source, target = target, source
    return source


_SIGN = np.uint32(0x80000000)
_MAGNITUDE = np.uint32(0x7FFFFFFF)
_INFINITY_BITS = np.uint32(0x7F800000)
_ALL_BITS = np.uint32(0xFFFFFFFF)
_DIGIT = np.uint32(2047)


@_jit
def radix_sorted_float32(values):
    """`values` (float32) in ascending order, NaNs last, as `np.sort` orders them (-0.0
    comes before 0.0, which compare equal; a NaN comes back as NaN, not its own bits): an
    11-bit radix sort of keys whose unsigned order is the floats' order, three passes
    counted in one read, a pass whose digit every key shares skipped."""
    size = len(values)
    bits = values.view(np.uint32)
    keys = np.empty(size, np.uint32)
    counts = np.zeros((3, 2048), np.int64)
    for i in range(size):
        word = bits[i]
        if word & _MAGNITUDE > _INFINITY_BITS:
            key = _ALL_BITS
        elif word & _SIGN:
            key = word ^ _ALL_BITS
        else:
            key = word | _SIGN
        keys[i] = key
        counts[0, key & _DIGIT] += 1
        counts[1, (key >> np.uint32(11)) & _DIGIT] += 1
        counts[2, key >> np.uint32(22)] += 1
    source = _distributed(keys, counts, np.array([0, 11, 22], np.uint32), _DIGIT)
    ordered = np.empty(size, np.float32)
    ordered_bits = ordered.view(np.uint32)
    for i in range(size):
        key = source[i]
        ordered_bits[i] = key ^ _SIGN if key & _SIGN else key ^ _ALL_BITS
    return ordered


def _numpy_sorts_floats_with_simd() -> bool:
    """Whether numpy sorts float32 with SIMD on this CPU: numpy 2 with AVX2 or AVX-512,
    numpy 1.26 (our pin) with AVX-512 alone (x86-simd-sort)."""
    try:
        # numpy's private module, read once here: a numpy that moved it falls back below
        # instead of failing this module's import.
        from numpy.core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # another layout: numpy's own sort, as before
        return True
    wanted = ("AVX512_SKX", "AVX2") if int(np.__version__.split(".")[0]) >= 2 \
        else ("AVX512_SKX",)
    return any(features.get(name) for name in wanted)


# Measured on 34.5k float32 values: with AVX-512, numpy's sort 0.30 ms (an earlier radix
# sort 0.85); on an AVX2 machine (AMD EPYC, numpy 1.26) numpy's 2.86 ms, the radix 0.39.
_NUMPY_SORT = _numpy_sorts_floats_with_simd()


def sorted_numbers(values: np.ndarray) -> np.ndarray:
    """`values` sorted as `np.sort` sorts them (NaNs last), by whichever is faster here for
    float32: numpy's SIMD sort or `radix_sorted_float32`."""
    if values.dtype == np.float32 and not _NUMPY_SORT:
        return radix_sorted_float32(wire.frozen(np.ascontiguousarray(values)))
    return np.sort(values)


def evenly_ranked(ordered: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values as `points` weighted points: the middle value of each of `points` runs
    of equally many ranks, and each run's length (float64), so a rank is off by less than a
    run."""
    edges = np.arange(points + 1, dtype=np.int64) * len(ordered) // points
    return ordered[(edges[:-1] + edges[1:] - 1) // 2], np.diff(edges).astype(np.float64)
