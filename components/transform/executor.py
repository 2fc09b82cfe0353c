"""ShardedTransform's Beam work: analyze on one split, transform every split, write shards.

Two Beam pipelines, one after the other:
  1. raw train split -> tft_beam.AnalyzeDataset(preprocessing_fn) -> WriteTransformFn
  2. ReadTransformFn + raw splits -> TransformDataset(record batches) -> tf.Examples, one per
     row or packed N rows per Example -> chunks -> the shared sharding writer
Splitting them lets step 2 know the transformed feature specs (fixed or variable length)
before it packs anything. Everything is staged and committed at the end, manifest last.
"""
from __future__ import annotations

import dataclasses
import inspect as pyinspect
import json
import logging
import os
import random
from typing import Any, Callable, Optional

import apache_beam as beam
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from tensorflow_metadata.proto.v0 import schema_pb2
from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils
from tfx.utils import io_utils
from tfx_bsl.public import tfxio

from components import codec, packing, shards
from components.transform.defaults import default_preprocessing_fn

OPTIONS_KEY = "options_json"
GRAPH_FOLDER = "transform_graph"


@dataclasses.dataclass(frozen=True)
class TransformOptions:
    module_file: Optional[str] = None  # a .py file defining preprocessing_fn
    preprocessing_fn: Optional[str] = None  # or "package.module.function"
    packed_rows: int = 0  # 0 writes one tf.Example per row
    analyze_split: str = "train"
    sharding: shards.ShardingOptions = dataclasses.field(default_factory=shards.ShardingOptions)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TransformOptions":
        values = json.loads(text)
        values["sharding"] = shards.ShardingOptions(**values["sharding"])
        return cls(**values)


def load_preprocessing_fn(options: TransformOptions, raw_schema: schema_pb2.Schema
                          ) -> Callable[[dict], dict]:
    """The user's preprocessing_fn, or the schema-derived default. A user function may take
    `(inputs, custom_config)`, as in TFX; custom_config carries the raw schema."""
    from tfx.utils import import_utils

    if options.module_file:
        fn = import_utils.import_func_from_source(options.module_file, "preprocessing_fn")
    elif options.preprocessing_fn:
        module, _, name = options.preprocessing_fn.rpartition(".")
        fn = import_utils.import_func_from_module(module, name)
    else:
        return default_preprocessing_fn(raw_schema)
    if len(pyinspect.signature(fn).parameters) >= 2:
        return lambda inputs: fn(inputs, {"raw_schema": raw_schema})
    return fn


def split_files(examples_dir: str, split: str) -> str:
    return os.path.join(examples_dir, f"Split-{split}", "*")


def _raw_source(examples_dir: str, split: str, schema: schema_pb2.Schema):
    return tfxio.TFExampleRecord(file_pattern=split_files(examples_dir, split), schema=schema,
                                 telemetry_descriptors=["tfrp", "transform"])


