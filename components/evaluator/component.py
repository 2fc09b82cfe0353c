"""The Evaluator: stock TFX's component and spec, run by our executor."""
from __future__ import annotations

from tfx import v1 as tfx
from tfx.dsl.components.base import executor_spec

from components.evaluator import executor


class Evaluator(tfx.components.Evaluator):
    """Stock TFX's Evaluator (same inputs, outputs and parameters; its outputs read by stock
    components), whose baseline may be a ProductionModel that holds no model yet."""

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)
