"""The ShardedTransform TFX component: its spec and parameters."""
from __future__ import annotations

from typing import Any, Optional

from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import channel_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from tfrecord_shards.options import OPTIONS_KEY, options_or_settings
from components.transform import executor, feature_stats
from components.transform.options import TransformOptions


class ShardedTransformSpec(ComponentSpec):
    PARAMETERS = {OPTIONS_KEY: ExecutionParameter(type=str)}
    INPUTS = {"examples": ChannelParameter(type=standard_artifacts.Examples),
              "schema": ChannelParameter(type=standard_artifacts.Schema),
              "anomalies": ChannelParameter(type=standard_artifacts.ExampleAnomalies,
                                            optional=True),
              "analyzer_cache": ChannelParameter(type=standard_artifacts.TransformCache,
                                                 optional=True)}
    OUTPUTS = {"transform_graph": ChannelParameter(type=standard_artifacts.TransformGraph),
               "transformed_examples": ChannelParameter(type=standard_artifacts.Examples),
               "post_transform_schema": ChannelParameter(type=standard_artifacts.Schema),
               "updated_analyzer_cache": ChannelParameter(
                   type=standard_artifacts.TransformCache),
               # Stock's statistics outputs, absent with disable_statistics as in stock.
               feature_stats.PRE_TRANSFORM_SCHEMA: ChannelParameter(
                   type=standard_artifacts.Schema, optional=True),
               feature_stats.PRE_TRANSFORM_STATS: ChannelParameter(
                   type=standard_artifacts.ExampleStatistics, optional=True),
               feature_stats.POST_TRANSFORM_STATS: ChannelParameter(
                   type=standard_artifacts.ExampleStatistics, optional=True),
               feature_stats.POST_TRANSFORM_ANOMALIES: ChannelParameter(
                   type=standard_artifacts.ExampleAnomalies, optional=True)}


class ShardedTransform(base_beam_component.BaseBeamComponent):
    """tf.Transform over Examples + Schema -> a standard TransformGraph, transformed Examples
    written with our shard control (count or size, compression, manifest, atomic commit),
    packed `packed_rows` rows per Example unless that is 0, and the post-transform Schema
    (annotated with the packing, so wire it into the Trainer's `schema`).

    Without `module_file` or `preprocessing_fn` the transform comes from the schema: z-scored
    floats, vocabulary ids for strings, ints kept. Give a `TransformOptions`, or its fields as
    keywords.

    `examples` may hold several Examples artifacts (a window of spans, from a resolver):
    they are analysed together and each split of the output holds all their rows. As stock
    Transform does, each input's analysis is kept in tf.Transform's analyzer cache
    (`updated_analyzer_cache`; an `analyzer_cache` input is read first), so an input seen
    before is not read again for analysis; `analyzer_cache_dir` keeps it in one folder across
    runs instead, which lets a rerun with the same inputs be reused from TFX's cache.

    Wire ExampleValidator's `anomalies` in to gate on them: with `fail_on_anomalies` (the
    default) any anomaly fails this component before it reads a row, naming every anomaly.
    TFX has no gate of its own, and validation that stops nothing only decorates a run.

    As stock Transform does unless `disable_statistics`, it also outputs
    `pre_transform_schema`, `pre_transform_stats` (the analysed rows), `post_transform_stats`
    (the transformed rows) and `post_transform_anomalies` (those statistics validated against
    the transformed schema), in stock's layout (components/transform/feature_stats.py).
    """

    SPEC_CLASS = ShardedTransformSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, examples, schema, options: Optional[TransformOptions] = None,
                 anomalies=None, analyzer_cache=None, **settings: Any):
        options = options_or_settings(TransformOptions, options, settings)
        statistics = {} if options.disable_statistics else {
            name: channel_utils.as_channel([artifact_type()]) for name, artifact_type in (
                (feature_stats.PRE_TRANSFORM_SCHEMA, standard_artifacts.Schema),
                (feature_stats.PRE_TRANSFORM_STATS, standard_artifacts.ExampleStatistics),
                (feature_stats.POST_TRANSFORM_STATS, standard_artifacts.ExampleStatistics),
                (feature_stats.POST_TRANSFORM_ANOMALIES, standard_artifacts.ExampleAnomalies))}
        super().__init__(spec=ShardedTransformSpec(
            examples=examples, schema=schema, anomalies=anomalies,
            analyzer_cache=analyzer_cache,
            updated_analyzer_cache=channel_utils.as_channel(
                [standard_artifacts.TransformCache()]),
            transform_graph=channel_utils.as_channel([standard_artifacts.TransformGraph()]),
            transformed_examples=channel_utils.as_channel([standard_artifacts.Examples()]),
            post_transform_schema=channel_utils.as_channel([standard_artifacts.Schema()]),
            **statistics, **{OPTIONS_KEY: options.to_json()}))
