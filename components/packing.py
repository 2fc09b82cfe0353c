"""Packed records: one tf.Example holds a block of N rows as column lists.

Parsing is what caps per-row input speed: every row is a tf.Example with its own feature map.
A packed Example carries N rows at once, so one parse yields N rows of each column.

Layout of a block, for a row schema with fixed features (shape known, always present) and
variable ones (everything else):
  `__rows__`        int64, one value: the rows really in this block (the last may be short)
  <fixed>           N * k values; a short block is padded with the schema default
  <variable>        the values of all N rows, concatenated
  <variable>__lengths  N int64s: values per row (0 for a missing value and for padding)

A string feature's values are stored dictionary-coded (schema tag
`tfrp.packed_strings=dictionary`, which every block written since 2026-11-25 has):
  <string>__dictionary  the block's distinct values
  <string>__codes       each value (as above: N * k, or concatenated) as its index there
Strings repeat (categories, names), so blocks are smaller, and a reader moves integer codes
and makes each string once, where parsing and shuffling strings made every string twice.
Blocks without the tag keep the values under <string> itself and are read as before.

The schema stored beside packed data is the *row* schema plus an annotation tag
`tfrp.packed_rows=<N>`; `packed_rows(schema)` reads it back. The Arrow->block encoder lives here
beside the block parser so the two sides of the format are in one file.
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Optional, Union

import numpy as np
from tensorflow_metadata.proto.v0 import schema_pb2

if TYPE_CHECKING:  # annotations only; the functions import TensorFlow when they run
    import tensorflow as tf

from components.codec import parser

ROWS_KEY = "__rows__"
LENGTHS_SUFFIX = "__lengths"
DICTIONARY_SUFFIX = "__dictionary"
CODES_SUFFIX = "__codes"
TAG_PREFIX = "tfrp.packed_rows="
DICTIONARY_TAG = "tfrp.packed_strings=dictionary"


def packed_rows(schema: schema_pb2.Schema) -> int:
    """N when `schema` describes packed data, else 0."""
    for tag in schema.annotation.tag:
        if tag.startswith(TAG_PREFIX):
            return int(tag[len(TAG_PREFIX):])
    return 0


def dictionary_coded(schema: schema_pb2.Schema) -> bool:
    """Whether packed blocks under `schema` store their strings dictionary-coded."""
    return DICTIONARY_TAG in schema.annotation.tag


def annotate(schema: schema_pb2.Schema, rows: int) -> schema_pb2.Schema:
    """The schema of data packed `rows` to a block, in the current layout."""
    packed = copy.deepcopy(schema)
    kept = [t for t in packed.annotation.tag
            if not t.startswith(TAG_PREFIX) and t != DICTIONARY_TAG]
    del packed.annotation.tag[:]
    packed.annotation.tag.extend(kept + [f"{TAG_PREFIX}{rows}", DICTIONARY_TAG])
    return packed


def block_schema(schema: schema_pb2.Schema) -> schema_pb2.Schema:
    """The schema of the packed blocks themselves (every column a list): what a decoder of
    the stored records is given."""
    blocks = schema_pb2.Schema()
    blocks.feature.add(name=ROWS_KEY, type=schema_pb2.INT)
    coded = dictionary_coded(schema)
    for feature in schema.feature:
        if coded and feature.type == schema_pb2.BYTES:
            blocks.feature.add(name=feature.name + DICTIONARY_SUFFIX, type=schema_pb2.BYTES)
            blocks.feature.add(name=feature.name + CODES_SUFFIX, type=schema_pb2.INT)
        else:
            blocks.feature.add(name=feature.name, type=feature.type)
        if not parser.is_fixed(feature):
            blocks.feature.add(name=feature.name + LENGTHS_SUFFIX, type=schema_pb2.INT)
    return blocks


def _fixed_size(spec) -> Optional[int]:
    import tensorflow as tf

    if isinstance(spec, tf.io.FixedLenFeature):
        return int(np.prod(spec.shape)) if spec.shape else 1
    return None


# ---------------------------------------------------------------------------------------------
# Writing: Arrow record batch (one row per entry) -> packed serialized Examples
# ---------------------------------------------------------------------------------------------
def _column_values(column, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(flat values, values per row) of an Arrow column that is scalar or list typed."""
    import tensorflow as tf

    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or \
            pa.types.is_fixed_size_list(column.type):
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        values = pc.list_flatten(column)
    else:
        lengths = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), np.int64)
        values = column.drop_null()
    if dtype == tf.string:
        flat = np.asarray([v if isinstance(v, bytes) else str(v).encode()
                           for v in values.to_pylist()], dtype=object)
    else:
        flat = values.to_numpy(zero_copy_only=False).astype(
            np.float32 if dtype == tf.float32 else np.int64)
    return flat, lengths.astype(np.int64)


