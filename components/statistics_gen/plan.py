"""Which features StatisticsGen's engine summarises, read how: a split's plan (the schema its
records are decoded by, and each feature's role: numeric, string, bytes or categorical int,
as TFDV picks them from the statistics schema), taken from the schema.pbtxt beside the
shards or, for stock ExampleGen's records, inferred from the records themselves in one
compiled pass (`kernels.unlisted_feature`). Also which statistics schemas the engine cannot
honour as TFDV does (`unsupported_schema`), and a split's record files.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

import numpy as np
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import fileio, tfrecord_io
from tfrecord_shards.codec import schema_file, wire
from tfrecord_shards.example_rows import record_files
from components.statistics_gen import kernels

# How a feature's values are summarised.
NUMERIC, STRING, BYTES, CATEGORICAL_INT = "numeric", "string", "bytes", "categorical_int"


@dataclasses.dataclass(frozen=True)
class FeaturePlan:
    name: str
    kind: int  # schema_pb2.INT, FLOAT or BYTES: how the records hold it
    role: str  # NUMERIC, STRING, BYTES or CATEGORICAL_INT: which statistics it gets


@dataclasses.dataclass(frozen=True)
class Plan:
    """The decoding schema and what each of its features gets. `kindless`: features the
    records hold only as a Feature with no list set (stock ExampleGen's column with no value
    at all), which stock's statistics list with every example missing."""

    schema: schema_pb2.Schema
    features: tuple[FeaturePlan, ...]
    kindless: tuple[str, ...] = ()


def unsupported_schema(schema: Optional[schema_pb2.Schema]) -> Optional[str]:
    """Why the fast path cannot honour a statistics schema exactly as TFDV does (features
    that make TFDV add generators or compute string statistics of floats), or None."""
    if schema is None:
        return None
    if schema.sparse_feature or schema.weighted_feature:
        return "sparse or weighted features"
    for feature in schema.feature:
        domain = feature.WhichOneof("domain_info")
        if feature.type == schema_pb2.STRUCT:
            return f"struct feature {feature.name!r}"
        if domain == "natural_language_domain":
            return f"natural-language feature {feature.name!r}"
        if feature.type == schema_pb2.FLOAT and feature.float_domain.is_categorical:
            return f"categorical float feature {feature.name!r}"
    return None


def _roles(stats_schema: Optional[schema_pb2.Schema]) -> tuple[set[str], set[str]]:
    """The features a statistics schema makes bytes (an image domain) and categorical ints
    (TFDV's schema_util.get_bytes_features and get_categorical_numeric_feature_types)."""
    if stats_schema is None:
        return set(), set()
    image = {f.name for f in stats_schema.feature if f.WhichOneof("domain_info") == "image_domain"}
    categorical = {f.name for f in stats_schema.feature if f.type == schema_pb2.INT and (
        (f.HasField("int_domain") and f.int_domain.is_categorical)
        or f.WhichOneof("domain_info") == "bool_domain")}
    return image, categorical


def make_plan(decoding: schema_pb2.Schema, stats_schema: Optional[schema_pb2.Schema] = None,
              kindless: Iterable[str] = ()) -> Plan:
    """The plan for records decoded by `decoding`; the statistics list the features in its
    order. (Stock's order is the order Beam's batches first hold them in, which varies with
    the batch sizes Beam picks as it runs; SchemaGen keeps the statistics' order.)"""
    image, categorical = _roles(stats_schema)
    features = []
    for feature in decoding.feature:
        if feature.type == schema_pb2.BYTES:
            role = BYTES if feature.name in image else STRING
        elif feature.type == schema_pb2.INT and feature.name in categorical:
            role = CATEGORICAL_INT
        else:
            role = NUMERIC
        features.append(FeaturePlan(feature.name, feature.type, role))
    return Plan(decoding, tuple(features), tuple(kindless))


