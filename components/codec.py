"""The one place that converts between tensorflow_metadata Schema, Arrow and tf.Example.

Every component imports these helpers instead of re-deriving feature specs, defaults or
encodings, so a schema written by ExampleGen means the same thing to Transform, Trainer
and `tfrp inspect`.
"""
from __future__ import annotations

from typing import Optional, Union

import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2

SCHEMA_FILE = "schema.pbtxt"

_DTYPES = {
    schema_pb2.INT: tf.int64,
    schema_pb2.FLOAT: tf.float32,
    schema_pb2.BYTES: tf.string,
}


def load_schema(path: str) -> schema_pb2.Schema:
    """Reads a text-format Schema; `path` may be the file or the folder holding schema.pbtxt."""
    from google.protobuf import text_format

    if tf.io.gfile.isdir(path):
        path = path.rstrip("/") + "/" + SCHEMA_FILE
    with tf.io.gfile.GFile(path, "r") as f:
        return text_format.Parse(f.read(), schema_pb2.Schema())


def write_schema(schema: schema_pb2.Schema, path: str) -> None:
    from google.protobuf import text_format

    with tf.io.gfile.GFile(path, "w") as f:
        f.write(text_format.MessageToString(schema))


def is_scalar(feature: schema_pb2.Feature) -> bool:
    """One value per example when present: the schema says so by shape or value_count."""
    if feature.HasField("shape"):
        return [d.size for d in feature.shape.dim] in ([], [1])
    return feature.HasField("value_count") and feature.value_count.max == 1


def feature_spec_from_schema(
    schema: schema_pb2.Schema,
) -> dict[str, Union[tf.io.FixedLenFeature, tf.io.VarLenFeature]]:
    """The parse spec for `tf.io.parse_example`.

    A feature with a fixed shape that is always present parses dense; everything else parses
    as VarLen and is densified afterwards with `densify`, because stock SchemaGen never sets
    shapes and a dense spec would fail on the first missing value.
    """
    spec = {}
    for feature in schema.feature:
        dtype = _DTYPES[feature.type]
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


def densify(value: Union[tf.Tensor, tf.SparseTensor], feature: schema_pb2.Feature
            ) -> Union[tf.Tensor, tf.RaggedTensor]:
    """Turns a parsed batch of one feature into a dense [batch, 1] or a ragged [batch, None].

    Scalar features (by schema) fill gaps with `default_value`; true lists stay ragged so no
    value is padded into existence.
    """
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


# ---------------------------------------------------------------------------------------------
# Arrow <-> tf.Example
# ---------------------------------------------------------------------------------------------
# Column kinds, ordered so that merging two kinds takes the wider one (CSV cells and JSON values
# widen the same way TFX's CSV decoder does: bool < int < float < bytes).
NULL, BOOL, INT, FLOAT, BYTES = "null", "bool", "int", "float", "bytes"
_KIND_ORDER = {NULL: 0, BOOL: 1, INT: 2, FLOAT: 3, BYTES: 4}
_KIND_TO_SCHEMA = {NULL: schema_pb2.BYTES, BOOL: schema_pb2.INT, INT: schema_pb2.INT,
                   FLOAT: schema_pb2.FLOAT, BYTES: schema_pb2.BYTES}
# Up to this many distinct values, a string column is recorded as a categorical domain.
MAX_DOMAIN_VALUES = 50


def widen(a: str, b: str) -> str:
    return a if _KIND_ORDER[a] >= _KIND_ORDER[b] else b


def arrow_kind(arrow_type) -> tuple[str, bool]:
    """(kind, is_list) of an Arrow type; nested lists and structs are not tf.Example values."""
    import pyarrow as pa

    is_list = pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or \
        pa.types.is_fixed_size_list(arrow_type)
    value_type = arrow_type.value_type if is_list else arrow_type
    if pa.types.is_null(value_type):
        return NULL, is_list
    if pa.types.is_boolean(value_type):
        return BOOL, is_list
    if pa.types.is_integer(value_type):
        return INT, is_list
    if pa.types.is_floating(value_type) or pa.types.is_decimal(value_type):
        return FLOAT, is_list
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type) or \
            pa.types.is_binary(value_type) or pa.types.is_large_binary(value_type) or \
            pa.types.is_dictionary(value_type):
        return BYTES, is_list
    if pa.types.is_timestamp(value_type) or pa.types.is_date(value_type):
        return INT, is_list
    raise TypeError(f"Arrow type {arrow_type} has no tf.Example equivalent")


def arrow_value_type(kind: str):
    """The Arrow type a column of `kind` is converted to before encoding."""
    import pyarrow as pa

    # float32 is what tf.train.FloatList stores: float64 sources are narrowed here, once.
    return {NULL: pa.binary(), BOOL: pa.int64(), INT: pa.int64(), FLOAT: pa.float32(),
            BYTES: pa.binary()}[kind]


