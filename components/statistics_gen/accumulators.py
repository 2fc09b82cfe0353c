"""StatisticsGen's accumulators: one block's summary (`block_part`: each feature's list
lengths, moments, sorted values thinned for the quantiles sketch, value counts), and a
split's statistics folded from those summaries block by block in file order
(`SplitStats.add`) or merged shard by shard in any order (`SplitStats.merge`, the Beam
job's), then built into the proto (`SplitStats.statistics`, `proto.py`).

The sketch (tfx_bsl's, the one TFDV uses) is fed a block's values sorted and thinned to at
most `_SUMMARY_POINTS` weighted points, which adds less than 1/_SUMMARY_POINTS of the values
to the rank error of its quantiles (TFDV's epsilon is 1/100).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import pyarrow as pa
from tensorflow_metadata.proto.v0 import statistics_pb2

from tfrecord_shards.codec import wire
from components.statistics_gen import kernels
from components.statistics_gen.options import StatisticsGenOptions
from components.statistics_gen.plan import BYTES, CATEGORICAL_INT, NUMERIC, FeaturePlan, Plan
from components.statistics_gen.proto import feature_statistics, quantiles_sketch

# A block's sorted values go to the quantiles sketch as at most this many weighted points.
_SUMMARY_POINTS = 2048
# Distinct (value, count) pairs of a string feature kept before they are merged.
_PENDING_VALUES = 1 << 20
_INT_SORT_RANGE = 1 << 16  # ints spanning fewer values than this are counted, not sorted


# --- One block's summary -----------------------------------------------------------------

@dataclasses.dataclass
class _Presence:
    non_missing: int
    min_values: int
    max_values: int
    total_values: int
    length_counts: np.ndarray  # examples holding 0, 1, 2, ... values


@dataclasses.dataclass
class _NumericPart:
    nans: int
    low: float
    high: float
    finite_low: float
    finite_high: float
    positive_infinite: int
    zeros: int
    count: int
    mean: float
    variance: float
    points: Optional[np.ndarray]  # weighted points for the quantiles sketch
    weights: Optional[np.ndarray]


@dataclasses.dataclass
class _FeaturePart:
    presence: _Presence
    numeric: Optional[_NumericPart] = None
    bytes_total: int = 0  # string and bytes features: total length of the values
    bytes_low: int = 0
    bytes_high: int = 0
    value_counts: Optional[pa.StructArray] = None  # string and categorical int features


@dataclasses.dataclass
class _BlockPart:
    rows: int
    features: dict[str, _FeaturePart]


_NO_BITMAP = np.zeros(0, np.uint8)


def _presence(column: pa.Array) -> _Presence:
    bitmap = column.buffers()[0]
    validity = np.frombuffer(bitmap, np.uint8) if column.null_count and bitmap is not None \
        else _NO_BITMAP
    count, fewest, most, total, tally = kernels.list_lengths(
        wire.frozen(column.offsets.to_numpy()), wire.frozen(validity), column.offset)
    return _Presence(int(count), int(fewest) if count else 0, int(most), int(total), tally)


def _thin(ordered: np.ndarray, counts: Optional[np.ndarray] = None
          ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values (each repeated counts[i] times when given) as at most `_SUMMARY_POINTS`
    weighted points: every distinct value when there are few enough, else the middle value
    of each of `_SUMMARY_POINTS` runs of equally many ranks (so any rank is off by less than
    a run)."""
    if counts is None:
        steps = ordered[1:] != ordered[:-1]
        # Counted before they are found: listing the steps of a column of mostly distinct
        # values cost more than its sort.
        if np.count_nonzero(steps) < _SUMMARY_POINTS:
            starts = np.concatenate([[0], np.flatnonzero(steps) + 1])
            return ordered[starts].astype(np.float64), \
                np.diff(np.append(starts, len(ordered))).astype(np.float64)
        points, weights = kernels.evenly_ranked(ordered, _SUMMARY_POINTS)
        return points.astype(np.float64), weights
    if len(ordered) <= _SUMMARY_POINTS:
        return ordered.astype(np.float64), counts.astype(np.float64)
    cumulative = np.cumsum(counts)
    total = int(cumulative[-1])
    edges = np.arange(_SUMMARY_POINTS + 1, dtype=np.int64) * total // _SUMMARY_POINTS
    middles = np.searchsorted(cumulative, (edges[:-1] + edges[1:] - 1) // 2, side="right")
    return ordered[middles].astype(np.float64), np.diff(edges).astype(np.float64)


def _whole_numbers(values: np.ndarray, nans: int, low: float, high: float,
                   finite_low: float, finite_high: float) -> bool:
    """Whether float `values` are all finite whole numbers spanning few enough values to be
    counted rather than sorted."""
    return not nans and low == finite_low and high == finite_high and \
        high - low < max(_INT_SORT_RANGE, len(values)) and \
        np.array_equal(values, np.rint(values))


def _numeric(values: np.ndarray) -> Optional[_NumericPart]:
    if not len(values):
        return None
    nans, low, high, finite_low, finite_high, positive_infinite, zeros, count, mean, squares = \
        kernels.moments(wire.frozen(values))
    points = weights = None
    if count:
        if values.dtype == np.float32 and _whole_numbers(values, nans, low, high, finite_low,
                                                         finite_high):
            # Flags and small counts stored as floats (a transform's `__missing` 0/1 column):
            # counting them took 0.4 ms for 181k values, where numpy's sort of a column of
            # few distinct values took 2.0 ms. The same points and weights as the sort's.
            tally = np.bincount((values - np.float32(low)).astype(np.int64))
            present = np.flatnonzero(tally)
            points, weights = _thin(present + low, tally[present])
        elif values.dtype == np.float32:
            # NaNs sort last; `count` leaves them out.
            points, weights = _thin(kernels.sorted_numbers(values)[:int(count)])
        else:
            first, last = kernels.int_range(wire.frozen(values))
            span = int(last) - int(first)
            if span < max(_INT_SORT_RANGE, len(values)):
                tally = np.bincount(values - first)
                present = np.flatnonzero(tally)
                points, weights = _thin(present + first, tally[present])
            else:
                keys = (values - first).view(np.uint64)
                ordered = (kernels.radix_sort(keys, span.bit_length()).view(np.int64) + first)
                points, weights = _thin(ordered)
    return _NumericPart(int(nans), float(low), float(high), float(finite_low),
                        float(finite_high), int(positive_infinite), int(zeros), int(count),
                        float(mean), float(squares / count) if count else 0.0, points, weights)


def block_part(block, decoder, plan: Plan) -> _BlockPart:
    return batch_part(decoder.decode(block), plan)


def batch_part(batch: pa.RecordBatch, plan: Plan) -> _BlockPart:
    """The summary of rows already decoded, as `RowDecoder` decodes them (a large_list
    column a feature)."""
    features = {}
    for feature in plan.features:
        column = batch.column(feature.name)
        if column.null_count == len(column):
            continue
        part = _FeaturePart(_presence(column))
        values = column.flatten()
        if feature.role == NUMERIC:
            part.numeric = _numeric(values.to_numpy(zero_copy_only=False))
        elif feature.role == CATEGORICAL_INT:
            part.value_counts = values.value_counts()
        elif len(values):
            value_offsets = np.frombuffer(values.buffers()[1], np.int64)[
                values.offset:values.offset + len(values) + 1]
            part.bytes_total = int(value_offsets[-1] - value_offsets[0])
            if feature.role == BYTES:
                sizes = np.diff(value_offsets)
                part.bytes_low, part.bytes_high = int(sizes.min()), int(sizes.max())
            else:
                part.value_counts = values.value_counts()
        features[feature.name] = part
    return _BlockPart(batch.num_rows, features)


# --- A split's accumulators --------------------------------------------------------------

class _FeatureStats:
    """One feature's statistics over the blocks folded so far."""

    def __init__(self, plan: FeaturePlan, options: StatisticsGenOptions):
        self.plan, self.options = plan, options
        self.non_missing = self.total_values = 0
        self.min_values, self.max_values = math.inf, 0
        self.length_counts = np.zeros(0, np.int64)
        # Numeric.
        self.nans = self.zeros = self.positive_infinite = self.count = 0
        self.low, self.high = math.inf, -math.inf
        self.finite_low, self.finite_high = math.inf, -math.inf
        self.mean = self.variance = 0.0
        self.sketch = quantiles_sketch(options.epsilon) if plan.role == NUMERIC else None
        # Strings and bytes.
        self.bytes_total = 0
        self.bytes_low, self.bytes_high = math.inf, -math.inf
        self.pending: list[pa.Table] = []
        self.pending_rows = 0

    def add(self, part: _FeaturePart) -> None:
        """Folds in one block's summary."""
        presence = part.presence
        self._add_presence(presence.non_missing, presence.total_values, presence.min_values,
                           presence.max_values, presence.length_counts)
        numeric = part.numeric
        if numeric is not None:
            self._add_numeric(numeric.nans, numeric.zeros, numeric.positive_infinite,
                              numeric.low, numeric.high, numeric.finite_low,
                              numeric.finite_high, numeric.count, numeric.mean,
                              numeric.variance)
            if numeric.count:
                self.sketch.AddValues(pa.array(numeric.points), pa.array(numeric.weights))
        self._add_bytes(part.bytes_total, presence.total_values, part.bytes_low,
                        part.bytes_high)
        if part.value_counts is not None and len(part.value_counts):
            self._add_value_counts([pa.Table.from_arrays(
                [part.value_counts.field("values"), part.value_counts.field("counts")],
                ["value", "count"])])

    def merge(self, other: "_FeatureStats") -> None:
        """Folds in the same feature's statistics over other blocks (another shard's),
        leaving `other` as it was. In any order and grouping, counts, extremes, lengths and
        value tables come out the same, the moments the same to rounding (Chan's parallel
        update, `_combine_moments`) and the quantiles within the sketch's rank error."""
        self._add_presence(other.non_missing, other.total_values, other.min_values,
                           other.max_values, other.length_counts)
        self._add_numeric(other.nans, other.zeros, other.positive_infinite, other.low,
                          other.high, other.finite_low, other.finite_high, other.count,
                          other.mean, other.variance)
        if other.count:
            self.sketch.Merge(other.sketch)
        self._add_bytes(other.bytes_total, other.total_values, other.bytes_low,
                        other.bytes_high)
        if other.pending:
            self._add_value_counts(other.pending)

    def compact(self) -> None:
        """Shrinks the state before it is sent elsewhere: the sketch compacted, the value
        tables merged into one. (tfx_bsl's sketch pickles, its state included.)"""
        if self.sketch is not None:
            self.sketch.Compact()
        if len(self.pending) > 1:
            self.pending = [self.value_counts()]
            self.pending_rows = self.pending[0].num_rows

    def _add_presence(self, non_missing: int, total_values: int, min_values, max_values,
                      length_counts: np.ndarray) -> None:
        if not non_missing:
            return
        self.non_missing += non_missing
        self.total_values += total_values
        self.min_values = min(self.min_values, min_values)
        self.max_values = max(self.max_values, max_values)
        self.length_counts = _add_counts(self.length_counts, length_counts)

    def _add_numeric(self, nans: int, zeros: int, positive_infinite: int, low: float,
                     high: float, finite_low: float, finite_high: float, count: int,
                     mean: float, variance: float) -> None:
        self.nans += nans
        if not count:
            return
        self.zeros += zeros
        self.positive_infinite += positive_infinite
        self.low, self.high = min(self.low, low), max(self.high, high)
        self.finite_low = min(self.finite_low, finite_low)
        self.finite_high = max(self.finite_high, finite_high)
        self.count, self.mean, self.variance = _combine_moments(
            self.count, self.mean, self.variance, count, mean, variance)

    def _add_bytes(self, bytes_total: int, total_values: int, low, high) -> None:
        self.bytes_total += bytes_total
        if self.plan.role == BYTES and total_values:
            self.bytes_low = min(self.bytes_low, low)
            self.bytes_high = max(self.bytes_high, high)

    def _add_value_counts(self, tables: list[pa.Table]) -> None:
        self.pending.extend(tables)
        self.pending_rows += sum(table.num_rows for table in tables)
        if self.pending_rows > _PENDING_VALUES:
            self.pending = [self.value_counts()]
            self.pending_rows = self.pending[0].num_rows

    def value_counts(self) -> pa.Table:
        """Each distinct value and its count (columns value, count)."""
        if len(self.pending) == 1:
            return self.pending[0]
        merged = pa.concat_tables(self.pending).group_by("value").aggregate(
            [("count", "sum")])
        # The group-by puts the sum first; tables concatenate only in one column order.
        return merged.select(["value", "count_sum"]).rename_columns(["value", "count"])


def _add_counts(total: np.ndarray, more: np.ndarray) -> np.ndarray:
    if len(more) > len(total):
        total, more = more.copy(), total
    total[:len(more)] += more
    return total


def _combine_moments(a_count: int, a_mean: float, a_variance: float,
                     b_count: int, b_mean: float, b_variance: float) -> tuple[int, float, float]:
    """Two (count, mean, population variance) as one: TFDV's MeanVarAccumulator merge
    (variance_util), so means and deviations agree with stock's to rounding."""
    if b_count > a_count:
        a_count, b_count = b_count, a_count
        a_mean, b_mean = b_mean, a_mean
        a_variance, b_variance = b_variance, a_variance
    count = a_count + b_count
    if count == 0:
        return 0, 0.0, 0.0
    ratio = b_count / count
    mean = a_mean + ratio * (b_mean - a_mean)
    variance = a_variance + ratio * (b_variance - a_variance + (b_mean - mean) * (b_mean - a_mean))
    return count, mean, variance


class SplitStats:
    """A split's statistics, folded block by block in file order (`add`), or shard by shard
    in any order (`merge`, the Beam job's)."""

    def __init__(self, plan: Plan, options: StatisticsGenOptions):
        self.plan, self.options = plan, options
        self.num_examples = 0
        self.features = {f.name: _FeatureStats(f, options) for f in plan.features}

    def add(self, part: _BlockPart) -> None:
        self.num_examples += part.rows
        for name, feature_part in part.features.items():
            self.features[name].add(feature_part)

    def merge(self, other: "SplitStats") -> "SplitStats":
        """Folds in the same split's statistics over other shards, leaving `other` as it
        was; returns self."""
        if [f.name for f in other.plan.features] != [f.name for f in self.plan.features]:
            raise ValueError("statistics of differently planned shards cannot be merged")
        self.num_examples += other.num_examples
        for name, feature in other.features.items():
            self.features[name].merge(feature)
        return self

    def compact(self) -> "SplitStats":
        """Shrinks the state before it is sent to another worker; returns self."""
        for feature in self.features.values():
            feature.compact()
        return self

    def statistics(self) -> statistics_pb2.DatasetFeatureStatisticsList:
        result = statistics_pb2.DatasetFeatureStatisticsList()
        dataset = result.datasets.add()
        dataset.num_examples = self.num_examples
        for feature in self.features.values():
            if feature.non_missing or feature.plan.name in self.plan.kindless:
                dataset.features.add().CopyFrom(
                    feature_statistics(feature, self.num_examples, self.options))
        return result
