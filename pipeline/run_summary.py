"""What the latest run of a pipeline produced, read back from its ML Metadata store."""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Callable, Optional

import tensorflow_model_analysis as tfma
from ml_metadata import metadata_store
from ml_metadata.proto import metadata_store_pb2

from components.example_gen import artifacts as tfx_artifacts
from tfrecord_shards import fileio
from components.production_model.find import PUSHED_MODEL
from tfrecord_shards.shards import read_manifest
from components.evaluator.output import SERVING_CHECK_FILE
from components.trainer.options import REPORT_FILE

# The EvalConfig's model names (pipeline.eval_config); TFMA keys each metric by them.
CANDIDATE_MODEL, BASELINE_MODEL = "candidate", "baseline"
# Wide enough for every node id.
NODE_WIDTH = 29
_OUTPUT_EVENTS = (metadata_store_pb2.Event.OUTPUT, metadata_store_pb2.Event.DECLARED_OUTPUT)
_STATE_NAMES = {
    metadata_store_pb2.Execution.COMPLETE: "ran",
    metadata_store_pb2.Execution.CACHED: "cached",
    metadata_store_pb2.Execution.FAILED: "failed",
    metadata_store_pb2.Execution.RUNNING: "running",
}


@dataclasses.dataclass
class RunSummary:
    run_id: str
    components: dict[str, str]  # node id -> "ran" | "cached" | ...
    artifacts: dict[str, list[metadata_store_pb2.Artifact]]  # type name -> artifacts
    rows_per_split: dict[str, int]
    schema_path: Optional[str]
    anomalies: dict[str, list[str]]  # split -> anomaly descriptions
    pushed_model: Optional[str]
    blessed: Optional[bool] = None
    # Overall metrics of the Evaluator on the eval split, name -> value.
    evaluation: dict[str, float] = dataclasses.field(default_factory=dict)
    task: Optional[str] = None  # what the Trainer was told to learn (components/trainer/tasks.py)
    task_reason: str = ""  # why, when the pipeline inferred it
    # Rows ExampleGen read but did not write, by why: quarantined, without a label.
    rows_left_out: dict[str, int] = dataclasses.field(default_factory=dict)
    # The latest blessed model the new one was compared with (its URI), and its metrics on
    # the same eval rows; None when there was none yet (the bounds alone decided).
    baseline_model: Optional[str] = None
    baseline_evaluation: dict[str, float] = dataclasses.field(default_factory=dict)
    # Why the Evaluator did not bless: "metric: what failed", one a threshold.
    validation_failures: list[str] = dataclasses.field(default_factory=list)
    resolvers: list[str] = dataclasses.field(default_factory=list)  # node ids
    # The span and version ExampleGen read ((0, 0) for a source without spans).
    span: tuple[int, int] = (0, 0)
    # Every span of a range ExampleGen read together; empty for one span.
    spans: tuple[int, ...] = ()
    # The spans Transform analysed this run, and those whose analysis it took from the
    # analyzer cache (a window of spans); empty when it analysed one input.
    analysed_spans: tuple[int, ...] = ()
    cached_spans: tuple[int, ...] = ()
    # What the Trainer's report says of its rows: trained on, choosing the weights, and
    # whether it read the eval split (components/trainer/module.py, `_validation_report`).
    trainer_rows: dict = dataclasses.field(default_factory=dict)
    # How serving_default compared with the scores on Transform's split (our Evaluator's
    # serving_check.json); empty when the Evaluator scored the raw records.
    serving_check: dict = dataclasses.field(default_factory=dict)

    def format(self, components: bool = True) -> str:
        """The run as text; `components=False` leaves out the line per component, for a run
        whose progress already printed one per component as each finished."""
        lines = [f"Run {self.run_id}"]
        if components:
            lines += [f"  {node:<{NODE_WIDTH}} {state}"
                      for node, state in self.components.items()]
            lines += [f"  {node:<{NODE_WIDTH}} resolved" for node in self.resolvers]
        cached = list(self.components.values()).count("cached")
        lines.append(f"Reused from cache: {cached} of {len(self.components)} components")
        rows = ", ".join(f"{s}={n:,}" for s, n in self.rows_per_split.items()) or "unknown"
        lines.append(f"Rows per split: {rows}")
        if len(self.spans) > 1:
            lines.append(f"Spans: {self.spans[0]}-{self.spans[-1]}" +
                         (f", the last at version {self.span[1]}" if self.span[1] else ""))
        elif self.span != (0, 0):
            lines.append(f"Span: {self.span[0]}" + (f", version {self.span[1]}"
                                                   if self.span[1] else ""))
        if self.cached_spans or len(self.analysed_spans) > 1:
            lines.append(f"Transform: analysed span(s) {_listed(self.analysed_spans)}; "
                         f"{_listed(self.cached_spans)} from the analyzer cache")
        left_out = [f"{n:,} {why}" for why, n in self.rows_left_out.items() if n]
        if left_out:
            lines.append(f"Rows left out: {', '.join(left_out)}")
        lines.append(f"Schema: {self.schema_path}")
        found = sum(len(a) for a in self.anomalies.values())
        lines.append(f"Anomalies found: {found}")
        for split, items in self.anomalies.items():
            lines += [f"  {split}: {item}" for item in items]
        if self.task:
            lines.append(f"Task: {self.task}" + (f" ({self.task_reason})"
                                                 if self.task_reason else ""))
        if self.trainer_rows:
            lines.append(trainer_line(self.trainer_rows))
        if self.evaluation:
            lines.append("Evaluation (eval split): " + ", ".join(
                f"{name}={_metric(value)}" for name, value in sorted(self.evaluation.items())))
        if self.serving_check:
            lines.append(
                "Scored: Transform's eval split through score_transformed; serving_default on "
                f"the first {self.serving_check['rows']:,} rows differed by at most "
                f"{self.serving_check['largest_difference']:.3g}")
        if self.baseline_model:
            lines.append(f"Compared with the model in production: {self.baseline_model}" + (
                " (" + ", ".join(f"{name}={_metric(value)}" for name, value in
                                 sorted(self.baseline_evaluation.items())) + ")"
                if self.baseline_evaluation else ""))
        elif self.evaluation:
            lines.append("Compared with: no blessed model yet (bounds alone)")
        if self.blessed is not None:
            lines.append(f"Model blessed by Evaluator: {'yes' if self.blessed else 'no'}")
        lines += [f"  not blessed: {failure}" for failure in self.validation_failures]
        lines.append(f"Pushed model: {self.pushed_model or 'not pushed'}")
        return "\n".join(lines)


