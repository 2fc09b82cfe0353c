"""A split's statistics as a DatasetFeatureStatisticsList, built as TFDV 1.16 builds it
(`feature_statistics` and below follow basic_stats_generator, quantiles_util and
top_k_uniques_stats_util), from a feature's accumulator (`accumulators._FeatureStats`:
counts, moments, its quantiles sketch, its value table). tests/test_statistics_gen.py checks
the output against stock StatisticsGen's on the same rows.

The quantiles sketch is tfx_bsl's, made as TFDV's BasicStatsGenerator makes it
(`quantiles_sketch`). Top values and unique counts are exact, as stock's (Beam's exact
counting, not TFDV's in-memory sketch).
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2
from tfx_bsl import sketches
from tfx_bsl.arrow import array_util

from components.statistics_gen.options import StatisticsGenOptions
from components.statistics_gen.plan import BYTES, CATEGORICAL_INT, STRING

# TFDV computes a numeric feature's histograms from this many quantiles per quantiles bucket.
_QUANTILES_FACTOR = 100
_NON_UTF8_PLACEHOLDER = "__BYTES_VALUE__"  # TFDV's label for a top value that is not UTF-8

_FNS = statistics_pb2.FeatureNameStatistics
_HISTOGRAM = statistics_pb2.Histogram


def quantiles_sketch(epsilon: float) -> sketches.QuantilesSketch:
    """TFDV's BasicStatsGenerator's sketch, made the same way."""
    return sketches.QuantilesSketch(eps=epsilon, max_num_elements=1 << 32, num_streams=1)


def feature_statistics(feature, num_examples: int,
                       options: StatisticsGenOptions) -> statistics_pb2.FeatureNameStatistics:
    """basic_stats_generator._make_feature_stats_proto, with the top-k generator's part."""
    plan = feature.plan
    result = _FNS()
    result.path.step.append(plan.name)
    if not feature.non_missing:
        # Seen only as Features with no list: TFDV has no type for it and says STRING.
        result.type = _FNS.STRING
        result.string_stats.common_stats.num_missing = num_examples
        return result
    result.type = {schema_pb2.INT: _FNS.INT, schema_pb2.FLOAT: _FNS.FLOAT}.get(
        plan.kind, _FNS.BYTES if plan.role == BYTES else _FNS.STRING)
    common = _common_statistics(feature, num_examples, options)
    if plan.role == BYTES:
        result.bytes_stats.CopyFrom(_bytes_statistics(feature))
        result.bytes_stats.common_stats.CopyFrom(common)
    elif plan.role in (STRING, CATEGORICAL_INT):
        strings = result.string_stats
        counts = feature.value_counts() if feature.pending else None
        if plan.role == CATEGORICAL_INT and counts is not None:
            # TFDV counts an int's length as its decimal string's.
            values = counts.column("value").to_numpy()
            digits = np.char.str_len(values.astype(str))
            feature.bytes_total = int(np.dot(digits, counts.column("count").to_numpy()))
        if feature.total_values > 0:
            strings.avg_length = feature.bytes_total / feature.total_values
        if plan.role == STRING and counts is not None:
            strings.invalid_utf8_count = _invalid_utf8(counts)
        strings.common_stats.CopyFrom(common)
        if counts is not None:
            _top_values(strings, counts, options)
    else:
        result.num_stats.CopyFrom(_numeric_statistics(feature, options))
        result.num_stats.common_stats.CopyFrom(common)
    return result


def _common_statistics(feature, num_examples: int,
                       options: StatisticsGenOptions) -> statistics_pb2.CommonStatistics:
    result = statistics_pb2.CommonStatistics()
    result.num_non_missing = feature.non_missing
    result.num_missing = num_examples - feature.non_missing
    if feature.non_missing:
        result.min_num_values = int(feature.min_values)
        result.max_num_values = int(feature.max_values)
        result.tot_num_values = feature.total_values
        result.avg_num_values = feature.total_values / feature.non_missing
        lengths = np.flatnonzero(feature.length_counts)
        sketch = quantiles_sketch(options.epsilon)
        sketch.AddValues(pa.array(lengths.astype(np.int64)),
                         pa.array(feature.length_counts[lengths].astype(np.float64)))
        result.num_values_histogram.CopyFrom(_quantiles_histogram(
            *_sketch_quantiles(sketch, options.num_values_histogram_buckets)))
    return result


