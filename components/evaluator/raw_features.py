"""The features decoded from the records themselves, not output by a model (a raw label,
slicing columns): their schema types (`raw_feature_schema`, `record_types`), the check that
every record has its label (`check_labels`), and a label's values as [rows, values]
(`raw_values`)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import tfrecord_io
from tfrecord_shards.codec import parser, schema_file


def as_rows(values: np.ndarray) -> np.ndarray:
    """A [rows] or [rows, ...] array as [rows, values]."""
    values = np.asarray(values)
    return values.reshape(len(values), -1)


def raw_feature_schema(names: Sequence[str], schema: Any, block: tfrecord_io.RecordBlock):
    """The features decoded here, typed by the given schema, else by the schema.pbtxt our
    ExampleGen writes beside its shards, else by the first records themselves."""
    if schema is None:
        schema = schema_file.find_schema(block.path)
    found = parser.feature_by_name(schema) if schema is not None else {}
    if schema is not None and any(tag.startswith("tfrp.packed_rows")
                                  for tag in schema.annotation.tag):
        raise ValueError(f"{block.path}: packed records (several rows a tf.Example); the "
                         f"Evaluator scores ExampleGen's rows, one a tf.Example")
    subset = schema_pb2.Schema()
    missing = [name for name in names if name not in found]
    typed = record_types(missing, block) if missing else {}
    for name in names:
        feature = subset.feature.add()
        if name in found:
            feature.CopyFrom(found[name])
        else:
            feature.name, feature.type = name, typed[name]
    return subset


def record_types(names: Sequence[str], block: tfrecord_io.RecordBlock,
                 sample: int = 1000) -> dict[str, int]:
    """The schema type of each named feature, from the kind of list the first records hold
    it in; a feature none of them holds is named in one line."""
    kinds = {"float_list": schema_pb2.FLOAT, "int64_list": schema_pb2.INT,
             "bytes_list": schema_pb2.BYTES}
    found: dict[str, int] = {}
    for i in range(min(sample, len(block.starts))):
        example = tf.train.Example.FromString(
            block.buffer[block.starts[i]:block.ends[i]].tobytes())
        for name in names:
            if name not in found and name in example.features.feature:
                kind = example.features.feature[name].WhichOneof("kind")
                if kind:
                    found[name] = kinds[kind]
        if len(found) == len(names):
            return found
    missing = [name for name in names if name not in found]
    raise ValueError(f"{block.path}: no feature {', '.join(map(repr, missing))} in the first "
                     f"{min(sample, len(block.starts))} records (a label_key or slicing "
                     f"column the model does not output either)")


def check_labels(batch: Any, block: tfrecord_io.RecordBlock, label_keys: Sequence[str]) -> None:
    """Every record has a label: a missing one is named by file and offset."""
    for key in set(label_keys):
        column = batch.column(batch.schema.get_field_index(key))
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        if (lengths == 0).any():
            row = int(np.flatnonzero(lengths == 0)[0])
            raise ValueError(f"{block.path}: record at byte offset {block.record_offset(row)} "
                             f"has no value for the label {key!r}")


def raw_values(column: Any, name: str) -> np.ndarray:
    """A raw feature's values as [rows, values] (every row holds as many)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_binary(column.type.value_type) or \
            pa.types.is_large_binary(column.type.value_type):
        raise ValueError(f"the label {name!r} holds bytes; a preprocessing function (the "
                         f"model spec's preprocessing_function_names) must map it to numbers")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if len(set(lengths.tolist())) > 1:
        raise ValueError(f"the label {name!r} holds {lengths.min()} to {lengths.max()} values "
                         f"a row; every row needs as many")
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    return values.reshape(len(column), int(lengths[0]) if len(lengths) else 1)
