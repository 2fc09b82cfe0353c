"""Slices and their metrics: each slicing spec's slices and their rows, as TFMA's slicer
makes them (`slice_rows`); every model's metrics on a slice (`slice_metrics`), or from the
statistics of its rows' parts (`slice_statistics`, merged, then `metrics_from_statistics`);
and the candidate-minus-baseline diffs TFMA adds (`with_diffs`)."""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tensorflow_model_analysis.slicer import slicer_lib
from tensorflow_model_analysis.utils import model_util

from components.evaluator import slice_stats
from components.evaluator.raw_features import as_rows
from components.evaluator.scoring import ModelScorer, Scored


def slice_rows(eval_config: Any, scored: Scored) -> dict[tuple, Optional[np.ndarray]]:
    """Each slice's key (TFMA's SliceKeyType: sorted (column, value) pairs) and its rows (None:
    all of them), slicing spec by slicing spec as TFMA's `SingleSliceSpec.generate_slices`
    slices: a row is in the slice of each combination of its distinct values of the columns,
    if it holds every feature value the spec names; bytes values as text."""
    specs = list(eval_config.slicing_specs) or [None]
    slices: dict[tuple, Optional[np.ndarray]] = {}
    for proto in specs:
        spec = slicer_lib.SingleSliceSpec(spec=proto) if proto is not None else \
            slicer_lib.SingleSliceSpec()
        if spec.is_overall():
            slices.setdefault((), None)
            continue
        matches = sorted(spec._features)  # noqa: SLF001 - TFMA's parsed (column, value) pairs
        keep = np.ones(scored.rows, bool)
        for column, value in matches:
            keep &= rows_holding(row_values(scored, column), value)
        columns = sorted(spec._columns)  # noqa: SLF001
        pairs = [row_values(scored, column) for column in columns]
        for key, rows in column_slices(columns, pairs, keep, matches).items():
            slices.setdefault(key, rows)
    return slices


@dataclasses.dataclass(frozen=True)
class RowValues:
    """A column's distinct values in each row: pair i is (rows[i], values[codes[i]])."""

    rows: np.ndarray
    codes: np.ndarray
    values: list  # Python values as TFMA's slice accessor gives them (bytes, int, float)
    size: int  # rows in all


def row_values(scored: Scored, column: str) -> RowValues:
    """Where TFMA's slice accessor looks: the models' transformed features first (every model
    that outputs the column), the raw features otherwise."""
    arrays = [outputs[column] for outputs in scored.transformed.values() if column in outputs]
    if arrays:
        rows_list, values_list = [], []
        for array in arrays:
            flat = as_rows(array)
            rows_list.append(np.repeat(np.arange(scored.rows), flat.shape[1]))
            values_list.append(flat.ravel())
        rows, values = np.concatenate(rows_list), np.concatenate(values_list)
    else:
        array = scored.raw.column(column)
        array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        rows = np.repeat(np.arange(scored.rows), lengths)
        flat = pc.list_flatten(array)
        values = flat.to_numpy(zero_copy_only=False) if not (
            pa.types.is_binary(flat.type) or pa.types.is_large_binary(flat.type)) else \
            np.array(flat.to_pylist(), dtype=object)
    distinct, codes = np.unique(values, return_inverse=True)
    # One pair a (row, value): TFMA takes a row's values through np.unique.
    pair = np.unique(rows.astype(np.int64) * len(distinct) + codes)
    return RowValues(pair // max(1, len(distinct)), pair % max(1, len(distinct)),
                     distinct.tolist(), scored.rows)


def rows_holding(column: RowValues, value: Any) -> np.ndarray:
    """Rows holding `value` as TFMA compares a spec's feature value with a row's values: equal,
    or a str equal to a bytes value's encoding, or a number whose str equals a value."""
    def match(candidate: Any) -> bool:
        if candidate == value:
            return True
        if isinstance(value, str):
            return value.encode() == candidate
        return str(value) == candidate

    hits = np.array([match(v) for v in column.values], bool)
    keep = np.zeros(column.size, bool)
    keep[column.rows[hits[column.codes]]] = True
    return keep


def column_slices(columns: Sequence[str], pairs: Sequence[RowValues], keep: np.ndarray,
                  matches: Sequence[tuple]) -> dict[tuple, np.ndarray]:
    """The slices of a spec's columns: each row's combinations of its values (a cartesian
    product per row), rows outside `keep` left out."""
    rows = np.flatnonzero(keep)
    combos = np.zeros((len(rows), 0), np.int64)
    for column in pairs:
        inside = keep[column.rows]
        column_rows, column_codes = column.rows[inside], column.codes[inside]
        order = np.argsort(column_rows, kind="stable")
        column_rows, column_codes = column_rows[order], column_codes[order]
        counts = np.bincount(column_rows, minlength=len(keep))
        firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        # Each existing combination repeated once per value its row holds in this column.
        repeat = counts[rows]
        expanded_rows = np.repeat(rows, repeat)
        expanded = np.repeat(combos, repeat, axis=0)
        offsets = np.arange(len(expanded_rows)) - np.repeat(np.cumsum(repeat) - repeat, repeat)
        new_codes = column_codes[firsts[expanded_rows] + offsets]
        rows, combos = expanded_rows, np.column_stack([expanded, new_codes])
    if not len(rows):
        return {}
    distinct, inverse = np.unique(combos, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(distinct) + 1))
    found = {}
    for i, codes in enumerate(distinct):
        parts = [(column, slice_value(pairs[j].values[code], column))
                 for j, (column, code) in enumerate(zip(columns, codes))]
        key = tuple(sorted(list(matches) + parts))
        found[key] = rows[order[bounds[i]:bounds[i + 1]]]
    return found


