"""The ShardedExampleGen TFX component: its spec and parameters."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import channel_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from components.example_gen import executor
from components.example_gen.options import ExampleGenOptions
from components.example_gen.sources import locate
from components.options import OPTIONS_KEY, options_or_settings


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

    def __init__(self, options: Optional[ExampleGenOptions] = None, **settings: Any):
        options = resolve_span(options_or_settings(ExampleGenOptions, options, settings))
        if options.source_fingerprint is None:
            options = dataclasses.replace(
                options, source_fingerprint=locate.local_fingerprint(options.source))
        super().__init__(spec=ShardedExampleGenSpec(
            examples=channel_utils.as_channel([standard_artifacts.Examples()]),
            **{OPTIONS_KEY: options.to_json()}))


# TFX's specs in a source pattern ({SPAN} and {VERSION} may carry a width: {SPAN:2}).
SPAN_SPECS = ("{SPAN", "{VERSION", "{YYYY}", "{MM}", "{DD}")


def resolve_span(options: ExampleGenOptions) -> ExampleGenOptions:
    """A source pattern with TFX's `{SPAN}`, `{YYYY}{MM}{DD}` and `{VERSION}` specs, resolved
    as stock ExampleGen resolves its input_config: the latest span, and its latest version.
    The options then read that span's files and carry its numbers and stock's fingerprint of
    them, so a run whose latest span was already processed is reused from the cache."""
    from tfx.components.example_gen import utils
    from tfx.proto import example_gen_pb2

    pattern = options.source
    found = [i for i in (pattern.find(spec) for spec in SPAN_SPECS) if i >= 0]
    if not found:
        return options
    # Stock globs below a base folder; the base is what comes before the first spec.
    base = os.path.dirname(pattern[:min(found)])
    split = example_gen_pb2.Input.Split(name="source", pattern=os.path.relpath(pattern, base))
    try:
        fingerprint, span, version = utils.calculate_splits_fingerprint_span_and_version(
            base, [split])
    except ValueError as error:
        raise ValueError(f"{pattern}: {error}") from None
    return dataclasses.replace(options, source=os.path.join(base, split.pattern), span=span,
                               version=version, source_fingerprint=fingerprint)
