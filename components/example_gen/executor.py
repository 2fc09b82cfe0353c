"""ShardedExampleGen's Beam work, used by the TFX executor and the `tfrp examplegen` CLI alike.

Beam elements are files, record-batch chunks and shard plans, never single rows:
  files -> profile (pass 1) -> merged profile (side input) -> schema
  files -> read typed batches, hash splits on arrays, encode with tfx_bsl, append to chunks
  chunks -> shard plan -> shards (copy + compress) -> manifest
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa
import tensorflow as tf

from components import codec, shards
from components.example_gen import sources
from components.example_gen.options import ExampleGenOptions, parse_splits

QUARANTINE_FILE = "bad_records-{unit:05d}.jsonl"


class BadRecordError(sources.SourceError):
    pass


@dataclasses.dataclass(frozen=True)
class UnitResult:
    """What one source file contributed: rows read, rows quarantined."""

    unit: int
    path: str
    rows_in: int
    quarantined: int


def _split_index(hashes: np.ndarray, weights: list[int]) -> np.ndarray:
    bucket = hashes % np.uint64(sum(weights))
    return np.searchsorted(np.cumsum(weights), bucket, side="right")


class _EncodeFile(beam.DoFn):
    """Pass 2 for one file: typed batches -> split/partition -> tf.Example chunks."""

    def __init__(self, options: ExampleGenOptions, fmt: str, staging: str):
        self._options, self._fmt, self._staging = options, fmt, staging

    def process(self, unit_and_path, profile: sources.FileProfile):
        unit, path = unit_and_path
        options = self._options
        splits = parse_splits(options.splits)
        weights = [w for _, w in splits]
        split_names = np.array([n for n, _ in splits], dtype=object)
        key_columns = [options.split_key] if options.split_key else list(profile.columns)
        writer = shards.ChunkWriter(os.path.join(self._staging, "_chunks"), unit,
                                    options.sharding.chunk_bytes)
        rows_in = quarantined = 0
        quarantine_path = os.path.join(self._staging, shards.QUARANTINE_DIR,
                                       QUARANTINE_FILE.format(unit=unit))
        quarantine = None
        # Reading (pyarrow) and encoding (tfx_bsl) release the GIL for much of their work;
        # one encoder thread working a batch ahead keeps both cores busy.
        pending: list = []
        with ThreadPoolExecutor(1) as encoder:
            try:
                for item in sources.read_file(path, self._fmt, profile.columns):
                    if isinstance(item, sources.BadRecord):
                        rows_in += 1
                        if options.on_bad_record == "fail":
                            raise BadRecordError(item.describe())
                        if quarantine is None:
                            tf.io.gfile.makedirs(os.path.dirname(quarantine_path))
                            quarantine = tf.io.gfile.GFile(quarantine_path, "w")
                        quarantine.write(json.dumps(dataclasses.asdict(item)) + "\n")
                        quarantined += 1
                        continue
                    if not item.num_rows:
                        continue
                    rows_in += item.num_rows
                    pending.append(encoder.submit(self._encode_batch, item, profile,
                                                  split_names, weights, key_columns))
                    while len(pending) > 1:
                        self._write(writer, pending.pop(0).result())
                for future in pending:
                    self._write(writer, future.result())
            finally:
                if quarantine is not None:
                    quarantine.close()
        for chunk in writer.close():
            yield chunk
        yield UnitResult(unit, path, rows_in, quarantined)

    @staticmethod
    def _write(writer: shards.ChunkWriter, groups) -> None:
        for partition, split, records in groups:
            writer.add(partition, split, records)

    def _encode_batch(self, batch, profile, split_names, weights, key_columns) -> list:
        """[(partition, split, serialized examples)] for one record batch, all on arrays."""
        options = self._options
        split_of_row = _split_index(sources.hash_rows(batch, key_columns), weights)
        if options.partition_by:
            index = batch.schema.get_field_index(options.partition_by)
            if index < 0:
                raise sources.SourceError(
                    f"--partition-by column {options.partition_by!r} is not in the data")
            column = batch.column(index)
            partitions, partition_of_row = np.unique(
                np.array([shards.partition_dir(options.partition_by, v)
                          for v in column.to_pylist()], dtype=object).astype(str),
                return_inverse=True)
        else:
            partitions, partition_of_row = [""], np.zeros(batch.num_rows, dtype=np.int64)
        records = codec.encode_examples(codec.to_example_batch(batch, profile.columns))
        group_of_row = partition_of_row * len(split_names) + split_of_row
        order = np.argsort(group_of_row, kind="stable")
        groups, starts = np.unique(group_of_row[order], return_index=True)
        out = []
        for group, start, end in zip(groups, starts, list(starts[1:]) + [len(order)]):
            partition, split = divmod(int(group), len(split_names))
            out.append((str(partitions[partition]), split_names[split],
                        [records[i] for i in order[start:end]]))
        return out


def _check_columns(profile: sources.FileProfile, options: ExampleGenOptions) -> None:
    for name, flag in ((options.split_key, "--split-key"), (options.partition_by,
                                                               "--partition-by")):
        if name and name not in profile.columns:
            raise ValueError(f"{flag} {name!r} is not a column of {options.source}; "
                             f"columns: {sorted(profile.columns)}")


def _merge_profiles(profiles) -> sources.FileProfile:
    merged = sources.FileProfile()
    for profile in profiles:
        merged = merged.merge(profile)
    return merged


def build_pipeline(pipeline: beam.Pipeline, options: ExampleGenOptions, fmt: str,
                   files: list[str], staging: str):
    """Adds ExampleGen's transforms to `pipeline`; the staging folder receives every output."""
    units = pipeline | "Files" >> beam.Create(list(enumerate(files)))
    profile = (
        units
        | "Profile" >> beam.Map(lambda unit: sources.profile_file(unit[1], fmt)[0])
        | "MergeProfiles" >> beam.CombineGlobally(_merge_profiles)
    )
    encoded = units | "Encode" >> beam.ParDo(
        _EncodeFile(options, fmt, staging), profile=beam.pvalue.AsSingleton(profile))
    chunks = encoded | "Chunks" >> beam.Filter(lambda x: isinstance(x, shards.Chunk))
    results = encoded | "Units" >> beam.Filter(lambda x: isinstance(x, UnitResult))
    written = (
        chunks
        | "AllChunks" >> beam.combiners.ToList()
        | "Plan" >> beam.FlatMap(shards.plan_shards, options.sharding)
        | "Spread" >> beam.Reshuffle()
        | "WriteShards" >> beam.Map(shards.write_shard, staging, options.sharding.compression)
    )
    _ = (
        pipeline
        | "Once" >> beam.Create([None])
        | "Finalize" >> beam.Map(
            _finalize, staging=staging, options=options, fmt=fmt,
            profile=beam.pvalue.AsSingleton(profile),
            written=beam.pvalue.AsList(written), results=beam.pvalue.AsList(results))
    )


