"""What an eval config asks of the fast Evaluator: the TFMA settings it refuses
(`check_config`), the metric keys TFMA outputs and each key's metric (`metric_keys`), and the
columns it slices on (`slicing_columns`)."""
from __future__ import annotations

from typing import Any

from tensorflow_model_analysis.metrics import metric_specs, metric_types

from components.evaluator import kinds
from components.evaluator.options import UnsupportedSetting

# The model types TFMA loads as Keras models.
KERAS_TYPES = ("tf_keras", "tf2")


def check_config(eval_config: Any) -> None:
    """Refuses, in one line each, the TFMA settings this evaluator does not implement."""
    def refuse(what: str) -> None:
        raise UnsupportedSetting(f"the fast Evaluator does not support {what}; use "
                                f"StockEvaluator (TFMA on Beam) for it")

    if len(eval_config.model_specs) > 2:
        refuse("more than two models")
    for spec in eval_config.model_specs:
        if spec.model_type and spec.model_type not in (*KERAS_TYPES, "tf_generic"):
            refuse(f"model_type {spec.model_type!r}")
        if spec.example_weight_key or spec.example_weight_keys:
            refuse("example weights")
        if spec.label_keys or spec.prediction_keys:
            refuse("multi-output models (label_keys, prediction_keys)")
    for spec in eval_config.metrics_specs:
        if spec.query_key:
            refuse("query_key")
        if spec.HasField("aggregate"):
            refuse("aggregate (micro and macro averages)")
        if spec.output_names and list(spec.output_names) != [""]:
            refuse("output_names")
        if spec.HasField("binarize") and (spec.binarize.k_list.values or
                                          spec.binarize.top_k_list.values):
            refuse("binarize by k or top k")
        if spec.example_weights.weighted:
            refuse("example-weighted metrics")
        for metric in spec.metrics:
            if metric.per_slice_thresholds or metric.cross_slice_thresholds:
                refuse("per-slice and cross-slice thresholds")
        if spec.per_slice_thresholds or spec.cross_slice_thresholds:
            refuse("per-slice and cross-slice thresholds")
    if eval_config.cross_slicing_specs:
        refuse("cross_slicing_specs")
    for spec in eval_config.slicing_specs:
        if spec.slice_keys_sql:
            refuse("slice_keys_sql")
    options = eval_config.options
    if options.compute_confidence_intervals.value:
        refuse("confidence intervals")
    if options.min_slice_size.value:
        refuse("min_slice_size")


def metric_keys(eval_config: Any) -> tuple[list, dict]:
    """The metric keys TFMA outputs for the config's metrics specs (its own
    `to_computations`, private keys left out) and each key name's metric instance."""
    computations = metric_specs.to_computations(eval_config.metrics_specs,
                                                eval_config=eval_config)
    keys = []
    for computation in computations:
        for key in computation.keys:
            if isinstance(key, metric_types.PlotKey):
                if key.name.startswith("_"):
                    continue
                raise UnsupportedSetting(f"plots ({key.name}); the fast Evaluator computes "
                                        f"metrics only, StockEvaluator plots too")
            if not key.name.startswith("_") and key not in keys:
                keys.append(key)
    instances = {}
    for _, _, instance in metric_specs.keys_and_metrics_from_specs(
            eval_config, eval_config.metrics_specs):
        instances[instance.name] = instance
    for key in keys:
        if key.name not in instances:
            raise UnsupportedSetting(f"the metric key {key.name!r}, which no configured metric "
                                    f"names")
        kinds.check_supported(instances[key.name])
    return keys, instances


def slicing_columns(eval_config: Any) -> list[str]:
    names = []
    for spec in eval_config.slicing_specs:
        for name in list(spec.feature_keys) + list(spec.feature_values):
            if name not in names:
                names.append(name)
    return names