def slice_value(value: Any, column: str) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"Found non-UTF8 feature value {value!r} in column "
                             f"{column!r}") from e
    return value


# --- a slice's metrics ----------------------------------------------------------------------
def slice_metrics(rows: Optional[np.ndarray], scorers: Sequence[ModelScorer], scored: Scored,
                  keys: Sequence[Any], instances: dict, runners: dict,
                  eval_config: Any) -> dict:
    """Every metric of every model on a slice's rows (None: all), then the candidate-minus-
    baseline diffs TFMA adds (`add_diff_metrics`). `runners`: the Keras metrics' by name."""
    found: dict = {}
    for scorer in scorers:
        scores = scored.scores[scorer.spec.name].take(rows)
        if scorer.default_metrics:
            found.update(zip(scorer.compiled_keys, scorer.compiled(scores)))
        for key in keys:
            if key.model_name == scorer.spec.name:
                found[key] = slice_stats.metric_value(instances[key.name], key, scores,
                                                        runners.get(key.name))
    return with_diffs(found, eval_config)


def slice_statistics(rows: Optional[np.ndarray], scorers: Sequence[ModelScorer],
                     scored: Scored, keys: Sequence[Any], instances: dict,
                     runners: dict) -> dict:
    """What `slice_metrics` computes its metrics from, as sums over the rows
    (`metrics.metric_statistics`; a model's compiled metrics under ("compiled", model)): the
    statistics of parts of a slice's rows add up to those of the whole slice
    (`metrics.merge_statistics`)."""
    found: dict = {}
    for scorer in scorers:
        scores = scored.scores[scorer.spec.name].take(rows)
        if scorer.default_metrics:
            found[("compiled", scorer.spec.name)] = scorer.compiled.state(scores)
        for key in keys:
            if key.model_name == scorer.spec.name and slice_stats.statistic_id(
                    instances[key.name], key) not in found:
                found.update(slice_stats.metric_statistics(
                    instances[key.name], key, scores, runners.get(key.name)))
    return found


def metrics_from_statistics(statistics: dict, scorers: Sequence[ModelScorer],
                            keys: Sequence[Any], instances: dict, runners: dict,
                            eval_config: Any) -> dict:
    """`slice_metrics` from a slice's statistics (`slice_statistics`, merged)."""
    found: dict = {}
    for scorer in scorers:
        if scorer.default_metrics:
            found.update(zip(scorer.compiled_keys, scorer.compiled.results(
                statistics[("compiled", scorer.spec.name)])))
        for key in keys:
            if key.model_name == scorer.spec.name:
                found[key] = slice_stats.statistics_value(instances[key.name], key,
                                                            statistics, runners.get(key.name))
    return with_diffs(found, eval_config)


def sliced_statistics(eval_config: Any, scored: Scored, scorers: Sequence[ModelScorer],
                      keys: Sequence[Any], instances: dict, runners: dict) -> list:
    """(slice key, `slice_statistics`) of every slice of some rows (a shard, a part): what
    the Beam job and the in-process path's parts each merge."""
    return [(slice_key, slice_statistics(rows, scorers, scored, keys, instances, runners))
            for slice_key, rows in slice_rows(eval_config, scored).items()]


def metrics_of_merged(slices: Iterable[tuple], scorers: Sequence[ModelScorer],
                      keys: Sequence[Any], instances: dict, runners: dict,
                      eval_config: Any) -> list:
    """(slice key, metrics) from each slice's merged statistics, the slices in the order
    the whole-array path writes them (`slice_order`)."""
    return [(slice_key, metrics_from_statistics(statistics, scorers, keys, instances, runners,
                                                eval_config))
            for slice_key, statistics in sorted(slices, key=slice_order(eval_config))]


def with_diffs(found: dict, eval_config: Any) -> dict:
    """`found` and the candidate-minus-baseline diffs TFMA adds (`add_diff_metrics`)."""
    baseline = model_util.get_baseline_model_spec(eval_config)
    if baseline is not None:
        diffs = {}
        for key, value in found.items():
            if key.is_diff or key.model_name == baseline.name:
                continue
            base = key.make_baseline_key(baseline.name)
            if base in found and is_diffable(value):
                diffs[key.make_diff_key()] = value - found[base]
        found.update(diffs)
    return found


def is_diffable(value: Any) -> bool:
    """Whether TFMA takes a candidate-minus-baseline diff of the value (numbers and numeric
    arrays)."""
    return isinstance(value, numbers.Number) or (
        isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.number))


def slice_order(eval_config: Any) -> Callable[[tuple], tuple]:
    """Slices in the order the in-process path writes them: by the first slicing spec that
    makes each, then by their values."""
    specs = [slicer_lib.SingleSliceSpec(spec=proto) for proto in eval_config.slicing_specs] \
        or [slicer_lib.SingleSliceSpec()]

    def order(item: tuple) -> tuple:
        slice_key = item[0]
        rank = next((i for i, spec in enumerate(specs) if spec.is_slice_applicable(slice_key)),
                    len(specs))
        return rank, tuple((column, type(value).__name__, value) for column, value in slice_key)

    return order
