"""StatisticsGen's engine: the statistics of each split of an Examples artifact, written as
stock StatisticsGen writes them (`Split-<name>/FeatureStats.pb`, one
DatasetFeatureStatisticsList), so that SchemaGen, ExampleValidator and TFDV's visualisation
take them unchanged. It imports no TFX, TensorFlow, Beam or TFDV.

Each split's shards are read a block at a time (`tfrecord_io.iter_record_blocks`), decoded to
Arrow by the compiled decoder and summarised by threads; the main thread folds the block
summaries in file order, so the output does not depend on which thread finished first.

Why not TFDV's own generators in-process: importing any part of TFDV imports TensorFlow and
Beam (15 to 20 s on the 2-core development machine, before any work), and its
BasicStatsGenerator alone takes about 8 us a row of taxi-like data (127k rows/s on one
core), half of it feeding every value to the quantiles sketch, where reading and decoding a
row take about 2.5 us. Here a block's numbers come from compiled loops, and the sketch
(tfx_bsl's, the one TFDV uses) is fed a block's values sorted and thinned to at most
`_SUMMARY_POINTS` weighted points, which adds less than 1/_SUMMARY_POINTS of the values to
the rank error of its quantiles (TFDV's epsilon is 1/100). The protos are built
as TFDV 1.16 builds them (`_feature_statistics` and below follow basic_stats_generator,
quantiles_util and top_k_uniques_stats_util); tests/test_statistics_gen.py checks the output
against stock StatisticsGen's on the same rows.

Top values and unique counts are exact, as stock's (Beam's exact counting, not TFDV's
in-memory sketch).
"""
from __future__ import annotations

import collections
import dataclasses
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator, Optional

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from tfrecord_shards import fileio, rows_done, tfrecord_io
from tfrecord_shards.codec import schema_file, wire
from components.statistics_gen.options import StatisticsGenOptions

STATS_FILE = "FeatureStats.pb"  # stock StatisticsGen's file name in each Split-<name>/

# A block's sorted values go to the quantiles sketch as at most this many weighted points.
_SUMMARY_POINTS = 2048
# Distinct (value, count) pairs of a string feature kept before they are merged.
_PENDING_VALUES = 1 << 20
# TFDV computes a numeric feature's histograms from this many quantiles per quantiles bucket.
_QUANTILES_FACTOR = 100
_NON_UTF8_PLACEHOLDER = "__BYTES_VALUE__"  # TFDV's label for a top value that is not UTF-8
_INT_SORT_RANGE = 1 << 16  # ints spanning fewer values than this are counted, not sorted

_FNS = statistics_pb2.FeatureNameStatistics
_HISTOGRAM = statistics_pb2.Histogram

# How a feature's values are summarised.
NUMERIC, STRING, BYTES, CATEGORICAL_INT = "numeric", "string", "bytes", "categorical_int"


# --- Which features, read how ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FeaturePlan:
    name: str
    kind: int  # schema_pb2.INT, FLOAT or BYTES: how the records hold it
    role: str  # NUMERIC, STRING, BYTES or CATEGORICAL_INT: which statistics it gets


@dataclasses.dataclass(frozen=True)
class Plan:
    """The decoding schema and what each of its features gets. `kindless`: features the
    records hold only as a Feature with no list set (stock ExampleGen's column with no value
    at all), which stock's statistics list with every example missing."""

    schema: schema_pb2.Schema
    features: tuple[FeaturePlan, ...]
    kindless: tuple[str, ...] = ()


def unsupported_schema(schema: Optional[schema_pb2.Schema]) -> Optional[str]:
    """Why the fast path cannot honour a statistics schema exactly as TFDV does (features
    that make TFDV add generators or compute string statistics of floats), or None."""
    if schema is None:
        return None
    if schema.sparse_feature or schema.weighted_feature:
        return "sparse or weighted features"
    for feature in schema.feature:
        domain = feature.WhichOneof("domain_info")
        if feature.type == schema_pb2.STRUCT:
            return f"struct feature {feature.name!r}"
        if domain == "natural_language_domain":
            return f"natural-language feature {feature.name!r}"
        if feature.type == schema_pb2.FLOAT and feature.float_domain.is_categorical:
            return f"categorical float feature {feature.name!r}"
    return None