def trainer_line(rows: dict) -> str:
    """The Trainer's rows: how many trained, how many chose the weights and where from."""
    if rows.get("split"):
        source = f"the {rows['split']} split"
    elif rows.get("fraction"):
        source = (f"{rows['fraction']:.0%} of the train split, held out by a hash of each "
                  f"{rows['hashed']}")
    else:
        source = "none held out: the last step's weights"
    eval_split = "read" if rows.get("eval_split_read") else "untouched"
    # A small train split is fitted again on every train row for the length they chose.
    refit = f"; then all {rows['refit_rows']:,} train rows trained the exported model for " \
        f"{rows['refit_steps']:,} steps" if rows.get("refit_rows") else ""
    # A large split's scaling sample gives its training rows' count as an estimate.
    about = "about " if rows.get("rows_trained_estimated") else ""
    return (f"Trainer: {about}{rows.get('rows_trained', 0):,} rows trained; "
            f"{rows.get('rows_choosing_weights', 0):,} validation rows chose the "
            f"{'training length' if refit else 'weights'} ({source}){refit}; "
            f"eval split {eval_split}")


def trainer_rows(artifacts) -> dict:
    """The validation part of the Trainer's input_report.json, from its ModelRun."""
    for model_run in artifacts.get("ModelRun", []):
        report = fileio.read_json(fileio.join(model_run.uri, REPORT_FILE))
        if report and report.get("validation"):
            return report["validation"]
    return {}


def _metric(value: float) -> str:
    """A count as the integer it is (17,791), any other metric to four figures."""
    return f"{int(value):,}" if float(value).is_integer() and abs(value) >= 1 else f"{value:.4g}"


