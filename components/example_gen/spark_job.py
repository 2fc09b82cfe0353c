"""ShardedExampleGen's work on Spark (`engine="spark"`): the Beam job's steps, as Spark tasks.

One task per source file (or byte range of a large plain CSV: `csv_ranges`, surveyed in tasks
first) profiles it (pass 1); the driver merges the small profiles; one task per file encodes
it into chunk files (`example_gen.encode.encode_file`, the function Beam's
DoFn calls); the driver plans shards; one task per shard writes it; the driver writes the
schema and manifest and commits. A format that types its columns as it reads (CSV) takes
both passes in one read, as in the Beam job: one task per file profiles and encodes it
(`encode.encode_file_inferring`), and only a file whose types the merged profile widened is
encoded again. The output is the one the Beam job writes.
"""
from __future__ import annotations

import logging

from tfrecord_shards import shards
from components.example_gen import encode
from components.example_gen.inputs import unchanged_source
from components.example_gen.options import ExampleGenOptions
from components.example_gen.sources import locate, registry
from components.example_gen.sources.base import FileProfile, SourceError, input_error_line
from spark_shards import session as spark_session
from components.example_gen.spark_write import write_shards


def run(options: ExampleGenOptions, output_dir: str, spark=None) -> dict:
    """Runs ExampleGen on Spark into `output_dir` and returns the manifest. `spark`: a
    session to use; by default one on `options.spark_master` with `options.spark_conf`."""
    inputs = options.input_patterns()
    fmt, files, file_splits = locate.input_files(inputs, options.format)
    shards.check_output_dir(output_dir)
    spark = spark or spark_session.get_session(options.spark_master, options.spark_conf)
    indexed = registry.elements(files, file_splits, fmt, options.piece_bytes)
    try:
        # As the Beam job: a source file changed since the run's fingerprint, or during the
        # read, stops the run before its commit.
        with shards.staged_output(output_dir) as staging, unchanged_source(options):
            indexed = _placed(spark.sparkContext, fmt, indexed)
            encode_files = _encode_in_one_read if registry.FORMATS[fmt].read_inferring \
                else _encode_in_two_passes
            profile, encoded = encode_files(spark.sparkContext, options, fmt, staging, indexed)
            chunks = [chunk for file_chunks, _ in encoded for chunk in file_chunks]
            written = write_shards(spark, shards.plan_shards(chunks, options.sharding),
                                   staging, options.sharding)
            encode.finalize(staging, options, fmt, profile, written,
                            [result for _, result in encoded], *locate.unread_files(inputs))
            manifest = shards.read_manifest(staging)
    except Exception as error:
        line = input_error_line(error)
        if line is None or isinstance(error, (ValueError, OSError)):
            raise  # ours, or already the user's own error
        raise SourceError(line) from error
    logging.info("ExampleGen (Spark) wrote %d rows (%d quarantined) to %s",
                 manifest["rows_written"], manifest["rows_quarantined"], output_dir)
    return manifest


def _placed(context, fmt: str, indexed: list) -> list:
    """`indexed` ready to read: its ranges surveyed in tasks and placed (`csv_ranges`)."""
    cut = registry.ranges_of(indexed)
    if not cut:
        return indexed
    logging.info("ExampleGen (Spark): reading %d byte ranges of large files", len(cut))
    ranges = registry.FORMATS[fmt].ranges
    layout = ranges.layout(context.parallelize(cut, len(cut)).map(_Survey(fmt)).collect())
    return [placed for element in indexed for placed in ranges.place(element, layout)]


class _Survey:
    def __init__(self, fmt: str):
        self._fmt = fmt

    def __call__(self, source):
        return source, registry.FORMATS[self._fmt].ranges.survey(source)


def _encode_in_two_passes(context, options: ExampleGenOptions, fmt: str, staging: str,
                          indexed: list) -> tuple[FileProfile, list]:
    """(the merged profile, each file's (chunks, counts)): every file profiled, then
    encoded with the merged profile's types."""
    profile = encode.merge_profiles(context.parallelize(indexed, len(indexed)).map(
        _ProfileFile(fmt)).collect())
    return profile, context.parallelize(indexed, len(indexed)).map(
        _EncodeFile(options, fmt, staging, profile)).collect()


def _encode_in_one_read(context, options: ExampleGenOptions, fmt: str, staging: str,
                        indexed: list) -> tuple[FileProfile, list]:
    """As `_encode_in_two_passes`, each file profiled and encoded in the same read, and
    encoded again only where the merged profile's types differ from its own."""
    inferred = context.parallelize(indexed, len(indexed)).map(
        _EncodeFileInferring(options, fmt, staging)).collect()
    profile = encode.merge_profiles(own for _, own in inferred)
    widened = [file for file, (_, own) in zip(indexed, inferred)
               if encode.encoded_with_other_types(own, profile)]
    again = {}
    if widened:
        again = dict(zip([file_index for file_index, _, _ in widened], context.parallelize(
            widened, len(widened)).map(_EncodeFile(options, fmt, staging, profile)).collect()))
    return profile, [again.get(file_index, encoded)
                     for (file_index, _, _), (encoded, _) in zip(indexed, inferred)]


class _ProfileFile:
    def __init__(self, fmt: str):
        self._fmt = fmt

    def __call__(self, indexed_path) -> FileProfile:
        return registry.profile_file(indexed_path[1], self._fmt)[0]


class _EncodeFile:
    def __init__(self, options: ExampleGenOptions, fmt: str, staging: str,
                 profile: FileProfile):
        self._options, self._fmt, self._staging, self._profile = (options, fmt, staging,
                                                                  profile)

    def __call__(self, indexed_path):
        file_index, path, split = indexed_path
        return encode.encode_file(self._options, self._fmt, self._staging, file_index, path,
                                  self._profile, split=split)


class _EncodeFileInferring:
    """One file's ((chunks, counts), its own profile), in one read."""

    def __init__(self, options: ExampleGenOptions, fmt: str, staging: str):
        self._options, self._fmt, self._staging = options, fmt, staging

    def __call__(self, indexed_path):
        file_index, path, split = indexed_path
        chunks, result, profile = encode.encode_file_inferring(
            self._options, self._fmt, self._staging, file_index, path, split=split)
        return (chunks, result), profile
