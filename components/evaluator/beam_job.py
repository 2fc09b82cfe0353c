"""The fast Evaluator as a Beam pipeline, for runners that spread work over machines or
processes (Dataflow, Flink, Spark, the DirectRunner's multi_processing mode); `runs_on_beam`
says when. One element a piece of the eval split:

1. `PlanScoring`, once, decides what is scored as the in-process path does
   (`transformed.unusable`): Transform's eval split, in pieces of about `part_rows` rows
   (whole packed records of one shard, read from its stored index, so a large shard spreads
   too), when its rows pair with the raw ones and the models can score it; else the raw
   records, in pieces of about `part_rows` records of a shard (whole gzip members, by the
   manifest's member index; a shard without an index whole). `Reshuffle` spreads the
   elements over the workers.
2. `ScoreShard` scores an element with today's code (`transformed.score_transformed` on a
   piece, its functions made and compiled once a worker; `scoring.score_files` on a raw
   piece), the models loaded once a worker process through Beam's `Shared` handle, slices
   its rows (`slices.slice_rows`) and emits each slice's sufficient statistics
   (`slices.slice_statistics`: prediction histograms and confusion counts, sums of errors,
   labels and predictions, Keras metrics' variables);
3. `CheckServing`, once, beside the scoring: when the transformed split is scored, the first
   `serving_check_rows` raw records through serving_default against the same rows of it
   (`transformed.check_serving_first_rows`), the check that keeps the blessing on the
   served signature;
4. `MergeStatistics`, a CombineFn per slice, adds them up (`slice_stats.merge_statistics`:
   sums, so in any order and grouping);
5. `Finish`, once, computes each slice's metrics from them (`slices.metrics_from_statistics`,
   the code the in-process path runs) and validates and writes the ModelEvaluation as
   `evaluate.evaluate` does (`output.validate`, `output.write_evaluation`), not blessing a
   model the check refused.

A Keras metric whose variables are not sums over the rows is refused in one line naming it
(`keras_metrics.KerasRunner.check_additive`). Imports no TFX.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Optional, Sequence

import apache_beam as beam
from apache_beam.utils import shared
from tensorflow_model_analysis.proto import validation_result_pb2
from tensorflow_model_analysis.slicer import slicer_lib

from tfrecord_shards import beam_runners, fileio, record_index, tfrecord_io
from components.evaluator import evaluate, keras_metrics, kinds, output, scoring, slice_stats
from components.evaluator.config import check_config, metric_keys, slicing_columns
from components.evaluator.slices import metrics_of_merged, sliced_statistics
from components.evaluator.options import EvaluatorOptions
from components.evaluator.transformed import (
    ServingCheck, TransformedSplit, check_rows, check_serving_first_rows, score_transformed,
    unusable)
from components.trainer.options import TRANSFORMED_SIGNATURE

SUMMARY_PREFIX = "evaluator-summary-"


def runs_on_beam(beam_pipeline_args: Optional[Sequence[str]]) -> bool:
    """Whether the Evaluator runs as a Beam pipeline under these Beam args: on any runner
    but the DirectRunner, and on the DirectRunner in its multi_processing mode. Without Beam
    args, or on the DirectRunner in process (in_memory, multi_threading), it scores in this
    process (`evaluate.evaluate`), without Beam's start-up."""
    return not beam_runners.args_in_this_process(beam_pipeline_args)


