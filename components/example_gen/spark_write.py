"""`write_examples`: a Spark DataFrame to the layout ShardedExampleGen writes.

Executors turn Arrow batches (`mapInArrow`) into tf.Examples with ExampleGen's own encoder
(`example_gen.encode.encode_batch`: the same split hashing, partition folders and codec) and
append them to chunk files in the staging folder. Each task returns one small record: its
chunk list and its column profile. The driver plans shards from those (`shards.plan_shards`),
executors copy and compress the shards (a task per core), and the driver writes the schema
and manifest and commits. No row passes through the driver and no row becomes a Python
object.
"""
from __future__ import annotations

import dataclasses
import pickle
from typing import Optional

import pyarrow as pa

from tfrecord_shards import fileio, hooks, shards
from tfrecord_shards.codec import serializer
from components.example_gen import encode
from components.example_gen.options import ExampleGenOptions
from components.example_gen.sources.base import FileProfile
from tfrecord_shards.options import from_flat
from tfrecord_shards.shards import ShardingOptions
from spark_shards import columns as spark_columns
from spark_shards.session import deal_by_weight

FORMAT = "spark-dataframe"


def write_examples(df, output_dir: str, options: Optional[ExampleGenOptions] = None,
                   **settings) -> dict:
    """Writes `df` as `Split-*/data_tfrecord-…` shards with `schema.pbtxt` and
    `manifest.json` under `output_dir` (which must be empty), and returns the manifest.

    The settings are ExampleGen's: an `ExampleGenOptions`, or its settings by name as
    keywords (`num_shards=4, compression="none"`), not both; its `source` and `engine` are
    this DataFrame and Spark. A typed DataFrame has no unparseable rows, so `on_bad_record`
    is recorded but nothing is quarantined; rows in = rows written is checked like every
    run's accounting."""
    frame = {"source": f"DataFrame[{', '.join(df.columns)}]", "engine": "spark"}
    if options is not None and settings:
        raise TypeError(f"give ExampleGenOptions or its settings {sorted(settings)}, not both")
    options = dataclasses.replace(options, **frame) if options is not None else \
        from_flat(ExampleGenOptions, {**settings, **frame})
    planned = spark_columns.plan_columns(df.schema)
    features = spark_columns.select_features(df, planned)
    kinds = _kinds(features, [c.name for c in planned])
    profile = FileProfile(columns=kinds)
    encode.check_columns(profile, options)
    spark = features.sparkSession
    with shards.staged_output(output_dir) as staging:
        payloads = features.mapInArrow(_PartitionEncoder(options, kinds, staging),
                                       "payload binary").collect()
        tasks = sorted((pickle.loads(row.payload) for row in payloads), key=lambda t: t[0])
        chunks = [chunk for _, task_chunks, _, _, _ in tasks for chunk in task_chunks]
        written = write_shards(spark, shards.plan_shards(chunks, options.sharding), staging,
                               options.sharding)
        results = [encode.FileResult(index, f"DataFrame partition {index}", rows, 0,
                                     unlabelled=unlabelled)
                   for index, _, _, rows, unlabelled in tasks]
        for _, _, task_profile, _, _ in tasks:
            profile = profile.merge(task_profile)
        encode.finalize(staging, options, FORMAT, profile, written, results,
                        comments={c.name: c.description for c in planned})
        manifest = shards.read_manifest(staging)
    return manifest


def _kinds(features, names: list[str]) -> dict:
    """Feature name -> (kind, is_list), from the Arrow types Spark will hand the tasks."""
    # pyspark: 0.13 s to import; only a Spark run needs it, not what imports this module.
    from pyspark.sql.pandas.types import to_arrow_schema

    return {name: serializer.arrow_kind(field.type)
            for name, field in zip(names, to_arrow_schema(features.schema))}


class _PartitionEncoder:
    """The mapInArrow function: one task's batches to chunk files, and one payload row."""

    def __init__(self, options: ExampleGenOptions, kinds: dict, staging: str):
        self._options, self._kinds, self._staging = options, kinds, staging

    def __call__(self, batches):
        # pyspark: 0.13 s to import; only a Spark task needs it, not what imports this module.
        from pyspark import TaskContext

        context = TaskContext.get()
        task = context.partitionId()
        options = self._options
        split_names, weights, key_columns = encode.split_plan(options, self._kinds)
        hooks.reached(hooks.TASK_STARTED, staging=self._staging, task=task,
                      stage="write_examples")
        # Only the chunks of the attempt whose payload Spark keeps are planned.
        writer = shards.ChunkWriter(fileio.join(self._staging, "_chunks"), task,
                                    options.sharding)
        # Kinds come from the DataFrame's schema, so the profile starts with every column
        # and only counts presence and string values.
        profile, rows, unlabelled = FileProfile(columns=dict(self._kinds)), 0, 0
        source = f"DataFrame partition {task}"
        names = list(self._kinds)
        for batch in batches:
            if not batch.num_rows:
                continue
            batch = pa.RecordBatch.from_arrays(batch.columns, names)
            rows += batch.num_rows
            profile.add_batch(batch, self._kinds)
            batch, dropped = encode.without_unlabelled(batch, options.label_key)
            unlabelled += dropped
            if batch.num_rows:
                encode.write_groups(writer, encode.encode_batch(
                    options, source, batch, profile.columns, split_names, weights, key_columns))
        chunks = writer.close()
        hooks.reached(hooks.TASK_WROTE, staging=self._staging, task=task,
                      stage="write_examples")
        payload = pickle.dumps((task, chunks, profile, rows, unlabelled))
        yield pa.RecordBatch.from_arrays([pa.array([payload], pa.binary())], ["payload"])


def write_shards(spark, specs: list, staging: str, sharding: ShardingOptions) -> list:
    """Writes the planned shards, one task per core, each writing a group of shards of about
    equal bytes; returns the Shards in the order of `specs`."""
    if not specs:
        return []
    groups = deal_by_weight([sum(p.end - p.start for p in spec.pieces) for spec in specs],
                            spark.sparkContext.defaultParallelism)
    written = spark.sparkContext.parallelize(
        [[(i, specs[i]) for i in group] for group in groups], len(groups)).flatMap(
        _ShardWriter(staging, sharding)).collect()
    return [shard for _, shard in sorted(written, key=lambda pair: pair[0])]


class _ShardWriter:
    def __init__(self, staging: str, sharding: ShardingOptions):
        self._staging, self._sharding = staging, sharding

    def __call__(self, group: list) -> list:
        return [(index, shards.write_shard(spec, self._staging, self._sharding))
                for index, spec in group]