class _EncodeChunks(beam.DoFn):
    """Transformed record batches -> serialized tf.Examples (per row or packed) in chunks.

    Packing buffers rows across batches, so only each bundle's last block can be short."""

    def __init__(self, split: str, schema: schema_pb2.Schema, packed_rows: int, staging: str,
                 chunk_bytes: int):
        self._split, self._schema, self._packed = split, schema, packed_rows
        self._staging, self._chunk_bytes = staging, chunk_bytes

    def start_bundle(self):
        self._writer = shards.ChunkWriter(os.path.join(self._staging, "_chunks"),
                                          random.getrandbits(40), self._chunk_bytes)
        self._pending, self._pending_rows, self._rows = [], 0, 0

    def process(self, element):
        import pyarrow as pa

        batch = element[0] if isinstance(element, tuple) else element
        self._rows += batch.num_rows
        if not self._packed:
            columns = {n: codec.arrow_kind(t) for n, t in zip(batch.schema.names,
                                                             batch.schema.types)}
            self._writer.add("", self._split, codec.encode_examples(
                codec.to_example_batch(batch, columns)))
            return
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        if self._pending_rows >= self._packed:
            table = pa.Table.from_batches(self._pending)
            full = (table.num_rows // self._packed) * self._packed
            self._writer.add("", self._split, packing.pack_batch(
                table.slice(0, full), self._schema, self._packed))
            rest = table.slice(full)
            self._pending = rest.to_batches() if rest.num_rows else []
            self._pending_rows = rest.num_rows

    def finish_bundle(self):
        import pyarrow as pa
        from apache_beam.transforms.window import GlobalWindows

        if self._pending_rows:
            self._writer.add("", self._split, packing.pack_batch(
                pa.Table.from_batches(self._pending), self._schema, self._packed))
        for chunk in self._writer.close():
            yield GlobalWindows.windowed_value(chunk)
        yield GlobalWindows.windowed_value(("rows", self._split, self._rows))


def _analyze(make_pipeline, options, examples_dir, raw_schema, graph_dir, temp_dir) -> None:
    preprocessing_fn = load_preprocessing_fn(options, raw_schema)
    source = _raw_source(examples_dir, options.analyze_split, raw_schema)
    with make_pipeline() as pipeline, tft_beam.Context(temp_dir=temp_dir):
        raw = pipeline | "ReadAnalyzeSplit" >> source.BeamSource()
        transform_fn = (raw, source.TensorAdapterConfig()) | "Analyze" >> \
            tft_beam.AnalyzeDataset(preprocessing_fn)
        _ = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(graph_dir)


def _transform(make_pipeline, options, examples_dir, splits, raw_schema, row_schema,
               graph_dir, temp_dir, staging) -> list:
    with make_pipeline() as pipeline, tft_beam.Context(temp_dir=temp_dir):
        transform_fn = pipeline | "ReadTransformFn" >> tft_beam.ReadTransformFn(graph_dir)
        outputs = []
        for split in splits:
            source = _raw_source(examples_dir, split, raw_schema)
            raw = pipeline | f"Read[{split}]" >> source.BeamSource()
            transformed, _ = ((raw, source.TensorAdapterConfig()), transform_fn) | \
                f"Transform[{split}]" >> tft_beam.TransformDataset(output_record_batches=True)
            outputs.append(transformed | f"Encode[{split}]" >> beam.ParDo(_EncodeChunks(
                split, row_schema, options.packed_rows, staging,
                options.sharding.chunk_bytes)))
        encoded = outputs | "AllSplits" >> beam.Flatten()
        written = (
            encoded
            | "Chunks" >> beam.Filter(lambda x: isinstance(x, shards.Chunk))
            | "AllChunks" >> beam.combiners.ToList()
            | "Plan" >> beam.FlatMap(shards.plan_shards, options.sharding)
            | "Spread" >> beam.Reshuffle()
            | "WriteShards" >> beam.Map(shards.write_shard, staging,
                                        options.sharding.compression))
        counts = encoded | "Counts" >> beam.Filter(lambda x: isinstance(x, tuple))
        result_path = os.path.join(staging, "_result.json")
        _ = (pipeline | "Once" >> beam.Create([None]) | "Collect" >> beam.Map(
            _write_result, result_path, written=beam.pvalue.AsList(written),
            counts=beam.pvalue.AsList(counts)))
    with tf.io.gfile.GFile(result_path) as f:
        return json.load(f)


def _write_result(_, path, written, counts) -> None:
    with tf.io.gfile.GFile(path, "w") as f:
        json.dump({"shards": [dataclasses.asdict(s) for s in written],
                   "rows": [list(c[1:]) for c in counts]}, f)


def run(options: TransformOptions, examples_dir: str, raw_schema: schema_pb2.Schema,
        graph_dir: str, output_dir: str, make_pipeline=None,
        splits: Optional[list[str]] = None) -> dict:
    """Transforms `examples_dir` into `output_dir` (Split-*/ shards, schema.pbtxt, manifest)
    and writes the TransformGraph to `graph_dir`. Returns the manifest."""
    make_pipeline = make_pipeline or beam.Pipeline
    active = codec.active_schema(raw_schema)
    dropped = sorted({f.name for f in raw_schema.feature} - {f.name for f in active.feature})
    if dropped:
        logging.info("Transform leaves out features the schema marks inactive: %s", dropped)
    raw_schema = active
    input_manifest = shards.read_manifest(examples_dir)
    splits = splits or (shards.split_names(input_manifest) if input_manifest else sorted(
        d.rstrip("/")[len("Split-"):] for d in tf.io.gfile.listdir(examples_dir)
        if d.startswith("Split-")))
    if options.analyze_split not in splits:
        raise ValueError(f"analyze split {options.analyze_split!r} is not among {splits}")
    tf.io.gfile.makedirs(output_dir)
    staging = shards.new_staging_dir(output_dir)
    graph_staging = os.path.join(staging, "_graph")
    temp_dir = os.path.join(staging, "_tft_tmp")
    try:
        _analyze(make_pipeline, options, examples_dir, raw_schema, graph_staging, temp_dir)
        # Stock TFX writes the raw schema into the graph too; raw_feature_spec() reads it.
        from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io

        metadata_io.write_metadata(
            dataset_metadata.DatasetMetadata(raw_schema),
            os.path.join(graph_staging, tft.TFTransformOutput.RAW_METADATA_DIR))
        row_schema = tft.TFTransformOutput(graph_staging).transformed_metadata.schema
        result = _transform(make_pipeline, options, examples_dir, splits, raw_schema,
                            row_schema, graph_staging, temp_dir, staging)
        rows = {}
        for split, count in result["rows"]:
            rows[split] = rows.get(split, 0) + count
        written = [shards.Shard(**s) for s in result["shards"]]
        manifest = shards.build_manifest(written, [], options.sharding.compression, 0,
                                         packed_rows=options.packed_rows,
                                         schema=codec.SCHEMA_FILE)
        for split, entry in manifest["splits"].items():
            entry["records"] = entry["rows"]
            entry["rows"] = rows.get(split, 0)
        manifest["rows_written"] = sum(rows.values())
        manifest["rows_in"] = sum(input_manifest["splits"][s]["rows"] for s in splits) \
            if input_manifest else manifest["rows_written"]
        if manifest["rows_in"] != manifest["rows_written"]:
            raise RuntimeError(f"Row accounting failed: {manifest['rows_in']} rows in, "
                               f"{manifest['rows_written']} transformed rows written")
        stored = packing.annotate(row_schema, options.packed_rows) if options.packed_rows \
            else row_schema
        codec.write_schema(stored, os.path.join(staging, codec.SCHEMA_FILE))
        shards.write_manifest(staging, manifest)
        io_utils.copy_dir(graph_staging, graph_dir)
        shards.commit(staging, output_dir)
    except BaseException:
        shards.discard(staging)
        raise
    logging.info("Transformed %d rows into %s (%s)", manifest["rows_written"], output_dir,
                 f"packed {options.packed_rows} rows per Example" if options.packed_rows
                 else "one Example per row")
    return manifest


def shards_schema(examples_dir: str) -> Optional[schema_pb2.Schema]:
    """The schema our ExampleGen stored beside its shards, if these are ours."""
    path = os.path.join(examples_dir, codec.SCHEMA_FILE)
    return codec.load_schema(path) if tf.io.gfile.exists(path) else None


def mark_images(schema: schema_pb2.Schema, stored: Optional[schema_pb2.Schema]
                ) -> schema_pb2.Schema:
    """`schema` with image_domain on the features our ExampleGen marked as images. Stock
    SchemaGen cannot tell encoded images from other bytes, and Transform must not turn
    images into vocabulary ids."""
    images = {f.name for f in (stored.feature if stored else []) if f.HasField("image_domain")}
    marked = schema_pb2.Schema()
    marked.CopyFrom(schema)
    for feature in marked.feature:
        if feature.name in images and feature.type == schema_pb2.BYTES:
            feature.image_domain.SetInParent()
    return marked


class Executor(base_beam_executor.BaseBeamExecutor):
    """Writes TransformGraph, transformed Examples (Split-*/, schema.pbtxt, manifest.json) and
    the post-transform Schema."""

    def Do(self, input_dict: dict[str, list], output_dict: dict[str, list],
           exec_properties: dict[str, Any]) -> None:
        options = TransformOptions.from_json(exec_properties[OPTIONS_KEY])
        examples = artifact_utils.get_single_instance(input_dict["examples"])
        schema_uri = artifact_utils.get_single_uri(input_dict["schema"])
        raw_schema = mark_images(codec.load_schema(io_utils.get_only_uri_in_dir(schema_uri)),
                                 shards_schema(examples.uri))
        graph = artifact_utils.get_single_instance(output_dict["transform_graph"])
        transformed = artifact_utils.get_single_instance(output_dict["transformed_examples"])
        splits = artifact_utils.decode_split_names(examples.split_names)
        manifest = run(options, examples.uri, raw_schema, graph.uri, transformed.uri,
                       make_pipeline=self._make_beam_pipeline, splits=splits)
        transformed.split_names = artifact_utils.encode_split_names(sorted(manifest["splits"]))
        transformed.set_int_custom_property("rows_written", manifest["rows_written"])
        transformed.set_int_custom_property("packed_rows", options.packed_rows)
        post_schema = artifact_utils.get_single_uri(output_dict["post_transform_schema"])
        codec.write_schema(tft.TFTransformOutput(graph.uri).transformed_metadata.schema,
                           os.path.join(post_schema, codec.SCHEMA_FILE))
