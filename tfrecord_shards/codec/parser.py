"""The codec's reading half: what a Schema means to a reader of tf.Examples.

Every component derives feature specs, defaults and dense values here instead of re-deriving
them, so a schema written by ExampleGen means the same thing to Transform, the Trainer and
`tfrp inspect`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from tensorflow_metadata.proto.v0 import schema_pb2

if TYPE_CHECKING:  # annotations only; the functions import TensorFlow when they run
    import tensorflow as tf

# TensorFlow is imported by the functions that build tensors, so the schema helpers here
# (is_scalar, default_value, ...) serve readers that run without it.


def is_scalar(feature: schema_pb2.Feature) -> bool:
    """One value per example when present: the schema says so by shape or value_count."""
    if feature.HasField("shape"):
        return [d.size for d in feature.shape.dim] in ([], [1])
    return feature.HasField("value_count") and feature.value_count.max == 1


def is_fixed(feature: schema_pb2.Feature) -> bool:
    """A fixed shape and always present: parsed dense, and packed without lengths."""
    return feature.HasField("shape") and feature.HasField("presence") and \
        feature.presence.min_fraction >= 1.0


def feature_spec_from_schema(
    schema: schema_pb2.Schema,
) -> dict[str, Union["tf.io.FixedLenFeature", "tf.io.VarLenFeature"]]:
    """The parse spec for `tf.io.parse_example`.

    A feature with a fixed shape that is always present parses dense; everything else parses
    as VarLen and is densified afterwards with `densify`, because stock SchemaGen never sets
    shapes and a dense spec would fail on the first missing value.
    """
    # tensorflow: 4 s to import; tfrp examplegen and inspect never load it (tests/test_cli.py)
    import tensorflow as tf

    dtypes = {schema_pb2.INT: tf.int64, schema_pb2.FLOAT: tf.float32,
              schema_pb2.BYTES: tf.string}
    spec = {}
    for feature in schema.feature:
        dtype = dtypes[feature.type]
        if is_fixed(feature):
            spec[feature.name] = tf.io.FixedLenFeature(
                [d.size for d in feature.shape.dim], dtype)
        else:
            spec[feature.name] = tf.io.VarLenFeature(dtype)
    return spec


def default_value(feature: schema_pb2.Feature) -> Union[int, float, bytes]:
    """What an absent value becomes: 0 for numbers, b'' for bytes.

    The Schema proto has no default field, so the default follows from the type; a model that
    needs a different fill (a median, a sentinel) belongs in `preprocessing_fn`.
    """
    return {schema_pb2.INT: 0, schema_pb2.FLOAT: 0.0, schema_pb2.BYTES: b""}[feature.type]


def densify(value: Union["tf.Tensor", "tf.SparseTensor"], feature: schema_pb2.Feature
            ) -> Union["tf.Tensor", "tf.RaggedTensor"]:
    """Turns a parsed batch of one feature into a dense [batch, 1] or a ragged [batch, None].

    Scalar features (by schema) fill gaps with `default_value`; true lists stay ragged so no
    value is padded into existence.
    """
    # tensorflow: 4 s to import; tfrp examplegen and inspect never load it (tests/test_cli.py)
    import tensorflow as tf

    if not isinstance(value, tf.SparseTensor):
        return value if value.shape.rank and value.shape.rank > 1 else tf.reshape(value, [-1, 1])
    if is_scalar(feature):
        batch = value.dense_shape[0]
        value = tf.SparseTensor(value.indices, value.values, tf.stack([batch, 1]))
        return tf.sparse.to_dense(value, default_value=default_value(feature))
    return tf.RaggedTensor.from_sparse(value)


def feature_by_name(schema: schema_pb2.Schema) -> dict[str, schema_pb2.Feature]:
    return {f.name: f for f in schema.feature}


def find_feature(schema: schema_pb2.Schema, name: str) -> Optional[schema_pb2.Feature]:
    return feature_by_name(schema).get(name)


# Lifecycle stages whose features tfx_bsl leaves out of tensor representations.
INACTIVE_STAGES = (schema_pb2.DEPRECATED, schema_pb2.DISABLED, schema_pb2.PLANNED,
                   schema_pb2.ALPHA, schema_pb2.DEBUG_ONLY, schema_pb2.VALIDATION_DERIVED)


def active_schema(schema: schema_pb2.Schema) -> schema_pb2.Schema:
    """`schema` without the features marked deprecated (or otherwise inactive).

    SchemaGen marks a feature DEPRECATED and types it BYTES when the train split never holds
    a value for it; the decoder would still decode that feature with the guessed type and
    fail on the one row of another split that has an int. Nothing downstream reads it."""
    active = schema_pb2.Schema()
    active.CopyFrom(schema)
    del active.feature[:]
    active.feature.extend(f for f in schema.feature if f.lifecycle_stage not in INACTIVE_STAGES)
    return active


def decode_examples(serialized: list[bytes], schema: Optional[schema_pb2.Schema] = None):
    """The inverse: a RecordBatch of list columns; with a schema the types come from it."""
    # tfx_bsl: 0.2 s to import; only decode_examples needs it, never the numpy decoder
    from tfx_bsl.coders import example_coder

    decoder = example_coder.ExamplesToRecordBatchDecoder(
        schema.SerializeToString() if schema is not None else None)
    return decoder.DecodeBatch(serialized)


# The decoder keeps about 33 bytes per (record, schema feature) while it works, so a wide
# schema over small records (sparse data: 16 MB of 50-byte records, 1,000 features) would
# need gigabytes; callers decode at most this many cells at a time (`records_per_decode`).
DECODE_CELLS = 1 << 21


def records_per_decode(schema: schema_pb2.Schema) -> int:
    """How many records `decode_record_block` should be given at a time for `schema`."""
    return max(1, DECODE_CELLS // max(1, len(schema.feature)))


_KIND_NAMES = ("float_list", "int64_list", "bytes_list")  # by wire.FLOAT_KIND, INT_KIND, BYTES_KIND


def decode_record_block(block, schema: schema_pb2.Schema):
    """A block of serialized tf.Examples (a `tfrecord_io.RecordBlock`) as the RecordBatch
    `decode_examples(records, schema)` gives (a large_list column per schema feature, null
    where a record has no value for it), decoded by compiled loops (codec/example_loops.py) in two
    passes over the records, counting then filling, with no Python object per record or
    value. A malformed record, or a feature of another type than the schema's, is a
    ValueError naming the file and offset."""
    # numpy + pyarrow: 0.25 s to import; the callers wanting feature specs alone need neither
    import numpy as np
    import pyarrow as pa

    # codec.wire (numba): 0.5 s to import; only the compiled decoder needs it, not the specs
    from tfrecord_shards.codec import example_loops, wire

    kinds_by_type = {schema_pb2.FLOAT: wire.FLOAT_KIND, schema_pb2.INT: wire.INT_KIND,
                     schema_pb2.BYTES: wire.BYTES_KIND}
    features = list(schema.feature)
    kinds = np.array([kinds_by_type[f.type] for f in features], np.int64)
    names = [f.name.encode() for f in features]
    keys = np.frombuffer(b"".join(names) or b"\0", np.uint8)
    key_offsets = np.cumsum([0] + [len(n) for n in names], dtype=np.int64)
    records = len(block.starts)
    lengths = np.full((records, len(features)), -1, np.int64)
    list_starts = np.empty((records, len(features)), np.int64)
    list_ends = np.empty((records, len(features)), np.int64)
    byte_totals = np.zeros(len(features), np.int64)
    buffer = wire.frozen(block.buffer)
    problem = example_loops.locate_values(buffer, *(wire.frozen(a) for a in (
        block.starts, block.ends, keys, key_offsets, kinds)), lengths, list_starts, list_ends,
        byte_totals)
    _raise_problem(block, features, kinds, *problem)

    offsets, absent, any_absent = example_loops.list_offsets(wire.frozen(lengths))
    counts = offsets[:, -1]
    # Each kind's values in one array, feature after feature; a bytes feature's offsets take
    # one slot more than its values (its data start).
    slots = np.where(kinds == wire.BYTES_KIND, counts + 1, counts)
    cursors = np.zeros(len(features), np.int64)
    for kind in (wire.FLOAT_KIND, wire.INT_KIND, wire.BYTES_KIND):
        mine = kinds == kind
        cursors[mine] = np.concatenate([[0], np.cumsum(slots[mine])[:-1]])
    byte_cursors = np.where(kinds == wire.BYTES_KIND,
                            np.cumsum(byte_totals) - byte_totals, 0).astype(np.int64)
    starts, byte_starts = cursors.copy(), byte_cursors.copy()
    floats = np.empty(int(slots[kinds == wire.FLOAT_KIND].sum()), np.float32)
    ints = np.empty(int(slots[kinds == wire.INT_KIND].sum()), np.int64)
    value_offsets = np.empty(max(int(slots[kinds == wire.BYTES_KIND].sum()), 1), np.int64)
    value_offsets[starts[kinds == wire.BYTES_KIND]] = byte_starts[kinds == wire.BYTES_KIND]
    data = np.empty(int(byte_totals.sum()), np.uint8)
    example_loops.fill_values(
        buffer, *(wire.frozen(a) for a in (lengths, list_starts, list_ends, kinds)),
        floats, ints, value_offsets, data, cursors, byte_cursors)

    columns = []
    for f, feature in enumerate(features):
        first, count = int(starts[f]), int(counts[f])
        if kinds[f] == wire.FLOAT_KIND:
            values = pa.array(floats[first:first + count])
        elif kinds[f] == wire.INT_KIND:
            values = pa.array(ints[first:first + count])
        else:
            # Zero-based offsets over the feature's own data: pyarrow 10's IPC writer (how
            # Spark receives batches) garbles a list's binary values whose offsets do not
            # start at 0.
            ends = value_offsets[first:first + count + 1]
            values = pa.LargeBinaryArray.from_buffers(
                pa.large_binary(), count,
                [None, pa.py_buffer(ends - ends[0]), pa.py_buffer(data[ends[0]:ends[-1]])])
        columns.append(pa.LargeListArray.from_arrays(
            pa.array(offsets[f]), values, mask=pa.array(absent[f]) if any_absent[f] else None))
    return pa.RecordBatch.from_arrays(columns, [f.name for f in features])


def _raise_problem(block, features: list, kinds, record: int, feature: int, problem: int
                   ) -> None:
    # codec.wire (numba): 0.5 s to import; only the compiled decoder needs it, not the specs
    from tfrecord_shards.codec import example_loops

    if problem == 0:
        return
    where = f"{block.path}: record at byte offset {block.record_offset(record)}"
    if feature < 0:
        raise ValueError(f"{where} is not a tf.Example")
    name = features[feature].name
    if problem == example_loops.WRONG_KIND:
        raise ValueError(f"{where}: feature {name!r} is not a {_KIND_NAMES[kinds[feature]]}, "
                         f"which its schema type "
                         f"{schema_pb2.FeatureType.Name(features[feature].type)} needs")
    if problem == example_loops.REPEATED_KEY:
        raise ValueError(f"{where}: feature {name!r} appears twice")
    raise ValueError(f"{where}: feature {name!r} is malformed")
