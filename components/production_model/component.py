"""The ProductionModel TFX component: its spec and parameters."""
from __future__ import annotations

from typing import Any, Optional

from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import channel_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from tfrecord_shards.options import OPTIONS_KEY, options_or_settings
from components.production_model import executor
from components.production_model.options import ProductionModelOptions

SERVING_STATE = "serving_state"


class ProductionModelSpec(ComponentSpec):
    PARAMETERS = {OPTIONS_KEY: ExecutionParameter(type=str),
                  SERVING_STATE: ExecutionParameter(type=str)}
    INPUTS = {}
    OUTPUTS = {"model": ChannelParameter(type=standard_artifacts.Model)}


class ProductionModel(base_component.BaseComponent):
    """The model the Pusher last pushed to `serving_dir`, as a standard Model artifact: the
    Evaluator's `baseline_model` and the Trainer's `base_model`.

    It stands where TFX's `latest_blessed_model_resolver` stood. That resolver compiles into
    two `resolver` tasks that only Vertex's ML Metadata answers; open-source Kubeflow
    Pipelines cannot run them. This step is an ordinary container task, so one compiled
    pipeline runs on both. The Pusher pushes exactly the blessed models, so the newest push is
    the latest blessed model the resolver would find, read from where serving reads it.
    """

    SPEC_CLASS = ProductionModelSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, options: Optional[ProductionModelOptions] = None,
                 serving_state: Optional[str] = None, **settings: Any):
        """`serving_state`: `find.serving_state` of the serving folder when the pipeline is
        built for a run now (LocalDagRunner), so that a new push reruns the cached step; None
        where it is built to run later (a compiled pipeline, whose step is never cached)."""
        options = options_or_settings(ProductionModelOptions, options, settings)
        super().__init__(spec=ProductionModelSpec(
            model=channel_utils.as_channel([standard_artifacts.Model()]),
            **{OPTIONS_KEY: options.to_json(), SERVING_STATE: serving_state or ""}))
