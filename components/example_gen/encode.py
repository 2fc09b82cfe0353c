"""ExampleGen's work, for any engine: one source file encoded into chunk files, and the
schema and manifest of a whole run. It imports no Beam, TFX or TensorFlow, so Beam's DoFns
and Spark's tasks call the same functions and write the same output.
"""
from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa

from tfrecord_shards import fileio, hooks, rows_done, shards
from tfrecord_shards.codec import schema_file, serializer
from components.example_gen import splits as splitting
from components.example_gen.options import ExampleGenOptions
from components.example_gen.sources import locate, registry
from components.example_gen.sources.base import (
    RESTART, BadRecord, FileProfile, Source, SourceError, arrow_kinds, source_path)
from components.example_gen.sources.image_source import IMAGE_FEATURE

QUARANTINE_FILE = "bad_records-{file_index:05d}.jsonl"


class BadRecordError(SourceError):
    """A bad record in `fail` mode: the run stops, naming the file and the row or offset."""


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
    unlabelled: int = 0  # rows left out for a null label


def encode_file(options: ExampleGenOptions, fmt: str, staging: str, file_index: int,
                source: Source, profile: FileProfile,
                on_rows: Optional[Callable[[int], None]] = None, split: Optional[str] = None
                ) -> tuple[list[shards.Chunk], FileResult]:
    """Pass 2 for one file: typed batches -> split/partition -> tf.Example chunk files under
    `staging`. Returns the chunks and the file's row counts; `on_rows` hears of rows read.
    `split`: the split of a pre-split input's file, which takes all its rows. `source` may
    be a range of a file (`SourceRange`), and `file_index` is then the range's."""
    return _encode_items(options, staging, file_index, source_path(source),
                         registry.read_file(source, fmt, profile.columns), profile.columns,
                         on_rows, split)


def encode_file_inferring(options: ExampleGenOptions, fmt: str, staging: str,
                          file_index: int, source: Source,
                          on_rows: Optional[Callable[[int], None]] = None,
                          split: Optional[str] = None
                          ) -> tuple[list[shards.Chunk], FileResult, FileProfile]:
    """Both passes for one file in one read, for a format that types its columns as it
    reads (`SourceFormat.read_inferring`): the chunks and counts `encode_file` gives with
    the file's own profile, and that profile. Where the reader widens a column it begins
    the file again, and the chunks of the attempt before go with the staging folder. A
    caller whose merged profile differs from the file's encodes it again (`encode_file`)."""
    items = registry.read_inferring(source, fmt)
    while True:
        attempt = None
        try:
            attempt = _Attempt(items)
            chunks, result = _encode_items(options, staging, file_index, source_path(source),
                                           attempt, attempt.kinds, on_rows, split)
        except _Restarted:
            if on_rows and attempt and attempt.profile.rows:
                on_rows(-attempt.profile.rows)  # those rows are read again
            continue
        return chunks, result, attempt.profile


class _Restarted(Exception):
    """The reader began the file again: the attempt's output is void."""


class _Attempt:
    """One read of a file by a `read_inferring` reader: its items up to the reader's
    RESTART (`_Restarted`), each batch profiled as it passes; `kinds`, those of the first
    batch, which every batch of a read shares, known before the first item is taken."""

    def __init__(self, items: Iterator):
        self._items = items
        self.profile = FileProfile()
        self.kinds: dict = {}
        self._ahead: list = []  # the bad records before the first batch, and that batch
        for item in self._next_items():
            self._ahead.append(item)
            if not isinstance(item, BadRecord):
                self.kinds = arrow_kinds(item)
                break

    def _next_items(self) -> Iterator:
        for item in self._items:
            if item is RESTART:
                raise _Restarted()
            yield item

    def __iter__(self) -> Iterator:
        for item in self._ahead:
            yield self._profiled(item)
        for item in self._next_items():
            yield self._profiled(item)

    def _profiled(self, item):
        if not isinstance(item, BadRecord):
            self.profile.add_batch(item, self.kinds)
        return item