# Reads an Examples folder's manifest (None where it has none). At 30M rows ExampleGen's is
# 10 MB (its gzip members' index), so a summary reads each once (`summarize`).
ManifestReader = Callable[[str], Optional[dict]]
# ExampleGen's Examples artifact and its manifest (`example_gen_output`), or None.
ExampleGenOutput = Optional[tuple[metadata_store_pb2.Artifact, dict]]


def example_gen_output(artifacts, read: ManifestReader) -> ExampleGenOutput:
    """ExampleGen's Examples artifact and its manifest (Transform's manifest has no
    "format")."""
    for examples in artifacts.get("Examples", []):
        manifest = read(examples.uri)
        if manifest and "format" in manifest:
            return examples, manifest
    return None


def example_gen_span(found: ExampleGenOutput) -> tuple[int, int]:
    """(span, version) of ExampleGen's Examples artifact."""
    if not found:
        return (0, 0)
    properties = found[0].properties
    return tuple(properties[name].int_value if name in properties else 0
                 for name in ("span", "version"))


def example_gen_spans(found: ExampleGenOutput) -> tuple[int, ...]:
    """The spans of a range ExampleGen read into one artifact (its `spans` property)."""
    return (tfx_artifacts.spans_of(found[0], tfx_artifacts.SPANS) or ()) if found else ()


def _listed(spans: tuple[int, ...]) -> str:
    return ", ".join(map(str, spans)) or "none"


def transform_spans(artifacts) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(spans analysed, spans from the analyzer cache) of ShardedTransform's output."""
    for examples in artifacts.get("Examples", []):
        analysed = tfx_artifacts.spans_of(examples, tfx_artifacts.ANALYSED_SPANS)
        if analysed is not None:
            return analysed, tfx_artifacts.spans_of(examples, tfx_artifacts.CACHED_SPANS) or ()
    return (), ()


def rows_left_out(found: ExampleGenOutput) -> dict[str, int]:
    """From ExampleGen's manifest: rows quarantined and rows without a label."""
    if not found:
        return {}
    return {"quarantined": found[1].get("rows_quarantined", 0),
            "without a label": found[1].get("rows_unlabelled", 0)}


def open_store(metadata_path: str) -> metadata_store.MetadataStore:
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(config)


def summarize(metadata_path: str, pipeline_name: str, run_id: Optional[str] = None
              ) -> RunSummary:
    """The run `run_id` of the pipeline, by default its latest."""
    store = open_store(metadata_path)
    runs = [c for c in store.get_contexts_by_type("pipeline_run")
            if pipeline_name in {p.name for p in _parent_pipelines(store, c)}]
    if run_id is not None:
        runs = [c for c in runs if c.name == run_id]
    if not runs:
        raise LookupError(f"No run {run_id or ''} of pipeline {pipeline_name!r} in "
                          f"{metadata_path}".replace("  ", " "))
    run = max(runs, key=lambda c: (c.create_time_since_epoch, c.id))
    executions = sorted(store.get_executions_by_context(run.id), key=lambda e: e.id)
    # Resolvers (the latest blessed model) resolve on every run; they are not components a
    # run can reuse, so they are listed apart.
    components = {node_name(store, execution): state_name(execution)
                  for execution in executions if not is_resolver(execution)}
    resolvers = [node_name(store, execution) for execution in executions
                 if is_resolver(execution)]
    # What this run made: a resolver's outputs are earlier runs' artifacts.
    artifacts = output_artifacts(store, [e for e in executions
                                         if not brings_earlier_artifacts(e)])
    config = trainer_config(executions)
    read = functools.cache(read_manifest)
    example_gen = example_gen_output(artifacts, read)
    candidate, baseline = evaluations(artifacts)
    variance = eval_label_variance(artifacts, config.get("label_key")) \
        if "mean_squared_error" in candidate else None
    analysed_spans, cached_spans = transform_spans(artifacts)
    checked = serving_check(artifacts)
    return RunSummary(
        run_id=run.name,
        components=components,
        resolvers=resolvers,
        artifacts=artifacts,
        rows_per_split=_rows_per_split(artifacts, read),
        rows_left_out=rows_left_out(example_gen),
        span=example_gen_span(example_gen), spans=example_gen_spans(example_gen),
        analysed_spans=analysed_spans, cached_spans=cached_spans,
        schema_path=_first_uri(artifacts, "Schema", "schema.pbtxt"),
        anomalies=anomalies(artifacts),
        pushed_model=_pushed_model(artifacts),
        blessed=_blessed(artifacts),
        evaluation=with_r_squared(candidate, variance),
        baseline_evaluation=with_r_squared(baseline, variance),
        baseline_model=baseline_model(store, executions),
        validation_failures=validation_failures(artifacts, checked.get("refusal")),
        serving_check=checked,
        task=config.get("task"), task_reason=config.get("task_reason") or "",
        trainer_rows=trainer_rows(artifacts),
    )


