"""The ShardedTransform TFX component: its spec and parameters."""
from __future__ import annotations

from typing import Optional

from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import channel_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from components.shards import ShardingOptions
from components.transform import executor
from components.transform.executor import TransformOptions


class ShardedTransformSpec(ComponentSpec):
    PARAMETERS = {executor.OPTIONS_KEY: ExecutionParameter(type=str)}
    INPUTS = {"examples": ChannelParameter(type=standard_artifacts.Examples),
              "schema": ChannelParameter(type=standard_artifacts.Schema)}
    OUTPUTS = {"transform_graph": ChannelParameter(type=standard_artifacts.TransformGraph),
               "transformed_examples": ChannelParameter(type=standard_artifacts.Examples),
               "post_transform_schema": ChannelParameter(type=standard_artifacts.Schema)}


class ShardedTransform(base_beam_component.BaseBeamComponent):
    """tf.Transform over Examples + Schema -> a standard TransformGraph, transformed Examples
    written with our shard control (count or size, compression, manifest, atomic commit),
    optionally packed `packed_rows` rows per Example, and the post-transform Schema.

    Without `module_file` or `preprocessing_fn` the transform comes from the schema: z-scored
    floats, vocabulary ids for strings, ints kept.
    """

    SPEC_CLASS = ShardedTransformSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, examples, schema, module_file: Optional[str] = None,
                 preprocessing_fn: Optional[str] = None, packed_rows: int = 0,
                 num_shards: Optional[int] = None, shard_size_mb: Optional[float] = None,
                 compression: str = "gzip", analyze_split: str = "train"):
        options = TransformOptions(
            module_file=module_file, preprocessing_fn=preprocessing_fn,
            packed_rows=packed_rows, analyze_split=analyze_split,
            sharding=ShardingOptions(num_shards=num_shards, shard_size_mb=shard_size_mb,
                                     compression=compression))
        super().__init__(spec=ShardedTransformSpec(
            examples=examples, schema=schema,
            transform_graph=channel_utils.as_channel([standard_artifacts.TransformGraph()]),
            transformed_examples=channel_utils.as_channel([standard_artifacts.Examples()]),
            post_transform_schema=channel_utils.as_channel([standard_artifacts.Schema()]),
            **{executor.OPTIONS_KEY: options.to_json()}))