def _dictionary_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, dictionary) of an array of bytes: dictionary[codes] == values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(pa.array(values, pa.binary()))
    return (encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64),
            np.asarray(encoded.dictionary.to_pylist(), dtype=object))


def _feature(values: np.ndarray, dtype) -> tf.train.Feature:
    import tensorflow as tf

    if dtype == tf.string:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))
    if dtype == tf.float32:
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def pack_batch(batch, schema: schema_pb2.Schema, rows_per_block: int) -> list[bytes]:
    """Packs every row of `batch` (pyarrow RecordBatch/Table) into blocks of `rows_per_block`;
    the last block holds the remainder. Columns not in the schema are an error."""
    import tensorflow as tf

    spec = parser.feature_spec_from_schema(schema)
    features = parser.feature_by_name(schema)
    coded = dictionary_coded(schema)
    names = list(batch.schema.names)
    unknown = sorted(set(names) - set(spec))
    if unknown:
        raise KeyError(f"columns {unknown} are not in the schema")
    columns = {}
    for name in names:
        flat, lengths = _column_values(batch.column(names.index(name)), spec[name].dtype)
        size = _fixed_size(spec[name])
        if size is not None and np.any(lengths != size):
            row = int(np.argmax(lengths != size))
            raise ValueError(f"feature {name!r} is fixed at {size} value(s) per row, but row "
                             f"{row} of the batch has {int(lengths[row])}")
        dictionary, padding = None, parser.default_value(features[name])
        if coded and spec[name].dtype == tf.string:
            # The padding value goes in the dictionary too, so a short block codes it.
            flat, dictionary = _dictionary_codes(np.append(
                flat, np.array([padding], dtype=object)))
            padding, flat = flat[-1], flat[:-1]
        columns[name] = (flat, np.concatenate([[0], np.cumsum(lengths)]), size, dictionary,
                         padding)
    blocks = []
    for start in range(0, batch.num_rows, rows_per_block):
        end = min(start + rows_per_block, batch.num_rows)
        block = {ROWS_KEY: _feature(np.array([end - start], np.int64), tf.int64)}
        for name, (flat, offsets, size, dictionary, padding) in columns.items():
            dtype = spec[name].dtype
            values = flat[offsets[start]:offsets[end]]
            if size is not None:
                pad = (rows_per_block - (end - start)) * size
                if pad:
                    filler = np.full(pad, padding, dtype=values.dtype)
                    values = np.concatenate([values, filler])
            else:
                lengths = np.zeros(rows_per_block, np.int64)
                lengths[:end - start] = np.diff(offsets[start:end + 1])
                block[name + LENGTHS_SUFFIX] = _feature(lengths, tf.int64)
            if dictionary is None:
                block[name] = _feature(values, dtype)
                continue
            used, codes = np.unique(values, return_inverse=True)
            block[name + DICTIONARY_SUFFIX] = _feature(dictionary[used], tf.string)
            block[name + CODES_SUFFIX] = _feature(codes.astype(np.int64), tf.int64)
        blocks.append(tf.train.Example(
            features=tf.train.Features(feature=block)).SerializeToString())
    return blocks


# ---------------------------------------------------------------------------------------------
# Reading: a batch of packed serialized Examples -> rows
# ---------------------------------------------------------------------------------------------
def block_spec(schema: schema_pb2.Schema, feature_names) -> dict:
    """The parse spec of packed blocks for the wanted row features."""
    import tensorflow as tf

    rows = packed_rows(schema)
    spec = parser.feature_spec_from_schema(schema)
    coded = dictionary_coded(schema)
    out = {ROWS_KEY: tf.io.FixedLenFeature([1], tf.int64)}
    for name in feature_names:
        size, dtype, key = _fixed_size(spec[name]), spec[name].dtype, name
        if coded and dtype == tf.string:
            out[name + DICTIONARY_SUFFIX] = tf.io.VarLenFeature(tf.string)
            dtype, key = tf.int64, name + CODES_SUFFIX
        if size is not None:
            out[key] = tf.io.FixedLenFeature([rows * size], dtype)
        else:
            out[key] = tf.io.VarLenFeature(dtype)
            out[name + LENGTHS_SUFFIX] = tf.io.FixedLenFeature([rows], tf.int64)
    return out


