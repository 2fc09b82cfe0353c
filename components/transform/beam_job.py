"""ShardedTransform's Beam job: analyze on one split, transform every split, write shards.
It imports no TFX, so the CLI and the bench run it without TFX.

Two Beam pipelines, one after the other:
  1. raw train split -> tft_beam.AnalyzeDataset(preprocessing_fn) -> WriteTransformFn
  2. ReadTransformFn + raw splits -> TransformDataset(record batches) -> tf.Examples, one per
     row or packed N rows per Example -> chunks -> the shared sharding writer
Splitting them lets step 2 know the transformed feature specs (fixed or variable length)
before it packs anything. Everything is staged and committed at the end, manifest last.
"""
from __future__ import annotations

import dataclasses
import logging
import random
from typing import Optional, Sequence, Union

import apache_beam as beam
import pyarrow as pa
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from apache_beam.transforms.window import GlobalWindows
from tensorflow_metadata.proto.v0 import schema_pb2
from tensorflow_transform.beam import analysis_graph_builder, analyzer_cache
from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io
from tfx_bsl.public import tfxio

from shard_readers import images
from tfrecord_shards import beam_shards, fileio, packing, shards, tfrecord_io
from tfrecord_shards.manifest import ROW_ORDER_INPUT
from tfrecord_shards.codec import parser, schema_file, serializer
from components.transform import columnar_job, feature_stats
from components.transform.encoding import ROW_COUNTS, SplitEncoder
from components.transform.graph_digest import graph_digest
from components.transform.inputs import analysis_key, dataset_key, split_files
from components.transform.options import TransformOptions
from components.transform.preprocessing import load_preprocessing_fn, raw_image_names



def _raw_source(examples_dir: str, split: str, schema: schema_pb2.Schema):
    return tfxio.TFExampleRecord(file_pattern=split_files(examples_dir, split), schema=schema,
                                 telemetry_descriptors=["tfrp", "transform"])


class _EncodeChunks(beam.DoFn):
    """Transformed record batches -> chunks of serialized tf.Examples, a bundle's worth under
    one random writer id (the general path's rows keep no order)."""

    def __init__(self, split: str, schema: schema_pb2.Schema, staging: str,
                 sharding: shards.ShardingOptions):
        self._split, self._schema = split, schema
        self._staging, self._sharding = staging, sharding

    def start_bundle(self):
        self._encoder = SplitEncoder(self._split, self._schema, self._staging, self._sharding,
                                     random.getrandbits(40))

    def process(self, element):
        self._encoder.add(element[0] if isinstance(element, tuple) else element)

    def finish_bundle(self):
        for chunk in self._encoder.close():
            yield GlobalWindows.windowed_value(chunk)
        yield beam.pvalue.TaggedOutput(ROW_COUNTS, GlobalWindows.windowed_value(
            (self._split, self._encoder.rows, self._encoder.records)))


def copy_cache(source: str, destination: str, keys: Optional[Sequence[str]] = None) -> None:
    """Copies analyzer cache entries (folders named by the input's `dataset_key`, alone or
    followed by `-` and more of the key) that `destination` lacks: all of `source`'s, or those
    of the inputs `keys`."""
    if not fileio.exists(source):
        return
    for name in fileio.listdir(source):
        name = name.rstrip("/")
        if keys is not None and not any(name == key or name.startswith(f"{key}-")
                                        for key in keys):
            continue
        if not fileio.exists(fileio.join(destination, name)):
            fileio.copy_tree(fileio.join(source, name), fileio.join(destination, name))


