"""The codec's writing half: Arrow record batches -> serialized tf.Examples, and the Schema a
profile of the data implies. It imports no TensorFlow, so encoding workers stay light.
"""
from __future__ import annotations

from typing import Optional

from tensorflow_metadata.proto.v0 import schema_pb2

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