def run(eval_config: Any, data_files: Sequence[str], model_paths: dict[str, str],
        output_uri: str, schema: Any = None, options: EvaluatorOptions = EvaluatorOptions(),
        make_pipeline: Optional[Callable[[], beam.Pipeline]] = None,
        beam_pipeline_args: Optional[Sequence[str]] = None,
        temp_dir: Optional[str] = None,
        transformed: Optional[TransformedSplit] = None) -> evaluate.EvalResult:
    """`evaluate.evaluate` as a Beam pipeline (`make_pipeline`, or one of
    `beam_pipeline_args`): the same arguments, outputs and result. `temp_dir` holds a small
    summary the pipeline leaves for this process (a folder its workers can write: the
    executor's temp folder; a local one by default)."""
    started = time.perf_counter()
    check_config(eval_config)
    keys, instances = metric_keys(eval_config)
    for instance in instances.values():
        if kinds.is_keras(instance):
            keras_metrics.KerasRunner.of_metric(instance).check_additive()
    data_files = list(data_files)
    if not data_files:
        raise ValueError("no examples to evaluate in no files")
    local_temp = None
    if temp_dir is None:
        temp_dir = local_temp = tempfile.mkdtemp(prefix="evaluator-")
    summary_path = fileio.join(temp_dir, f"{SUMMARY_PREFIX}{uuid.uuid4().hex}.json")
    job = Job(eval_config, dict(model_paths), schema, options, data_files, transformed)
    models = shared.Shared()
    make_pipeline = make_pipeline or (lambda: beam.Pipeline(
        argv=[str(arg) for arg in beam_pipeline_args or []]))
    try:
        with make_pipeline() as pipeline:
            once = pipeline | "Once" >> beam.Create([None])
            scored = (once
                      | "Plan" >> beam.ParDo(PlanScoring(job, models))
                      | "Spread" >> beam.Reshuffle()
                      | "Score" >> beam.ParDo(ScoreShard(job, models)).with_outputs(
                          ScoreShard.ROWS, main="slices"))
            checks = once | "CheckServing" >> beam.ParDo(CheckServing(job, models))
            merged = (scored.slices
                      | "Merge" >> beam.CombinePerKey(MergeStatistics())
                      | "Values" >> beam.Values())
            counts = scored[ScoreShard.ROWS] | "Rows" >> beam.CombinePerKey(added_counts)
            _ = (once
                 | "Finish" >> beam.ParDo(Finish(job, models, output_uri, summary_path),
                                          slices=beam.pvalue.AsList(merged),
                                          counts=beam.pvalue.AsDict(counts),
                                          checks=beam.pvalue.AsList(checks)))
        summary = fileio.read_json(summary_path)
        if summary is None:
            raise RuntimeError(f"the Evaluator's Beam pipeline ended without its summary "
                               f"({summary_path}): did its last step run?")
        fileio.remove(summary_path)
    finally:
        if local_temp:
            fileio.rmtree(local_temp)
    validation = read_validation(output_uri)
    seconds = time.perf_counter() - started
    check = ServingCheck(**summary["serving_check"]) if summary.get("serving_check") else None
    if check is not None and check.refusal:
        logging.error("Evaluator: %s", check.refusal)
    scored = "; ".join(f"{elements} {SCORED_WORDS[kind]}"
                       for kind, (elements, _) in sorted(summary["scored"].items()))
    logging.info("Evaluator on Beam: %d rows, %d slices, %d model(s): %s, in %.1f s",
                 summary["rows"], summary["slices"], len(model_paths), scored, seconds)
    return evaluate.EvalResult(validation, summary["rows"], summary["slices"], seconds, check)


def read_validation(output_uri: str) -> Any:
    """The ValidationResult the pipeline wrote."""
    path = fileio.join(output_uri, output.VALIDATIONS_FILE)
    (record,) = [record for _, record in tfrecord_io.iter_records(path)]
    return validation_result_pb2.ValidationResult.FromString(record)


class Job:
    """What every step needs: the eval config (TFMA's defaults applied), the models, the
    schema, options and the files to score (raw, and Transform's of the same rows when
    given). Pickled into the steps; `tag` names its models in a worker."""

    def __init__(self, eval_config: Any, model_paths: dict[str, str], schema: Any,
                 options: EvaluatorOptions, data_files: Sequence[str],
                 transformed: Optional[TransformedSplit] = None):
        self.eval_config, self.model_paths = eval_config, model_paths
        self.schema, self.options = schema, options
        self.data_files, self.transformed = list(data_files), transformed
        digest = hashlib.sha256(eval_config.SerializeToString(deterministic=True))
        for name in sorted(model_paths):
            digest.update(f"\0{name}\0{model_paths[name]}".encode())
        self.tag = digest.hexdigest()


