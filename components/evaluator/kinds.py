"""Which of our computations gives a TFMA metric's value (`metric_kind`): a count, TFMA's
confusion-matrix metrics, a mean regression error, a calibration metric, or a Keras metric
or loss named in the config; any other metric is refused in one line (`check_supported`)."""
from __future__ import annotations

from typing import Any, Optional

from tensorflow_model_analysis.metrics import (calibration, confusion_matrix_metrics,
                                               example_count, mean_regression_error,
                                               weighted_example_count)
from tensorflow_model_analysis.utils.keras_lib import tf_keras

from components.evaluator.options import UnsupportedSetting


def _tfma_kinds() -> dict:
    return {
        example_count.ExampleCount: ("count", None),
        weighted_example_count.WeightedExampleCount: ("count", None),
        mean_regression_error.MeanSquaredError: ("regression", "squared"),
        mean_regression_error.MeanAbsoluteError: ("regression", "absolute"),
        mean_regression_error.MeanAbsolutePercentageError: ("regression",
                                                            "absolute_percentage"),
        mean_regression_error.MeanSquaredLogarithmicError: ("regression",
                                                            "squared_logarithmic"),
        calibration.MeanLabel: ("calibration", "mean_label"),
        calibration.MeanPrediction: ("calibration", "mean_prediction"),
        calibration.Calibration: ("calibration", "calibration"),
    }


def check_supported(instance: Any) -> None:
    """Raises UnsupportedSetting for a metric the fast Evaluator does not compute."""
    metric_kind(instance)


def metric_kind(instance: Any) -> tuple[str, Optional[str]]:
    """(kind, detail): "count", "confusion", "regression" (and which error), "calibration"
    (and which ratio) or "keras"."""
    kind = _tfma_kinds().get(type(instance))
    if kind:
        return kind
    if isinstance(instance, confusion_matrix_metrics.ConfusionMatrixMetricBase):
        return "confusion", None
    if isinstance(instance, (tf_keras.metrics.Metric, tf_keras.losses.Loss)):
        # TFMA computes these Keras classes from its own confusion matrices, not Keras's.
        confusion = (tf_keras.metrics.AUC, tf_keras.metrics.SpecificityAtSensitivity,
                     tf_keras.metrics.SensitivityAtSpecificity, tf_keras.metrics.TruePositives,
                     tf_keras.metrics.FalsePositives, tf_keras.metrics.TrueNegatives,
                     tf_keras.metrics.FalseNegatives, tf_keras.metrics.Precision,
                     tf_keras.metrics.Recall)
        if type(instance) in confusion:
            raise UnsupportedSetting(
                f"{instance.name}: the Keras class {type(instance).__name__}; name TFMA's "
                f"class of the same name (no module) instead")
        return "keras", None
    raise UnsupportedSetting(f"{type(instance).__name__} ({instance.name})")


def is_keras(instance: Any) -> bool:
    """Whether a Keras metric or loss named in the config (`KerasRunner` runs it)."""
    return metric_kind(instance)[0] == "keras"


def check_keras_key(key: Any) -> None:
    """Refuses a Keras metric under a binarize sub key."""
    if key.sub_key:
        raise UnsupportedSetting(f"{key.name}: a Keras metric under a binarize sub key")
