"""`read_examples`: TFRecord shards of tf.Example (ours or stock ExampleGen's, gzip or plain)
as a Spark DataFrame, with no hand-written feature spec.

The columns come from `schema.pbtxt` when one is beside the shards (or given), else from a
sample of records. Executors read whole files a block at a time with the project's framing
reader, so a corrupt record is an error naming the file and offset, and decode them to Arrow
with the codec's compiled decoder (no TensorFlow); packed records are unpacked into rows on
Arrow arrays. `col=value/` folders become columns, as in Spark's partition discovery.
"""
from __future__ import annotations

import urllib.parse
from typing import Union

import numpy as np
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import fileio, shards, tfrecord_io
from tfrecord_shards.codec import parser, schema_file
from tfrecord_shards.example_rows import record_files
from tfrecord_shards.packing.arrow import RowDecoder
from spark_shards.session import deal_by_weight

SAMPLE_RECORDS = 1_000


def read_examples(spark, path: str,
                  schema: Union[None, str, schema_pb2.Schema] = None):
    """A DataFrame of the tf.Examples under `path` (a shard, a Split-* folder or an output
    folder). `schema` is a Schema or a schema.pbtxt path; without it the stored schema is
    used, or the types are inferred from the first records."""
    # pyspark.sql.types: 0.11 s to import; only the Spark schema needs it
    from pyspark.sql import types as T

    files = _tfrecord_files(path)
    if not files:
        raise FileNotFoundError(f"{path}: no TFRecord files")
    if isinstance(schema, str):
        schema = schema_file.load_schema(schema)
    schema = schema or schema_file.find_schema(files[0]) or _inferred_schema(files[0])
    root = path if fileio.isdir(path) else fileio.dirname(path)
    # A partition column the records also hold (ExampleGen's partition_by keeps it) is read
    # from the records.
    stored = {f.name for f in schema.feature}
    partition_names = [n for n in _partition_names(root, files) if n not in stored]
    fields = [T.StructField(f.name, _spark_type(f, schema), True) for f in schema.feature]
    fields += [T.StructField(name, T.StringType(), True) for name in partition_names]
    spark_schema = T.StructType(fields)
    groups = file_groups(files, spark.sparkContext.defaultParallelism)
    # Task i reads groups[i]; spark.range makes the task ids in the JVM, with no Python.
    tasks = spark.range(0, len(groups), 1, len(groups))
    return tasks.mapInArrow(_FileDecoder(schema, root, partition_names, groups), spark_schema)


def file_groups(files: list[str], cores: int) -> list[list[str]]:
    """The files cut into at most `cores` groups of about equal bytes: one task a group."""
    return [[files[i] for i in group]
            for group in deal_by_weight([fileio.size(f) for f in files], cores)]


def _tfrecord_files(path: str) -> list[str]:
    # The shard library's own listing (not ExampleGen's source listing): hidden files,
    # indexes and quarantine left out, and an output whose commit stopped refused.
    return [f for f in record_files(path) if
            fileio.basename(f).startswith("data_tfrecord-") or ".tfrecord" in f]


def _inferred_schema(path: str) -> schema_pb2.Schema:
    """Types from the first records: a feature is a scalar when every sampled record holds
    exactly one value, else a list."""
    # pyarrow.compute: 80 ms to import; the driver's listing needs none
    import pyarrow.compute as pc

    records = []
    for _, record in tfrecord_io.iter_records(path):
        records.append(record)
        if len(records) >= SAMPLE_RECORDS:
            break
    batch = parser.decode_examples(records)
    schema = schema_pb2.Schema()
    kinds = {"int64": schema_pb2.INT, "float": schema_pb2.FLOAT}
    for name, column in zip(batch.schema.names, batch.columns):
        # A feature with no value in the sample decodes as nulls of no type: bytes then.
        value_type = column.type.value_type if hasattr(column.type, "value_type") else None
        feature = schema.feature.add(name=name, type=kinds.get(str(value_type),
                                                               schema_pb2.BYTES))
        if value_type is not None and len(column) and column.null_count == 0 and \
                pc.all(pc.equal(pc.list_value_length(column), 1)).as_py():
            feature.value_count.min = feature.value_count.max = 1
    return schema


def _partition_names(root: str, files: list[str]) -> list[str]:
    names: list[str] = []
    for f in files:
        for part in fileio.parts(fileio.relpath(fileio.dirname(f), root)):
            if "=" in part:
                name = urllib.parse.unquote(part.split("=", 1)[0])
                if name not in names:
                    names.append(name)
    return names