def trainer_config(executions) -> dict:
    """The Trainer's custom_config, as the pipeline settled it."""
    for execution in executions:
        for properties in (execution.properties, execution.custom_properties):
            if "custom_config" in properties:
                try:
                    config = json.loads(properties["custom_config"].string_value or "{}")
                except ValueError:
                    continue
                if isinstance(config, dict) and config.get("task"):
                    return config
    return {}


def with_r_squared(metrics: dict[str, float], variance: Optional[float]) -> dict[str, float]:
    """`metrics` with R² = 1 - MSE / Var(label) beside the MSE. TFMA has no R² of its own,
    and Keras's R2Score does not merge across TFMA's batches."""
    mse = metrics.get("mean_squared_error")
    if mse is None or not variance:
        return metrics
    return dict(metrics, r_squared=1 - mse / variance)


def eval_label_variance(artifacts, label_key: Optional[str]) -> Optional[float]:
    """The label's variance over the eval split's rows, from StatisticsGen (the rows the
    Evaluator scored: rows without a label are not written)."""
    if not label_key:
        return None
    for stats in artifacts.get("ExampleStatistics", []):
        path = fileio.join(stats.uri, "Split-eval", "FeatureStats.pb")
        if not fileio.exists(path):
            continue
        for feature in tfx_artifacts.load_statistics(path).datasets[0].features:
            name = feature.path.step[-1] if feature.path.step else feature.name
            if name == label_key and feature.num_stats.std_dev > 0:
                return feature.num_stats.std_dev ** 2
    return None


def is_resolver(execution) -> bool:
    return execution.type.endswith(".Resolver")


def brings_earlier_artifacts(execution) -> bool:
    """A resolver, or the step that copies the model in production: what they output is
    what earlier runs made, not this run."""
    return is_resolver(execution) or execution.type.endswith(".ProductionModel")


def describe_resolved(store: metadata_store.MetadataStore, execution) -> str:
    """What a resolver found, in a few words: the latest blessed model, or none yet."""
    events = store.get_events_by_execution_ids([execution.id])
    found = store.get_artifacts_by_id([e.artifact_id for e in events
                                       if e.type == metadata_store_pb2.Event.INTERNAL_OUTPUT])
    models = [a.uri for a in found
              if store.get_artifact_types_by_id([a.type_id])[0].name == "Model"]
    return f"latest blessed model {models[-1]}" if models else "no blessed model yet"


def node_name(store: metadata_store.MetadataStore, execution) -> str:
    """The component id of an execution (its "node" context is <pipeline>.<component id>)."""
    return next((c.name.split(".", 1)[-1] for c in store.get_contexts_by_execution(execution.id)
                 if c.type == "node"), execution.type)


def state_name(execution) -> str:
    return _STATE_NAMES.get(execution.last_known_state, "unknown")


def output_artifacts(store: metadata_store.MetadataStore, executions
                     ) -> dict[str, list[metadata_store_pb2.Artifact]]:
    """The artifacts `executions` produced, by type name (each artifact's `.type` set)."""
    events = store.get_events_by_execution_ids([e.id for e in executions])
    artifact_ids = sorted({e.artifact_id for e in events if e.type in _OUTPUT_EVENTS})
    artifacts: dict[str, list] = {}
    types = {}
    for artifact in store.get_artifacts_by_id(artifact_ids):
        if artifact.type_id not in types:
            types[artifact.type_id] = store.get_artifact_types_by_id([artifact.type_id])[0].name
        artifact.type = types[artifact.type_id]
        artifacts.setdefault(artifact.type, []).append(artifact)
    return artifacts