class Models:
    """A worker's models and metric objects, made once a process (`Shared`): the scorers,
    the metric keys and instances, the configured Keras metrics' runners, and a lock that
    keeps threads apart while Keras metric variables are reset, updated and read."""

    def __init__(self, job: Job):
        config = job.eval_config
        self.keys, self.instances = metric_keys(config)
        self.scorers = [scoring.ModelScorer.load(spec, job.model_paths[spec.name], config)
                        for spec in config.model_specs]
        self.runners = {name: keras_metrics.KerasRunner.of_metric(instance)
                        for name, instance in self.instances.items()
                        if kinds.is_keras(instance)}
        for scorer in self.scorers:
            if scorer.default_metrics:
                scorer.compiled.check_additive()
        columns = slicing_columns(config)
        self.raw_names = sorted(
            {s.spec.label_key for s in self.scorers if not s.label_transformed} |
            {c for c in columns if not any(c in s.transformed_outputs for s in self.scorers)})
        # The same decision on every worker: the same models, config and split.
        self.why_not_transformed = unusable(self.scorers, self.raw_names, columns,
                                            job.transformed) \
            if job.options.score_transformed else "score_transformed is off"
        # The score_transformed functions, made (and compiled) once for every piece.
        self.scoring_functions: dict = {}
        self.lock = threading.Lock()


class _ModelsStep(beam.DoFn):
    def __init__(self, job: Job, models: shared.Shared):
        self._job, self._shared = job, models
        self._models: Optional[Models] = None

    def setup(self) -> None:
        job = self._job
        self._models = self._shared.acquire(lambda: Models(job), tag=job.tag)


# The kinds of file `PlanScoring` hands `ScoreShard`.
RAW, TRANSFORMED = "raw", "transformed"
SCORED_WORDS = {RAW: "piece(s) of raw records through serving_default",
                TRANSFORMED: f"piece(s) of Transform's split through {TRANSFORMED_SIGNATURE}"}


class PlanScoring(_ModelsStep):
    """Once: what to score, as (RAW, a piece of a raw file: about `part_rows` records,
    `record_index.pieces`) or (TRANSFORMED, a piece of Transform's split: about `part_rows`
    rows of one file, `TransformedSplit.pieces`)."""

    def process(self, _: Any) -> Iterator[tuple]:
        job, models = self._job, self._models
        if models.why_not_transformed:
            if job.transformed is not None:
                logging.info("Evaluator: scoring the raw records: %s",
                             models.why_not_transformed)
            pieces = record_index.pieces(job.data_files, job.options.part_rows)
            logging.info("Evaluator: scoring %d raw files through serving_default, in %d "
                         "pieces", len(job.data_files), len(pieces))
            yield from ((RAW, piece) for piece in pieces)
            return
        pieces = job.transformed.pieces(job.options.part_rows)
        logging.info("Evaluator: scoring %d transformed rows through %s, in %d pieces",
                     job.transformed.rows, TRANSFORMED_SIGNATURE, len(pieces))
        yield from ((TRANSFORMED, piece) for piece in pieces)


class ScoreShard(_ModelsStep):
    """Scores one element (a piece of a raw shard or of Transform's split); emits (slice id,
    (slice key, statistics)) a slice of its rows, and (its kind, (1, its rows)) to ROWS."""

    ROWS = "rows"

    def process(self, element: tuple) -> Iterator[Any]:
        job, models = self._job, self._models
        kind, work = element
        # A transformed piece is scored in parts (`part_rows`), each reduced as it comes, so
        # its scores are never all in memory; a raw piece (about `part_rows` records, or a
        # whole file without an index) at once, as in process.
        parts = score_transformed(models.scorers, work, job.options,
                                  models.scoring_functions) if kind == TRANSFORMED \
            else [scoring.score_files(models.scorers, [work], models.raw_names, job.schema,
                                      job.options)]
        rows = 0
        for scored in parts:
            rows += scored.rows
            if not scored.rows:
                continue
            with models.lock:
                found = sliced_statistics(job.eval_config, scored, models.scorers,
                                          models.keys, models.instances, models.runners)
            yield from ((slice_id(slice_key), (slice_key, statistics))
                        for slice_key, statistics in found)
        yield beam.pvalue.TaggedOutput(self.ROWS, (kind, (1, rows)))


