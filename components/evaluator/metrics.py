"""TFMA's metrics on whole arrays of labels and predictions: the sufficient statistics (counts
at thresholds, the calibration histogram, sums of errors) in one vectorised pass a slice,
where TFMA makes a Python step a row, and TFMA's own code for everything after them.

What is ours is the counting, written to match TFMA 0.47.1 step for step:
- a row's label and prediction become binary pairs as `metric_util.
  to_label_prediction_example_weight(flatten=True, fractional_labels=True)` makes them (a
  class id's one-vs-rest pair under a `binarize` sub key; every class of a multiclass row
  otherwise), each pair weighing (1 - label) as a negative and label as a positive;
- confusion matrices at explicit thresholds count `prediction > threshold`, as
  `binary_confusion_matrices`'s combiner does;
- at `num_thresholds` (AUC's 10,000 by default) TFMA buckets predictions into the 10,002
  bins of `calibration_histogram`, rebins them onto the thresholds (`calibration_histogram.
  rebin`) and sums them into matrices (`_histogram_to_binary_confusion_matrices`); the same
  three steps here are one bincount, one searchsorted and two cumulative sums.
What is TFMA's: each metric's value from the matrices (`_metric_value` of the metric class
itself: AUC's interpolation, accuracy, precision, ...), the Keras metrics (the model's
compiled metrics and Keras classes named in the config are Keras's own objects, updated once
with the slice's arrays), and the keys (`metric_specs.to_computations`).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Optional, Sequence

import numpy as np

# TFMA's constants (binary_confusion_matrices._EPSILON, calibration_histogram's default).
EPSILON = 1e-7
HISTOGRAM_BUCKETS = 10_000


class UnsupportedSetting(ValueError):
    """A metric or TFMA setting this evaluator does not implement; StockEvaluator (TFMA on Beam)
    does."""


@dataclasses.dataclass(frozen=True)
class Scores:
    """One model's labels and predictions for the evaluated rows, as [rows, values] arrays in
    the dtypes the model and the examples gave them."""

    labels: np.ndarray
    predictions: np.ndarray

    def __post_init__(self) -> None:
        if len(self.labels) != len(self.predictions):
            raise ValueError(f"{len(self.labels)} labels for {len(self.predictions)} "
                             f"predictions")

    def take(self, rows: Optional[np.ndarray]) -> "Scores":
        """The rows `rows` (indices); all of them for None."""
        if rows is None:
            return self
        return Scores(self.labels[rows], self.predictions[rows])

    def __len__(self) -> int:
        return len(self.labels)


def _one_hot(labels: np.ndarray, classes: int) -> np.ndarray:
    """Sparse class ids [rows, 1] as [rows, classes]; an id of -1 (a label a vocabulary did
    not know) is all zeros, as `metric_util.one_hot` makes it."""
    ids = labels[:, 0].astype(np.int64)
    if np.any((ids < -1) | (ids >= classes)):
        raise ValueError(f"a class id label outside 0..{classes - 1}: "
                         f"{ids[(ids < -1) | (ids >= classes)][0]}")
    hot = np.zeros((len(ids), classes + 1))
    hot[np.arange(len(ids)), ids] = 1.0
    return hot[:, :classes]


def _is_sparse(scores: Scores) -> bool:
    return scores.labels.shape[1] == 1 and scores.predictions.shape[1] > 1


def class_scores(scores: Scores, class_id: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-row label and prediction ([rows] each) under a class id sub key (one-vs-rest), or
    as they are when each row holds one of each (TFMA's `select_class_id`)."""
    labels, predictions = scores.labels, scores.predictions
    if class_id is None:
        if labels.shape[1] != 1 or predictions.shape[1] != 1:
            raise UnsupportedSetting(
                f"a metric of one label and one prediction a row was asked of labels of "
                f"width {labels.shape[1]} and predictions of width {predictions.shape[1]}; "
                f"binarize the metrics spec by class_ids")
        return labels[:, 0], predictions[:, 0]
    if not 0 <= class_id < predictions.shape[1]:
        raise ValueError(f"class_id {class_id} out of range of predictions of width "
                         f"{predictions.shape[1]}")
    if _is_sparse(scores):
        return (labels[:, 0] == class_id).astype(np.float64), predictions[:, class_id]
    return labels[:, class_id], predictions[:, class_id]


