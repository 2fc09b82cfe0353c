"""StockEvaluator's executor: stock's, with a baseline that holds no model dropped first."""
from __future__ import annotations

import logging
from typing import Any

from tfx.components.evaluator import executor as stock
from tfx.types import standard_component_specs

from components.production_model.executor import has_model


class Executor(stock.Executor):
    """Before the first push, ProductionModel's artifact is an empty folder. Stock's executor
    treats a given baseline as a model; without one it drops the eval config's baseline and
    its change thresholds (rubber stamp), as it does when TFX's resolver finds nothing."""

    def Do(self, input_dict: dict[str, list], output_dict: dict[str, list],
           exec_properties: dict[str, Any]) -> None:
        super().Do(without_empty_baseline(input_dict), output_dict, exec_properties)


def without_empty_baseline(input_dict: dict[str, list]) -> dict[str, list]:
    """`input_dict` without its baseline model when that is a ProductionModel holding no
    model yet."""
    key = standard_component_specs.BASELINE_MODEL_KEY
    baselines = input_dict.get(key) or []
    if baselines and not all(has_model(artifact.uri) for artifact in baselines):
        logging.info("Evaluator: no production model yet, so no baseline to compare with")
        return {name: value for name, value in input_dict.items() if name != key}
    return input_dict