def describe_outputs(artifacts: dict[str, list]) -> str:
    """What one component produced, in a few words: rows and shards, schema features,
    anomalies, metrics, blessing, pushed or not."""
    parts = []
    for examples in artifacts.get("Examples", []):
        manifest = read_manifest(examples.uri)
        if manifest:
            rows = " ".join(f"{s}={v['rows']:,}" for s, v in sorted(manifest["splits"].items()))
            shards = sum(len(v["shards"]) for v in manifest["splits"].values())
            parts.append(f"rows {rows} in {shards} shard(s)")
        else:
            parts.append(f"splits {','.join(split_names(examples))}")
    for schema in artifacts.get("Schema", []):
        path = fileio.join(schema.uri, "schema.pbtxt")
        if fileio.exists(path):
            parts.append(f"schema of {fileio.read_text(path).count('feature {')} features")
    if "ExampleStatistics" in artifacts:
        # Transform's pre- and post-transform statistics have no splits (stock's layout):
        # they are told apart by their output's folder.
        parts.append("statistics of " + ", ".join(
            s for a in artifacts["ExampleStatistics"]
            for s in split_names(a) or [fileio.basename(fileio.dirname(a.uri.rstrip("/")))]))
    if "ExampleAnomalies" in artifacts:
        parts.append(f"{sum(len(a) for a in anomalies(artifacts).values())} anomalies")
    if "TransformGraph" in artifacts:
        parts.append("transform graph")
    for model in artifacts.get("Model", []):
        pushed = model.custom_properties.get(PUSHED_MODEL)
        if pushed is None:
            parts.append("model")
        else:
            parts.append(f"model in production {pushed.string_value}" if pushed.string_value
                         else "no model in production yet")
    metrics = evaluations(artifacts)[0]
    if metrics:
        parts.append(", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())
                               if k != "example_count"))
    if _blessed(artifacts) is not None:
        parts.append("blessed" if _blessed(artifacts) else "not blessed")
    if "PushedModel" in artifacts:
        parts.append("pushed" if _pushed_model(artifacts) else "not pushed")
    return "; ".join(parts)


def _parent_pipelines(store, run_context):
    # TFX links each pipeline_run context to its pipeline context as a child.
    try:
        return store.get_parent_contexts_by_context(run_context.id)
    except Exception:  # Older stores keep no parentage; fall back to the run's own name.
        return [run_context]


def _first_uri(artifacts, type_name: str, filename: str = "") -> Optional[str]:
    found = artifacts.get(type_name)
    return fileio.join(found[0].uri, filename) if found else None


def split_names(artifact) -> list[str]:
    raw = artifact.properties.get("split_names") or artifact.custom_properties.get("split_names")
    return json.loads(raw.string_value) if raw else []


def _rows_per_split(artifacts, read: ManifestReader) -> dict[str, int]:
    """Read from our manifest when ExampleGen wrote one, else from StatisticsGen's output."""
    for examples in artifacts.get("Examples", []):
        manifest = read(examples.uri)
        if manifest:
            return {s: v["rows"] for s, v in manifest["splits"].items()}
    rows = {}
    for stats in artifacts.get("ExampleStatistics", []):
        for split in split_names(stats):
            path = fileio.join(stats.uri, f"Split-{split}", "FeatureStats.pb")
            if fileio.exists(path):
                rows[split] = tfx_artifacts.load_statistics(path).datasets[0].num_examples
    return rows


def anomalies(artifacts) -> dict[str, list[str]]:
    found = {}
    for artifact in artifacts.get("ExampleAnomalies", []):
        found.update(tfx_artifacts.split_anomalies(artifact.uri, split_names(artifact)))
    return found


def _pushed_model(artifacts) -> Optional[str]:
    for artifact in artifacts.get("PushedModel", []):
        pushed = artifact.custom_properties.get("pushed")
        if pushed and pushed.int_value == 1:
            return artifact.custom_properties["pushed_destination"].string_value
    return None


def _blessed(artifacts) -> Optional[bool]:
    for artifact in artifacts.get("ModelBlessing", []):
        blessed = artifact.custom_properties.get("blessed")
        if blessed is not None:
            return blessed.int_value == 1
    return None


