"""The ShardedExampleGen TFX component: its spec and parameters."""
from __future__ import annotations

from typing import Optional

from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter
from tfx.types import channel_utils

from components.example_gen import executor, sources
from components.example_gen.options import DEFAULT_SPLITS, ExampleGenOptions
from components.shards import ShardingOptions


class ShardedExampleGenSpec(ComponentSpec):
    PARAMETERS = {executor.OPTIONS_KEY: ExecutionParameter(type=str)}
    INPUTS = {}
    OUTPUTS = {"examples": ChannelParameter(type=standard_artifacts.Examples)}


class ShardedExampleGen(base_beam_component.BaseBeamComponent):
    """CSV, Parquet, JSON Lines, TFRecord or an image folder -> a standard Examples artifact.

    Unlike stock ExampleGen it controls shard count or size, hashes splits on arrays, records
    the schema and a manifest beside the data, and quarantines bad rows with counts.
    """

    SPEC_CLASS = ShardedExampleGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, source: str, format: str = "auto", splits: str = DEFAULT_SPLITS,
                 split_key: Optional[str] = None, partition_by: Optional[str] = None,
                 num_shards: Optional[int] = None, shard_size_mb: Optional[float] = None,
                 compression: str = "gzip", on_bad_record: str = "fail"):
        options = ExampleGenOptions(
            source=source, format=format, splits=splits, split_key=split_key,
            partition_by=partition_by, on_bad_record=on_bad_record,
            sharding=ShardingOptions(num_shards=num_shards, shard_size_mb=shard_size_mb,
                                     compression=compression),
            source_fingerprint=sources.local_fingerprint(source))
        super().__init__(spec=ShardedExampleGenSpec(
            examples=channel_utils.as_channel([standard_artifacts.Examples()]),
            **{executor.OPTIONS_KEY: options.to_json()}))
