"""One model's labels and predictions on the evaluated rows (`Scores`), and the pairs of them
TFMA's metrics take: a row's one label and prediction, a class id's one-vs-rest pair
(`class_scores`), or the binary pairs of `metric_util.to_label_prediction_example_weight(
flatten=True, fractional_labels=True)` (`binary_pairs`: a class id's pair under a `binarize`
sub key, every class of a multiclass row otherwise)."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from components.evaluator.options import UnsupportedSetting


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


def class_id_of(key: Any) -> Optional[int]:
    """A metric key's class id sub key (None without one); top k and k sub keys refused."""
    if key.sub_key and (key.sub_key.top_k is not None or key.sub_key.k is not None):
        raise UnsupportedSetting(f"{key.name}: top_k and k sub keys")
    return key.sub_key.class_id if key.sub_key else None


def scalar_pairs(scores: Scores, key: Any) -> tuple[np.ndarray, np.ndarray]:
    """`class_scores` under a metric key's class id sub key, if it has one."""
    return class_scores(scores, key.sub_key.class_id if key.sub_key else None)
