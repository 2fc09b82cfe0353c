"""StatisticsGen's compiled loops (numba), each a pass over one block's arrays: the records'
features and list kinds for schema inference (`unlisted_feature`), a column's moments and
list lengths, and the sorting that orders a block's wide-ranging integers for the quantiles
sketch (an 11-bit radix sort; numpy sorts floats faster).

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
    source = keys.copy()
    target = np.empty_like(source)
    for p in range(passes):
        if counts[p].max() == len(keys):
            continue
        start = 0
        for digit in range(2048):
            size = counts[p, digit]
            counts[p, digit] = start
            start += size
        shift = np.uint64(11 * p)
        for key in source:
            digit = (key >> shift) & np.uint64(2047)
            target[counts[p, digit]] = key
            counts[p, digit] += 1
        source, target = target, source
    return source