def _encode_items(options: ExampleGenOptions, staging: str, file_index: int, path: str,
                  items: Iterable, columns: dict, on_rows: Optional[Callable[[int], None]],
                  split: Optional[str]) -> tuple[list[shards.Chunk], FileResult]:
    """`items` (a file's typed batches and bad records) encoded with `columns` (name ->
    (kind, is_list)) into chunks under `staging`; the chunks and the file's row counts."""
    split_names, weights, key_columns = split_plan(options, columns)
    if split is not None:
        weights = [int(name == split) for name in split_names]
    hooks.reached(hooks.TASK_STARTED, staging=staging, task=file_index, stage="encode")
    writer = shards.ChunkWriter(fileio.join(staging, "_chunks"), file_index,
                                options.sharding)
    rows_in = quarantined = lost = lost_bytes = unlabelled = 0
    lost_count_known = True
    # Written in this attempt's folder and moved into place when the file is done, so a
    # retried attempt's quarantine replaces a failed one's whole.
    quarantine_name = QUARANTINE_FILE.format(file_index=file_index)
    quarantine_path = fileio.join(writer.folder, quarantine_name)
    quarantine = None
    # Reading (pyarrow) and encoding (numpy and Arrow kernels) release the GIL for much of
    # their work; one encoder thread working a batch ahead keeps both cores busy.
    pending: list = []
    with ThreadPoolExecutor(1) as encoder:
        try:
            for item in items:
                if isinstance(item, BadRecord):
                    if options.on_bad_record == "fail":
                        raise BadRecordError(item.describe())
                    if quarantine is None:
                        quarantine = fileio.open_file(quarantine_path, "w")
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
                rows_done.add(item.num_rows)
                if on_rows:
                    on_rows(item.num_rows)
                item, dropped = without_unlabelled(item, options.label_key)
                unlabelled += dropped
                if not item.num_rows:
                    continue
                pending.append(encoder.submit(encode_batch, options, path, item, columns,
                                              split_names, weights, key_columns))
                while len(pending) > 1:
                    write_groups(writer, pending.pop(0).result())
            for future in pending:
                write_groups(writer, future.result())
        finally:
            if quarantine is not None:
                quarantine.close()
    chunks = writer.close()
    hooks.reached(hooks.TASK_WROTE, staging=staging, task=file_index, stage="encode")
    if quarantine is not None:
        fileio.makedirs(fileio.join(staging, shards.QUARANTINE_DIR))
        fileio.rename(quarantine_path, fileio.join(staging, shards.QUARANTINE_DIR,
                                                    quarantine_name))
    return chunks, FileResult(file_index, path, rows_in, quarantined, lost, lost_bytes,
                                      lost_count_known, unlabelled)


def without_unlabelled(batch: pa.RecordBatch, label_key: Optional[str]
                       ) -> tuple[pa.RecordBatch, int]:
    """(`batch` without the rows whose label is null, how many those were). A batch without
    the label column (a computed label) keeps every row."""
    index = batch.schema.get_field_index(label_key) if label_key else -1
    if index < 0 or not batch.column(index).null_count:
        return batch, 0
    kept = batch.filter(batch.column(index).is_valid())
    return kept, batch.num_rows - kept.num_rows


def split_plan(options: ExampleGenOptions, columns) -> tuple[np.ndarray, list[int], list[str]]:
    """(split names, weights, key columns) that every batch of a run is split with: the
    split key, or else every column."""
    weights = [w for _, w in splitting.parse_splits(options.splits)] \
        if not options.input_config else [1] * len(options.split_names)
    return (np.array(options.split_names, dtype=object), weights,
            [options.split_key] if options.split_key else list(columns))


def write_groups(writer: shards.ChunkWriter, groups) -> None:
    """Appends `encode_batch`'s (partition, split, records) groups to the chunk files."""
    for partition, split, records in groups:
        writer.add(partition, split, records)


def encode_batch(options: ExampleGenOptions, path: str, batch: pa.RecordBatch,
                 columns: dict, split_names, weights, key_columns) -> list:
    """[(partition, split, serialized examples)] for one record batch, all on arrays."""
    if sum(weights) == max(weights):  # one split takes every row: a pre-split input
        split_of_row = np.full(batch.num_rows, weights.index(max(weights)), dtype=np.int64)
    else:
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
    group_of_row = partition_of_row * len(split_names) + split_of_row
    order = np.argsort(group_of_row, kind="stable")
    groups, starts = np.unique(group_of_row[order], return_index=True)
    records = serializer.encode_examples_array(
        serializer.to_example_batch(batch, columns), order)
    out = []
    for group, start, end in zip(groups, starts, list(starts[1:]) + [len(order)]):
        partition, split = divmod(int(group), len(split_names))
        out.append((str(partitions[partition]), split_names[split],
                    records.slice(start, end - start)))
    return out


def check_columns(profile: FileProfile, options: ExampleGenOptions) -> None:
    for name, flag in ((options.split_key, "--split-key"), (options.partition_by,
                                                               "--partition-by")):
        if name and name not in profile.columns:
            raise ValueError(f"{flag} {name!r} is not a column of {options.source}; "
                             f"columns: {sorted(profile.columns)}")


def encoded_with_other_types(own: FileProfile, merged: FileProfile) -> bool:
    """Whether a file encoded with its own profile (`encode_file_inferring`) must be
    encoded again with the merged one: another file widened a column, or has a column this
    one lacks, or the columns come in another order."""
    return list(own.columns.items()) != list(merged.columns.items())


