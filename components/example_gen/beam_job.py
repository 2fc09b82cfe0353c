"""ShardedExampleGen's Beam job, used by the TFX executor and the `tfrp examplegen` CLI alike.
It imports no TFX, so the CLI and the bench start without it.

Beam elements are files, record-batch chunks and shard plans, never single rows:
  files -> profile (pass 1) -> merged profile (side input) -> schema
  files -> read typed batches, hash splits on arrays, encode columnar, append to chunks
  chunks -> shard plan -> shards (copy + compress) -> manifest
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import tensorflow as tf

from components import beam_shards, shards
from components.codec import schema_file, serializer
from components.example_gen import splits as splitting
from components.example_gen.options import ExampleGenOptions
from components.example_gen.sources import locate, registry
from components.example_gen.sources.base import BadRecord, FileProfile, SourceError
from components.example_gen.sources.image_source import IMAGE_FEATURE

QUARANTINE_FILE = "bad_records-{file_index:05d}.jsonl"
# The tagged output of _EncodeFile that carries one FileResult per source file.
FILE_RESULTS = "file_results"


class BadRecordError(SourceError):
    pass


def input_error_line(error: BaseException) -> Optional[str]:
    """The one line a user sees for an error caused by the input or the settings (it names
    the file and the row or offset), or None for an error of ours, which keeps its traceback.
    Beam re-raises a DoFn's error wrapped, with its own context appended; that is dropped."""
    import re

    cause = error.__cause__ or error.__context__
    if not (isinstance(error, (ValueError, FileExistsError, FileNotFoundError))
            or isinstance(cause, SourceError) or "SourceError" in type(error).__name__
            or "BadRecordError" in str(error)):
        return None
    text = str(error).strip().splitlines()
    line = next((l for l in reversed(text) if re.search(r"Error: ", l)), text[-1] if text
                else repr(error))
    line = re.sub(r"^.*?(\w*Error): ", "", line)
    return re.sub(r" \[while running .*\]$", "", line)


class Progress:
    """Progress bars of a run whose DoFns execute in this process (the default DirectRunner):
    source files profiled, then rows encoded. On other runners the workers have no bars and
    nothing is shown."""

    current: Optional["Progress"] = None

    def __init__(self, files: int):
        from tqdm import tqdm

        # disable=None: only on a terminal, so logs and CI output stay clean.
        self.profiled = tqdm(total=files, desc="profile", unit="file", disable=None)
        self.encoded = tqdm(desc="encode", unit="row", unit_scale=True, disable=None)

    def profiled_file(self) -> None:
        self.profiled.update(1)

    def encoded_rows(self, rows: int, total: int) -> None:
        if self.encoded.total != total:
            self.encoded.total = total
            self.encoded.refresh()
        self.encoded.update(rows)

    def close(self) -> None:
        self.profiled.close()
        self.encoded.close()


def _profile(indexed_path, fmt: str) -> FileProfile:
    profile = registry.profile_file(indexed_path[1], fmt)[0]
    if Progress.current:
        Progress.current.profiled_file()
    return profile


@dataclasses.dataclass(frozen=True)
class FileResult:
    """What one source file contributed: rows read, rows quarantined."""

    file_index: int
    path: str
    rows_in: int
    quarantined: int
    lost: int = 0  # records in damaged regions, counted from the file's index
    lost_bytes: int = 0
    lost_count_known: bool = True


