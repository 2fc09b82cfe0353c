"""The ShardedExampleGen TFX component: its spec and parameters."""
from __future__ import annotations

from typing import Any, Optional

from google.protobuf import json_format, message
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import channel_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from components.example_gen import executor
from components.example_gen.options import ExampleGenOptions
from components.example_gen.inputs import settle_inputs
from tfrecord_shards.options import OPTIONS_KEY, options_or_settings


class ShardedExampleGenSpec(ComponentSpec):
    PARAMETERS = {OPTIONS_KEY: ExecutionParameter(type=str)}
    INPUTS = {}
    OUTPUTS = {"examples": ChannelParameter(type=standard_artifacts.Examples)}


class ShardedExampleGen(base_beam_component.BaseBeamComponent):
    """CSV, Parquet, JSON Lines, TFRecord or an image folder -> a standard Examples artifact.

    Unlike stock ExampleGen it controls shard count or size, hashes splits on arrays, records
    the schema and a manifest beside the data, and quarantines bad rows with counts.

    Give an `ExampleGenOptions`, or its fields as keywords: `ShardedExampleGen(source=...)`.
    """

    SPEC_CLASS = ShardedExampleGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, options: Optional[ExampleGenOptions] = None, settle: bool = True,
                 **settings: Any):
        """Stock's `input_config` (an `example_gen_pb2.Input`) and `range_config` (a
        `range_config_pb2.RangeConfig`) are taken as they are, so a stock pipeline's carry
        over. `settle`: resolve the spans and fingerprint the source now, for a run that
        starts now (LocalDagRunner); a compiled pipeline leaves them to its driver task,
        which settles them each time the pipeline runs."""
        settings = {name: _from_proto(name, value) for name, value in settings.items()}
        options = options_or_settings(ExampleGenOptions, options, settings)
        if settle:
            options = settle_inputs(options)
        super().__init__(spec=ShardedExampleGenSpec(
            examples=channel_utils.as_channel([standard_artifacts.Examples()]),
            **{OPTIONS_KEY: options.to_json()}))


def _from_proto(name: str, value: Any) -> Any:
    """A stock input_config or range_config proto as our options hold it; others as given."""
    if not isinstance(value, message.Message):
        return value
    if name == "input_config":
        return {split.name: split.pattern for split in value.splits}
    return json_format.MessageToDict(value, preserving_proto_field_name=True)
