"""The fast Evaluator's engine: TFMA's evaluation of one or two exported models on the raw
eval examples, without Beam and without TFX, written as TFMA writes it.

The examples are read with our framing reader (`tfrecord_io.iter_record_blocks`, ~16 MB of
records a block). Each model scores them through its own serving signature in one
`tf.function` call per batch: the batch's records are cut out of the block's bytes inside
TensorFlow (`tf.strings.substr` of one string tensor, no Python object a record), and the
model's preprocessing signatures (`transform_features`, when the eval config names them) run
in the same call for the label and any sliced feature they output (scoring.py). Features the
model does not output (a raw label, slicing columns) are decoded with
`parser.decode_record_block` (raw_features.py). Metrics are then computed per slice
(slices.py) on whole arrays (scores.py, confusion.py, means.py, keras_metrics.py, through
slice_stats.py); TFMA's own code gives the metric keys (config.py), checks the thresholds
(`metrics_validator`, `CombineValidations`) and makes the protos that
`tfma.load_eval_result`, `load_metrics` and `load_validation_result` read (output.py).
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np

from components.evaluator import keras_metrics, kinds, slice_stats
from components.evaluator.config import check_config, metric_keys, slicing_columns
from components.evaluator.options import EvaluatorOptions, UnsupportedSetting
from components.evaluator.output import validate, write_evaluation
from components.evaluator.scoring import ModelScorer, Scored, score_files
from components.evaluator.scores import Scores
from components.evaluator.slices import (metrics_of_merged, slice_metrics, slice_rows,
                                         sliced_statistics)
from components.evaluator.transformed import (ServingCheck, TransformedSplit, check_serving,
                                              score_transformed, unusable)
from components.trainer.options import TRANSFORMED_SIGNATURE


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """What an evaluation found: the validation result TFMA would write, and counts."""

    validation: Any  # validation_result_pb2.ValidationResult
    rows: int
    slices: int
    seconds: float
    serving_check: Optional[ServingCheck] = None  # when the transformed split was scored


def evaluate(eval_config: Any, data_files: Sequence[str], model_paths: dict[str, str],
             output_uri: str, schema: Any = None,
             options: EvaluatorOptions = EvaluatorOptions(),
             transformed: Optional[TransformedSplit] = None) -> EvalResult:
    """Evaluates the models of `eval_config` (a tfma.EvalConfig with TFMA's defaults applied,
    as `update_eval_config_with_defaults` leaves it), found at `model_paths` by model spec
    name, on the tf.Examples in `data_files` (TFRecord, gzip or plain), and writes TFMA's
    ModelEvaluation files to `output_uri`. `schema` types the features decoded here (a raw
    label, slicing columns); without it, the schema.pbtxt beside our ExampleGen's shards, or
    the first records' own types. With `transformed` (Transform's files of the same rows, in
    the same order), the models score those instead, checked against serving_default on the
    first rows (transformed.py)."""
    started = time.perf_counter()
    check_config(eval_config)
    keys, instances = metric_keys(eval_config)
    scorers = [ModelScorer.load(spec, model_paths[spec.name], eval_config)
               for spec in eval_config.model_specs]
    columns = slicing_columns(eval_config)
    raw_names = sorted({s.spec.label_key for s in scorers if not s.label_transformed} |
                       {c for c in columns if not any(c in s.transformed_outputs
                                                      for s in scorers)})
    runners = {name: keras_metrics.KerasRunner.of_metric(instance)
               for name, instance in instances.items() if kinds.is_keras(instance)}
    why_not = unusable(scorers, raw_names, columns, transformed) if options.score_transformed \
        else "score_transformed is off"
    if why_not:
        if transformed is not None:
            logging.info("Evaluator: scoring the raw records: %s", why_not)
        scored, check = score_files(scorers, data_files, raw_names, schema, options), None
        if not scored.rows:
            raise ValueError(f"no examples to evaluate in {', '.join(data_files) or 'no files'}")
        rows, sliced_metrics = scored.rows, _whole_metrics(scored, scorers, keys, instances,
                                                           runners, eval_config)
    else:
        logging.info("Evaluator: scoring %d transformed rows through %s", transformed.rows,
                     TRANSFORMED_SIGNATURE)
        parts, check = _checked(score_transformed(scorers, transformed, options), scorers,
                                data_files, options)
        rows, sliced_metrics = _merged_metrics(parts, scorers, keys, instances, runners,
                                               eval_config)
        if not rows:
            raise ValueError(f"no examples to evaluate in {', '.join(transformed.files)}")
    validation = validate(sliced_metrics, eval_config)
    if check is not None and check.refusal:
        logging.error("Evaluator: %s", check.refusal)
        validation.validation_ok = False
    write_evaluation(output_uri, eval_config, sliced_metrics, validation,
                     {s.spec.name: s.path for s in scorers}, data_files, check)
    seconds = time.perf_counter() - started
    logging.info("Evaluator: %d rows, %d slices, %d model(s) in %.1f s", rows,
                 len(sliced_metrics), len(scorers), seconds)
    return EvalResult(validation, rows, len(sliced_metrics), seconds, check)


def _checked(parts: Iterator[Scored], scorers: Sequence[ModelScorer],
             data_files: Sequence[str], options: EvaluatorOptions
             ) -> tuple[Iterator[Scored], ServingCheck]:
    """`parts` as they come, and the check of serving_default against the first one (which
    holds at least `serving_check_rows` rows, or all)."""
    first = next(parts, None)
    if first is None:
        return iter(()), ServingCheck(0, 0.0, None)
    return itertools.chain([first], parts), check_serving(scorers, data_files, first, options)


def _whole_metrics(scored: Scored, scorers: Sequence[ModelScorer], keys: Sequence[Any],
                   instances: dict, runners: dict, eval_config: Any) -> list:
    """Every slice's metrics on the whole arrays of its rows."""
    return [(slice_key, slice_metrics(rows, scorers, scored, keys, instances, runners,
                                      eval_config))
            for slice_key, rows in slice_rows(eval_config, scored).items()]


