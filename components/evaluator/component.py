"""The Evaluators: `Evaluator` (ours: TFMA's metrics, slices and validation without Beam) and
`StockEvaluator` (stock TFX's, TFMA on Beam). Both have stock's inputs, outputs and
parameters, so either is a drop-in for the other, and both take a ProductionModel holding no
model yet as "no baseline"."""
from __future__ import annotations

from typing import Any, Optional

import tensorflow_model_analysis as tfma
from tfx import types
from tfx.components.evaluator import component as stock
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ExecutionParameter
from tfx.utils import json_utils

from components.evaluator import executor, stock_executor
from components.evaluator.executor import TRANSFORMED_EXAMPLES_KEY
from components.evaluator.options import EvaluatorOptions
from tfrecord_shards.options import OPTIONS_KEY, options_or_settings


class EvaluatorSpec(standard_component_specs.EvaluatorSpec):
    """Stock's Evaluator spec, and our options."""

    PARAMETERS = {**standard_component_specs.EvaluatorSpec.PARAMETERS,
                  OPTIONS_KEY: ExecutionParameter(type=str, optional=True)}
    INPUTS = {**standard_component_specs.EvaluatorSpec.INPUTS,
              TRANSFORMED_EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples,
                                                         optional=True)}


class Evaluator(base_component.BaseComponent):
    """Evaluates a model (and a baseline) on the eval split as stock's Evaluator does, with
    the same outputs: a ModelEvaluation that `tfma.load_eval_result`, `load_metrics` and
    `load_validation_result` read, and a ModelBlessing that stock's Pusher reads. It scores
    the raw examples through the model's own signatures in large batches and computes the
    configured TFMA metrics on whole arrays (components/evaluator/evaluate.py): in the
    executor's process by default, as a Beam pipeline on the pipeline's Beam runner when that
    is not the DirectRunner in process (components/evaluator/beam_job.py). Given Transform's
    `transformed_examples` of the same rows, it scores those through the model's layers after
    the Transform graph instead, checked against serving_default on the first rows
    (components/evaluator/transformed.py). What it does not implement (plots, example
    weights, confidence intervals, UDF modules, ...) is refused in one line naming
    StockEvaluator."""

    SPEC_CLASS = EvaluatorSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, examples: types.BaseChannel, model: types.BaseChannel,
                 baseline_model: Optional[types.BaseChannel] = None,
                 eval_config: Optional[tfma.EvalConfig] = None,
                 example_splits: Optional[list[str]] = None,
                 schema: Optional[types.BaseChannel] = None,
                 transformed_examples: Optional[types.BaseChannel] = None,
                 options: Optional[EvaluatorOptions] = None, **settings: Any):
        if eval_config is None:
            raise ValueError("the Evaluator needs an eval_config")
        options = options_or_settings(EvaluatorOptions, options, settings)
        super().__init__(spec=EvaluatorSpec(
            examples=examples, model=model, baseline_model=baseline_model,
            eval_config=eval_config, example_splits=json_utils.dumps(example_splits),
            schema=schema, transformed_examples=transformed_examples,
            evaluation=types.Channel(type=standard_artifacts.ModelEvaluation),
            blessing=types.Channel(type=standard_artifacts.ModelBlessing),
            **{OPTIONS_KEY: options.to_json()}))


class StockEvaluator(stock.Evaluator):
    """Stock TFX's Evaluator (same inputs, outputs and parameters; its outputs read by stock
    components), whose baseline may be a ProductionModel that holds no model yet."""

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(stock_executor.Executor)