class _EncodeFile(beam.DoFn):
    """Pass 2 for one file: typed batches -> split/partition -> tf.Example chunks."""

    def __init__(self, options: ExampleGenOptions, fmt: str, staging: str):
        self._options, self._fmt, self._staging = options, fmt, staging

    def process(self, indexed_path, profile: FileProfile):
        file_index, path = indexed_path
        options = self._options
        splits = splitting.parse_splits(options.splits)
        weights = [w for _, w in splits]
        split_names = np.array([n for n, _ in splits], dtype=object)
        key_columns = [options.split_key] if options.split_key else list(profile.columns)
        writer = shards.ChunkWriter(os.path.join(self._staging, "_chunks"), file_index,
                                    options.sharding.chunk_bytes)
        rows_in = quarantined = lost = lost_bytes = 0
        lost_count_known = True
        quarantine_path = os.path.join(self._staging, shards.QUARANTINE_DIR,
                                       QUARANTINE_FILE.format(file_index=file_index))
        quarantine = None
        # Reading (pyarrow) and encoding (tfx_bsl) release the GIL for much of their work;
        # one encoder thread working a batch ahead keeps both cores busy.
        pending: list = []
        with ThreadPoolExecutor(1) as encoder:
            try:
                for item in registry.read_file(path, self._fmt, profile.columns):
                    if isinstance(item, BadRecord):
                        if options.on_bad_record == "fail":
                            raise BadRecordError(item.describe())
                        if quarantine is None:
                            tf.io.gfile.makedirs(os.path.dirname(quarantine_path))
                            quarantine = tf.io.gfile.GFile(quarantine_path, "w")
                        quarantine.write(json.dumps(dataclasses.asdict(item)) + "\n")
                        if item.lost_bytes:  # a damaged region: its records are lost, not kept
                            lost += item.lost_records or 0
                            rows_in += item.lost_records or 0
                            lost_bytes += item.lost_bytes
                            lost_count_known &= item.lost_records is not None
                        else:
                            rows_in += 1
                            quarantined += 1
                        continue
                    if not item.num_rows:
                        continue
                    rows_in += item.num_rows
                    if Progress.current:
                        Progress.current.encoded_rows(item.num_rows, profile.rows)
                    pending.append(encoder.submit(self._encode_batch, path, item, profile,
                                                  split_names, weights, key_columns))
                    while len(pending) > 1:
                        self._write(writer, pending.pop(0).result())
                for future in pending:
                    self._write(writer, future.result())
            finally:
                if quarantine is not None:
                    quarantine.close()
        yield from writer.close()
        yield beam.pvalue.TaggedOutput(FILE_RESULTS, FileResult(
            file_index, path, rows_in, quarantined, lost, lost_bytes, lost_count_known))

    @staticmethod
    def _write(writer: shards.ChunkWriter, groups) -> None:
        for partition, split, records in groups:
            writer.add(partition, split, records)

    def _encode_batch(self, path, batch, profile, split_names, weights, key_columns) -> list:
        """[(partition, split, serialized examples)] for one record batch, all on arrays."""
        options = self._options
        try:
            split_of_row = splitting.split_index(splitting.hash_rows(
                batch, key_columns, absent_as_null=not options.split_key), weights)
        except SourceError as e:
            raise SourceError(f"{path}: {e}") from e
        if options.partition_by:
            index = batch.schema.get_field_index(options.partition_by)
            if index < 0:
                raise SourceError(
                    f"{path}: --partition-by column {options.partition_by!r} is not in it")
            column = batch.column(index)
            partitions, partition_of_row = np.unique(
                np.array([shards.partition_dir(options.partition_by, v)
                          for v in column.to_pylist()], dtype=object).astype(str),
                return_inverse=True)
        else:
            partitions, partition_of_row = [""], np.zeros(batch.num_rows, dtype=np.int64)
        records = serializer.encode_examples_array(
            serializer.to_example_batch(batch, profile.columns))
        group_of_row = partition_of_row * len(split_names) + split_of_row
        order = np.argsort(group_of_row, kind="stable")
        groups, starts = np.unique(group_of_row[order], return_index=True)
        out = []
        for group, start, end in zip(groups, starts, list(starts[1:]) + [len(order)]):
            partition, split = divmod(int(group), len(split_names))
            out.append((str(partitions[partition]), split_names[split],
                        records.take(pa.array(order[start:end]))))
        return out


def _check_columns(profile: FileProfile, options: ExampleGenOptions) -> None:
    for name, flag in ((options.split_key, "--split-key"), (options.partition_by,
                                                               "--partition-by")):
        if name and name not in profile.columns:
            raise ValueError(f"{flag} {name!r} is not a column of {options.source}; "
                             f"columns: {sorted(profile.columns)}")


def _merge_profiles(profiles) -> FileProfile:
    merged = FileProfile()
    for profile in profiles:
        merged = merged.merge(profile)
    return merged