def _analyze(make_pipeline, options, examples_dirs, raw_schema, preprocessing_fn, graph_dir,
             temp_dir) -> dict[str, list[str]]:
    """Analyses the analyze split of every input with tf.Transform; writes the transform
    function. With an analyzer cache folder, each input's analysis is read from it when it is
    there (keyed by `dataset_key`), and only the others are read and analysed, their results
    added to the cache. Returns the inputs analysed and those taken from the cache."""
    # tf.Transform's cache entries are keyed by the analyzers' graph; the input's folder
    # name adds what else the analysis depends on (the split, schema, settings, versions).
    context = analysis_key(options, raw_schema)
    sources = {analyzer_cache.DatasetKey(f"{dataset_key(d)}-{context}"): _raw_source(
        d, options.analyze_split, raw_schema) for d in examples_dirs}
    names = {key: d for key, d in zip(sources, examples_dirs)}
    adapter_config = next(iter(sources.values())).TensorAdapterConfig()
    cache_dir = options.analyzer_cache_dir
    with make_pipeline() as pipeline, tft_beam.Context(temp_dir=temp_dir):
        if not cache_dir:
            raw = [pipeline | f"ReadAnalyzeSplit[{i}]" >> source.BeamSource()
                   for i, source in enumerate(sources.values())] | "AllInputs" >> beam.Flatten()
            transform_fn = (raw, adapter_config) | "Analyze" >> \
                tft_beam.AnalyzeDataset(preprocessing_fn)
            analysed = list(sources)
        else:
            specs = next(iter(sources.values())).TensorAdapter().OriginalTypeSpecs()
            keys = list(sources)
            entry_keys = analysis_graph_builder.get_analysis_cache_entry_keys(
                preprocessing_fn, specs, keys, False)
            cached = [k for k in keys if fileio.exists(fileio.join(cache_dir, k.key))]
            input_cache = pipeline | "ReadCache" >> analyzer_cache.ReadAnalysisCacheFromFS(
                cache_dir, cached, cache_entry_keys=entry_keys) if cached else {}
            analysed = analysis_graph_builder.get_analysis_dataset_keys(
                preprocessing_fn, specs, keys, input_cache, False)
            data = {key: (pipeline | f"ReadAnalyzeSplit[{i}]" >> sources[key].BeamSource())
                    if key in analysed else None for i, key in enumerate(keys)}
            transform_fn, cache_output = (data, input_cache, adapter_config) | "Analyze" >> \
                tft_beam.AnalyzeDatasetWithCache(preprocessing_fn, pipeline=pipeline)
            if cache_output:
                _ = cache_output | "WriteCache" >> analyzer_cache.WriteAnalysisCacheToFS(
                    pipeline, cache_dir, dataset_keys=keys)
        _ = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(graph_dir)
    return {"analysed": [names[k] for k in sources if k in analysed],
            "from_cache": [names[k] for k in sources if k not in analysed]}


def _transform(make_pipeline, options, examples_dirs, splits, raw_schema, schema,
               graph_dir, temp_dir, staging, columnar: bool,
               kept: Optional[dict[str, str]] = None, statistics_plan=None,
               statistics_path: Optional[str] = None,
               pieces: Optional[columnar_job.InputPieces] = None) -> list:
    with make_pipeline() as pipeline, tft_beam.Context(temp_dir=temp_dir):
        transform_fn = None if columnar else \
            pipeline | "ReadTransformFn" >> tft_beam.ReadTransformFn(graph_dir)
        outputs = []
        for split in splits:
            if columnar:
                outputs.append(columnar_job.transformed_chunks(
                    pipeline, split, columnar_job.pieces_of(pieces, examples_dirs, split),
                    raw_schema, graph_dir, kept, schema, staging, options.sharding,
                    statistics_plan))
                continue
            sources = [_raw_source(d, split, raw_schema) for d in examples_dirs]
            raw = [pipeline | f"Read[{split}][{i}]" >> source.BeamSource()
                   for i, source in enumerate(sources)] | f"All[{split}]" >> beam.Flatten()
            transformed, _ = ((raw, sources[0].TensorAdapterConfig()), transform_fn) | \
                f"Transform[{split}]" >> tft_beam.TransformDataset(output_record_batches=True)
            outputs.append(transformed | f"Encode[{split}]" >> beam.ParDo(_EncodeChunks(
                split, schema, staging, options.sharding)).with_outputs(ROW_COUNTS, main="chunks"))
        chunks = [o.chunks for o in outputs] | "AllChunks" >> beam.Flatten()
        counts = [o[ROW_COUNTS] for o in outputs] | "AllCounts" >> beam.Flatten()
        if columnar and statistics_plan:
            columnar_job.merged_statistics(
                "transformed", [o[columnar_job.STATISTICS] for o in outputs]
                | "AllStatistics" >> beam.Flatten(), statistics_path)
        written = chunks | "WriteShards" >> beam_shards.WriteShards(staging, options.sharding)
        result_path = fileio.join(staging, "_result.json")
        _ = (pipeline | "Once" >> beam.Create([None]) | "Collect" >> beam.Map(
            _write_result, result_path, written=beam.pvalue.AsList(written),
            counts=beam.pvalue.AsList(counts)))
    columnar_job.release(graph_dir)
    return fileio.read_json(result_path)