def evaluations(artifacts) -> tuple[dict[str, float], dict[str, float]]:
    """The overall slice of the newest ModelEvaluation: the new model's metrics, and the
    metrics of the model it was compared with (empty without one)."""
    found: tuple[dict[str, float], dict[str, float]] = ({}, {})
    evaluated = artifacts.get("ModelEvaluation", [])
    if not evaluated:
        return found
    for slice_metrics in tfma.load_metrics(evaluated[-1].uri):
        if slice_metrics.slice_key.single_slice_keys:
            continue
        for item in slice_metrics.metric_keys_and_values:
            if item.value.HasField("double_value") and not item.key.is_diff:
                baseline = item.key.model_name == BASELINE_MODEL
                found[baseline][item.key.name] = item.value.double_value.value
    return found


def serving_check(artifacts) -> dict:
    """The newest ModelEvaluation's check of serving_default against the scores on
    Transform's split; {} when it has none."""
    evaluations = artifacts.get("ModelEvaluation", [])
    path = fileio.join(evaluations[-1].uri, SERVING_CHECK_FILE) if evaluations else None
    return fileio.read_json(path) if path and fileio.exists(path) else {}


def validation_failures(artifacts, refusal: Optional[str] = None) -> list[str]:
    """What kept the newest ModelEvaluation from blessing: each failed threshold, and the
    Evaluator's `refusal` (serving_default disagreeing with the scores on Transform's
    split)."""
    evaluations = artifacts.get("ModelEvaluation", [])
    if not evaluations:
        return []
    failures = [refusal.removeprefix("not blessed: ")] if refusal else []
    try:
        result = tfma.load_validation_result(evaluations[-1].uri)
    except Exception:  # noqa: BLE001 - no validation written (no thresholds): nothing failed
        return failures
    for slice_failure in result.metric_validations_per_slice:
        for failure in slice_failure.failures:
            threshold = failure.metric_threshold
            if failure.metric_key.is_diff and threshold.HasField("change_threshold"):
                limit = threshold.change_threshold.absolute.value
                what = f"worse than the latest blessed model's by more than {abs(limit):g}"
            else:
                what = "outside its bound"
            value = failure.metric_value.double_value.value
            failures.append(f"{failure.metric_key.name}"
                            f"{' change' if failure.metric_key.is_diff else ''}"
                            f"={_metric(value)}: {what}")
    return failures


def baseline_model(store: metadata_store.MetadataStore, executions) -> Optional[str]:
    """The model the Evaluator took as its baseline in this run, if any: the pushed folder
    ProductionModel copied, or None before the first push."""
    events = store.get_events_by_execution_ids([e.id for e in executions])
    for event in events:
        if event.type == metadata_store_pb2.Event.INPUT and any(
                step.HasField("key") and step.key == "baseline_model"
                for step in event.path.steps):
            artifact = store.get_artifacts_by_id([event.artifact_id])[0]
            pushed = artifact.custom_properties.get(PUSHED_MODEL)
            return (pushed.string_value or None) if pushed else None
    return None


# The metric each task is judged by (the Evaluator's bound and the baseline comparison), as
# TFMA names it in the evaluation.
TASK_METRICS = {"binary": "binary_accuracy", "multiclass": "sparse_categorical_accuracy",
                "regression": "mean_squared_error"}


@dataclasses.dataclass(frozen=True)
class RunPoint:
    """One run of a pipeline, as the metric-over-time view shows it."""

    run_id: str
    span: int
    metric: str
    value: Optional[float]
    blessed: Optional[bool]
    pushed: bool


def history(metadata_path: str, pipeline_name: str, limit: int = 30) -> list[RunPoint]:
    """The pipeline's latest `limit` runs, oldest first: each run's span, its model's task
    metric on the eval split, and whether it was blessed and pushed."""
    store = open_store(metadata_path)
    runs = sorted((c for c in store.get_contexts_by_type("pipeline_run")
                   if pipeline_name in {p.name for p in _parent_pipelines(store, c)}),
                  key=lambda c: (c.create_time_since_epoch, c.id))[-limit:]
    points = []
    for run in runs:
        summary = summarize(metadata_path, pipeline_name, run.name)
        metric = TASK_METRICS.get(summary.task or "", "")
        points.append(RunPoint(run.name, summary.span[0], metric,
                               summary.evaluation.get(metric), summary.blessed,
                               bool(summary.pushed_model)))
    return points

