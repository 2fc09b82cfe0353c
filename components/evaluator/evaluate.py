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
import logging
import time
from typing import Any, Optional, Sequence

from components.evaluator import keras_metrics, kinds
from components.evaluator.config import check_config, metric_keys, slicing_columns
from components.evaluator.options import EvaluatorOptions
from components.evaluator.output import validate, write_evaluation
from components.evaluator.scoring import ModelScorer, Scored, score_files
from components.evaluator.transformed import (ServingCheck, TransformedSplit, check_serving,
                                              score_transformed, unusable)
from components.trainer.options import TRANSFORMED_SIGNATURE
from components.evaluator.slices import slice_metrics, slice_rows


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
    scored, check = _scored(scorers, data_files, raw_names, schema, options, transformed)
    if not scored.rows:
        raise ValueError(f"no examples to evaluate in {', '.join(data_files) or 'no files'}")
    slices = slice_rows(eval_config, scored)
    runners = {name: keras_metrics.KerasRunner.of_metric(instance)
               for name, instance in instances.items() if kinds.is_keras(instance)}
    sliced_metrics = [(slice_key, slice_metrics(rows, scorers, scored, keys, instances,
                                                runners, eval_config))
                      for slice_key, rows in slices.items()]
    validation = validate(sliced_metrics, eval_config)
    if check is not None and check.refusal:
        logging.error("Evaluator: %s", check.refusal)
        validation.validation_ok = False
    write_evaluation(output_uri, eval_config, sliced_metrics, validation,
                     {s.spec.name: s.path for s in scorers}, data_files, check)
    seconds = time.perf_counter() - started
    logging.info("Evaluator: %d rows, %d slices, %d model(s) in %.1f s", scored.rows,
                 len(slices), len(scorers), seconds)
    return EvalResult(validation, scored.rows, len(slices), seconds, check)


def _scored(scorers: Sequence[ModelScorer], data_files: Sequence[str], raw_names: list[str],
            schema: Any, options: EvaluatorOptions, split: Optional[TransformedSplit]
            ) -> tuple[Scored, Optional[ServingCheck]]:
    """The models' scores: on Transform's split, checked against serving_default, when
    `split` pairs with the raw rows and the models can; else on the raw records."""
    why_not = unusable(scorers, raw_names, split) if options.score_transformed else \
        "score_transformed is off"
    if why_not:
        if split is not None or options.score_transformed is False:
            logging.info("Evaluator: scoring the raw records: %s", why_not)
        return score_files(scorers, data_files, raw_names, schema, options), None
    logging.info("Evaluator: scoring %d transformed rows through %s", split.rows,
                 TRANSFORMED_SIGNATURE)
    scored = score_transformed(scorers, split, options)
    return scored, check_serving(scorers, data_files, scored, options)