def _merged_metrics(parts: Iterable[Scored], scorers: Sequence[ModelScorer],
                    keys: Sequence[Any], instances: dict, runners: dict, eval_config: Any
                    ) -> tuple[int, list]:
    """Every slice's metrics over the rows of all `parts`: from each part's sufficient
    statistics, merged, so one part at a time is in memory, when every metric's statistics
    add up over parts of the rows; else on whole arrays, the parts joined."""
    if not _additive(scorers, runners):
        whole = _joined(list(parts))
        return whole.rows, _whole_metrics(whole, scorers, keys, instances, runners,
                                          eval_config) if whole.rows else []
    merged: dict = {}
    total = 0
    for part in parts:
        total += part.rows
        for slice_key, found in sliced_statistics(eval_config, part, scorers, keys, instances,
                                                  runners):
            merged[slice_key] = slice_stats.merge_statistics([merged[slice_key], found]) \
                if slice_key in merged else found
    return total, metrics_of_merged(merged.items(), scorers, keys, instances, runners,
                                    eval_config)


def _additive(scorers: Sequence[ModelScorer], runners: dict) -> bool:
    """Whether every Keras metric's variables are sums over the rows."""
    try:
        for runner in [*runners.values(), *(s.compiled for s in scorers if s.default_metrics)]:
            runner.check_additive()
    except UnsupportedSetting:
        return False
    return True


def _joined(parts: list[Scored]) -> Scored:
    """One Scored of all the parts' rows, in order."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return Scored(0, {}, {}, None)
    names = parts[0].scores
    return Scored(sum(p.rows for p in parts),
                  {name: Scores(np.concatenate([p.scores[name].labels for p in parts]),
                                np.concatenate([p.scores[name].predictions for p in parts]))
                   for name in names}, {name: {} for name in parts[0].transformed}, None)
