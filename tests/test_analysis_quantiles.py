"""The columnar analysis's quantiles accumulator: each batch sorted and thinned before tfx_bsl's
sketch, the boundaries still within the rank error the analyzer asked for, on the taxi sample
(real rows, with missing values), in any order of merging."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from components.example_gen.sources.locate import TAXI_SOURCE, resolve_source
from components.transform.statistics import QUANTILES, AnalyzerSpec, Quantiles

NUM_BUCKETS = 10
BATCH_ROWS = 2_500


def _taxi_column(name: str) -> np.ndarray:
    column = pd.read_csv(resolve_source(TAXI_SOURCE), usecols=[name])[name]
    return column.to_numpy(np.int64 if column.dtype.kind == "i" else np.float32)


def _spec(epsilon: float, dtype: str) -> AnalyzerSpec:
    return AnalyzerSpec("q", QUANTILES, dtype, num_buckets=NUM_BUCKETS, epsilon=epsilon)


def _sketched(values: np.ndarray, spec: AnalyzerSpec, batch_rows: int = BATCH_ROWS
              ) -> Quantiles:
    quantiles = Quantiles(spec)
    for start in range(0, len(values), batch_rows):
        quantiles.add({"values": values[start:start + batch_rows]})
    return quantiles


def _rank_errors(values: np.ndarray, boundaries: np.ndarray) -> list[float]:
    """For each boundary, how far (as a share of the finite values) the ranks it splits at
    lie from the exact quantile's rank: 0 where a tie on the boundary spans that rank."""
    finite = np.sort(values[~np.isnan(values)] if values.dtype.kind == "f" else values)
    errors = []
    for number, boundary in enumerate(boundaries, start=1):
        target = number * len(finite) / NUM_BUCKETS
        below = np.searchsorted(finite, boundary, side="left")
        through = np.searchsorted(finite, boundary, side="right")
        errors.append(max(below - target, target - through, 0) / len(finite))
    return errors


@pytest.mark.parametrize("name", ["dropoff_latitude", "fare", "trip_seconds",
                                  "trip_start_timestamp"])
@pytest.mark.parametrize("epsilon", [0.01, 0.05])
def test_thinned_boundaries_stay_within_epsilon(name, epsilon):
    values = _taxi_column(name)
    spec = _spec(epsilon, "int64" if values.dtype.kind == "i" else "float32")
    quantiles = _sketched(values, spec)
    # Every batch is thinned: 2,500 values to at most 1,000 (epsilon 0.01) or 200 points.
    assert quantiles.points < BATCH_ROWS
    boundaries = quantiles.result(spec).ravel()
    assert boundaries.shape == (NUM_BUCKETS - 1,)
    assert np.all(np.diff(boundaries) >= 0)
    assert max(_rank_errors(values, boundaries)) <= epsilon
    if name == "dropoff_latitude":  # 483 missing values, left out as the sketch leaves NaNs
        assert np.isnan(values).sum() == 483


def test_missing_values_do_not_move_the_boundaries():
    """Missing values left out of the ranks, as the sketch leaves NaNs out: each real value
    followed by 19 missing ones, so a batch of 2,500 holds 125 real values."""
    values = _taxi_column("dropoff_latitude")
    spec = _spec(0.01, "float32")
    finite = values[~np.isnan(values)]
    padded = np.full((len(finite), 20), np.nan, np.float32)
    padded[:, 0] = finite
    boundaries = _sketched(padded.ravel(), spec).result(spec)
    assert max(_rank_errors(finite, boundaries.ravel())) <= 0.01


def test_any_merge_order_and_grouping_stays_within_epsilon():
    values = _taxi_column("trip_miles")
    spec = _spec(0.01, "float32")
    parts = [_sketched(values[start:start + 3_000], spec)
             for start in range(0, len(values), 3_000)]

    def merged(order, groups):
        groups_merged = []
        for group in groups:
            total = Quantiles(spec)
            for index in group:
                total.merge(parts[order[index]])
            groups_merged.append(total)
        result = Quantiles(spec)
        for group in groups_merged:
            result.merge(group)
        return result.result(spec)

    forward = merged(list(range(len(parts))), [[0, 1], [2, 3, 4]])
    backward = merged(list(reversed(range(len(parts)))), [[0], [1, 2], [3, 4]])
    assert max(_rank_errors(values, forward.ravel())) <= 0.01
    assert max(_rank_errors(values, backward.ravel())) <= 0.01