def split_files(examples_uri: str, split: str) -> list[str]:
    """The record files of one split (stock's `Split-<name>/` layout; bookkeeping files and
    hidden ones left out, a stopped commit of ours refused)."""
    folder = fileio.join(examples_uri, f"Split-{split}")
    if not fileio.isdir(folder):
        raise FileNotFoundError(f"{folder}: no such split folder in the Examples artifact")
    return record_files(folder)


_SCHEMA_KINDS = {wire.FLOAT_KIND: schema_pb2.FLOAT, wire.INT_KIND: schema_pb2.INT,
                 wire.BYTES_KIND: schema_pb2.BYTES}
_WIRE_KINDS = {schema: wire_kind for wire_kind, schema in _SCHEMA_KINDS.items()}


def infer_schema(files: list[str]) -> tuple[schema_pb2.Schema, list[str]]:
    """Every feature of every record and the kind of list it holds, for records without a
    schema.pbtxt (stock ExampleGen's, ImportExampleGen's): (the schema to decode with, in the
    order the features first appear; the features seen only with no value list). One
    compiled pass over all records (`kernels.unlisted_feature`) that stops only at a feature
    it has not met yet, so a feature first met at the last record is counted as TFDV counts
    it; a feature whose kind changes is refused with both places."""
    names: list[str] = []
    kinds: list[int] = []  # schema kind, or -1 while seen only with no list
    where: list[str] = []
    keys, key_offsets, known = np.zeros(0, np.uint8), np.zeros(1, np.int64), np.zeros(0, np.int64)
    for path in files:
        for block in tfrecord_io.iter_record_blocks(path):
            first = 0
            while True:
                record, key_start, key_end, kind = kernels.unlisted_feature(
                    wire.frozen(block.buffer), block.starts, block.ends, first,
                    wire.frozen(keys), wire.frozen(key_offsets), wire.frozen(known))
                if record < 0:
                    break
                here = f"{path} at offset {block.record_offset(record)}"
                if key_start < 0:
                    raise ValueError(f"{here}: the record is not a serialized tf.Example")
                try:
                    name = block.buffer[key_start:key_end].tobytes().decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(f"{here}: a feature name is not UTF-8") from None
                schema_kind = _SCHEMA_KINDS[kind] if kind >= 0 else -1
                if name not in names:
                    names.append(name)
                    kinds.append(schema_kind)
                    where.append(here)
                    keys = np.frombuffer("".join(names).encode("utf-8"), np.uint8)
                    key_offsets = np.concatenate([[0], np.cumsum(
                        [len(n.encode("utf-8")) for n in names])]).astype(np.int64)
                else:
                    index = names.index(name)
                    if kinds[index] >= 0:
                        raise ValueError(
                            f"{here}: feature {name!r} holds "
                            f"{schema_pb2.FeatureType.Name(schema_kind)} values, "
                            f"{where[index]} {schema_pb2.FeatureType.Name(kinds[index])}")
                    kinds[index], where[index] = schema_kind, here
                known = np.array([_WIRE_KINDS.get(k, -1) for k in kinds], np.int64)
                first = record
    schema = schema_pb2.Schema()
    kindless = []
    for name, kind in zip(names, kinds):
        # A feature seen only with no list is decoded as bytes, TFDV's type for it.
        schema.feature.add(name=name, type=schema_pb2.BYTES if kind < 0 else kind)
        if kind < 0:
            kindless.append(name)
    return schema, kindless


def plan_for(split_folder: str, files: list[str],
             stats_schema: Optional[schema_pb2.Schema] = None) -> Plan:
    """How to read a split: by the schema.pbtxt above its shards (our ExampleGen and
    Transform write one), else by the types the records show (stock ExampleGen)."""
    stored = schema_file.find_schema(split_folder)
    if stored is not None:
        return make_plan(stored, stats_schema)
    decoding, kindless = infer_schema(files)
    return make_plan(decoding, stats_schema, kindless)