def merge_profiles(profiles) -> FileProfile:
    merged = FileProfile()
    for profile in profiles:
        merged = merged.merge(profile)
    return merged


def finalize(staging: str, options: ExampleGenOptions, fmt: str, profile: FileProfile,
             written: list, results: list[FileResult], hidden_files: Sequence[str] = (),
             layout_files: Sequence[str] = (), comments: Optional[dict] = None) -> None:
    """The schema, the manifest (checked: rows in = written + quarantined + lost +
    unlabelled) into
    `staging`, from the merged profile, the shards written and every file's counts.
    `comments` (feature -> text) say how a value was converted, in each feature's
    annotation."""
    check_columns(profile, options)
    quarantined = sum(r.quarantined for r in results)
    sources_info = per_file(results)
    # Presence is counted over every readable row, unlabelled ones included (the profile saw
    # them): "always present" there is "always present" in the rows written.
    good_rows = sum(r.rows_in - r.quarantined - r.lost for r in results)
    schema = serializer.schema_from_profile(profile.columns, good_rows, profile.non_null,
                                            profile.string_values)
    if fmt == "images":
        # Marks the encoded bytes as an image, so Transform passes them through untouched.
        next(f for f in schema.feature if f.name == IMAGE_FEATURE).image_domain.SetInParent()
    for feature in schema.feature:
        if (comments or {}).get(feature.name):
            feature.annotation.comment.append(comments[feature.name])
    schema_file.write_schema(schema, fileio.join(staging, schema_file.SCHEMA_FILE))
    manifest = shards.build_manifest(
        written, sources_info, options.sharding.compression, quarantined,
        format=fmt, split_key=options.split_key, partition_by=options.partition_by,
        schema=schema_file.SCHEMA_FILE,
        splits_requested=options.splits if not options.input_config else None,
        input_config=options.input_config, spans=options.resolved_spans,
        engine=options.engine,
        # Records in damaged regions of TFRecord sources: counted when the source's index
        # says how many; otherwise only their bytes are known, and rows_in is a lower bound.
        rows_lost=sum(r.lost for r in results), bytes_lost=sum(r.lost_bytes for r in results),
        rows_unlabelled=sum(r.unlabelled for r in results), label_key=options.label_key,
        lost_count_known=all(r.lost_count_known for r in results),
        # Named, not read: see locate.is_hidden and locate.is_layout_file.
        hidden_files_skipped=list(hidden_files),
        layout_files_skipped=list(layout_files))
    shards.check_row_accounting(manifest)
    shards.write_manifest(staging, manifest)


def per_file(results: list[FileResult]) -> list[dict]:
    """Each source file's counts for the manifest, in file order: the sum of its ranges'
    where several workers read it in ranges (consecutive indexes of one path), with how
    many (`ranges`)."""
    files: dict[str, dict] = {}
    for r in sorted(results, key=lambda r: r.file_index):
        entry = files.setdefault(r.path, {"path": r.path, "rows_in": 0, "quarantined": 0,
                                          "rows_lost": 0, "bytes_lost": 0,
                                          "rows_unlabelled": 0, "ranges": 0})
        for key, value in (("rows_in", r.rows_in), ("quarantined", r.quarantined),
                           ("rows_lost", r.lost), ("bytes_lost", r.lost_bytes),
                           ("rows_unlabelled", r.unlabelled), ("ranges", 1)):
            entry[key] += value
    for entry in files.values():
        if entry["ranges"] == 1:  # read whole
            del entry["ranges"]
    return list(files.values())


def first_columns(source: str, fmt: str) -> tuple[str, list[str]]:
    """(first file, the column names of its first rows)."""
    _, fmt, files = locate.source_files(source, fmt)
    for item in registry.read_file(files[0], fmt, None):
        if not isinstance(item, BadRecord) and item.num_rows:
            return files[0], list(item.schema.names)
    return files[0], []


def sample_column(source: str, fmt: str, column: str, max_rows: int = 100_000
                  ) -> tuple[str, Optional[pa.Array]]:
    """(first file, up to `max_rows` values of `column` from it): what the pipeline looks at
    to settle a label's task before anything runs. None when the file has no such column;
    bad rows are skipped here (ExampleGen's own pass counts them)."""
    _, fmt, files = locate.source_files(source, fmt)
    chunks, rows = [], 0
    for item in registry.read_file(files[0], fmt, None):
        if isinstance(item, BadRecord) or not item.num_rows:
            continue
        if column not in item.schema.names:
            return files[0], None
        chunks.append(item.column(item.schema.get_field_index(column)))
        rows += item.num_rows
        if rows >= max_rows:
            break
    if not chunks:
        return files[0], None
    return files[0], pa.concat_arrays(chunks)[:max_rows]