class CheckServing(_ModelsStep):
    """Once, when Transform's split is scored: serving_default on the first raw rows against
    the same rows of it (a ServingCheck); nothing otherwise."""

    def process(self, _: Any) -> Iterator[ServingCheck]:
        job, models = self._job, self._models
        if not models.why_not_transformed:
            yield check_serving_first_rows(models.scorers, job.transformed, job.data_files,
                                           job.options)


def slice_id(slice_key: tuple) -> bytes:
    """A slice key as Beam's grouping key: TFMA's serialized SliceKey, deterministic bytes
    whatever the values' types."""
    return slicer_lib.serialize_slice_key(slice_key).SerializeToString(deterministic=True)


class MergeStatistics(beam.CombineFn):
    """A slice's statistics from its parts (shards): (slice key, statistics) added up by
    `slice_stats.merge_statistics`, sums whatever the order and grouping Beam merges them in."""

    def create_accumulator(self) -> Optional[tuple]:
        return None

    def add_input(self, accumulator: Optional[tuple], part: tuple) -> tuple:
        return self.merge_accumulators([accumulator, part])

    def merge_accumulators(self, accumulators) -> Optional[tuple]:
        found = [a for a in accumulators if a is not None]
        if not found:
            return None
        return found[0][0], slice_stats.merge_statistics([a[1] for a in found])

    def extract_output(self, accumulator: Optional[tuple]) -> Optional[tuple]:
        return accumulator


class Finish(_ModelsStep):
    """Once: every slice's metrics from its merged statistics, validated and written as
    `evaluate.evaluate` writes them (not blessed where the serving check refused); the rows,
    slices, files and check to the summary file."""

    def __init__(self, job: Job, models: shared.Shared, output_uri: str, summary_path: str):
        super().__init__(job, models)
        self._output_uri, self._summary_path = output_uri, summary_path

    def process(self, _: Any, slices: list, counts: dict, checks: list) -> None:
        job, models = self._job, self._models
        check = checks[0] if checks else None
        rows = sum(scored_rows for _, scored_rows in counts.values())
        if not rows:
            files = job.transformed.files if check else job.data_files
            raise ValueError(f"no examples to evaluate in {', '.join(files)}")
        if check is not None:
            check_rows(rows, job.transformed)
        with models.lock:
            sliced_metrics = metrics_of_merged(slices, models.scorers, models.keys,
                                               models.instances, models.runners,
                                               job.eval_config)
        validation = output.validate(sliced_metrics, job.eval_config)
        if check is not None and check.refusal:
            validation.validation_ok = False  # logged by `run`, in the launching process
        output.write_evaluation(self._output_uri, job.eval_config, sliced_metrics,
                                  validation, dict(job.model_paths), job.data_files, check)
        fileio.makedirs(fileio.dirname(self._summary_path))
        fileio.write_json(self._summary_path, {
            "rows": int(rows), "slices": len(sliced_metrics),
            "scored": {kind: [int(elements), int(scored_rows)]
                       for kind, (elements, scored_rows) in counts.items()},
            "serving_check": dataclasses.asdict(check) if check else None})


def added_counts(counts) -> tuple[int, int]:
    """(elements, rows) of many (elements, rows): a CombinePerKey's function, so any
    grouping."""
    elements = rows = 0
    for more_elements, more_rows in counts:
        elements, rows = elements + more_elements, rows + more_rows
    return elements, rows
