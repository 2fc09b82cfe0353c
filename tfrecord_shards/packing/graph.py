"""Reading packed blocks in the TensorFlow graph: the parse spec of blocks and the unpacker
the input function maps over parsed groups of them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards.packing.layout import ROWS_KEY, PackedLayout

if TYPE_CHECKING:  # annotations only; the functions import TensorFlow when they run
    import tensorflow as tf


def _dtype(schema_type: int):
    # tensorflow: 4 s to import; the no-TensorFlow readers use this package (test_numpy_reader)
    import tensorflow as tf

    return {schema_pb2.INT: tf.int64, schema_pb2.FLOAT: tf.float32,
            schema_pb2.BYTES: tf.string}[schema_type]


def block_spec(layout: PackedLayout, feature_names) -> dict:
    """The parse spec of packed blocks for the wanted row features."""
    # tensorflow: 4 s to import; the no-TensorFlow readers use this package (test_numpy_reader)
    import tensorflow as tf

    out = {ROWS_KEY: tf.io.FixedLenFeature([1], tf.int64)}
    for name in feature_names:
        feature = layout.feature(name)
        if feature.dictionary:
            out[feature.dictionary_key] = tf.io.VarLenFeature(tf.string)
        dtype = _dtype(feature.values_type)
        if feature.fixed_size is not None:
            out[feature.values_key] = tf.io.FixedLenFeature(
                [layout.rows * feature.fixed_size], dtype)
        else:
            out[feature.values_key] = tf.io.VarLenFeature(dtype)
            out[feature.lengths_key] = tf.io.FixedLenFeature([layout.rows], tf.int64)
    return out


def unpack(parsed: dict, layout: PackedLayout, feature_names,
           shuffle_seed: Optional["tf.Tensor"] = None
           ) -> dict[str, Union["tf.Tensor", "tf.RaggedTensor"]]:
    """Parsed blocks [B, ...] -> the real rows of all B blocks: fixed features [R, k] (k=1 for
    scalars), variable ones ragged [R, None]. Padding rows of short blocks are dropped and, with
    a `shuffle_seed` (an int64 [2] tensor), the rows come out in an order drawn from it: one
    index serves every feature, so dropping and shuffling cost one move per feature. The
    shuffle is stateless, so an iterator over it can be checkpointed."""
    # tensorflow: 4 s to import; the no-TensorFlow readers use this package (test_numpy_reader)
    import tensorflow as tf

    real = tf.reshape(tf.sequence_mask(parsed[ROWS_KEY][:, 0], layout.rows), [-1])
    index = tf.where(real)[:, 0]
    if shuffle_seed is not None:
        index = tf.random.experimental.stateless_shuffle(index, seed=shuffle_seed)
    destination = _destinations(index, tf.size(real))
    out = {}
    for name in feature_names:
        feature = layout.feature(name)
        dictionary = parsed[feature.dictionary_key] if feature.dictionary else None
        if feature.fixed_size is not None:
            stored = parsed[feature.values_key]
            if dictionary is not None:
                stored = stored + _dictionary_starts(dictionary)[:, None]
            values = _move_rows(tf.reshape(stored, [-1, feature.fixed_size]), index,
                                destination)
            if dictionary is not None:  # each string is made once, in its final place
                values = tf.gather(dictionary.values, values)
            out[name] = tf.reshape(values, [-1, *feature.shape]) \
                if len(feature.shape) > 1 else values
            continue
        if dictionary is None:
            values = parsed[feature.values_key].values
        else:
            codes = parsed[feature.values_key]
            values = tf.gather(dictionary.values, codes.values + tf.gather(
                _dictionary_starts(dictionary), codes.indices[:, 0]))
        lengths = tf.reshape(parsed[feature.lengths_key], [-1])
        if feature.scalar:
            out[name] = _scalar_rows(values, lengths, index, feature.default)
            continue
        out[name] = tf.gather(tf.RaggedTensor.from_row_lengths(values, lengths), index)
    return out


def _dictionary_starts(dictionary: "tf.SparseTensor") -> "tf.Tensor":
    """Where each block's dictionary starts among all the blocks' values: a block's code
    plus its start indexes `dictionary.values`."""
    # tensorflow: 4 s to import; the no-TensorFlow readers use this package (test_numpy_reader)
    import tensorflow as tf

    blocks = tf.cast(dictionary.dense_shape[0], tf.int32)
    sizes = tf.math.bincount(tf.cast(dictionary.indices[:, 0], tf.int32), minlength=blocks,
                             maxlength=blocks, dtype=tf.int64)
    return tf.cumsum(sizes, exclusive=True)


def _destinations(index: "tf.Tensor", stored_rows: "tf.Tensor") -> "tf.Tensor":
    """For each stored row, its place in the output (`index` inverted), or -1 for a padding
    row, which the scatter in `_move_rows` then drops."""
    # tensorflow: 4 s to import; the no-TensorFlow readers use this package (test_numpy_reader)
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
    # tensorflow: 4 s to import; the no-TensorFlow readers use this package (test_numpy_reader)
    import tensorflow as tf

    rows = tf.size(index)
    if values.dtype == tf.float32:
        moved = tf.math.unsorted_segment_sum(tf.bitcast(values, tf.int32), destination, rows)
        return tf.bitcast(moved, tf.float32)
    if values.dtype in (tf.int64, tf.int32):
        return tf.math.unsorted_segment_sum(values, destination, rows)
    return tf.gather(values, index)


def _scalar_rows(values: "tf.Tensor", lengths: "tf.Tensor", index: "tf.Tensor",
                 default) -> "tf.Tensor":
    """A nullable scalar's rows `index` as [R, 1], a missing value as the schema default (what
    a per-row read gives). Each row holds 0 or 1 values, so the value of row i sits at the
    running count of values before it: two integer gathers and one gather of values, where a
    ragged gather and densify would build row splits and scatter."""
    # tensorflow: 4 s to import; the no-TensorFlow readers use this package (test_numpy_reader)
    import tensorflow as tf

    present = tf.gather(lengths, index) > 0
    position = tf.gather(tf.cumsum(lengths, exclusive=True), index)
    padded = tf.concat([values, tf.constant([default], values.dtype)], axis=0)
    safe = tf.where(present, position, tf.cast(tf.size(values), position.dtype))
    return tf.reshape(tf.gather(padded, safe), [-1, 1])
