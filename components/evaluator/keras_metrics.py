"""Keras metrics on a slice's arrays: the Keras metrics and losses named in the config and a
Keras model's compiled metrics and loss, Keras's own objects run by `KerasRunner`; their
variables as a state that adds up over parts of the rows (`KerasState`), for the Keras
classes whose state is sums (`is_additive`); and the keys TFMA gives compiled metrics."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow_model_analysis.metrics import metric_types
from tensorflow_model_analysis.utils.keras_lib import tf_keras

from components.evaluator.options import UnsupportedSetting
from components.evaluator.scores import Scores


class KerasRunner:
    """Keras metrics reset, updated with a slice's arrays and read in one call: Keras's own
    objects, so Keras's own arithmetic (TFMA updates them batch by batch and adds the states
    up: the same sums). The call is a graph traced once, without AutoGraph (converting Keras's
    update code with it takes seconds), about 1 ms a slice where eager Keras takes 25; eager,
    op by op, if Keras's code does not trace so."""

    def __init__(self, metrics: Sequence[Any], update: Callable[[Any, Any], None]):
        self.metrics, self.update = list(metrics), update
        self._graphs: dict[str, Callable] = {}
        self._eager = False

    @classmethod
    def of_metric(cls, instance: Any) -> "KerasRunner":
        """A Keras metric or loss named in the config (a loss as the mean of its per-row
        values, as TFMA's `_LossMetric` takes it)."""
        if isinstance(instance, tf_keras.losses.Loss):
            instance = tf_keras.metrics.MeanMetricWrapper(instance, name=instance.name)
        return cls([instance], instance.update_state)

    @classmethod
    def of_compiled(cls, model: Any) -> "KerasRunner":
        """A Keras model's compiled metrics and loss, every row weighing 1, as TFMA's
        `_KerasCompiledMetricsCombiner` updates them."""
        def update(labels: Any, predictions: Any) -> None:
            weights = tf.ones([tf.shape(predictions)[0], 1], tf.float32)
            model.compiled_metrics.update_state(labels, predictions, sample_weight=weights)
            model.compiled_loss(labels, predictions, sample_weight=weights)

        return cls(compiled_metrics(model), update)

    def _run(self, labels: Any, predictions: Any) -> list:
        for metric in self.metrics:
            metric.reset_state()
        self.update(labels, predictions)
        return [metric.result() for metric in self.metrics]

    def _state(self, labels: Any, predictions: Any) -> list:
        for metric in self.metrics:
            metric.reset_state()
        self.update(labels, predictions)
        return [[tf.identity(variable) for variable in metric.variables]
                for metric in self.metrics]

    def __call__(self, scores: Scores) -> list:
        """Each metric's value on `scores`."""
        return [value.numpy() for value in self._traced(self._run, scores)]

    def state(self, scores: Scores) -> "KerasState":
        """Each metric's variables after an update with `scores` alone: sums (see
        `check_additive`), so the states of parts of a slice's rows add up to the state of
        all of them."""
        values = self._traced(self._state, scores)
        return KerasState(
            (scores.labels.dtype.str, scores.labels.shape[1]),
            (scores.predictions.dtype.str, scores.predictions.shape[1]),
            tuple(tuple(value.numpy() for value in metric) for metric in values))

    def results(self, state: "KerasState") -> list:
        """Each metric's value from a state (`state`, or several added): the variables set
        to it, then Keras's own `result()`."""
        if any(len(metric.variables) != len(values)
               for metric, values in zip(self.metrics, state.values)):
            # Variables some metrics make on their first update (R2Score's), made by one
            # with no rows.
            empty = [tf.zeros([0, width], dtype) for dtype, width in (state.labels,
                                                                      state.predictions)]
            tf.autograph.experimental.do_not_convert(self._run)(*empty)
        found = []
        for metric, values in zip(self.metrics, state.values):
            if len(metric.variables) != len(values):
                raise ValueError(f"{metric.name}: {len(metric.variables)} variables against "
                                 f"a state of {len(values)}")
            for variable, value in zip(metric.variables, values):
                variable.assign(value)
            found.append(metric.result().numpy())
        return found

    def check_additive(self) -> None:
        """Refuses, in one line naming it, a metric whose variables are not all sums over
        the rows, which `state` could not split over parts of them: the Keras classes
        listed in `ADDITIVE_KERAS` whose updating and reading are Keras's own."""
        for metric in self.metrics:
            if not is_additive(metric):
                raise UnsupportedSetting(
                    f"{metric.name} ({type(metric).__module__}.{type(metric).__name__}): "
                    f"a Keras metric whose state does not add up over parts of the rows; "
                    f"the Evaluator on Beam merges the parts' states, so evaluate it with "
                    f"the local runner or StockEvaluator")

    def _traced(self, function: Callable, scores: Scores) -> Any:
        """`function` as a graph traced once; eagerly if Keras's code does not trace."""
        labels, predictions = tf.constant(scores.labels), tf.constant(scores.predictions)
        graph = self._graphs.get(function.__name__)
        if graph is not None and not self._eager:
            try:
                return graph(labels, predictions)
            except (TypeError, ValueError, NotImplementedError,
                    tf.errors.OperatorNotAllowedInGraphError) as e:
                logging.info("Evaluator: Keras metrics %s run eagerly (%s)",
                             [m.name for m in self.metrics], e)
                self._eager = True
        values = tf.autograph.experimental.do_not_convert(function)(labels, predictions)
        if graph is None:
            # Traced after a first eager run, which makes the variables some metrics make
            # on their first update (R2Score's): the graph then resets every one of them.
            self._graphs[function.__name__] = tf.function(
                function, autograph=False, input_signature=[
                    tf.TensorSpec([None, labels.shape[1]], labels.dtype),
                    tf.TensorSpec([None, predictions.shape[1]], predictions.dtype)])
        return values


