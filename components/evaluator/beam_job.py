"""The fast Evaluator as a Beam pipeline, for runners that spread work over machines or
processes (Dataflow, Flink, Spark, the DirectRunner's multi_processing mode); `runs_on_beam`
says when. One element a shard file of the eval split:

1. `ScoreShard` scores the shard with today's code (`scoring.score_files` on that one file),
   the models loaded once a worker process through Beam's `Shared` handle, slices its rows
   (`slices.slice_rows`) and emits each slice's sufficient statistics
   (`slices.slice_statistics`: prediction histograms and confusion counts, sums of errors,
   labels and predictions, Keras metrics' variables);
2. `MergeStatistics`, a CombineFn per slice, adds them up (`slice_stats.merge_statistics`:
   sums, so in any order and grouping);
3. `Finish`, once, computes each slice's metrics from them (`slices.metrics_from_statistics`,
   the code the in-process path runs) and validates and writes the ModelEvaluation as
   `evaluate.evaluate` does (`output.validate`, `output.write_evaluation`).

A Keras metric whose variables are not sums over the rows is refused in one line naming it
(`keras_metrics.KerasRunner.check_additive`). Imports no TFX.
"""
from __future__ import annotations

import hashlib
import logging
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Optional, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.utils import shared
from tensorflow_model_analysis.proto import validation_result_pb2
from tensorflow_model_analysis.slicer import slicer_lib

from tfrecord_shards import fileio, tfrecord_io
from components.evaluator import evaluate, keras_metrics, kinds, output, scoring, slice_stats
from components.evaluator.config import check_config, metric_keys, slicing_columns
from components.evaluator.slices import metrics_of_merged, sliced_statistics
from components.evaluator.options import EvaluatorOptions

# Runners that run in this process unless told otherwise (`--direct_running_mode`).
LOCAL_RUNNERS = ("direct", "directrunner", "bundlebaseddirectrunner", "switchingdirectrunner")
SUMMARY_PREFIX = "evaluator-summary-"


def runs_on_beam(beam_pipeline_args: Optional[Sequence[str]]) -> bool:
    """Whether the Evaluator runs as a Beam pipeline under these Beam args: on any runner
    but the DirectRunner, and on the DirectRunner in its multi_processing mode. Without Beam
    args, or on the DirectRunner in process (in_memory, multi_threading), it scores in this
    process (`evaluate.evaluate`), without Beam's start-up."""
    if not beam_pipeline_args:
        return False
    options = PipelineOptions([str(arg) for arg in beam_pipeline_args])
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    if not isinstance(runner, str):
        runner = type(runner).__name__
    if runner.rsplit(".", 1)[-1].lower() not in LOCAL_RUNNERS:
        return True
    return options.view_as(DirectOptions).direct_running_mode == "multi_processing"


def run(eval_config: Any, data_files: Sequence[str], model_paths: dict[str, str],
        output_uri: str, schema: Any = None, options: EvaluatorOptions = EvaluatorOptions(),
        make_pipeline: Optional[Callable[[], beam.Pipeline]] = None,
        beam_pipeline_args: Optional[Sequence[str]] = None,
        temp_dir: Optional[str] = None) -> evaluate.EvalResult:
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
    job = Job(eval_config, dict(model_paths), schema, options)
    models = shared.Shared()
    make_pipeline = make_pipeline or (lambda: beam.Pipeline(
        argv=[str(arg) for arg in beam_pipeline_args or []]))
    try:
        with make_pipeline() as pipeline:
            scored = (pipeline
                      | "Shards" >> beam.Create(data_files)
                      | "Score" >> beam.ParDo(ScoreShard(job, models)).with_outputs(
                          ScoreShard.ROWS, main="slices"))
            merged = (scored.slices
                      | "Merge" >> beam.CombinePerKey(MergeStatistics())
                      | "Values" >> beam.Values())
            rows = scored[ScoreShard.ROWS] | "Rows" >> beam.CombineGlobally(sum)
            _ = (pipeline
                 | "Once" >> beam.Create([None])
                 | "Finish" >> beam.ParDo(Finish(job, models, output_uri, data_files,
                                                 summary_path),
                                          slices=beam.pvalue.AsList(merged),
                                          rows=beam.pvalue.AsSingleton(rows)))
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
    logging.info("Evaluator on Beam: %d rows, %d slices, %d model(s), %d file(s) in %.1f s",
                 summary["rows"], summary["slices"], len(model_paths), len(data_files),
                 seconds)
    return evaluate.EvalResult(validation, summary["rows"], summary["slices"], seconds)


def read_validation(output_uri: str) -> Any:
    """The ValidationResult the pipeline wrote."""
    path = fileio.join(output_uri, output.VALIDATIONS_FILE)
    (record,) = [record for _, record in tfrecord_io.iter_records(path)]
    return validation_result_pb2.ValidationResult.FromString(record)


class Job:
    """What every step needs: the eval config (TFMA's defaults applied), the models, the
    schema and options. Pickled into the steps; `tag` names its models in a worker."""

    def __init__(self, eval_config: Any, model_paths: dict[str, str], schema: Any,
                 options: EvaluatorOptions):
        self.eval_config, self.model_paths = eval_config, model_paths
        self.schema, self.options = schema, options
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
        self.lock = threading.Lock()


class _ModelsStep(beam.DoFn):
    def __init__(self, job: Job, models: shared.Shared):
        self._job, self._shared = job, models
        self._models: Optional[Models] = None

    def setup(self) -> None:
        job = self._job
        self._models = self._shared.acquire(lambda: Models(job), tag=job.tag)


class ScoreShard(_ModelsStep):
    """Scores one shard file; emits (slice id, (slice key, statistics)) a slice of its rows,
    and its row count to ROWS."""

    ROWS = "rows"

    def process(self, path: str) -> Iterator[Any]:
        job, models = self._job, self._models
        scored = scoring.score_files(models.scorers, [path], models.raw_names, job.schema,
                                      job.options)
        yield beam.pvalue.TaggedOutput(self.ROWS, scored.rows)
        if not scored.rows:
            return
        with models.lock:
            found = [(slice_id(slice_key), (slice_key, statistics))
                     for slice_key, statistics in sliced_statistics(
                         job.eval_config, scored, models.scorers, models.keys,
                         models.instances, models.runners)]
        yield from found


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
    `evaluate.evaluate` writes them; the rows and slices counted to the summary file."""

    def __init__(self, job: Job, models: shared.Shared, output_uri: str,
                 data_files: Sequence[str], summary_path: str):
        super().__init__(job, models)
        self._output_uri, self._data_files = output_uri, list(data_files)
        self._summary_path = summary_path

    def process(self, _: Any, slices: list, rows: int) -> None:
        job, models = self._job, self._models
        if not rows:
            raise ValueError(f"no examples to evaluate in {', '.join(self._data_files)}")
        with models.lock:
            sliced_metrics = metrics_of_merged(slices, models.scorers, models.keys,
                                               models.instances, models.runners,
                                               job.eval_config)
        validation = output.validate(sliced_metrics, job.eval_config)
        output.write_evaluation(self._output_uri, job.eval_config, sliced_metrics,
                                  validation, dict(job.model_paths), self._data_files)
        fileio.makedirs(fileio.dirname(self._summary_path))
        fileio.write_json(self._summary_path, {"rows": int(rows),
                                               "slices": len(sliced_metrics)})
