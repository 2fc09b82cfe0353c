"""TFRecord files of tf.Example, read with our framing reader so damage is named and skipped."""
from __future__ import annotations

from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import tfrecord_io
from tfrecord_shards.codec import parser, schema_file, serializer
from components.example_gen.sources.base import (
    BadRecord, Item, SourceFormat, profile_batches)

TFRECORD_BATCH = 4_096


def read_tfrecord(path: str, kinds: Optional[dict] = None) -> Iterator[Item]:
    """`kinds` is not needed: decoded tf.Examples carry their own types.

    A null is written as an absent feature, so a column null in every row of a file is in no
    record; when the shards' schema.pbtxt is there (ours are), its features that a batch lacks
    are added as null columns, so re-reading our output keeps every column."""
    stored = schema_file.find_schema(path)
    records: list[bytes] = []
    for offset, record in tfrecord_io.iter_records(path, resync=True):
        if isinstance(record, tfrecord_io.CorruptRegion):
            yield BadRecord(path, f"offset {record.offset}",
                            f"{record.length} bytes skipped ({record.reason}; {record.loss})",
                            lost_bytes=record.length, lost_records=record.records_lost)
            continue
        records.append(record)
        if len(records) >= TFRECORD_BATCH:
            yield from _with_schema_columns(_decode_records(path, records, offset), stored)
            records = []
    if records:
        yield from _with_schema_columns(_decode_records(path, records, None), stored)


_SCHEMA_TYPES = {schema_pb2.INT: pa.int64(), schema_pb2.FLOAT: pa.float32(),
                 schema_pb2.BYTES: pa.binary()}


def _with_schema_columns(items: Iterator[Item], schema: Optional[schema_pb2.Schema]
                         ) -> Iterator[Item]:
    for item in items:
        if schema is not None and isinstance(item, pa.RecordBatch):
            names = set(item.schema.names)
            missing = [f for f in schema.feature if f.name not in names]
            if missing:
                item = pa.RecordBatch.from_arrays(
                    item.columns + [pa.nulls(item.num_rows, pa.list_(_SCHEMA_TYPES[f.type]))
                                    for f in missing],
                    item.schema.names + [f.name for f in missing])
        yield item


def _decode_records(path, records, offset) -> Iterator[Item]:
    try:
        yield parser.decode_examples(records)
    except RuntimeError:
        # One bad payload spoils the whole batch decode; find it record by record.
        good = []
        for record in records:
            try:
                parser.decode_examples([record])
                good.append(record)
            except RuntimeError as error:
                yield BadRecord(path, f"record near offset {offset}",
                                f"not a tf.Example: {error}")
        if good:
            yield parser.decode_examples(good)


def profile_list_batch(batch: pa.RecordBatch) -> dict:
    """Decoded tf.Examples are all lists; a column is a list only if some row has 2+ values."""
    kinds = {}
    for i, name in enumerate(batch.schema.names):
        array = batch.column(i)
        kind, is_list = serializer.arrow_kind(array.type)
        if is_list and len(array):
            lengths = pc.list_value_length(array).fill_null(0)
            is_list = pc.max(lengths).as_py() > 1
        kinds[name] = (kind, is_list)
    return kinds


def profile_tfrecord(path: str):
    return profile_batches(path, read_tfrecord, profile_list_batch)


# TFX's own shard names (data_tfrecord-00000-of-00001) carry no extension.
FORMAT = SourceFormat("tfrecord", (".tfrecord", ".tfrecords", ""), read_tfrecord,
                      profile_tfrecord)