def _write_result(_, path, written, counts) -> None:
    fileio.write_json(path, {"shards": [dataclasses.asdict(s) for s in written],
                             "rows": [list(c) for c in counts]}, indent=None)


def run(options: TransformOptions, examples_dir: Union[str, Sequence[str]],
        raw_schema: schema_pb2.Schema, graph_dir: str, output_dir: str, make_pipeline=None,
        splits: Optional[list[str]] = None,
        statistics: Optional[feature_stats.PassStatistics] = None) -> dict:
    """Transforms `examples_dir` (one Examples folder, or several: a window of spans) into
    `output_dir` (Split-*/ shards, schema.pbtxt, manifest) and writes the TransformGraph to
    `graph_dir`. Several inputs are analysed together and each split holds all their rows.
    With `statistics`, the columnar path's passes summarise the rows they hold into its
    `pre` and `post` (`feature_stats.PassStatistics`). Returns the manifest."""
    examples_dirs = [examples_dir] if isinstance(examples_dir, str) else list(examples_dir)
    make_pipeline = make_pipeline or beam.Pipeline
    active = parser.active_schema(raw_schema)
    dropped = sorted({f.name for f in raw_schema.feature} - {f.name for f in active.feature})
    if dropped:
        logging.info("Transform leaves out features the schema marks inactive: %s", dropped)
    raw_schema, input_manifests = active, [shards.read_manifest(d) for d in examples_dirs]
    splits = splits or split_names(examples_dirs[0], input_manifests[0])
    if options.analyze_split not in splits:
        raise ValueError(f"analyze split {options.analyze_split!r} is not among {splits}")
    columnar = columnar_job.columnar_inputs(options, raw_schema) \
        if options.analysis == "columnar" else None
    with shards.staged_output(output_dir) as staging:
        graph_staging, temp_dir = fileio.join(staging, "_graph"), fileio.join(staging, "_tft_tmp")
        # The analysed split's decoded batches, read by the transform instead of decoding it
        # again: hidden in the staging folder and deleted once the transform is done.
        kept_dir = fileio.join(staging, "_decoded") if options.reuse_decoded else None
        kept = {}
        pre_path, post_path = (fileio.join(temp_dir, f"{stage}_transform_statistics.pkl")
                               for stage in ("pre", "post"))
        pieces = {}  # each input's pieces of each split, cut once for both passes
        if columnar:
            pieces = columnar_job.input_pieces(examples_dirs, splits, options.piece_records)
            analysis = columnar_job.analyze(
                make_pipeline, options, examples_dirs, raw_schema, columnar, graph_staging,
                temp_dir, pieces, kept_dir, statistics.pre_plan if statistics else None,
                pre_path)
            kept = columnar_job.kept_copies(kept_dir, columnar_job.pieces_of(
                pieces, analysis["analysed"], options.analyze_split))
            if statistics and not analysis["from_cache"]:
                statistics.pre = columnar_job.read_statistics(pre_path)
        else:
            analysis = _analyze(make_pipeline, options, examples_dirs, raw_schema,
                                load_preprocessing_fn(options, raw_schema), graph_staging,
                                temp_dir)
        # Stock TFX writes the raw schema into the graph too; raw_feature_spec() reads it.
        metadata_io.write_metadata(
            dataset_metadata.DatasetMetadata(raw_schema),
            fileio.join(graph_staging, tft.TFTransformOutput.RAW_METADATA_DIR))
        row_schema = tft.TFTransformOutput(graph_staging).transformed_metadata.schema
        schema = stored_schema(row_schema, options, raw_image_names(raw_schema, options))
        if statistics and columnar:
            statistics.post_plan = feature_stats.post_transform_plan(schema, row_schema)
        # The encoder is given the schema stored beside the blocks, so they say the same.
        try:
            result = _transform(make_pipeline, options, examples_dirs, splits, raw_schema,
                                schema, graph_staging, temp_dir, staging, columnar is not None,
                                kept, statistics.post_plan if statistics else None, post_path,
                                pieces)
            if statistics and statistics.post_plan:
                statistics.post = columnar_job.read_statistics(post_path)
        finally:
            if kept_dir and fileio.exists(kept_dir):
                fileio.rmtree(kept_dir)
        written = [shards.Shard(**s) for s in result["shards"]]
        manifest = shards.build_manifest(written, [], options.sharding.compression, 0,
                                         schema=schema_file.SCHEMA_FILE, inputs=examples_dirs,
                                         analysis=analysis,
                                         transform_graph_digest=graph_digest(graph_staging),
                                         **({"row_order": ROW_ORDER_INPUT} if columnar else {}))
        expected = [rows_in(d, splits, m) for d, m in zip(examples_dirs, input_manifests)]
        reconcile(manifest, result["rows"], {split: sum(e[split] for e in expected)
                                             for split in splits})
        schema_file.write_schema(schema, fileio.join(staging, schema_file.SCHEMA_FILE))
        shards.write_manifest(staging, manifest)
        fileio.copy_tree(graph_staging, graph_dir)
    logging.info("Transformed %d rows into %s (%s; %s analysis)", manifest["rows_written"],
                 output_dir,
                 f"packed {options.packed_rows} rows per Example" if options.packed_rows
                 else "one Example per row", "columnar" if columnar else "tf.Transform")
    return manifest