def unpack(parsed: dict, schema: schema_pb2.Schema, feature_names,
           shuffle_seed: Optional["tf.Tensor"] = None
           ) -> dict[str, Union[tf.Tensor, tf.RaggedTensor]]:
    """Parsed blocks [B, ...] -> the real rows of all B blocks: fixed features [R, k] (k=1 for
    scalars), variable ones ragged [R, None]. Padding rows of short blocks are dropped and, with
    a `shuffle_seed` (an int64 [2] tensor), the rows come out in an order drawn from it: one
    index serves every feature, so dropping and shuffling cost one move per feature. The
    shuffle is stateless, so an iterator over it can be checkpointed."""
    import tensorflow as tf

    rows = packed_rows(schema)
    spec = parser.feature_spec_from_schema(schema)
    real = tf.reshape(tf.sequence_mask(parsed[ROWS_KEY][:, 0], rows), [-1])
    index = tf.where(real)[:, 0]
    if shuffle_seed is not None:
        index = tf.random.experimental.stateless_shuffle(index, seed=shuffle_seed)
    destination = _destinations(index, tf.size(real))
    coded = dictionary_coded(schema)
    out = {}
    for name in feature_names:
        size = _fixed_size(spec[name])
        dictionary = parsed[name + DICTIONARY_SUFFIX] \
            if coded and spec[name].dtype == tf.string else None
        if size is not None:
            stored = parsed[name] if dictionary is None else \
                parsed[name + CODES_SUFFIX] + _dictionary_starts(dictionary)[:, None]
            values = _move_rows(tf.reshape(stored, [-1, size]), index, destination)
            if dictionary is not None:  # each string is made once, in its final place
                values = tf.gather(dictionary.values, values)
            shape = spec[name].shape
            out[name] = tf.reshape(values, [-1, *shape]) if len(shape) > 1 else values
            continue
        if dictionary is None:
            values = parsed[name].values
        else:
            codes = parsed[name + CODES_SUFFIX]
            values = tf.gather(dictionary.values, codes.values + tf.gather(
                _dictionary_starts(dictionary), codes.indices[:, 0]))
        lengths = tf.reshape(parsed[name + LENGTHS_SUFFIX], [-1])
        feature = parser.find_feature(schema, name)
        if parser.is_scalar(feature):
            out[name] = _scalar_rows(values, lengths, index, parser.default_value(feature))
            continue
        out[name] = tf.gather(tf.RaggedTensor.from_row_lengths(values, lengths), index)
    return out


def _dictionary_starts(dictionary: "tf.SparseTensor") -> "tf.Tensor":
    """Where each block's dictionary starts among all the blocks' values: a block's code
    plus its start indexes `dictionary.values`."""
    import tensorflow as tf

    blocks = tf.cast(dictionary.dense_shape[0], tf.int32)
    sizes = tf.math.bincount(tf.cast(dictionary.indices[:, 0], tf.int32), minlength=blocks,
                             maxlength=blocks, dtype=tf.int64)
    return tf.cumsum(sizes, exclusive=True)


def _destinations(index: "tf.Tensor", stored_rows: "tf.Tensor") -> "tf.Tensor":
    """For each stored row, its place in the output (`index` inverted), or -1 for a padding
    row, which the scatter in `_move_rows` then drops."""
    import tensorflow as tf

    return tf.tensor_scatter_nd_update(
        tf.fill([stored_rows], tf.constant(-1, tf.int32)), index[:, None],
        tf.range(tf.size(index, out_type=tf.int32)))


def _move_rows(values: "tf.Tensor", index: "tf.Tensor", destination: "tf.Tensor"
               ) -> "tf.Tensor":
    """`tf.gather(values, index)`. Numbers are scattered instead, as an integer segment sum of
    their bit patterns into zeros: exact (NaNs and -0.0 kept) and, for one value a row,
    about twice as fast as TF's gather, which copies element by element
    (`python -m bench.profile_packed` times both)."""
    import tensorflow as tf

    rows = tf.size(index)
    if values.dtype == tf.float32:
        moved = tf.math.unsorted_segment_sum(tf.bitcast(values, tf.int32), destination, rows)
        return tf.bitcast(moved, tf.float32)
    if values.dtype in (tf.int64, tf.int32):
        return tf.math.unsorted_segment_sum(values, destination, rows)
    return tf.gather(values, index)


def _scalar_rows(values: tf.Tensor, lengths: tf.Tensor, index: tf.Tensor,
                 default) -> tf.Tensor:
    """A nullable scalar's rows `index` as [R, 1], a missing value as the schema default (what
    a per-row read gives). Each row holds 0 or 1 values, so the value of row i sits at the
    running count of values before it: two integer gathers and one gather of values, where a
    ragged gather and densify would build row splits and scatter."""
    import tensorflow as tf

    present = tf.gather(lengths, index) > 0
    position = tf.gather(tf.cumsum(lengths, exclusive=True), index)
    padded = tf.concat([values, tf.constant([default], values.dtype)], axis=0)
    safe = tf.where(present, position, tf.cast(tf.size(values), position.dtype))
    return tf.reshape(tf.gather(padded, safe), [-1, 1])
