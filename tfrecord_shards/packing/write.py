"""Writing packed blocks: an Arrow batch of rows -> serialized block Examples.

The block columns are built on Arrow and numpy arrays (one list entry per block) and
serialized by the codec's compiled encoder, the same one that writes per-row Examples, so no
Python object is made per row or value.
"""
from __future__ import annotations

import numpy as np
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards.codec import serializer
from tfrecord_shards.packing.layout import ROWS_KEY, PackedFeature, PackedLayout

_KINDS = {schema_pb2.INT: serializer.INT, schema_pb2.FLOAT: serializer.FLOAT,
          schema_pb2.BYTES: serializer.BYTES}


def pack_batch(batch, layout: PackedLayout) -> list[bytes]:
    """Every row of `batch` (a pyarrow RecordBatch or Table) packed into blocks of
    `layout.rows`; the last block holds the remainder. A column the layout lacks, or a fixed
    feature with another number of values in some row, is an error."""
    # pyarrow: 60 ms to import after numpy; only packing a batch needs it
    import pyarrow as pa

    names = list(batch.schema.names)
    unknown = sorted(set(names) - {f.name for f in layout.features})
    if unknown:
        raise KeyError(f"columns {unknown} are not in the schema")
    rows = batch.num_rows
    blocks = -(-rows // layout.rows)
    real_rows = np.minimum(layout.rows, rows - np.arange(blocks) * layout.rows)
    columns = {ROWS_KEY: _lists(pa.array(real_rows, pa.int64()), np.arange(blocks + 1))}
    for feature in layout.features:
        if feature.name in names:
            columns.update(_feature_columns(batch.column(names.index(feature.name)), feature,
                                            layout.rows, blocks))
    return serializer.encode_examples(pa.RecordBatch.from_arrays(list(columns.values()),
                                                                 list(columns)))


def _feature_columns(column, feature: PackedFeature, block_rows: int, blocks: int) -> dict:
    """The block columns of one feature: its values (or codes and dictionary), and lengths
    when it is variable."""
    # pyarrow.compute: 0.2 s to import; only packing a batch needs it
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = len(column)
    values = _fixed_values(column, feature) if feature.fixed_size is not None else None
    if values is None:
        lists = serializer.to_example_column(column, _KINDS[feature.type], False)
        lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(
            zero_copy_only=False).astype(np.int64)
        values = pc.list_flatten(lists)
        wrong = np.flatnonzero(lengths != feature.fixed_size) \
            if feature.fixed_size is not None else []
        if len(wrong):
            raise ValueError(f"feature {feature.name!r} is fixed at {feature.fixed_size} "
                             f"value(s) per row, but row {int(wrong[0])} of the batch has "
                             f"{int(lengths[wrong[0]])}")
    # A null inside a list has no tf.Example form; it is stored as the schema default.
    if values.null_count:
        values = pc.fill_null(values, feature.default)
    out = {}
    if feature.fixed_size is not None:
        size = feature.fixed_size
        padding = (blocks * block_rows - rows) * size
        if padding:
            values = pa.concat_arrays([values, pa.array([feature.default] * padding,
                                                        values.type)])
        block_offsets = np.arange(blocks + 1) * block_rows * size
    else:
        row_offsets = np.concatenate([[0], np.cumsum(lengths)])
        block_offsets = row_offsets[np.minimum(np.arange(blocks + 1) * block_rows, rows)]
        padded = np.zeros(blocks * block_rows, np.int64)
        padded[:rows] = lengths
        out[feature.lengths_key] = _lists(pa.array(padded),
                                          np.arange(blocks + 1) * block_rows)
    if feature.dictionary:
        codes, dictionary, dictionary_offsets = _block_dictionaries(values, block_offsets)
        out[feature.dictionary_key] = _lists(dictionary, dictionary_offsets)
        out[feature.values_key] = _lists(pa.array(codes), block_offsets)
    else:
        out[feature.values_key] = _lists(values, block_offsets)
    return out


def _fixed_values(column, feature: PackedFeature):
    """The values of a list column every row of which holds `feature.fixed_size` of them, in
    the kind the encoder takes, without building the list column `to_example_column` makes
    (a transformed batch's 34 columns: a third of packing it); None when a row is missing or
    holds another number of values, which the general way reports."""
    # pyarrow: 60 ms to import after numpy; only packing a batch needs it
    import pyarrow as pa

    parts = []
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        if chunk.null_count or not (pa.types.is_list(chunk.type)
                                    or pa.types.is_large_list(chunk.type)):
            return None
        offsets = chunk.offsets.to_numpy()
        if len(chunk) and (np.diff(offsets) != feature.fixed_size).any():
            return None
        parts.append(chunk.values.slice(offsets[0], offsets[-1] - offsets[0]))
    if not parts:
        return None
    values = parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
    return serializer.cast_values(values, _KINDS[feature.type])


def _block_dictionaries(values, block_offsets: np.ndarray):
    """(codes, dictionary values, dictionary offsets) for string `values` cut into blocks at
    `block_offsets`: each block's dictionary holds its distinct values once, and a value's
    code is its index in its own block's dictionary."""
    # pyarrow.compute: 0.2 s to import; only packing a batch needs it
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(values)
    distinct = len(encoded.dictionary)
    global_codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    block_of_value = np.repeat(np.arange(len(block_offsets) - 1), np.diff(block_offsets))
    # One sort over (block, global code) pairs finds every block's distinct values at once.
    used, position = np.unique(block_of_value * distinct + global_codes, return_inverse=True)
    dictionary_offsets = np.searchsorted(used, np.arange(len(block_offsets)) * distinct)
    codes = position - dictionary_offsets[block_of_value]
    return codes, encoded.dictionary.take(used % max(distinct, 1)), dictionary_offsets


def _lists(values, offsets: np.ndarray):
    # pyarrow: 60 ms to import after numpy; only packing a batch needs it
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array(np.asarray(offsets, np.int32)), values)
