"""The compiled loop under `splits.hash_rows` for numeric columns, apart so that importing
the split helpers does not import numba (about 0.2 s and 60 MB), which only encoding needs."""
from __future__ import annotations

import numba
import numpy as np

_MIX_1, _MIX_2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_SHIFT_1, _SHIFT_2, _SHIFT_3 = np.uint64(30), np.uint64(27), np.uint64(31)


@numba.njit(cache=True, nogil=True)
def mix_in_bits(combined, bits, valid, null_hash, step):
    """`combined[row] = combined[row] * step ^ hash`, where hash is pandas' `hash_array` of
    the value's bits (the splitmix64 finalizer), or `null_hash` where `valid` (empty: no
    nulls) is 0. `step` is `splits.HASH_STEP`, passed in so this module imports nothing of
    ours."""
    for row in range(len(combined)):
        if len(valid) and not valid[row]:
            hashed = null_hash
        else:
            hashed = bits[row]
            hashed ^= hashed >> _SHIFT_1
            hashed *= _MIX_1
            hashed ^= hashed >> _SHIFT_2
            hashed *= _MIX_2
            hashed ^= hashed >> _SHIFT_3
        combined[row] = combined[row] * step ^ hashed