def split_names(examples_dir: str, input_manifest: Optional[dict]) -> list[str]:
    """The splits of an input: its manifest's (our ExampleGen's), else its Split-* folders."""
    if input_manifest:
        return shards.split_names(input_manifest)
    return sorted(d.rstrip("/")[len("Split-"):] for d in tf.io.gfile.listdir(examples_dir)
                  if d.startswith("Split-"))


def rows_in(examples_dir: str, splits: list[str], input_manifest: Optional[dict]
            ) -> dict[str, int]:
    """Rows per split of the input: from our ExampleGen's manifest, or else counted from the
    shards' own TFRecord framing (stock ExampleGen output has no manifest)."""
    if input_manifest:
        return {split: input_manifest["splits"][split]["rows"] for split in splits}
    return {split: sum(tfrecord_io.count_records(path)
                       for path in tf.io.gfile.glob(split_files(examples_dir, split)))
            for split in splits}


def reconcile(manifest: dict, encoded: list, expected: dict[str, int]) -> None:
    """Checks, per split, that Transform read every input row, encoded every row it read, and
    that the shards hold every record it encoded; records the counts in the manifest.

    `encoded` holds the encoders' (split, rows, records) tallies; the shards' record counts
    come from the sharding writer, which counts the records it framed into each shard."""
    rows, records = dict.fromkeys(expected, 0), dict.fromkeys(expected, 0)
    for split, row_count, record_count in encoded:
        rows[split] += row_count
        records[split] += record_count
    problems = []
    for split, want in sorted(expected.items()):
        entry = manifest["splits"].setdefault(split, {"rows": 0, "bytes": 0, "shards": []})
        in_shards = entry["rows"]  # the writer's count of records framed into the shards
        entry.update(rows=rows[split], records=in_shards)
        if rows[split] != want:
            problems.append(f"{split}: {want} rows in the input, {rows[split]} read")
        if records[split] != in_shards:
            problems.append(f"{split}: {records[split]} records encoded, {in_shards} in shards")
    manifest["rows_in"] = sum(expected.values())
    manifest["rows_written"] = sum(rows.values())
    if problems:
        raise RuntimeError("Transform's row accounting failed: " + "; ".join(problems))
    shards.check_row_accounting(manifest)


def stored_schema(row_schema: schema_pb2.Schema, options: TransformOptions,
                  raw_images: list[str]) -> schema_pb2.Schema:
    """The schema of the transformed examples as stored: the row schema, annotated with the
    packing when the examples are packed and with the shape of features stored as raw
    pixels. It is also the post-transform Schema artifact, so the Trainer learns both from
    its input."""
    schema = row_schema
    if raw_images:
        schema = images.mark_raw(schema, [f.name for f in row_schema.feature
                                          if f.name in raw_images and f.type == schema_pb2.BYTES],
                                 images.ImageSpec(*options.image_shape))
    return packing.annotate(schema, options.packed_rows) if options.packed_rows else schema


def shards_schema(examples_dir: str) -> Optional[schema_pb2.Schema]:
    """The schema our ExampleGen stored beside its shards, if these are ours."""
    path = fileio.join(examples_dir, schema_file.SCHEMA_FILE)
    return schema_file.load_schema(path) if tf.io.gfile.exists(path) else None


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