def _sketch_quantiles(sketch, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    sketch.Compact()
    quantiles, counts = sketch.GetQuantilesAndCumulativeWeights(buckets)
    return (quantiles.flatten().to_numpy(zero_copy_only=False),
            counts.flatten().to_numpy(zero_copy_only=False))


def _invalid_utf8(counts: pa.Table) -> int:
    """How many of the values are not UTF-8, from each distinct value's count."""
    values = counts.column("value").combine_chunks()
    if not array_util.CountInvalidUTF8(values):
        return 0
    tally = counts.column("count").to_numpy()
    return int(sum(tally[i] for i in range(len(values))
                   if array_util.CountInvalidUTF8(values.slice(i, 1))))


def _numeric_statistics(feature, options: StatisticsGenOptions
                        ) -> statistics_pb2.NumericStatistics:
    """basic_stats_generator._make_numeric_stats_proto, unweighted."""
    result = statistics_pb2.NumericStatistics()
    if feature.total_values - feature.nans == 0:
        if feature.nans:
            result.histograms.add(type=_HISTOGRAM.STANDARD).num_nan = feature.nans
            result.histograms.add(type=_HISTOGRAM.QUANTILES).num_nan = feature.nans
        return result
    result.mean = float(feature.mean)
    result.std_dev = math.sqrt(max(0.0, feature.variance))
    result.num_zeros = feature.zeros
    result.min = float(feature.low)
    result.max = float(feature.high)
    quantiles, counts = _sketch_quantiles(
        feature.sketch, _QUANTILES_FACTOR * options.num_quantiles_histogram_buckets)
    result.median = float(_median(quantiles))
    standard = _equi_width_histogram(quantiles, counts, feature.finite_low, feature.finite_high,
                                     options.num_histogram_buckets, feature.positive_infinite)
    standard.num_nan = feature.nans
    result.histograms.add().CopyFrom(standard)
    quantile = _quantiles_histogram(*_rebin(quantiles, counts, _QUANTILES_FACTOR))
    quantile.num_nan = feature.nans
    result.histograms.add().CopyFrom(quantile)
    return result


def _bytes_statistics(feature) -> statistics_pb2.BytesStatistics:
    result = statistics_pb2.BytesStatistics()
    if feature.total_values > 0:
        result.avg_num_bytes = feature.bytes_total / feature.total_values
        result.min_num_bytes = feature.bytes_low
        result.max_num_bytes = feature.bytes_high
        result.max_num_bytes_int = int(feature.bytes_high)
    return result


def _top_values(strings: statistics_pb2.StringStatistics, counts: pa.Table,
                options: StatisticsGenOptions) -> None:
    """top_k_uniques_stats_generator's output: the number of distinct values, and the most
    frequent ones, count first and the larger value first among equal counts (Beam's Top
    over (count, value))."""
    strings.unique = counts.num_rows
    keep = max(options.num_top_values, options.num_rank_histogram_buckets)
    order = pc.sort_indices(counts, sort_keys=[("count", "descending"),
                                               ("value", "descending")])
    top = counts.take(order[:keep])
    for rank, (value, count) in enumerate(zip(top.column("value").to_pylist(),
                                              top.column("count").to_pylist())):
        if count < options.frequency_threshold:
            break
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeError:
                value = _NON_UTF8_PLACEHOLDER
        else:
            value = str(value)
        if rank < options.num_top_values:
            strings.top_values.add(value=value, frequency=count)
        if rank < options.num_rank_histogram_buckets:
            strings.rank_histogram.buckets.add(low_rank=rank, high_rank=rank,
                                               sample_count=count, label=value)


def _median(quantiles: np.ndarray) -> float:
    middle = len(quantiles) // 2
    if len(quantiles) % 2 == 0:
        return (quantiles[middle - 1] + quantiles[middle]) / 2.0
    return quantiles[middle]


def _bin_weights(boundaries: np.ndarray, cumulative: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """quantiles_util._get_bin_weights: each bin's weight, spread evenly over bins with the
    same bounds (a value repeated across quantiles)."""
    cumulative = cumulative.astype(np.float64)
    lows, highs = boundaries[:-1], boundaries[1:]
    weights = np.diff(cumulative)
    i = 0
    while i < lows.size:
        j = i + 1
        while j < lows.size and highs[i] == highs[j]:
            j += 1
        if j > i + 1:
            weights[i:j] = weights[i:j].sum() / (j - i)
        i = j
    same = 0
    while same < lows.size and lows[0] == lows[same] and highs[0] == highs[same]:
        same += 1
    if same > 0:
        weights[0:same] += cumulative[0] / same
    return lows, highs, weights


def _rebin(quantiles: np.ndarray, cumulative: np.ndarray, factor: int
           ) -> tuple[np.ndarray, np.ndarray]:
    return (np.concatenate([[quantiles[0]], quantiles[factor::factor]]),
            np.concatenate([[cumulative[0]], cumulative[factor::factor]]))


def _quantiles_histogram(quantiles: np.ndarray, cumulative: np.ndarray
                         ) -> statistics_pb2.Histogram:
    result = statistics_pb2.Histogram(type=_HISTOGRAM.QUANTILES)
    lows, highs, weights = _bin_weights(quantiles, cumulative)
    for low, high, weight in zip(lows.tolist(), highs.tolist(), weights.tolist()):
        result.buckets.add(low_value=low, high_value=high, sample_count=weight)
    return result


def _strip_infinities(quantiles: np.ndarray, cumulative: np.ndarray, finite_high: float,
                      positive_infinite: float) -> tuple[np.ndarray, np.ndarray, float]:
    negative = np.searchsorted(quantiles, float("-inf"), side="right")
    negative_infinite = 0
    if negative:
        negative_infinite = cumulative[negative - 1]
        cumulative = cumulative[negative:] - negative_infinite
        quantiles = quantiles[negative:]
    if positive_infinite:
        positive = np.searchsorted(quantiles, float("inf"), side="left")
        finite_count = cumulative[-1] - positive_infinite
        quantiles = np.concatenate([quantiles[:positive], [finite_high]])
        cumulative = np.concatenate([cumulative[:positive], [finite_count]])
    return quantiles, cumulative, negative_infinite


def _overlap(low_value: float, high_value: float, low: float, high: float, first: bool
             ) -> tuple[float, bool, bool]:
    """quantiles_util._overlap: (the share of a bucket inside [low, high], whether the bucket
    lies before it, whether after)."""
    if high_value == low_value == low:
        return (1.0, False, False) if first else (0.0, True, False)
    if high_value < low:
        return 0.0, True, False
    if low_value > high:
        return 0.0, False, True
    if low <= low_value and high >= high_value:
        return 1.0, False, False
    if low <= low_value:
        return (high - low_value) / (high_value - low_value), False, False
    if high >= high_value:
        return (high_value - low) / (high_value - low_value), False, False
    return (high - low) / (high_value - low_value), False, False


def _equi_width_histogram(quantiles: np.ndarray, cumulative: np.ndarray, finite_low: float,
                          finite_high: float, buckets: int, positive_infinite: float
                          ) -> statistics_pb2.Histogram:
    """quantiles_util.generate_equi_width_histogram: equal-width buckets over the finite
    range, each counted from the quantile buckets it overlaps (uniform within each)."""
    result = statistics_pb2.Histogram(type=_HISTOGRAM.STANDARD)
    if not np.isfinite(finite_low) and not np.isfinite(finite_high):
        result.buckets.add(low_value=finite_low, high_value=finite_high,
                           sample_count=cumulative[-1])
        return result
    quantiles, cumulative, negative_infinite = _strip_infinities(
        quantiles, cumulative, finite_high, positive_infinite)
    lows, highs, weights = _bin_weights(quantiles, cumulative)
    if finite_low == finite_high:
        bounds = np.array([finite_low, finite_high])
    else:
        bounds = np.linspace(finite_low, finite_high, buckets + 1)
        if not np.isfinite(bounds).all():
            return result
    if negative_infinite:
        result.buckets.add(low_value=float("-inf"), high_value=float("-inf"),
                           sample_count=negative_infinite)
    # The quantile buckets as the proto would hold them (doubles), as TFDV reads them back.
    lows, highs, weights = lows.tolist(), highs.tolist(), weights.tolist()
    start = 0
    for i in range(bounds.size - 1):
        low, high = float(bounds[i]), float(bounds[i + 1])
        count = 0.0
        for current in range(start, len(lows)):
            share, before, after = _overlap(lows[current], highs[current], low, high, i == 0)
            if after:
                break
            if before:
                start = current
            count += share * weights[current]
        result.buckets.add(low_value=low, high_value=high, sample_count=count)
    if positive_infinite:
        result.buckets.add(low_value=float("inf"), high_value=float("inf"),
                           sample_count=positive_infinite)
    return result
