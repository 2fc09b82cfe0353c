"""TFMA's means over the rows, from sums that add up over parts of them: the mean regression
errors (mean_regression_error.py: squared, absolute, absolute percentage, squared
logarithmic) and MeanLabel, MeanPrediction and Calibration (calibration.py)."""
from __future__ import annotations

from typing import Any

import numpy as np

from components.evaluator.scores import Scores, scalar_pairs


def regression_error(kind: str, scores: Scores, key: Any) -> float:
    """TFMA's mean regression errors: the mean over rows of each row's error, rows whose
    error is NaN left out (mean_regression_error.py), the error taken in the arrays' own
    dtype as TFMA takes it."""
    return regression_mean(regression_sums(kind, scores, key))


def regression_sums(kind: str, scores: Scores, key: Any) -> np.ndarray:
    """[sum of the rows' errors, rows], rows whose error is NaN left out."""
    if kind == "squared":
        difference = scores.labels - scores.predictions
        errors = np.sum(np.square(difference), axis=1)
    else:
        labels, predictions = scalar_pairs(scores, key)
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


def regression_mean(sums: np.ndarray) -> float:
    total, rows = sums
    return float(total / rows) if rows else float("nan")


def calibration_value(kind: str, scores: Scores, key: Any) -> float:
    """MeanLabel, MeanPrediction and Calibration (TFMA's calibration.py): sums of labels,
    predictions and rows."""
    return calibration_ratio(kind, calibration_sums(scores, key))


def calibration_sums(scores: Scores, key: Any) -> np.ndarray:
    """[sum of labels, sum of predictions, rows]."""
    labels, predictions = scalar_pairs(scores, key)
    labels = np.asarray(labels, np.float64)
    predictions = np.asarray(predictions, np.float64)
    return np.array([labels.sum(), predictions.sum(), float(len(labels))])


def calibration_ratio(kind: str, sums: np.ndarray) -> float:
    labels, predictions, rows = sums
    if kind == "calibration":
        return float("nan") if np.isclose(labels, 0.0) else float(predictions / labels)
    if np.isclose(rows, 0.0):
        return float("nan")
    return float((labels if kind == "mean_label" else predictions) / rows)
