"""ShardedTransform's statistics outputs, written as TFX 1.16's stock Transform writes them
with its default `disable_statistics=False` (tfx/components/transform/executor.py), so a
user watching them (TFDV's visualisation, a check on post-transform anomalies) reads ours
unchanged:

- `pre_transform_schema/schema.pbtxt`: the raw Schema Transform was given;
- `pre_transform_stats/FeatureStats.pb`: one DatasetFeatureStatisticsList of the analysed
  rows (the analyze split of every input, together), of the columns the preprocessing_fn
  reads, as stock projects them;
- `post_transform_stats/FeatureStats.pb`: of the transformed rows of every split, together
  (one row per transformed row: packed Examples are unpacked first);
- `post_transform_anomalies/SchemaDiff.pb`: TFDV's validation of those statistics against
  the transformed schema (tf.Transform's output schema, stock's post-transform schema).

Stock's files sit at the artifact's root, with no `Split-<name>/` folder. The statistics come
from StatisticsGen's engine (`components/statistics_gen/`), with the schema as its statistics
schema, as stock gives TFDV the schema: on the columnar path from the batches Transform's
passes already hold (`PassStatistics`), else by reading the rows (`stats_job.scan`);
tests/test_transform_statistics.py checks them against stock Transform's on the taxi sample,
and the passes' against reading the rows.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Optional, Sequence

from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from tfrecord_shards import fileio
from tfrecord_shards.codec import schema_file
from components.statistics_gen import accumulators
from components.statistics_gen import plan as stats_plan
from components.statistics_gen import stats_job
from components.statistics_gen.options import StatisticsGenOptions
from components.transform.inputs import tensor_adapter_config

# Stock Transform's output names (standard_component_specs) and file names.
PRE_TRANSFORM_SCHEMA = "pre_transform_schema"
PRE_TRANSFORM_STATS = "pre_transform_stats"
POST_TRANSFORM_SCHEMA = "post_transform_schema"
POST_TRANSFORM_STATS = "post_transform_stats"
POST_TRANSFORM_ANOMALIES = "post_transform_anomalies"
# The outputs that exist only with statistics on (the post-transform schema always exists:
# the Trainer reads the packing from it).
STATISTICS_OUTPUTS = (PRE_TRANSFORM_SCHEMA, PRE_TRANSFORM_STATS, POST_TRANSFORM_STATS,
                      POST_TRANSFORM_ANOMALIES)
STATS_FILE = stats_job.STATS_FILE
ANOMALIES_FILE = "SchemaDiff.pb"
# Every file's rows are summarised as one dataset, as stock flattens its inputs.
_ALL = "all"


def input_columns(preprocessing_fn: Callable[[dict], dict], raw_schema: schema_pb2.Schema
                  ) -> list[str]:
    """The raw columns the preprocessing_fn reads, to analyse or to transform: stock reads
    these alone for its pre-transform statistics."""
    # tf.Transform, tfx_bsl.tfxio: 2.9 s to import (TensorFlow); the statistics need neither.
    import tensorflow_transform as tft
    from tfx_bsl.tfxio import tensor_adapter

    specs = tensor_adapter.TensorAdapter(tensor_adapter_config(raw_schema)).TypeSpecs()
    return sorted(set(tft.get_analyze_input_columns(preprocessing_fn, dict(specs)))
                  | set(tft.get_transform_input_columns(preprocessing_fn, dict(specs))))


def _statistics_schema(schema: Optional[schema_pb2.Schema]) -> Optional[schema_pb2.Schema]:
    """`schema` when the fast engine honours it as TFDV does, else None (its features are
    then summarised by their stored types alone), which is logged."""
    reason = stats_plan.unsupported_schema(schema)
    if reason:
        logging.warning("Transform's statistics leave out the schema's feature roles: it has "
                        "%s", reason)
        return None
    return schema


def _narrowed(plan: stats_plan.Plan, columns: Optional[Sequence[str]]) -> stats_plan.Plan:
    """`plan` reading only `columns` (in the plan's order), its tags kept."""
    if columns is None:
        return plan
    keep = set(columns)
    schema = schema_pb2.Schema()
    schema.CopyFrom(plan.schema)
    del schema.feature[:]
    schema.feature.extend(f for f in plan.schema.feature if f.name in keep)
    return stats_plan.Plan(schema, tuple(f for f in plan.features if f.name in keep),
                          tuple(name for name in plan.kindless if name in keep))


def statistics(examples_dirs: Sequence[str], splits: Sequence[str],
               schema: Optional[schema_pb2.Schema],
               columns: Optional[Sequence[str]] = None
               ) -> statistics_pb2.DatasetFeatureStatisticsList:
    """The statistics of the `splits` of every Examples folder, as one dataset (of `columns`
    alone when given), with `schema` as the statistics schema."""
    files = _files(examples_dirs, splits)
    plan = split_plan(examples_dirs, splits, schema, columns)
    return finished(stats_job.scan([(_ALL, files, plan)], StatisticsGenOptions(),
                                   count_rows=False)[_ALL])


def _files(examples_dirs: Sequence[str], splits: Sequence[str]) -> list[str]:
    return [path for d in examples_dirs for split in splits
            for path in stats_plan.split_files(d, split)]


def split_plan(examples_dirs: Sequence[str], splits: Sequence[str],
               schema: Optional[schema_pb2.Schema],
               columns: Optional[Sequence[str]] = None) -> stats_plan.Plan:
    """How `statistics` reads and summarises those splits."""
    return _narrowed(stats_plan.plan_for(fileio.join(examples_dirs[0], f"Split-{splits[0]}"),
                                         _files(examples_dirs, splits),
                                         _statistics_schema(schema)), columns)


def finished(stats: accumulators.SplitStats) -> statistics_pb2.DatasetFeatureStatisticsList:
    return _sketch_order(stats.statistics())


@dataclasses.dataclass
class PassStatistics:
    """The statistics outputs taken from the batches Transform's passes already hold, so that
    no row is read and decoded again for them: the analysis summarises the raw rows it
    decodes (`pre_plan`, as `statistics` would read the analysed split), the transform the
    rows it transformed before they are packed (`post_plan`). `pre` and `post` are what the
    passes gave, each None where a pass could not see every row the same way (an input's
    analysis taken from the analyzer cache, tf.Transform's general path, transformed
    features of varying length): `write_outputs` then reads those rows as before."""

    pre_plan: Optional[stats_plan.Plan]
    post_plan: Optional[stats_plan.Plan] = None
    pre: Optional[accumulators.SplitStats] = None
    post: Optional[accumulators.SplitStats] = None


def pass_statistics(examples_dirs: Sequence[str], analyze_split: str,
                    raw_schema: schema_pb2.Schema, columns: Sequence[str],
                    decoding: schema_pb2.Schema) -> PassStatistics:
    """What the analysis can summarise of the rows it decodes with `decoding` (Transform's
    raw schema): the pre-transform statistics' plan, when each feature it reads is decoded
    as the plan's own decoder would (the same kind, and no feature seen without a kind)."""
    plan = split_plan(examples_dirs, [analyze_split], raw_schema, columns)
    kinds = {f.name: f.type for f in decoding.feature}
    same = not plan.kindless and all(kinds.get(f.name) == f.kind for f in plan.features)
    return PassStatistics(plan if same else None)


def post_transform_plan(stored: schema_pb2.Schema, transformed: schema_pb2.Schema
                        ) -> Optional[stats_plan.Plan]:
    """The post-transform statistics' plan for rows as tf.Transform's converter gives them,
    when every transformed feature has a fixed shape (a row has its values, never none, as
    the stored shards give them back); else None."""
    if not all(f.HasField("shape") for f in stored.feature):
        return None
    return stats_plan.make_plan(stored, _statistics_schema(transformed))


def summarise(stats: accumulators.SplitStats, batch) -> None:
    """Adds a batch of rows (decoded or transformed, large_list columns) to `stats`."""
    stats.add(accumulators.batch_part(batch, stats.plan))


def _sketch_order(stats: statistics_pb2.DatasetFeatureStatisticsList
                  ) -> statistics_pb2.DatasetFeatureStatisticsList:
    """`stats` with the values of each categorical int feature ranked as stock Transform
    ranks them. Its TFDV runs the sketch-based top-k (`experimental_use_sketch_based_topk_
    uniques`), which holds values as strings: equal counts are ordered by the value's text,
    descending ("8" before "10"), where StatisticsGen's exact top-k orders them by number.
    The rank histogram holds the top 1,000 values, the top values are its first ones."""
    for feature in stats.datasets[0].features:
        if feature.type != statistics_pb2.FeatureNameStatistics.INT or \
                not feature.HasField("string_stats"):
            continue
        strings = feature.string_stats
        buckets = sorted(((b.sample_count, b.label) for b in strings.rank_histogram.buckets),
                         reverse=True)
        for rank, (bucket, (count, label)) in enumerate(zip(strings.rank_histogram.buckets,
                                                           buckets)):
            bucket.low_rank = bucket.high_rank = rank
            bucket.label, bucket.sample_count = label, count
        for top, (count, label) in zip(strings.top_values, buckets):
            top.value, top.frequency = label, count
    return stats


def write_statistics(stats: statistics_pb2.DatasetFeatureStatisticsList, uri: str) -> None:
    fileio.makedirs(uri)
    fileio.write_bytes(fileio.join(uri, STATS_FILE), stats.SerializeToString())


def write_outputs(uris: dict[str, str], examples_dirs: Sequence[str], analyze_split: str,
                  given_schema: schema_pb2.Schema, raw_schema: schema_pb2.Schema,
                  columns: Sequence[str],
                  transformed_dir: str, splits: Sequence[str],
                  transformed_schema: schema_pb2.Schema,
                  from_passes: Optional[PassStatistics] = None) -> dict[str, int]:
    """Writes the four statistics outputs (`uris`, by STATISTICS_OUTPUTS' names): the
    schema Transform was given, the statistics of `columns` of the analysed rows with
    `raw_schema` as their statistics schema, those of every split of the transformed rows
    and their validation against `transformed_schema`. Statistics `from_passes` gave are
    used as they are; the others are read from the rows. Returns the number of anomalies of
    each feature that has any."""
    # tensorflow_data_validation: 1.9 s to import; the statistics themselves need none.
    import tensorflow_data_validation as tfdv

    fileio.makedirs(uris[PRE_TRANSFORM_SCHEMA])
    schema_file.write_schema(given_schema, fileio.join(uris[PRE_TRANSFORM_SCHEMA],
                                                     schema_file.SCHEMA_FILE))
    from_passes = from_passes or PassStatistics(None)
    write_statistics(finished(from_passes.pre) if from_passes.pre else statistics(
        examples_dirs, [analyze_split], raw_schema, columns), uris[PRE_TRANSFORM_STATS])
    post = finished(from_passes.post) if from_passes.post else statistics(
        [transformed_dir], list(splits), transformed_schema)
    write_statistics(post, uris[POST_TRANSFORM_STATS])
    anomalies = tfdv.validate_statistics(post, transformed_schema)
    fileio.makedirs(uris[POST_TRANSFORM_ANOMALIES])
    fileio.write_bytes(fileio.join(uris[POST_TRANSFORM_ANOMALIES], ANOMALIES_FILE),
                       anomalies.SerializeToString())
    return {name: len(info.reason) for name, info in anomalies.anomaly_info.items()}