def binary_pairs(scores: Scores, class_id: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
    """(label, prediction) pairs as `to_label_prediction_example_weight(flatten=True)` yields
    them, both float64: one a row, one a class a row for a multiclass model without a class
    id sub key (sparse labels one-hot first)."""
    if class_id is not None:
        labels, predictions = class_scores(scores, class_id)
    else:
        labels, predictions = scores.labels, scores.predictions
        if _is_sparse(scores):
            labels = _one_hot(labels, predictions.shape[1])
        if labels.shape != predictions.shape:
            raise ValueError(f"labels of width {labels.shape[1]} do not pair with "
                             f"predictions of width {predictions.shape[1]}")
    labels = np.asarray(labels, np.float64).ravel()
    predictions = np.asarray(predictions, np.float64).ravel()
    if labels.size and (labels.min() < 0 or labels.max() > 1):
        bad = labels[(labels < 0) | (labels > 1)][0]
        raise ValueError(f"a label of {bad:g}: binary classification metrics need labels "
                         f"within [0, 1]")
    return labels, predictions


@dataclasses.dataclass(frozen=True)
class Counts:
    """Weighted positives and negatives of each pair, the pairs' fractional-label split."""

    positives: np.ndarray
    negatives: np.ndarray
    predictions: np.ndarray

    @classmethod
    def of(cls, labels: np.ndarray, predictions: np.ndarray) -> "Counts":
        return cls(labels, 1.0 - labels, predictions)


def matrices_at_thresholds(counts: Counts, thresholds: Sequence[float]
                           ) -> tuple[list, list, list, list]:
    """(tp, tn, fp, fn) at each threshold, a pair predicted positive when its prediction is
    above the threshold (`binary_confusion_matrices`' combiner)."""
    tp, tn, fp, fn = [], [], [], []
    for threshold in thresholds:
        above = counts.predictions > threshold
        tp.append(float(counts.positives[above].sum()))
        fp.append(float(counts.negatives[above].sum()))
        fn.append(float(counts.positives[~above].sum()))
        tn.append(float(counts.negatives[~above].sum()))
    return tp, tn, fp, fn


def histogram_buckets(predictions: np.ndarray) -> np.ndarray:
    """Each prediction's bucket of TFMA's calibration histogram: 0 below 0, 1..10,000 for
    [0, 1) in steps of 1/10,000, 10,001 from 1 up (`_CalibrationHistogramCombiner.
    _bucket_index`, in the same float64 arithmetic)."""
    if np.isnan(predictions).any():
        raise ValueError("a prediction is NaN")
    index = predictions * float(HISTOGRAM_BUCKETS) + 1
    return np.clip(np.floor(index), 0, HISTOGRAM_BUCKETS + 1).astype(np.int64)


def matrices_from_histogram(counts: Counts, thresholds: Sequence[float]
                            ) -> tuple[list, list, list, list]:
    """(tp, tn, fp, fn) at `thresholds` through TFMA's histogram: the pairs' buckets,
    `rebin` onto the thresholds (a bucket goes to the last threshold its lower edge reaches),
    then `_histogram_to_binary_confusion_matrices` (tp and fp: sums from the threshold's bin
    up; tn and fn: sums below it)."""
    return matrices_from_buckets(*bucket_totals(counts), thresholds)


def bucket_totals(counts: Counts) -> tuple[np.ndarray, np.ndarray]:
    """The weighted positives and negatives in each of the histogram's 10,002 buckets."""
    buckets = histogram_buckets(counts.predictions)
    size = HISTOGRAM_BUCKETS + 2
    return (np.bincount(buckets, weights=counts.positives, minlength=size),
            np.bincount(buckets, weights=counts.negatives, minlength=size))


def matrices_from_buckets(positives: np.ndarray, negatives: np.ndarray,
                          thresholds: Sequence[float]) -> tuple[list, list, list, list]:
    """(tp, tn, fp, fn) at `thresholds` from the histogram's bucket totals
    (`bucket_totals`, or their sums over several parts of the rows)."""
    thresholds = list(thresholds)
    size = HISTOGRAM_BUCKETS + 2
    # A bucket's lower edge as `rebin` computes it.
    ids = np.arange(size, dtype=np.float64)
    edges = (ids - 1) / HISTOGRAM_BUCKETS * (1.0 - 0.0) + 0.0
    edges[0], edges[-1] = -np.inf, np.inf
    rebin = [t + EPSILON if t != 0 else t for t in thresholds]
    if thresholds[0] >= 0:
        rebin = [-EPSILON] + rebin
    if thresholds[-1] < 1.0:
        rebin = rebin + [1.0 + EPSILON]
    offsets = np.searchsorted(np.array(rebin[1:]), edges, side="right")
    bins = len(rebin)
    positives = np.bincount(offsets, weights=positives, minlength=bins)
    negatives = np.bincount(offsets, weights=negatives, minlength=bins)
    tp = np.cumsum(positives[::-1])[::-1]
    fp = np.cumsum(negatives[::-1])[::-1]
    fn = np.concatenate([[0.0], np.cumsum(positives)[:-1]])
    tn = np.concatenate([[0.0], np.cumsum(negatives)[:-1]])
    first = 1 if (thresholds[0] >= 0 or len(thresholds) == 1) and bins > 1 else 0
    window = slice(first, first + len(thresholds))
    tp, fp, fn, tn = (a[window].copy() for a in (tp, fp, fn, tn))
    for i, threshold in enumerate(thresholds):
        if threshold >= 1.0 + EPSILON:
            tp[i], fp[i], fn[i], tn[i] = 0.0, 0.0, tp[0], fp[0]
    return tp.tolist(), tn.tolist(), fp.tolist(), fn.tolist()


def interpolated_thresholds(count: int) -> list[float]:
    """TFMA's (and Keras AUC's) `num_thresholds` thresholds: -epsilon, 1/(n-1), ...,
    (n-2)/(n-1), 1 + epsilon."""
    return list(_interpolated_thresholds(count))


@functools.lru_cache(maxsize=16)
def _interpolated_thresholds(count: int) -> tuple[float, ...]:
    # Made once a count: a metric's thresholds are asked for each time its statistics and
    # its value are, a slice and model at a time.
    inner = [(i + 1) * 1.0 / (count - 1) for i in range(count - 2)]
    return (-EPSILON, *inner, 1.0 + EPSILON)


def matrix_thresholds(instance: Any) -> tuple[list[float], bool]:
    """The thresholds a TFMA confusion-matrix metric is computed at and whether TFMA takes
    them from the histogram: `ConfusionMatrixMetricBase._metric_computations`' defaults,
    then `binary_confusion_matrices`' choice."""
    kwargs = instance.kwargs
    if kwargs.get("top_k") is not None or kwargs.get("class_id") is not None:
        raise UnsupportedSetting(f"{instance.name}: top_k and class_id on the metric itself; "
                                f"give class ids in the metrics spec's binarize instead")
    thresholds, num_thresholds = kwargs.get("thresholds"), kwargs.get("num_thresholds")
    if num_thresholds is None and thresholds is None:
        default = instance._default_threshold()  # noqa: SLF001 - TFMA's own default
        if default is not None:
            thresholds = [default]
    if isinstance(thresholds, (int, float)):
        thresholds = [float(thresholds)]
    if thresholds:
        if not num_thresholds and thresholds == interpolated_thresholds(len(thresholds)):
            num_thresholds, thresholds = len(thresholds), None
        elif num_thresholds in (HISTOGRAM_BUCKETS, 200) and \
                len(thresholds) == num_thresholds - 2:
            thresholds = None
    if num_thresholds is None and thresholds is None:
        num_thresholds = HISTOGRAM_BUCKETS
    if num_thresholds is not None:
        if num_thresholds <= 1:
            raise ValueError(f"{instance.name}: num_thresholds must be > 1")
        return interpolated_thresholds(num_thresholds), True
    thresholds = list(thresholds)
    if len(thresholds) == 1 and thresholds[0] < 0:
        # TFMA counts this case on a one-bucket histogram of its own (top k).
        raise UnsupportedSetting(f"{instance.name}: a single negative threshold")
    return thresholds, False


def confusion_matrix_value(instance: Any, key: Any, scores: Scores) -> Any:
    """A TFMA confusion-matrix metric (AUC, BinaryAccuracy, Precision, ...): our matrices,
    the class's own formula."""
    return statistics_value(instance, key, metric_statistics(instance, key, scores))


def _confusion_value(instance: Any, key: Any, thresholds: Sequence[float],
                     matrices: Sequence[Sequence[float]]) -> Any:
    """The class's own formula on (tp, tn, fp, fn) at `thresholds`."""
    from tensorflow_model_analysis.metrics import binary_confusion_matrices

    tp, tn, fp, fn = (list(map(float, values)) for values in matrices)
    matrices = binary_confusion_matrices.Matrices(list(thresholds), tp, tn, fp, fn)
    extra = {name: value for name, value in instance.kwargs.items()
             if name not in ("thresholds", "num_thresholds", "top_k", "class_id", "name")}
    # A slice of one class gives TFMA's formulas 0/0, which they turn into NaN or 0 as TFMA
    # reports them; numpy's warnings about it say nothing more.
    with np.errstate(divide="ignore", invalid="ignore"):
        return instance._metric_value(key=key, matrices=matrices, **extra)  # noqa: SLF001


def _class_id(key: Any) -> Optional[int]:
    if key.sub_key and (key.sub_key.top_k is not None or key.sub_key.k is not None):
        raise UnsupportedSetting(f"{key.name}: top_k and k sub keys")
    return key.sub_key.class_id if key.sub_key else None


def _scalar_pairs(scores: Scores, key: Any) -> tuple[np.ndarray, np.ndarray]:
    return class_scores(scores, key.sub_key.class_id if key.sub_key else None)


def regression_error(kind: str, scores: Scores, key: Any) -> float:
    """TFMA's mean regression errors: the mean over rows of each row's error, rows whose
    error is NaN left out (mean_regression_error.py), the error taken in the arrays' own
    dtype as TFMA takes it."""
    return _regression_mean(_regression_sums(kind, scores, key))


def _regression_sums(kind: str, scores: Scores, key: Any) -> np.ndarray:
    """[sum of the rows' errors, rows], rows whose error is NaN left out."""
    if kind == "squared":
        difference = scores.labels - scores.predictions
        errors = np.sum(np.square(difference), axis=1)
    else:
        labels, predictions = _scalar_pairs(scores, key)
        if kind == "absolute":
            errors = np.absolute(labels - predictions)
        elif kind == "absolute_percentage":
            with np.errstate(divide="ignore", invalid="ignore"):
                errors = 100 * np.absolute((labels - predictions) / labels)
            errors = np.where(labels == 0, np.nan, errors)
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                errors = np.square(np.log(labels + 1) - np.log(predictions + 1))
    errors = np.asarray(errors, np.float64)
    kept = errors[~np.isnan(errors)]
    return np.array([kept.sum(), float(len(kept))])


def _regression_mean(sums: np.ndarray) -> float:
    total, rows = sums
    return float(total / rows) if rows else float("nan")


def calibration_value(kind: str, scores: Scores, key: Any) -> float:
    """MeanLabel, MeanPrediction and Calibration (TFMA's calibration.py): sums of labels,
    predictions and rows."""
    return _calibration_ratio(kind, _calibration_sums(scores, key))


def _calibration_sums(scores: Scores, key: Any) -> np.ndarray:
    """[sum of labels, sum of predictions, rows]."""
    labels, predictions = _scalar_pairs(scores, key)
    labels = np.asarray(labels, np.float64)
    predictions = np.asarray(predictions, np.float64)
    return np.array([labels.sum(), predictions.sum(), float(len(labels))])


def _calibration_ratio(kind: str, sums: np.ndarray) -> float:
    labels, predictions, rows = sums
    if kind == "calibration":
        return float("nan") if np.isclose(labels, 0.0) else float(predictions / labels)
    if np.isclose(rows, 0.0):
        return float("nan")
    return float((labels if kind == "mean_label" else predictions) / rows)


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
        from tensorflow_model_analysis.utils.keras_lib import tf_keras

        if isinstance(instance, tf_keras.losses.Loss):
            instance = tf_keras.metrics.MeanMetricWrapper(instance, name=instance.name)
        return cls([instance], instance.update_state)

    @classmethod
    def of_compiled(cls, model: Any) -> "KerasRunner":
        """A Keras model's compiled metrics and loss, every row weighing 1, as TFMA's
        `_KerasCompiledMetricsCombiner` updates them."""
        import tensorflow as tf

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
        import tensorflow as tf

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
        import tensorflow as tf

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
        import tensorflow as tf

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
    from tensorflow_model_analysis.utils.keras_lib import tf_keras

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


def _tfma_kinds() -> dict:
    from tensorflow_model_analysis.metrics import (calibration, example_count,
                                                   mean_regression_error,
                                                   weighted_example_count)

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
    """Raises UnsupportedSetting for a metric this module does not compute."""
    _kind(instance)


def _kind(instance: Any) -> tuple[str, Optional[str]]:
    from tensorflow_model_analysis.metrics import confusion_matrix_metrics

    from tensorflow_model_analysis.utils.keras_lib import tf_keras

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


def metric_value(instance: Any, key: Any, scores: Scores,
                 keras: Optional[KerasRunner] = None) -> Any:
    """The value of TFMA metric key `key`, of metric `instance` (a TFMA metric, or a Keras
    metric or loss named in the config, run by `keras`), on `scores`."""
    if _kind(instance)[0] == "keras":
        _check_keras_key(key)
        (value,) = (keras or KerasRunner.of_metric(instance))(scores)
        return value
    return statistics_value(instance, key, metric_statistics(instance, key, scores))


def _check_keras_key(key: Any) -> None:
    if key.sub_key:
        raise UnsupportedSetting(f"{key.name}: a Keras metric under a binarize sub key")


# --- sufficient statistics: a metric's value from parts of the rows ---------------------------
# What each metric's value is computed from, as sums over the rows: the rows; a class's
# weighted positives and negatives in each bucket of the calibration histogram (AUC and
# every metric at num_thresholds), or the confusion matrices at explicit thresholds; the sum
# of errors and the rows that have one; the sums of labels and predictions; Keras metrics'
# variables. `metric_statistics` takes them from some rows of a slice, `merge_statistics`
# adds those of several parts (in any order and grouping: sums), `statistics_value` computes
# the metric from them, with the same code the in-process path runs on a whole slice.
@dataclasses.dataclass(frozen=True)
class BucketCounts:
    """A class's weighted positives and negatives in the histogram's buckets, the buckets
    holding a prediction only (a slice of a shard fills few of the 10,002)."""

    ids: np.ndarray  # sorted bucket ids
    positives: np.ndarray
    negatives: np.ndarray

    @classmethod
    def of(cls, counts: Counts) -> "BucketCounts":
        positives, negatives = bucket_totals(counts)
        # Every pair weighs 1 in all (label + 1 - label), so a bucket holding one is not 0.
        ids = np.flatnonzero((positives != 0) | (negatives != 0))
        return cls(ids, positives[ids], negatives[ids])

    def __add__(self, other: "BucketCounts") -> "BucketCounts":
        ids, inverse = np.unique(np.concatenate([self.ids, other.ids]), return_inverse=True)
        inverse = inverse.ravel()
        add = lambda a, b: np.bincount(inverse, weights=np.concatenate([a, b]),  # noqa: E731
                                       minlength=len(ids))
        return BucketCounts(ids, add(self.positives, other.positives),
                            add(self.negatives, other.negatives))

    def totals(self) -> tuple[np.ndarray, np.ndarray]:
        size = HISTOGRAM_BUCKETS + 2
        positives, negatives = np.zeros(size), np.zeros(size)
        positives[self.ids], negatives[self.ids] = self.positives, self.negatives
        return positives, negatives


def statistic_id(instance: Any, key: Any) -> tuple:
    """What the value of `key` (of metric `instance`) is computed from, as a key of the
    statistics: metrics that need the same share it (AUC, Precision and Recall at
    num_thresholds, one histogram a model and class)."""
    kind, detail = _kind(instance)
    if kind == "count":
        return ("rows",)
    if kind == "confusion":
        class_id = _class_id(key)
        thresholds, from_histogram = matrix_thresholds(instance)
        if from_histogram:
            return ("buckets", key.model_name, class_id)
        return ("matrices", key.model_name, class_id, tuple(thresholds))
    if kind == "regression":
        return ("errors", key.model_name, detail, _class_id(key))
    if kind == "calibration":
        return ("sums", key.model_name, _class_id(key))
    _check_keras_key(key)
    return ("keras", key.model_name, key.name)


def metric_statistics(instance: Any, key: Any, scores: Scores,
                      keras: Optional[KerasRunner] = None) -> dict:
    """{statistic_id: statistics} of `key` on `scores` (some or all of a slice's rows);
    `keras`: the runner of a Keras metric named in the config."""
    found_id = statistic_id(instance, key)
    kind, detail = _kind(instance)
    if kind == "count":
        value: Any = float(len(scores))
    elif kind == "confusion":
        counts = Counts.of(*binary_pairs(scores, found_id[2]))
        if found_id[0] == "buckets":
            value = BucketCounts.of(counts)
        else:
            value = np.array(matrices_at_thresholds(counts, found_id[3]))
    elif kind == "regression":
        value = _regression_sums(detail, scores, key)
    elif kind == "calibration":
        value = _calibration_sums(scores, key)
    else:
        value = (keras or KerasRunner.of_metric(instance)).state(scores)
    return {found_id: value}


def merge_statistics(parts: Sequence[dict]) -> dict:
    """The statistics of several parts of a slice's rows, added up: every part's
    statistics by id (a part may lack ids another has: no row of a model's class, say,
    never happens, but a part only holds what was asked of it). The parts are not
    changed."""
    merged: dict = {}
    for part in parts:
        for found_id, value in part.items():
            merged[found_id] = merged[found_id] + value if found_id in merged else value
    return merged


def statistics_value(instance: Any, key: Any, statistics: dict,
                     keras: Optional[KerasRunner] = None) -> Any:
    """The value of `key` (of metric `instance`) from a slice's statistics."""
    found_id = statistic_id(instance, key)
    value = statistics[found_id]
    kind, detail = _kind(instance)
    if kind == "count":
        return np.float64(value)
    if kind == "confusion":
        thresholds, _ = matrix_thresholds(instance)
        matrices = matrices_from_buckets(*value.totals(), thresholds) \
            if found_id[0] == "buckets" else value
        return _confusion_value(instance, key, thresholds, matrices)
    if kind == "regression":
        return _regression_mean(value)
    if kind == "calibration":
        return _calibration_ratio(detail, value)
    (result,) = (keras or KerasRunner.of_metric(instance)).results(value)
    return result


def is_keras(instance: Any) -> bool:
    return _kind(instance)[0] == "keras"


def compiled_metric_keys(model: Any, model_name: str) -> list:
    """The keys TFMA gives a Keras model's compiled metrics and loss (keras_util.
    _metric_keys): the metric's own name, no example_weighted, a class id or top k of its
    own as the sub key."""
    from tensorflow_model_analysis.metrics import metric_types

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


def is_diffable(value: Any) -> bool:
    """Whether TFMA takes a candidate-minus-baseline diff of the value (numbers and numeric
    arrays)."""
    import numbers

    return isinstance(value, numbers.Number) or (
        isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.number))