def _roles(stats_schema: Optional[schema_pb2.Schema]) -> tuple[set[str], set[str]]:
    """The features a statistics schema makes bytes (an image domain) and categorical ints
    (TFDV's schema_util.get_bytes_features and get_categorical_numeric_feature_types)."""
    if stats_schema is None:
        return set(), set()
    image = {f.name for f in stats_schema.feature if f.WhichOneof("domain_info") == "image_domain"}
    categorical = {f.name for f in stats_schema.feature if f.type == schema_pb2.INT and (
        (f.HasField("int_domain") and f.int_domain.is_categorical)
        or f.WhichOneof("domain_info") == "bool_domain")}
    return image, categorical


def make_plan(decoding: schema_pb2.Schema, stats_schema: Optional[schema_pb2.Schema] = None,
              kindless: Iterable[str] = ()) -> Plan:
    """The plan for records decoded by `decoding`; the statistics list the features in its
    order. (Stock's order is the order Beam's batches first hold them in, which varies with
    the batch sizes Beam picks as it runs; SchemaGen keeps the statistics' order.)"""
    image, categorical = _roles(stats_schema)
    features = []
    for feature in decoding.feature:
        if feature.type == schema_pb2.BYTES:
            role = BYTES if feature.name in image else STRING
        elif feature.type == schema_pb2.INT and feature.name in categorical:
            role = CATEGORICAL_INT
        else:
            role = NUMERIC
        features.append(FeaturePlan(feature.name, feature.type, role))
    return Plan(decoding, tuple(features), tuple(kindless))


def split_files(examples_uri: str, split: str) -> list[str]:
    """The record files of one split (stock's `Split-<name>/` layout; bookkeeping files and
    hidden ones left out, a stopped commit of ours refused)."""
    from tfrecord_shards.example_rows import record_files

    folder = fileio.join(examples_uri, f"Split-{split}")
    if not fileio.isdir(folder):
        raise FileNotFoundError(f"{folder}: no such split folder in the Examples artifact")
    return record_files(folder)


_SCHEMA_KINDS = {wire.FLOAT_KIND: schema_pb2.FLOAT, wire.INT_KIND: schema_pb2.INT,
                 wire.BYTES_KIND: schema_pb2.BYTES}


def infer_schema(files: list[str]) -> tuple[schema_pb2.Schema, list[str]]:
    """Every feature of every record and the kind of list it holds, for records without a
    schema.pbtxt (stock ExampleGen's, ImportExampleGen's): (the schema to decode with, in the
    order the features first appear; the features seen only with no value list). One
    compiled pass over all records (`_unlisted_feature`) that stops only at a feature it
    has not met yet, so a feature first met at the last record is counted as TFDV counts
    it; a feature whose kind changes is refused with both places."""
    names: list[str] = []
    kinds: list[int] = []  # schema kind, or -1 while seen only with no list
    where: list[str] = []
    keys, key_offsets, known = np.zeros(0, np.uint8), np.zeros(1, np.int64), np.zeros(0, np.int64)
    for path in files:
        for block in tfrecord_io.iter_record_blocks(path):
            first = 0
            while True:
                record, key_start, key_end, kind = _unlisted_feature(
                    wire.frozen(block.buffer), block.starts, block.ends, first,
                    wire.frozen(keys), wire.frozen(key_offsets), wire.frozen(known))
                if record < 0:
                    break
                here = f"{path} at offset {block.record_offset(record)}"
                if key_start < 0:
                    raise ValueError(f"{here}: the record is not a serialized tf.Example")
                try:
                    name = block.buffer[key_start:key_end].tobytes().decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(f"{here}: a feature name is not UTF-8") from None
                schema_kind = _SCHEMA_KINDS[kind] if kind >= 0 else -1
                if name not in names:
                    names.append(name)
                    kinds.append(schema_kind)
                    where.append(here)
                    keys = np.frombuffer("".join(names).encode("utf-8"), np.uint8)
                    key_offsets = np.concatenate([[0], np.cumsum(
                        [len(n.encode("utf-8")) for n in names])]).astype(np.int64)
                else:
                    index = names.index(name)
                    if kinds[index] >= 0:
                        raise ValueError(
                            f"{here}: feature {name!r} holds "
                            f"{schema_pb2.FeatureType.Name(schema_kind)} values, "
                            f"{where[index]} {schema_pb2.FeatureType.Name(kinds[index])}")
                    kinds[index], where[index] = schema_kind, here
                known = np.array([_WIRE_KINDS.get(k, -1) for k in kinds], np.int64)
                first = record
    schema = schema_pb2.Schema()
    kindless = []
    for name, kind in zip(names, kinds):
        # A feature seen only with no list is decoded as bytes, TFDV's type for it.
        schema.feature.add(name=name, type=schema_pb2.BYTES if kind < 0 else kind)
        if kind < 0:
            kindless.append(name)
    return schema, kindless


