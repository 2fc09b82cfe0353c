"""ShardedExampleGen's Beam job, used by the TFX executor and the `tfrp examplegen` CLI alike.
It imports no TFX, so the CLI and the bench start without it.

Beam elements are files (or byte ranges of a large one), record-batch chunks and shard plans,
never single rows:
  files -> profile (pass 1) -> merged profile (side input) -> schema
  files -> read typed batches, hash splits on arrays, encode columnar, append to chunks
  chunks -> shard plan -> shards (copy + compress) -> manifest
A format that types its columns as it reads (CSV) takes both passes in one read:
  files -> read, profile and encode with the file's own types -> merged profile -> schema
  files whose types the merged profile widened -> encode again with the merged types
On a runner outside this process a large plain CSV is cut into byte ranges first: each range's
quotes are counted (`csv_ranges.survey`), and from all the counts (`csv_ranges.layout`) each
range finds the records that begin inside it; a file whose quotes break RFC 4180 is read whole.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions
from tqdm import tqdm

from tfrecord_shards import beam_runners, beam_shards, shards
from components.example_gen import encode
from components.example_gen.inputs import unchanged_source
from components.example_gen.options import ExampleGenOptions
from components.example_gen.sources import locate, registry
from components.example_gen.sources.base import FileProfile, SourceRange


class Progress:
    """Progress bars of a run whose DoFns execute in this process (the default DirectRunner):
    source files profiled, then rows encoded. On other runners the workers have no bars and
    nothing is shown."""

    current: Optional["Progress"] = None

    def __init__(self, files: int):
        # disable=None: only on a terminal, so logs and CI output stay clean.
        self.profiled = tqdm(total=files, desc="profile", unit="file", disable=None)
        self.encoded = tqdm(desc="encode", unit="row", unit_scale=True, disable=None)

    def profiled_file(self) -> None:
        self.profiled.update(1)

    def encoded_rows(self, rows: int, total: Optional[int]) -> None:
        if self.encoded.total != total:
            self.encoded.total = total
            self.encoded.refresh()
        self.encoded.update(rows)

    def close(self) -> None:
        self.profiled.close()
        if self.encoded.total is None:  # one read a file: the rows were not known before
            self.encoded.total = self.encoded.n
            self.encoded.refresh()
        self.encoded.close()


def _profile(indexed_path, fmt: str) -> FileProfile:
    profile = registry.profile_file(indexed_path[1], fmt)[0]
    if Progress.current:
        Progress.current.profiled_file()
    return profile


class _EncodeFile(beam.DoFn):
    """Pass 2 for one file (`encode.encode_file`): one (chunks, counts) element. One output,
    not a tagged second one: Beam 2.59's BundleBasedDirectRunner, the local runner that
    retries failed bundles as Dataflow does, delivers a DoFn's main output into its tagged
    output, and the retry tests run there."""

    def __init__(self, options: ExampleGenOptions, fmt: str, staging: str):
        self._options, self._fmt, self._staging = options, fmt, staging

    def process(self, indexed_path, profile: FileProfile):
        file_index, path, split = indexed_path
        progress = Progress.current
        chunks, result = encode.encode_file(
            self._options, self._fmt, self._staging, file_index, path, profile, split=split,
            on_rows=(lambda rows: progress.encoded_rows(rows, profile.rows)) if progress
            else None)
        yield chunks, result


class _EncodeFileInferring(beam.DoFn):
    """Both passes for one file in one read (`encode.encode_file_inferring`): one
    (file, (chunks, counts), its profile) element."""

    def __init__(self, options: ExampleGenOptions, fmt: str, staging: str):
        self._options, self._fmt, self._staging = options, fmt, staging

    def process(self, indexed_path):
        file_index, path, split = indexed_path
        progress = Progress.current
        chunks, result, profile = encode.encode_file_inferring(
            self._options, self._fmt, self._staging, file_index, path, split=split,
            on_rows=(lambda rows: progress.encoded_rows(rows, None)) if progress else None)
        if progress:
            progress.profiled_file()
        yield indexed_path, (chunks, result), profile


class _EncodeAgainIfWidened(beam.DoFn):
    """A file's (chunks, counts) as `_EncodeFileInferring` made them when its profile has
    the merged profile's columns and kinds, in order; else the file encoded again with the
    merged profile's (`encode.encode_file`)."""

    def __init__(self, options: ExampleGenOptions, fmt: str, staging: str):
        self._encode_file = _EncodeFile(options, fmt, staging)

    def process(self, element, profile: FileProfile):
        indexed_path, encoded, own_profile = element
        if not encode.encoded_with_other_types(own_profile, profile):
            yield encoded
        else:
            yield from self._encode_file.process(indexed_path, profile)


