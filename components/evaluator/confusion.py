"""Confusion matrices as TFMA counts them, on whole arrays in one vectorised pass a slice
where TFMA makes a Python step a row, written to match TFMA 0.47.1 step for step:
- each binary pair (`scores.binary_pairs`) weighs (1 - label) as a negative and label as a
  positive (`Counts`);
- confusion matrices at explicit thresholds count `prediction > threshold`, as
  `binary_confusion_matrices`'s combiner does (`matrices_at_thresholds`);
- at `num_thresholds` (AUC's 10,000 by default) TFMA buckets predictions into the 10,002
  bins of `calibration_histogram`, rebins them onto the thresholds (`calibration_histogram.
  rebin`) and sums them into matrices (`_histogram_to_binary_confusion_matrices`); the same
  three steps here are one bincount, one searchsorted and two cumulative sums
  (`bucket_totals`, `matrices_from_buckets`).
Which thresholds a metric takes, and how, is TFMA's choice (`matrix_thresholds`); its value
from the matrices is the metric class's own `_metric_value` (`confusion_value`: AUC's
interpolation, accuracy, precision, ...).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import numpy as np
from tensorflow_model_analysis.metrics import binary_confusion_matrices

from components.evaluator.options import UnsupportedSetting

# TFMA's constants (binary_confusion_matrices._EPSILON, calibration_histogram's default).
EPSILON = 1e-7
HISTOGRAM_BUCKETS = 10_000


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


def confusion_value(instance: Any, key: Any, thresholds: Sequence[float],
                    matrices: Sequence[Sequence[float]]) -> Any:
    """The class's own formula on (tp, tn, fp, fn) at `thresholds`."""
    tp, tn, fp, fn = (list(map(float, values)) for values in matrices)
    matrices = binary_confusion_matrices.Matrices(list(thresholds), tp, tn, fp, fn)
    extra = {name: value for name, value in instance.kwargs.items()
             if name not in ("thresholds", "num_thresholds", "top_k", "class_id", "name")}
    # A slice of one class gives TFMA's formulas 0/0, which they turn into NaN or 0 as TFMA
    # reports them; numpy's warnings about it say nothing more.
    with np.errstate(divide="ignore", invalid="ignore"):
        return instance._metric_value(key=key, matrices=matrices, **extra)  # noqa: SLF001
