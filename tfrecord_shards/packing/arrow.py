"""Reading packed blocks on Arrow arrays, with no TensorFlow: the one unpacker that the Spark
reader, `tfrp inspect` and the numpy/PyTorch reader all call.

`unpack_blocks` turns decoded blocks into exactly the RecordBatch that per-row records of the
same rows decode to (`parser.decode_record_block`: a large_list column per feature), so a
reader downstream has one form to handle whether the data is packed or not. The one thing a
block cannot keep is the difference between a missing list and an empty one: both come back
as an empty list.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards.codec import parser
from tfrecord_shards.packing.layout import ROWS_KEY, PackedFeature, PackedLayout


class RowDecoder:
    """Records (a `tfrecord_io.RecordBlock`) -> rows as Arrow, packed or not, for one
    schema (narrowed to `features` when given); the layout is worked out once here."""

    def __init__(self, schema: schema_pb2.Schema, features: Optional[Sequence[str]] = None):
        if features is not None:
            schema = _only(schema, features)
        self.schema = schema
        self.layout: Optional[PackedLayout] = PackedLayout.from_schema(schema)
        self.record_schema = self.layout.block_schema() if self.layout else schema
        self.records_per_decode = parser.records_per_decode(self.record_schema)

    def decode(self, block):
        decoded = parser.decode_record_block(block, self.record_schema)
        return unpack_blocks(decoded, self.layout) if self.layout else decoded


def _only(schema: schema_pb2.Schema, names: Sequence[str]) -> schema_pb2.Schema:
    """`schema` with just the features `names`, in that order (its tags kept)."""
    by_name = parser.feature_by_name(schema)
    narrowed = schema_pb2.Schema()
    narrowed.CopyFrom(schema)
    del narrowed.feature[:]
    narrowed.feature.extend(by_name[name] for name in names)
    return narrowed


def unpack_blocks(blocks, layout: PackedLayout):
    """Decoded blocks (`parser.decode_record_block` with `layout.block_schema()`) as one row
    per entry: each feature a large_list column of its rows' values, padding rows dropped."""
    # pyarrow: 80 ms to import after numpy; only unpacking to Arrow columns needs it
    import pyarrow as pa

    names = blocks.schema.names
    real_rows = _flat(blocks.column(names.index(ROWS_KEY))).to_numpy(
        zero_copy_only=False).astype(np.int64)
    columns = [_feature_rows(blocks, names, feature, real_rows)
               for feature in layout.features]
    return pa.RecordBatch.from_arrays(columns, [f.name for f in layout.features])


def _feature_rows(blocks, names: list[str], feature: PackedFeature, real_rows: np.ndarray):
    # pyarrow: 80 ms to import after numpy; only unpacking to Arrow columns needs it
    import pyarrow as pa

    stored = blocks.column(names.index(feature.values_key))
    block_offsets = _offsets(stored)
    positions = None  # which stored values are real rows' values (None: all of them)
    if feature.fixed_size is not None:
        size = feature.fixed_size
        # With no short block every stored value is a real row's, in order.
        if not np.array_equal(np.diff(block_offsets), real_rows * size):
            positions = _runs(block_offsets[:-1], real_rows * size)
        kept = len(positions) if positions is not None else int(block_offsets[-1])
        row_offsets = np.arange(0, kept + 1, size, dtype=np.int64)
    else:
        # Padding rows hold no values, so every stored value belongs to a real row.
        lengths_column = blocks.column(names.index(feature.lengths_key))
        all_lengths = _flat(lengths_column).to_numpy(zero_copy_only=False).astype(np.int64)
        lengths = all_lengths[_runs(_offsets(lengths_column)[:-1], real_rows)]
        row_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = _flat(stored)
    if positions is not None:
        values = values.take(pa.array(positions))
    if feature.dictionary:
        dictionary = blocks.column(names.index(feature.dictionary_key))
        dictionary_starts = _offsets(dictionary)
        block_of_value = np.repeat(np.arange(len(block_offsets) - 1), np.diff(block_offsets))
        if positions is not None:
            block_of_value = block_of_value[positions]
        codes = values.to_numpy(zero_copy_only=False).astype(np.int64)
        values = _flat(dictionary).take(pa.array(
            codes + dictionary_starts[block_of_value]))
    return pa.LargeListArray.from_arrays(pa.array(row_offsets), values)


def _runs(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices starts[i], starts[i] + 1, ..., starts[i] + counts[i] - 1, for every i."""
    counts = np.asarray(counts, np.int64)
    total = int(counts.sum())
    if not total:
        return np.zeros(0, np.int64)
    firsts = np.cumsum(counts) - counts
    return np.repeat(np.asarray(starts, np.int64) - firsts, counts) + np.arange(total)


def _offsets(column) -> np.ndarray:
    """A list column's offsets from 0, as `_flat` indexes its values."""
    offsets = column.offsets.to_numpy().astype(np.int64)
    return offsets - offsets[0]


def _flat(column):
    """A list column's values, from its first offset to its last."""
    offsets = column.offsets.to_numpy()
    return column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