def _partition_values(root: str, path: str) -> dict:
    values = {}
    for part in fileio.parts(fileio.relpath(fileio.dirname(path), root)):
        if "=" in part:
            name, text = part.split("=", 1)
            values[urllib.parse.unquote(name)] = (
                None if text == shards.NULL_PARTITION else
                "" if text == shards.EMPTY_PARTITION else urllib.parse.unquote(text))
    return values


def _is_string(feature: schema_pb2.Feature, schema: schema_pb2.Schema) -> bool:
    """A bytes feature is text when the schema gives it a string domain of UTF-8 values;
    any other bytes feature (images, serialized protos, hashes) stays binary."""
    if feature.type != schema_pb2.BYTES:
        return False
    if feature.HasField("string_domain"):
        values = feature.string_domain.value
    else:
        domain = next((d for d in schema.string_domain if d.name == feature.domain), None)
        if domain is None:
            return False
        values = domain.value
    try:
        for value in values:
            value.encode("utf-8", "surrogateescape").decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _spark_type(feature: schema_pb2.Feature, schema: schema_pb2.Schema):
    # pyspark.sql.types: 0.11 s to import; only the Spark schema needs it
    from pyspark.sql import types as T

    value = {schema_pb2.INT: T.LongType(), schema_pb2.FLOAT: T.FloatType()}.get(
        feature.type, T.StringType() if _is_string(feature, schema) else T.BinaryType())
    return value if parser.is_scalar(feature) else T.ArrayType(value, True)


class _FileDecoder:
    """The mapInArrow function: task ids in, the decoded rows of their files out.

    Each file is read a block at a time and decoded by the codec's compiled reader
    (`parser.decode_record_block`): no TensorFlow in the executors, and no Python object per
    record or value. A damaged record is an error naming the file and offset."""

    def __init__(self, schema: schema_pb2.Schema, root: str, partition_names: list[str],
                 groups: list[list[str]]):
        self._schema, self._root, self._partition_names = schema, root, partition_names
        self._groups = groups
        self._decoder = RowDecoder(schema)

    def __call__(self, batches):
        for batch in batches:
            for path in (p for task in batch.column(0).to_pylist() for p in self._groups[task]):
                for block in tfrecord_io.iter_record_blocks(path):
                    for part in block.parts(self._decoder.records_per_decode):
                        yield self._with_partitions(path, self._rows(part))

    def _with_partitions(self, path: str, decoded):
        # pyarrow: 40 ms to import; the driver's listing needs none
        import pyarrow as pa

        if not self._partition_names:
            return decoded
        values = _partition_values(self._root, path)
        return pa.RecordBatch.from_arrays(
            decoded.columns + [pa.array([values.get(n)] * decoded.num_rows, pa.string())
                               for n in self._partition_names],
            decoded.schema.names + self._partition_names)

    def _rows(self, block):
        # pyarrow: 40 ms to import; the driver's listing needs none
        import pyarrow as pa

        decoded = self._decoder.decode(block)
        columns = [_typed(decoded.column(i), feature, self._schema)
                   for i, feature in enumerate(self._schema.feature)]
        return pa.RecordBatch.from_arrays(columns, [f.name for f in self._schema.feature])


def _typed(column, feature: schema_pb2.Feature, schema: schema_pb2.Schema):
    """A decoded column (a list per row, as `RowDecoder` gives every column, packed or not)
    as the Spark type's Arrow type: scalars take a row's one value, an empty list is a
    null."""
    # pyarrow(.compute): 0.1 s to import; the driver's listing needs neither
    import pyarrow as pa
    import pyarrow.compute as pc

    value_type = {schema_pb2.INT: pa.int64(), schema_pb2.FLOAT: pa.float32()}.get(
        feature.type, pa.string() if _is_string(feature, schema) else pa.binary())
    if not parser.is_scalar(feature):
        return column.cast(pa.list_(value_type))
    offsets = column.offsets.to_numpy()
    if column.null_count == 0 and offsets[-1] - offsets[0] == len(column) and \
            (np.diff(offsets) == 1).all():  # one value in every row: the values are it
        column = pc.list_flatten(column)
    else:
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(
            zero_copy_only=False)
        first = pa.array(offsets[:-1] - offsets[0], mask=lengths == 0)
        column = pc.list_flatten(column).take(first)
    return column.cast(value_type)
