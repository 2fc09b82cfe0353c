"""Deterministic hash splits: which split each row goes to, from its values alone.

Every engine (Beam, Spark) calls these on Arrow batches, so a row lands in the same split
whichever engine wrote it.
"""
from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrecord_shards.codec import serializer
from components.example_gen.sources.base import SourceError
from tfrecord_shards.options import SettingError

DEFAULT_SPLITS = "train:2,eval:1"  # the same 2:1 hash split stock ExampleGen uses
# hash_rows folds each column in as `combined * HASH_STEP ^ hash(column)`.
HASH_STEP = np.uint64(1_000_003)


def parse_splits(text: str) -> list[tuple[str, int]]:
    """'train:8,eval:2' -> [('train', 8), ('eval', 2)], checked."""
    splits = []
    for part in text.split(","):
        name, _, buckets = part.strip().partition(":")
        if not name or not buckets.isdigit() or int(buckets) < 1:
            raise SettingError(["splits"], "{0} wants name:weight pairs like train:8,eval:2, "
                                           f"got {text!r}")
        if not name.replace("_", "").replace("-", "").isalnum():
            raise SettingError(["splits"], f"{{0}}: split name {name!r} must be letters, "
                                           "digits, '-' or '_'")
        splits.append((name, int(buckets)))
    if len({n for n, _ in splits}) != len(splits):
        raise SettingError(["splits"], f"{{0}} names a split twice: {text!r}")
    return splits


def hash_rows(batch: pa.RecordBatch, columns: list[str],
              absent_as_null: bool = False) -> np.ndarray:
    """A stable uint64 per row from the named columns' values: each column's pandas
    `hash_array` values (fixed-key SipHash for text and objects, splitmix64 for numbers),
    folded in column by column.
    With `absent_as_null`, a column this batch lacks (a file without it) hashes as nulls;
    otherwise it is an error, as for an explicit split key."""
    combined = np.zeros(batch.num_rows, dtype=np.uint64)
    for name in columns:
        index = batch.schema.get_field_index(name)
        if index < 0 and not absent_as_null:
            raise SourceError(f"split key column {name!r} is not in the data")
        array = batch.column(index) if index >= 0 else pa.nulls(batch.num_rows)
        if pa.types.is_timestamp(array.type) or pa.types.is_date(array.type):
            # By the value stored, so a row's split does not depend on how its source or
            # engine typed the time (unit, zone, date or timestamp).
            array = serializer.epoch_seconds(array)
        if _is_number(array.type):
            _mix_in_numbers(combined, array)
        else:
            combined *= HASH_STEP
            combined ^= _hash_each_distinct(array) if _is_text(array.type) \
                else _hash_objects(array)
    return combined


def _hash_objects(array: pa.Array) -> np.ndarray:
    """pandas' hash of the column's values as numpy gives them, lists and other Python
    objects by their repr."""
    # pandas: 0.3 s to import; only text and object columns hash with it, not numbers.
    import pandas as pd

    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        values = np.array([repr(v) for v in array.to_pylist()], dtype=object)
    else:
        values = array.to_numpy(zero_copy_only=False)
        if values.dtype == object:
            values = np.array([v if v is None or isinstance(v, (bytes, str)) else repr(v)
                               for v in values], dtype=object)
    return pd.util.hash_array(values, categorize=False)


def _is_text(kind: pa.DataType) -> bool:
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind))


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _mix_in_numbers(combined: np.ndarray, array: pa.Array) -> None:
    """`combined = combined * HASH_STEP ^ hash(value)` for each row of a numeric column, in one
    compiled pass, where hash is pandas' (`hash_array`: the value's bits as uint64, through
    the splitmix64 finalizer) and a null hashes as None does. Whether a batch holds a null
    must not change how its other values hash (Arrow gives ints with nulls as floats), or a
    row's split would hang on which rows share its batch; so the values are read in the
    column's own type, from its buffers."""
    if not len(array):
        return  # an empty array's value buffer may be missing altogether
    if pa.types.is_boolean(array.type):
        values = array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64)
    else:
        # The value buffer itself: a null's slot holds some value, hashed as None below.
        width = array.type.bit_width // 8
        values = np.frombuffer(array.buffers()[1], f"u{width}")[
            array.offset:array.offset + len(array)]
        # pandas widens each value's own bits to uint64: zero-extended, never sign-extended.
        values = values.astype(np.uint64) if width < 8 else values
    valid = _NO_NULLS
    if array.null_count:
        valid = np.unpackbits(np.frombuffer(array.buffers()[0], np.uint8),
                              bitorder="little")[array.offset:array.offset + len(array)]
    # split_hash: 0.2 s to import (numba); only a split on a numeric column needs it.
    from components.example_gen import split_hash

    split_hash.mix_in_bits(combined, values, valid, _null_hash(), HASH_STEP)


_NO_NULLS = np.zeros(0, np.uint8)


@functools.lru_cache(maxsize=None)
def _null_hash() -> np.uint64:
    # pandas: 0.3 s to import; only a split on a column with nulls needs it.
    import pandas as pd

    return pd.util.hash_array(np.array([None], dtype=object), categorize=False)[0]


def _hash_each_distinct(array: pa.Array) -> np.ndarray:
    """pandas' hash of every value of a string or binary column, the same numbers as hashing
    them one by one, but each distinct value is hashed once (Arrow's dictionary encoding finds
    them): a column of few values (payment types, companies) hashes about 10x faster. A null
    hashes as None does."""
    # pandas: 0.3 s to import; only text and object columns hash with it, not numbers.
    import pandas as pd

    encoded = pc.dictionary_encode(array)
    distinct = encoded.dictionary.to_numpy(zero_copy_only=False).astype(object)
    hashed = pd.util.hash_array(np.append(distinct, np.array([None], dtype=object)),
                                categorize=False)
    return hashed[pc.fill_null(encoded.indices, len(distinct)).to_numpy()]


def split_index(hashes: np.ndarray, weights: list[int]) -> np.ndarray:
    """The split number of each row: hashes bucketed in proportion to the split weights."""
    bucket = hashes % np.uint64(sum(weights))
    return np.searchsorted(np.cumsum(weights), bucket, side="right")