_WIRE_KINDS = {schema: wire_kind for wire_kind, schema in _SCHEMA_KINDS.items()}


# --- Compiled loops ------------------------------------------------------------------------

_jit = numba.njit(cache=True, nogil=True)


@_jit
def _unlisted_feature(buffer, starts, ends, first: int, keys, key_offsets, kinds):
    """From record `first` on, the first Features map entry that the known features
    (named keys[key_offsets[f]:key_offsets[f + 1]], holding lists of wire kind kinds[f], -1
    while seen with no list) do not account for: a name not among them, or a list where
    none or one of another kind was seen. (record, key start, key end, its list's wire kind
    or -1); (-1, 0, 0, -1) when there is none; (record, -1, -1, -1) when the record is
    malformed."""
    features = len(key_offsets) - 1
    guess = 0
    for r in range(first, len(starts)):
        position, end = starts[r], ends[r]
        while position < end:
            entry, features_end = wire._next_message(buffer, position, end)
            if entry < 0:
                return r, -1, -1, -1
            while entry < features_end:
                field, entry_end = wire._next_message(buffer, entry, features_end)
                if field < 0:
                    return r, -1, -1, -1
                keyed = False
                key_start = key_end = value_start = value_end = 0
                while field < entry_end:
                    tag, field = wire._get_tag(buffer, field, entry_end)
                    if field < 0:
                        return r, -1, -1, -1
                    if tag == 0x0A or tag == 0x12:
                        inner, inner_end = wire._message_end(buffer, field, entry_end)
                        if inner < 0:
                            return r, -1, -1, -1
                        if tag == 0x0A:
                            keyed = True
                            key_start, key_end = inner, inner_end
                        else:
                            value_start, value_end = inner, inner_end
                        field = inner_end
                    else:
                        field = wire._skip_field(buffer, field, entry_end, tag & 7)
                        if field < 0:
                            return r, -1, -1, -1
                entry = entry_end
                if not keyed:
                    continue
                kind = -1
                value = value_start
                while value < value_end:
                    tag, value = wire._get_tag(buffer, value, value_end)
                    if value < 0:
                        return r, -1, -1, -1
                    if tag == 0x0A or tag == 0x12 or tag == 0x1A:  # bytes, float, int64 list
                        kind = wire.BYTES_KIND if tag == 0x0A else \
                            wire.FLOAT_KIND if tag == 0x12 else wire.INT_KIND
                        inner, value = wire._message_end(buffer, value, value_end)
                        if inner < 0:
                            return r, -1, -1, -1
                    else:
                        value = wire._skip_field(buffer, value, value_end, tag & 7)
                        if value < 0:
                            return r, -1, -1, -1
                f = wire._key_index(buffer, key_start, key_end, keys, key_offsets, guess)
                if f < 0 or (kind >= 0 and kinds[f] != kind):
                    return r, key_start, key_end, kind
                # Writers keep one order of features, so the next entry is nearly always
                # the next known feature.
                guess = f + 1 if f + 1 < features else 0
            position = features_end
    return -1, 0, 0, -1


@_jit
def _moments(values):
    """Over the values that are not NaN: (NaN count, min, max, finite min, finite max,
    +inf count, zeros, count, mean, sum of squared deviations)."""
    nans = zeros = count = positive_infinite = 0
    low, high = np.inf, -np.inf
    finite_low, finite_high = np.inf, -np.inf
    total = 0.0
    for value in values:
        x = np.float64(value)
        if x != x:
            nans += 1
            continue
        count += 1
        total += x
        low = min(low, x)
        high = max(high, x)
        if x == 0.0:
            zeros += 1
        if np.isfinite(x):
            finite_low = min(finite_low, x)
            finite_high = max(finite_high, x)
        elif x > 0:
            positive_infinite += 1
    mean = total / count if count else 0.0
    squares = 0.0
    for value in values:
        x = np.float64(value)
        if x == x:
            squares += (x - mean) * (x - mean)
    return (nans, low, high, finite_low, finite_high, positive_infinite, zeros, count, mean,
            squares)


