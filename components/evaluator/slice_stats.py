"""A metric's value from sufficient statistics, sums over the rows that merge: the rows; a
class's weighted positives and negatives in each bucket of the calibration histogram (AUC and
every metric at num_thresholds), or the confusion matrices at explicit thresholds; the sum
of errors and the rows that have one; the sums of labels and predictions; Keras metrics'
variables. `metric_statistics` takes them from some rows of a slice, `merge_statistics`
adds those of several parts (in any order and grouping: sums), `statistics_value` computes
the metric from them; `metric_value` is the two on a whole slice, as the in-process path
runs them."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from components.evaluator.confusion import (HISTOGRAM_BUCKETS, Counts, bucket_totals,
                                            confusion_value, matrices_at_thresholds,
                                            matrices_from_buckets, matrix_thresholds)
from components.evaluator.keras_metrics import KerasRunner
from components.evaluator.kinds import check_keras_key, metric_kind
from components.evaluator.means import (calibration_ratio, calibration_sums,
                                        regression_mean, regression_sums)
from components.evaluator.scores import Scores, binary_pairs, class_id_of


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
    kind, detail = metric_kind(instance)
    if kind == "count":
        return ("rows",)
    if kind == "confusion":
        class_id = class_id_of(key)
        thresholds, from_histogram = matrix_thresholds(instance)
        if from_histogram:
            return ("buckets", key.model_name, class_id)
        return ("matrices", key.model_name, class_id, tuple(thresholds))
    if kind == "regression":
        return ("errors", key.model_name, detail, class_id_of(key))
    if kind == "calibration":
        return ("sums", key.model_name, class_id_of(key))
    check_keras_key(key)
    return ("keras", key.model_name, key.name)


def metric_statistics(instance: Any, key: Any, scores: Scores,
                      keras: Optional[KerasRunner] = None) -> dict:
    """{statistic_id: statistics} of `key` on `scores` (some or all of a slice's rows);
    `keras`: the runner of a Keras metric named in the config."""
    found_id = statistic_id(instance, key)
    kind, detail = metric_kind(instance)
    if kind == "count":
        value: Any = float(len(scores))
    elif kind == "confusion":
        counts = Counts.of(*binary_pairs(scores, found_id[2]))
        if found_id[0] == "buckets":
            value = BucketCounts.of(counts)
        else:
            value = np.array(matrices_at_thresholds(counts, found_id[3]))
    elif kind == "regression":
        value = regression_sums(detail, scores, key)
    elif kind == "calibration":
        value = calibration_sums(scores, key)
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
    kind, detail = metric_kind(instance)
    if kind == "count":
        return np.float64(value)
    if kind == "confusion":
        thresholds, _ = matrix_thresholds(instance)
        matrices = matrices_from_buckets(*value.totals(), thresholds) \
            if found_id[0] == "buckets" else value
        return confusion_value(instance, key, thresholds, matrices)
    if kind == "regression":
        return regression_mean(value)
    if kind == "calibration":
        return calibration_ratio(detail, value)
    (result,) = (keras or KerasRunner.of_metric(instance)).results(value)
    return result


def metric_value(instance: Any, key: Any, scores: Scores,
                 keras: Optional[KerasRunner] = None) -> Any:
    """The value of TFMA metric key `key`, of metric `instance` (a TFMA metric, or a Keras
    metric or loss named in the config, run by `keras`), on `scores`."""
    if metric_kind(instance)[0] == "keras":
        check_keras_key(key)
        (value,) = (keras or KerasRunner.of_metric(instance))(scores)
        return value
    return statistics_value(instance, key, metric_statistics(instance, key, scores))


def confusion_matrix_value(instance: Any, key: Any, scores: Scores) -> Any:
    """A TFMA confusion-matrix metric (AUC, BinaryAccuracy, Precision, ...): our matrices,
    the class's own formula."""
    return statistics_value(instance, key, metric_statistics(instance, key, scores))