def _finalize(_, staging, options, fmt, profile, written, results) -> None:
    _check_columns(profile, options)
    quarantined = sum(r.quarantined for r in results)
    sources_info = [{"path": r.path, "rows_in": r.rows_in, "quarantined": r.quarantined}
                    for r in sorted(results, key=lambda r: r.unit)]
    good_rows = sum(r.rows_in - r.quarantined for r in results)
    schema = codec.schema_from_profile(profile.columns, good_rows, profile.non_null,
                                       profile.string_values)
    if fmt == "images":
        # Marks the encoded bytes as an image, so Transform passes them through untouched.
        codec.find_feature(schema, sources.IMAGE_FEATURE).image_domain.SetInParent()
    codec.write_schema(schema, os.path.join(staging, codec.SCHEMA_FILE))
    manifest = shards.build_manifest(
        written, sources_info, options.sharding.compression, quarantined,
        format=fmt, split_key=options.split_key, partition_by=options.partition_by,
        schema=codec.SCHEMA_FILE,
        splits_requested=options.splits)
    if manifest["rows_in"] != manifest["rows_written"] + quarantined:
        raise RuntimeError(
            f"Row accounting failed: {manifest['rows_in']} in, {manifest['rows_written']} "
            f"written, {quarantined} quarantined")
    shards.write_manifest(staging, manifest)


def run(options: ExampleGenOptions, output_dir: str,
        beam_pipeline_args: Optional[list[str]] = None,
        make_pipeline=None) -> dict:
    """Runs ExampleGen into `output_dir` and returns the manifest.

    Outputs appear only when the whole run succeeded; on failure the staging folder is removed.
    `make_pipeline` lets the TFX executor supply its own configured Beam pipeline.
    """
    source = sources.resolve_source(options.source)
    fmt = sources.detect_format(source) if options.format == "auto" else options.format
    if fmt not in sources.FORMATS:
        raise ValueError(f"--format must be one of {sources.FORMATS} or auto, not {fmt!r}")
    files = sources.list_files(source, fmt)
    if not files:
        raise sources.SourceError(f"{source}: no source files")
    tf.io.gfile.makedirs(output_dir)
    existing = [n for n in tf.io.gfile.listdir(output_dir) if not n.startswith(".staging-")]
    if existing:
        raise FileExistsError(f"{output_dir} is not empty ({sorted(existing)[:3]}...)")
    staging = shards.new_staging_dir(output_dir)
    try:
        pipeline = make_pipeline() if make_pipeline else beam.Pipeline(
            argv=list(beam_pipeline_args or []))
        with pipeline:
            build_pipeline(pipeline, options, fmt, files, staging)
        manifest = shards.read_manifest(staging)
        shards.commit(staging, output_dir)
    except BaseException:
        shards.discard(staging)
        raise
    logging.info("ExampleGen wrote %d rows (%d quarantined) to %s", manifest["rows_written"],
                 manifest["rows_quarantined"], output_dir)
    return manifest


# ---------------------------------------------------------------------------------------------
# TFX executor
# ---------------------------------------------------------------------------------------------
from tfx.components.example_gen import utils as example_gen_utils  # noqa: E402
from tfx.components.util import examples_utils  # noqa: E402
from tfx.dsl.components.base import base_beam_executor  # noqa: E402
from tfx.proto import example_gen_pb2  # noqa: E402
from tfx.types import artifact_utils  # noqa: E402

OPTIONS_KEY = "options_json"


class Executor(base_beam_executor.BaseBeamExecutor):
    """Writes a standard Examples artifact: Split-<name>/ shards, schema.pbtxt, manifest.json."""

    def Do(self, input_dict: dict[str, list], output_dict: dict[str, list],
           exec_properties: dict[str, Any]) -> None:
        options = ExampleGenOptions.from_json(exec_properties[OPTIONS_KEY])
        examples = artifact_utils.get_single_instance(output_dict["examples"])
        manifest = run(options, examples.uri, make_pipeline=self._make_beam_pipeline)
        examples.split_names = artifact_utils.encode_split_names(shards.split_names(manifest))
        examples_utils.set_payload_format(examples, example_gen_pb2.FORMAT_TF_EXAMPLE)
        examples.set_string_custom_property(
            example_gen_utils.FINGERPRINT_PROPERTY_NAME,
            ",".join(f"{s['path']}:{s['rows_in']}" for s in manifest["sources"]))
        examples.set_int_custom_property("rows_written", manifest["rows_written"])
        examples.set_int_custom_property("rows_quarantined", manifest["rows_quarantined"])