def build_pipeline(pipeline: beam.Pipeline, options: ExampleGenOptions, fmt: str,
                   files: list[str], staging: str, hidden_files: Sequence[str] = (),
                   layout_files: Sequence[str] = (),
                   file_splits: Optional[Sequence[Optional[str]]] = None):
    """Adds ExampleGen's transforms to `pipeline`; the staging folder receives every output.
    `file_splits`: each file's split when the inputs are pre-split (None: hash-split)."""
    # In this process one worker reads every element in turn: a file is read whole there.
    elements = registry.elements(files, file_splits or [None] * len(files), fmt,
                                 None if _in_this_process(pipeline) else options.piece_bytes)
    indexed_files = pipeline | "Files" >> beam.Create(elements)
    cut = registry.ranges_of(elements)
    if cut:
        logging.info("ExampleGen: reading %d files as %d elements, %d of them byte ranges of "
                     "about %d bytes", len(files), len(elements), len(cut), options.piece_bytes)
        layout = (pipeline | "Ranges" >> beam.Create(cut)
                  | "Survey" >> beam.Map(_surveyed, fmt)
                  | "AllSurveys" >> beam.combiners.ToList()
                  | "Layout" >> beam.Map(_layout, fmt))
        indexed_files = indexed_files | "Place" >> beam.FlatMap(
            _placed, fmt, placed=beam.pvalue.AsSingleton(layout))
    if registry.FORMATS[fmt].read_inferring:
        # One read a file: each file encoded with the types it infers as it is read, then
        # encoded again with the merged profile's only where those differ (another file's
        # values widened a column, or it lacks a column others have).
        inferred = indexed_files | "EncodeInferring" >> beam.ParDo(
            _EncodeFileInferring(options, fmt, staging))
        profile = (inferred | "Profiles" >> beam.MapTuple(lambda _, encoded, profile: profile)
                   | "MergeProfiles" >> beam.CombineGlobally(encode.merge_profiles))
        encoded = inferred | "EncodeAgainIfWidened" >> beam.ParDo(
            _EncodeAgainIfWidened(options, fmt, staging), profile=beam.pvalue.AsSingleton(profile))
    else:
        profile = (
            indexed_files
            | "Profile" >> beam.Map(_profile, fmt)
            | "MergeProfiles" >> beam.CombineGlobally(encode.merge_profiles)
        )
        encoded = indexed_files | "Encode" >> beam.ParDo(
            _EncodeFile(options, fmt, staging), profile=beam.pvalue.AsSingleton(profile))
    written = (encoded | "Chunks" >> beam.FlatMap(lambda file: file[0])
               | "WriteShards" >> beam_shards.WriteShards(staging, options.sharding))
    results = encoded | "Results" >> beam.Map(lambda file: file[1])
    _ = (
        pipeline
        | "Once" >> beam.Create([None])
        | "Finalize" >> beam.Map(
            _finalize, staging=staging, options=options, fmt=fmt,
            hidden_files=list(hidden_files), layout_files=list(layout_files),
            profile=beam.pvalue.AsSingleton(profile),
            written=beam.pvalue.AsList(written), results=beam.pvalue.AsList(results))
    )


def _in_this_process(pipeline: beam.Pipeline) -> bool:
    return beam_runners.in_this_process(
        type(pipeline.runner).__name__,
        pipeline.options.view_as(DirectOptions).direct_running_mode)


def _surveyed(source: SourceRange, fmt: str) -> tuple:
    return source, registry.FORMATS[fmt].ranges.survey(source)


def _layout(surveys: list, fmt: str) -> dict:
    return registry.FORMATS[fmt].ranges.layout(surveys)


def _placed(element: tuple, fmt: str, placed: dict) -> list:
    return list(registry.FORMATS[fmt].ranges.place(element, placed))


def _finalize(_, staging, options, fmt, hidden_files, layout_files, profile, written,
              results) -> None:
    encode.finalize(staging, options, fmt, profile, written, results, hidden_files,
                    layout_files)


def run(options: ExampleGenOptions, output_dir: str,
        beam_pipeline_args: Optional[list[str]] = None,
        make_pipeline=None, progress: bool = False) -> dict:
    """Runs ExampleGen into `output_dir` and returns the manifest.

    Outputs appear only when the whole run succeeded; on failure the staging folder is removed.
    A source that changed since the run's fingerprint was taken, or while it was read, fails
    the run before its commit (`unchanged_source`).
    `make_pipeline` lets the TFX executor supply its own configured Beam pipeline; `progress`
    shows progress bars on a terminal (the CLI's default).
    """
    inputs = options.input_patterns()
    fmt, files, file_splits = locate.input_files(inputs, options.format)
    shards.check_output_dir(output_dir)  # before any work, not after
    Progress.current = Progress(len(files)) if progress else None
    try:
        with shards.staged_output(output_dir) as staging, unchanged_source(options):
            pipeline = make_pipeline() if make_pipeline else beam.Pipeline(
                argv=list(beam_pipeline_args or []))
            with pipeline:
                build_pipeline(pipeline, options, fmt, files, staging,
                               *locate.unread_files(inputs),
                               file_splits)
            manifest = shards.read_manifest(staging)
    finally:
        if Progress.current:
            Progress.current.close()
            Progress.current = None
    logging.info("ExampleGen wrote %d rows (%d quarantined) to %s", manifest["rows_written"],
                 manifest["rows_quarantined"], output_dir)
    return manifest