def to_example_column(array, kind: str, is_list: bool):
    """Converts one Arrow column to the list<T> layout the tfx_bsl encoder takes.

    A null scalar becomes a null list, which the encoder writes as an empty Feature: parsers
    (tf.io.parse_example, tfx_bsl's decoder, TFDV) treat it as absent, as they do for stock
    CsvExampleGen output.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    target = arrow_value_type(kind)
    # tf.Example decoders give lists even for scalars; keep the data's own layout.
    if is_list or pa.types.is_list(array.type) or pa.types.is_large_list(array.type) or \
            pa.types.is_fixed_size_list(array.type):
        if pa.types.is_large_list(array.type) or pa.types.is_fixed_size_list(array.type):
            array = array.cast(pa.list_(array.type.value_type))
        values = _cast_values(array.values, kind, target)
        return pa.ListArray.from_arrays(array.offsets, values, mask=array.is_null()) \
            if array.null_count else pa.ListArray.from_arrays(array.offsets, values)
    values = _cast_values(array, kind, target)
    offsets = np.arange(len(values) + 1, dtype=np.int32)
    if values.null_count:
        valid = np.asarray(values.is_valid())
        offsets[1:] = np.cumsum(valid, dtype=np.int32)
        values = pc.drop_null(values)
        return pa.ListArray.from_arrays(pa.array(offsets), values,
                                        mask=pa.array(~valid))
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _cast_values(values, kind: str, target):
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if kind == BOOL and pa.types.is_boolean(values.type):
        return values.cast(pa.int8()).cast(pa.int64())
    if (pa.types.is_timestamp(values.type) or pa.types.is_date(values.type)):
        return values.cast(pa.int64())
    if kind == BYTES and not (pa.types.is_binary(values.type) or pa.types.is_string(values.type)
                              or pa.types.is_large_binary(values.type)
                              or pa.types.is_large_string(values.type)):
        values = pc.cast(values, pa.string())
    return values.cast(target)


def to_example_batch(batch, columns: dict[str, tuple[str, bool]]):
    """A RecordBatch of list<T> columns, ready for `encode_examples`.

    `columns` maps name -> (kind, is_list) from the whole-dataset profile; a column the batch
    lacks (a file without it) is all null.
    """
    import pyarrow as pa

    arrays, names = [], []
    for name, (kind, is_list) in columns.items():
        index = batch.schema.get_field_index(name)
        if index < 0:
            arrays.append(pa.nulls(batch.num_rows, pa.list_(arrow_value_type(kind))))
        else:
            arrays.append(to_example_column(batch.column(index), kind, is_list))
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names)


def encode_examples(example_batch) -> list[bytes]:
    """Serialized tf.Examples, one per row, by tfx_bsl's C++ encoder."""
    from tfx_bsl.coders import example_coder

    return example_coder.RecordBatchToExamplesEncoder().encode(example_batch)


def decode_examples(serialized: list[bytes], schema: Optional[schema_pb2.Schema] = None):
    """The inverse: a RecordBatch of list columns; with a schema the types come from it."""
    from tfx_bsl.coders import example_coder

    decoder = example_coder.ExamplesToRecordBatchDecoder(
        schema.SerializeToString() if schema is not None else None)
    return decoder.DecodeBatch(serialized)


def schema_from_profile(columns: dict[str, tuple[str, bool]], rows: int,
                        non_null: dict[str, int],
                        string_values: dict[str, Optional[set]]) -> schema_pb2.Schema:
    """A tensorflow_metadata Schema for the profiled columns.

    Presence records how often a value was there; scalars get value_count 1..1 (which is how
    our readers, and stock SchemaGen, tell a scalar from a list); string columns with at most
    MAX_DOMAIN_VALUES distinct values get a string domain.
    """
    schema = schema_pb2.Schema()
    for name, (kind, is_list) in columns.items():
        feature = schema.feature.add(name=name, type=_KIND_TO_SCHEMA[kind])
        present = non_null.get(name, 0)
        feature.presence.min_count = 1 if present else 0
        feature.presence.min_fraction = (present / rows) if rows else 0.0
        if not is_list:
            feature.value_count.min = 1
            feature.value_count.max = 1
        if kind == BOOL:
            feature.int_domain.min, feature.int_domain.max = 0, 1
            feature.int_domain.is_categorical = True
        values = string_values.get(name)
        if kind == BYTES and values and len(values) <= MAX_DOMAIN_VALUES:
            domain = schema.string_domain.add(name=name)
            domain.value.extend(sorted(v.decode("utf-8", "backslashreplace")
                                       if isinstance(v, bytes) else str(v) for v in values))
            feature.domain = name
    return schema
