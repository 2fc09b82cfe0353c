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


def feature_spec_from_schema(
    schema: schema_pb2.Schema,
) -> dict[str, Union["tf.io.FixedLenFeature", "tf.io.VarLenFeature"]]:
    """The parse spec for `tf.io.parse_example`.

    A feature with a fixed shape that is always present parses dense; everything else parses
    as VarLen and is densified afterwards with `densify`, because stock SchemaGen never sets
    shapes and a dense spec would fail on the first missing value.
    """
    import tensorflow as tf

    dtypes = {schema_pb2.INT: tf.int64, schema_pb2.FLOAT: tf.float32,
              schema_pb2.BYTES: tf.string}
    spec = {}
    for feature in schema.feature:
        dtype = dtypes[feature.type]
        always_present = (
            feature.HasField("presence") and feature.presence.min_fraction >= 1.0)
        if feature.HasField("shape") and always_present:
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
    from tfx_bsl.coders import example_coder

    decoder = example_coder.ExamplesToRecordBatchDecoder(
        schema.SerializeToString() if schema is not None else None)
    return decoder.DecodeBatch(serialized)