def _additive_keras() -> tuple:
    """Keras metric classes whose variables are all sums over the rows (totals and counts,
    counts at thresholds, confusion matrices, sums of squares): merged by adding them, as
    TFMA merges Keras metrics' weights."""
    m = tf_keras.metrics
    return (m.Mean, m.Sum, m.MeanTensor, m.AUC, m.Precision, m.Recall, m.TruePositives,
            m.FalsePositives, m.TrueNegatives, m.FalseNegatives,
            m.SensitivityAtSpecificity, m.SpecificityAtSensitivity, m.PrecisionAtRecall,
            m.RecallAtPrecision, m.IoU, m.BinaryIoU, m.MeanIoU, m.OneHotIoU, m.OneHotMeanIoU,
            m.R2Score, m.FBetaScore)


def is_additive(metric: Any) -> bool:
    """Whether a Keras metric's state is sums over the rows: an instance of a class of
    `_additive_keras`, updated, read and reset by Keras's own code (a subclass of ours that
    overrides any of them may keep something else, a maximum say)."""
    if not isinstance(metric, _additive_keras()):
        return False
    for name in ("update_state", "result", "reset_state"):
        owner = next((c for c in type(metric).__mro__ if name in vars(c)), None)
        if owner is None or owner.__module__.split(".")[0] not in ("tf_keras", "keras"):
            return False
    return True


@dataclasses.dataclass(frozen=True)
class KerasState:
    """Keras metrics' variables after updates with some rows (KerasRunner.state), and the
    dtype and width of the labels and predictions they were updated with."""

    labels: tuple
    predictions: tuple
    values: tuple  # per metric, per variable: numpy arrays

    def __add__(self, other: "KerasState") -> "KerasState":
        return KerasState(self.labels, self.predictions, tuple(
            tuple(_add(a, b) for a, b in zip(mine, theirs))
            for mine, theirs in zip(self.values, other.values)))


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sums of floats in float64, whatever the variables' own dtype (float32 sums of parts
    added in float32 would depend on the order they are added in); counts as they are."""
    a, b = np.asarray(a), np.asarray(b)
    if np.issubdtype(a.dtype, np.floating) or np.issubdtype(b.dtype, np.floating):
        return np.add(a, b, dtype=np.float64)
    return a + b


def compiled_metric_keys(model: Any, model_name: str) -> list:
    """The keys TFMA gives a Keras model's compiled metrics and loss (keras_util.
    _metric_keys): the metric's own name, no example_weighted, a class id or top k of its
    own as the sub key."""
    outputs = list(getattr(model, "output_names", None) or [])
    keys = []
    for metric in compiled_metrics(model):
        sub_key = None
        if getattr(metric, "class_id", None) is not None:
            sub_key = metric_types.SubKey(class_id=metric.class_id)
        elif getattr(metric, "top_k", None) is not None:
            sub_key = metric_types.SubKey(top_k=metric.top_k)
        for output in outputs:
            if metric.name.startswith(output + "_"):
                raise UnsupportedSetting(f"{metric.name}: a compiled metric of one output "
                                        f"of a multi-output model")
        keys.append(metric_types.MetricKey(name=metric.name, model_name=model_name,
                                           sub_key=sub_key, example_weighted=None))
    return keys


def compiled_metrics(model: Any) -> list:
    """The model's compiled metrics, then its compiled loss's, in TFMA's order; empty when
    the model has none or adds metrics TFMA would need `model.evaluate` for."""
    if not getattr(model, "metrics", None):
        return []
    compiled, loss = getattr(model, "compiled_metrics", None), \
        getattr(model, "compiled_loss", None)
    if not (compiled and loss and
            len(compiled.metrics) + len(loss.metrics) == len(model.metrics)):
        raise UnsupportedSetting("a Keras model whose metrics are not all compiled ones "
                                "(TFMA runs model.evaluate for those)")
    return list(compiled.metrics) + list(loss.metrics)