@_jit
def _list_lengths(offsets, validity, first_bit: int):
    """Over the present lists (validity: Arrow's bitmap from bit `first_bit`, or empty when
    every list is present): (count, fewest values, most values, total values, how many lists
    hold 0, 1, 2, ... values)."""
    rows = len(offsets) - 1
    count = total = 0
    fewest, most = np.iinfo(np.int64).max, 0
    for row in range(rows):
        bit = first_bit + row
        if len(validity) and not (validity[bit >> 3] >> (bit & 7)) & 1:
            continue
        length = offsets[row + 1] - offsets[row]
        count += 1
        total += length
        fewest = min(fewest, length)
        most = max(most, length)
    tally = np.zeros(most + 1 if count else 0, np.int64)
    if count and fewest == most:  # every list the same length (scalar features)
        tally[most] = count
        return count, fewest, most, total, tally
    for row in range(rows):
        bit = first_bit + row
        if len(validity) and not (validity[bit >> 3] >> (bit & 7)) & 1:
            continue
        tally[offsets[row + 1] - offsets[row]] += 1
    return count, fewest, most, total, tally


@_jit
def _int_range(values):
    low, high = values[0], values[0]
    for value in values:
        low = min(low, value)
        high = max(high, value)
    return low, high


@_jit
def _float_keys(bits):
    """float32 bit patterns -> uint64 keys that sort as the floats do, NaNs left out."""
    keys = np.empty(len(bits), np.uint64)
    count = 0
    for raw in bits:
        if (raw & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
            continue  # NaN
        key = np.uint64(raw)
        keys[count] = key ^ np.uint64(0xFFFFFFFF) if key >> np.uint64(31) else \
            key | np.uint64(0x80000000)
        count += 1
    return keys[:count]


@_jit
def _float_bits(keys):
    """`_float_keys` undone: sorted keys -> float32 bit patterns."""
    bits = np.empty(len(keys), np.uint32)
    for i in range(len(keys)):
        key = keys[i]
        bits[i] = np.uint32(key ^ np.uint64(0x80000000) if key >> np.uint64(31)
                            else key ^ np.uint64(0xFFFFFFFF))
    return bits


@_jit
def _radix_sort(keys, bits: int):
    """`keys` (uint64 below 2**bits) sorted, 11 bits a pass (least significant first), all
    passes counted in one read; a pass whose digit every key shares (the high bits of
    values in a narrow range) is skipped."""
    passes = max(1, (bits + 10) // 11)
    counts = np.zeros((passes, 2048), np.int64)
    for key in keys:
        for p in range(passes):
            counts[p, (key >> np.uint64(11 * p)) & np.uint64(2047)] += 1
    source = keys.copy()
    target = np.empty_like(source)
    for p in range(passes):
        if counts[p].max() == len(keys):
            continue
        start = 0
        for digit in range(2048):
            size = counts[p, digit]
            counts[p, digit] = start
            start += size
        shift = np.uint64(11 * p)
        for key in source:
            digit = (key >> shift) & np.uint64(2047)
            target[counts[p, digit]] = key
            counts[p, digit] += 1
        source, target = target, source
    return source


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
    count, fewest, most, total, tally = _list_lengths(
        wire.frozen(column.offsets.to_numpy()), wire.frozen(validity), column.offset)
    return _Presence(int(count), int(fewest) if count else 0, int(most), int(total), tally)


def _thin(ordered: np.ndarray, counts: Optional[np.ndarray] = None
          ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values (each repeated counts[i] times when given) as at most `_SUMMARY_POINTS`
    weighted points: every distinct value when there are few enough, else the middle value
    of each of `_SUMMARY_POINTS` runs of equally many ranks (so any rank is off by less than
    a run)."""
    if counts is None:
        starts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
        if len(starts) < _SUMMARY_POINTS:
            starts = np.concatenate([[0], starts])
            return ordered[starts].astype(np.float64), \
                np.diff(np.append(starts, len(ordered))).astype(np.float64)
        total = len(ordered)
        edges = np.arange(_SUMMARY_POINTS + 1, dtype=np.int64) * total // _SUMMARY_POINTS
        return ordered[(edges[:-1] + edges[1:] - 1) // 2].astype(np.float64), \
            np.diff(edges).astype(np.float64)
    if len(ordered) <= _SUMMARY_POINTS:
        return ordered.astype(np.float64), counts.astype(np.float64)
    cumulative = np.cumsum(counts)
    total = int(cumulative[-1])
    edges = np.arange(_SUMMARY_POINTS + 1, dtype=np.int64) * total // _SUMMARY_POINTS
    middles = np.searchsorted(cumulative, (edges[:-1] + edges[1:] - 1) // 2, side="right")
    return ordered[middles].astype(np.float64), np.diff(edges).astype(np.float64)


def _numeric(values: np.ndarray) -> Optional[_NumericPart]:
    if not len(values):
        return None
    nans, low, high, finite_low, finite_high, positive_infinite, zeros, count, mean, squares = \
        _moments(wire.frozen(values))
    points = weights = None
    if count:
        if values.dtype == np.float32:
            keys = _float_keys(wire.frozen(values.view(np.uint32)))
            ordered = _float_bits(_radix_sort(keys, 32)).view(np.float32)
            points, weights = _thin(ordered)
        else:
            first, last = _int_range(wire.frozen(values))
            span = int(last) - int(first)
            if span < max(_INT_SORT_RANGE, len(values)):
                tally = np.bincount(values - first)
                present = np.flatnonzero(tally)
                points, weights = _thin(present + first, tally[present])
            else:
                keys = (values - first).view(np.uint64)
                ordered = (_radix_sort(keys, span.bit_length()).view(np.int64) + first)
                points, weights = _thin(ordered)
    return _NumericPart(int(nans), float(low), float(high), float(finite_low),
                        float(finite_high), int(positive_infinite), int(zeros), int(count),
                        float(mean), float(squares / count) if count else 0.0, points, weights)


def _block_part(block, decoder, plan: Plan) -> _BlockPart:
    batch = decoder.decode(block)
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

def _sketch(epsilon: float):
    from tfx_bsl import sketches

    # TFDV's BasicStatsGenerator's sketch, made the same way.
    return sketches.QuantilesSketch(eps=epsilon, max_num_elements=1 << 32, num_streams=1)


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
        self.sketch = _sketch(options.epsilon) if plan.role == NUMERIC else None
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
        return merged.rename_columns(["count" if n == "count_sum" else n
                                      for n in merged.column_names])


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
        rows_done.add(part.rows)
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
                    _feature_statistics(feature, self.num_examples, self.options))
        return result


# --- Reading a split ---------------------------------------------------------------------

def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def scan(inputs: Iterable[tuple[str, list[str], Plan]], options: StatisticsGenOptions
         ) -> dict[str, SplitStats]:
    """{split: its statistics} of (split, record files, plan) inputs. The main thread reads
    the files (inflating and unframing release the GIL) and folds the block summaries in
    order; `options.threads` threads decode and summarise the blocks."""
    from tfrecord_shards.packing.arrow import RowDecoder

    threads = options.threads or _cpus()
    results: dict[str, SplitStats] = {}
    in_flight: collections.deque = collections.deque()
    with ThreadPoolExecutor(threads, thread_name_prefix="statistics") as pool:
        try:
            for split, files, plan in inputs:
                stats = results[split] = SplitStats(plan, options)
                decoder = RowDecoder(plan.schema)
                for path in files:
                    for block in tfrecord_io.iter_record_blocks(path):
                        for part in block.parts(decoder.records_per_decode):
                            in_flight.append((stats, pool.submit(
                                _block_part, part, decoder, plan)))
                            while len(in_flight) > threads + 2:
                                owner, future = in_flight.popleft()
                                owner.add(future.result())
            while in_flight:
                owner, future = in_flight.popleft()
                owner.add(future.result())
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return results


def plan_for(split_folder: str, files: list[str],
             stats_schema: Optional[schema_pb2.Schema] = None) -> Plan:
    """How to read a split: by the schema.pbtxt above its shards (our ExampleGen and
    Transform write one), else by the types the records show (stock ExampleGen)."""
    stored = schema_file.find_schema(split_folder)
    if stored is not None:
        return make_plan(stored, stats_schema)
    decoding, kindless = infer_schema(files)
    return make_plan(decoding, stats_schema, kindless)


def split_statistics(examples_uri: str, splits: list[str],
                     options: Optional[StatisticsGenOptions] = None,
                     stats_schema: Optional[schema_pb2.Schema] = None
                     ) -> dict[str, statistics_pb2.DatasetFeatureStatisticsList]:
    """{split: DatasetFeatureStatisticsList} for the splits of the Examples at
    `examples_uri`, as stock StatisticsGen computes them (with `stats_schema` as its schema
    input)."""
    options = options or StatisticsGenOptions()
    inputs = split_inputs(examples_uri, splits, stats_schema)
    return {split: stats.statistics() for split, stats in scan(inputs, options).items()}


def split_inputs(examples_uri: str, splits: list[str],
                 stats_schema: Optional[schema_pb2.Schema] = None
                 ) -> list[tuple[str, list[str], Plan]]:
    """(split, its record files, its plan) for each split: what `scan` and the Beam job
    read."""
    reason = unsupported_schema(stats_schema)
    if reason:
        raise ValueError(f"the statistics schema has {reason}, which needs stock "
                         f"StatisticsGen")
    inputs = []
    for split in splits:
        files = split_files(examples_uri, split)
        inputs.append((split, files, plan_for(fileio.join(examples_uri, f"Split-{split}"),
                                              files, stats_schema)))
    return inputs


def write_statistics(output_uri: str, split: str,
                     stats: statistics_pb2.DatasetFeatureStatisticsList) -> int:
    """Writes `output_uri`/Split-<split>/FeatureStats.pb; returns the split's example
    count."""
    folder = fileio.join(output_uri, f"Split-{split}")
    fileio.makedirs(folder)
    fileio.write_bytes(fileio.join(folder, STATS_FILE), stats.SerializeToString())
    return stats.datasets[0].num_examples


def run(examples_uri: str, output_uri: str, splits: list[str],
        options: Optional[StatisticsGenOptions] = None,
        stats_schema: Optional[schema_pb2.Schema] = None) -> dict[str, int]:
    """Writes `output_uri`/Split-<name>/FeatureStats.pb for each split; returns each split's
    example count. (`engine.run` picks this or the Beam job.)"""
    return {split: write_statistics(output_uri, split, stats) for split, stats in
            split_statistics(examples_uri, splits, options, stats_schema).items()}


def artifact_splits(examples_uri: str) -> list[str]:
    """The split names of an Examples artifact folder, from its Split-<name>/ folders."""
    return sorted(name[len("Split-"):] for name in fileio.listdir(examples_uri)
                  if name.startswith("Split-") and fileio.isdir(fileio.join(examples_uri, name)))


# --- The protos, as TFDV 1.16 builds them ------------------------------------------------

def _feature_statistics(feature: _FeatureStats, num_examples: int,
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


def _common_statistics(feature: _FeatureStats, num_examples: int,
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
        sketch = _sketch(options.epsilon)
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
    from tfx_bsl.arrow import array_util

    values = counts.column("value").combine_chunks()
    if not array_util.CountInvalidUTF8(values):
        return 0
    tally = counts.column("count").to_numpy()
    return int(sum(tally[i] for i in range(len(values))
                   if array_util.CountInvalidUTF8(values.slice(i, 1))))


def _numeric_statistics(feature: _FeatureStats, options: StatisticsGenOptions
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


def _bytes_statistics(feature: _FeatureStats) -> statistics_pb2.BytesStatistics:
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


# --- Command line (timing the engine as a whole process) ---------------------------------

def main(argv: Optional[list[str]] = None) -> None:
    import argparse
    import time

    arguments = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arguments.add_argument("examples", help="an Examples artifact folder (Split-*/ inside)")
    arguments.add_argument("output", help="the ExampleStatistics folder to write")
    arguments.add_argument("--splits", help="comma-separated (default: every Split-*/)")
    arguments.add_argument("--threads", type=int)
    given = arguments.parse_args(argv)
    started = time.perf_counter()
    splits = given.splits.split(",") if given.splits else artifact_splits(given.examples)
    written = run(given.examples, given.output, splits,
                  StatisticsGenOptions(threads=given.threads))
    rows = sum(written.values())
    seconds = time.perf_counter() - started
    print(f"{rows:,} rows in {seconds:.2f} s ({rows / seconds:,.0f} rows/s): "
          + ", ".join(f"{split} {count:,}" for split, count in written.items()))


if __name__ == "__main__":
    main()
