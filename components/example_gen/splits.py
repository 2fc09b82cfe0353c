"""Deterministic hash splits: which split each row goes to, from its values alone.

Every engine (Beam, Spark) calls these on Arrow batches, so a row lands in the same split
whichever engine wrote it.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from components.example_gen.sources.base import SourceError

DEFAULT_SPLITS = "train:2,eval:1"  # the same 2:1 hash split stock ExampleGen uses


def parse_splits(text: str) -> list[tuple[str, int]]:
    """'train:8,eval:2' -> [('train', 8), ('eval', 2)], checked."""
    splits = []
    for part in text.split(","):
        name, _, buckets = part.strip().partition(":")
        if not name or not buckets.isdigit() or int(buckets) < 1:
            raise ValueError(f"--splits wants name:weight pairs like train:8,eval:2, got {text!r}")
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"split name {name!r} must be letters, digits, '-' or '_'")
        splits.append((name, int(buckets)))
    if len({n for n, _ in splits}) != len(splits):
        raise ValueError(f"--splits names a split twice: {text!r}")
    return splits


def hash_rows(batch: pa.RecordBatch, columns: list[str],
              absent_as_null: bool = False) -> np.ndarray:
    """A stable uint64 per row from the named columns' values (pandas' fixed-key SipHash).
    With `absent_as_null`, a column this batch lacks (a file without it) hashes as nulls;
    otherwise it is an error, as for an explicit split key."""
    import pandas as pd

    combined = np.zeros(batch.num_rows, dtype=np.uint64)
    for name in columns:
        index = batch.schema.get_field_index(name)
        if index < 0 and not absent_as_null:
            raise SourceError(f"split key column {name!r} is not in the data")
        array = batch.column(index) if index >= 0 else pa.nulls(batch.num_rows)
        if _is_text(array.type):
            hashed = _hash_each_distinct(array)
        elif _is_number(array.type):
            hashed = _hash_numbers(array)
        else:
            if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
                values = np.array([repr(v) for v in array.to_pylist()], dtype=object)
            else:
                values = array.to_numpy(zero_copy_only=False)
                if values.dtype == object:
                    values = np.array([v if v is None or isinstance(v, (bytes, str))
                                       else repr(v) for v in values], dtype=object)
            hashed = pd.util.hash_array(values, categorize=False)
        combined = combined * np.uint64(1_000_003) ^ hashed
    return combined


def _is_text(kind: pa.DataType) -> bool:
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind))


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _hash_numbers(array: pa.Array) -> np.ndarray:
    """pandas' hash of each value in the column's own type, a null as None hashes. Whether a
    batch holds a null must not change how its other values hash (Arrow gives ints with nulls
    as floats), or a row's split would hang on which rows share its batch."""
    import pandas as pd
    import pyarrow.compute as pc

    if not array.null_count:
        return pd.util.hash_array(array.to_numpy(zero_copy_only=False), categorize=False)
    zero = pa.scalar(False if pa.types.is_boolean(array.type) else 0, array.type)
    hashed = pd.util.hash_array(pc.fill_null(array, zero).to_numpy(zero_copy_only=False),
                                categorize=False)
    hashed[pc.is_null(array).to_numpy(zero_copy_only=False)] = pd.util.hash_array(
        np.array([None], dtype=object), categorize=False)[0]
    return hashed


def _hash_each_distinct(array: pa.Array) -> np.ndarray:
    """pandas' hash of every value of a string or binary column, the same numbers as hashing
    them one by one, but each distinct value is hashed once (Arrow's dictionary encoding finds
    them): a column of few values (payment types, companies) hashes about 10x faster. A null
    hashes as None does."""
    import pandas as pd
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(array)
    distinct = encoded.dictionary.to_numpy(zero_copy_only=False).astype(object)
    hashed = pd.util.hash_array(np.append(distinct, np.array([None], dtype=object)),
                                categorize=False)
    return hashed[pc.fill_null(encoded.indices, len(distinct)).to_numpy()]


def split_index(hashes: np.ndarray, weights: list[int]) -> np.ndarray:
    """The split number of each row: hashes bucketed in proportion to the split weights."""
    bucket = hashes % np.uint64(sum(weights))
    return np.searchsorted(np.cumsum(weights), bucket, side="right")