def build_pipeline(pipeline: beam.Pipeline, options: ExampleGenOptions, fmt: str,
                   files: list[str], staging: str, hidden_files: Sequence[str] = (),
                   layout_files: Sequence[str] = ()):
    """Adds ExampleGen's transforms to `pipeline`; the staging folder receives every output."""
    indexed_files = pipeline | "Files" >> beam.Create(list(enumerate(files)))
    profile = (
        indexed_files
        | "Profile" >> beam.Map(_profile, fmt)
        | "MergeProfiles" >> beam.CombineGlobally(_merge_profiles)
    )
    encoded = indexed_files | "Encode" >> beam.ParDo(
        _EncodeFile(options, fmt, staging), profile=beam.pvalue.AsSingleton(profile)
    ).with_outputs(FILE_RESULTS, main="chunks")
    written = encoded.chunks | "WriteShards" >> beam_shards.WriteShards(staging, options.sharding)
    results = encoded[FILE_RESULTS]
    _ = (
        pipeline
        | "Once" >> beam.Create([None])
        | "Finalize" >> beam.Map(
            _finalize, staging=staging, options=options, fmt=fmt,
            hidden_files=list(hidden_files), layout_files=list(layout_files),
            profile=beam.pvalue.AsSingleton(profile),
            written=beam.pvalue.AsList(written), results=beam.pvalue.AsList(results))
    )


def _finalize(_, staging, options, fmt, hidden_files, layout_files, profile, written,
              results) -> None:
    _check_columns(profile, options)
    quarantined = sum(r.quarantined for r in results)
    sources_info = [{"path": r.path, "rows_in": r.rows_in, "quarantined": r.quarantined,
                     "rows_lost": r.lost, "bytes_lost": r.lost_bytes}
                    for r in sorted(results, key=lambda r: r.file_index)]
    good_rows = sum(r.rows_in - r.quarantined - r.lost for r in results)
    schema = serializer.schema_from_profile(profile.columns, good_rows, profile.non_null,
                                            profile.string_values)
    if fmt == "images":
        # Marks the encoded bytes as an image, so Transform passes them through untouched.
        next(f for f in schema.feature if f.name == IMAGE_FEATURE).image_domain.SetInParent()
    schema_file.write_schema(schema, os.path.join(staging, schema_file.SCHEMA_FILE))
    manifest = shards.build_manifest(
        written, sources_info, options.sharding.compression, quarantined,
        format=fmt, split_key=options.split_key, partition_by=options.partition_by,
        schema=schema_file.SCHEMA_FILE,
        splits_requested=options.splits,
        # Records in damaged regions of TFRecord sources: counted when the source's index
        # says how many; otherwise only their bytes are known, and rows_in is a lower bound.
        rows_lost=sum(r.lost for r in results), bytes_lost=sum(r.lost_bytes for r in results),
        lost_count_known=all(r.lost_count_known for r in results),
        # Named, not read: see locate.is_hidden and locate.is_layout_file.
        hidden_files_skipped=hidden_files, layout_files_skipped=layout_files)
    shards.check_row_accounting(manifest)
    shards.write_manifest(staging, manifest)


def run(options: ExampleGenOptions, output_dir: str,
        beam_pipeline_args: Optional[list[str]] = None,
        make_pipeline=None, progress: bool = False) -> dict:
    """Runs ExampleGen into `output_dir` and returns the manifest.

    Outputs appear only when the whole run succeeded; on failure the staging folder is removed.
    `make_pipeline` lets the TFX executor supply its own configured Beam pipeline; `progress`
    shows progress bars on a terminal (the CLI's default).
    """
    source = locate.resolve_source(options.source)
    fmt = locate.detect_format(source) if options.format == "auto" else options.format
    if fmt not in registry.FORMATS:
        raise ValueError(f"--format must be one of {tuple(registry.FORMATS)} or auto, "
                         f"not {fmt!r}")
    files = locate.list_files(source, fmt)
    if not files:
        raise SourceError(f"{source}: no source files")
    shards.check_output_dir(output_dir)  # before any work, not after
    Progress.current = Progress(len(files)) if progress else None
    try:
        with shards.staged_output(output_dir) as staging:
            pipeline = make_pipeline() if make_pipeline else beam.Pipeline(
                argv=list(beam_pipeline_args or []))
            with pipeline:
                build_pipeline(pipeline, options, fmt, files, staging,
                               locate.hidden_files(source), locate.layout_files(source))
            manifest = shards.read_manifest(staging)
    finally:
        if Progress.current:
            Progress.current.close()
            Progress.current = None
    logging.info("ExampleGen wrote %d rows (%d quarantined) to %s", manifest["rows_written"],
                 manifest["rows_quarantined"], output_dir)
    return manifest
