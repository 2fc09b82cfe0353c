"""`create_pipeline()`: the one place the components are wired together.

ShardedExampleGen -> StatisticsGen -> SchemaGen | ImportSchemaGen -> ExampleValidator
-> ShardedTransform -> Trainer -> Evaluator -> Pusher (blessed models only).
"""
from __future__ import annotations

from typing import Optional

import tensorflow_model_analysis as tfma
from ml_metadata.proto import metadata_store_pb2
# TFX's parts one by one: `tfx.v1` imports every component TFX has (BulkInferrer,
# InfraValidator, Tuner, Google Cloud's extensions), ten seconds more of every run's start.
from tfx.components.example_validator.component import ExampleValidator
from tfx.components.schema_gen.component import SchemaGen
from tfx.components.schema_gen.import_schema_gen.component import ImportSchemaGen
from tfx.components.trainer.component import Trainer
from tfx.dsl.components.common.resolver import Resolver
from tfx.dsl.input_resolution.strategies.span_range_strategy import SpanRangeStrategy
from tfx.orchestration.pipeline import Pipeline
from tfx.proto import pusher_pb2, range_config_pb2, trainer_pb2
from tfx.types import channel, standard_artifacts

from tfrecord_shards import fileio
from tfrecord_shards.codec import schema_file
from components.example_gen.component import ShardedExampleGen
from components.example_gen.inputs import resolve_inputs
from components.example_gen import encode
from components.evaluator.component import Evaluator, StockEvaluator
from components.production_model.component import ProductionModel
from components.statistics_gen.component import StatisticsGen
from components.production_model.find import serving_state
from components.pusher.component import Pusher
from components.trainer import tasks
from components.trainer.options import TRANSFORM_SIGNATURE
from components.transform.component import ShardedTransform
from pipeline import datasets, run_summary
from pipeline.configs import PipelineConfig

TRAINER_RUN_FN = "components.trainer.module.run_fn"


def settle_task(config: PipelineConfig, source: str) -> PipelineConfig:
    """`config` with its task settled, and a regression's default max_mse: what the label's
    values in the first source file say (components/trainer/tasks.py), unless both are set."""
    given = None if config.task == tasks.AUTO else config.task
    if given and (given != tasks.REGRESSION or config.max_mse is not None):
        return config
    path, values = encode.sample_column(source, config.data_format, config.label_key)
    if values is None:
        raise tasks.TaskError(
            f"{path}: no column {config.label_key!r} to infer the task from; set label_key, "
            f"or set task=binary|multiclass|regression when preprocessing_fn computes the label")
    summary = tasks.summarize_label(values, config.label_key, path)
    task = given or summary.task
    max_mse = config.max_mse
    if task == tasks.REGRESSION and max_mse is None:
        if summary.variance is None:
            raise tasks.TaskError(f"{path}: the label {config.label_key!r} is not numeric; "
                                  f"it cannot be a regression target")
        max_mse = summary.variance
    return config.replace(task=task, max_mse=max_mse,
                          task_reason="" if given else summary.reason)


def check_data_fits_dataset(config: PipelineConfig, source: str) -> None:
    """Your own data under a bundled dataset's settings (`--data-root` without `--dataset
    table`) would fail late, in validation or Transform; it is refused here, in one line."""
    if not config.data_root or config.dataset == "table" or not config.schema_file or \
            config.data_format == "images" or not fileio.exists(config.schema_file):
        return
    expected = [f.name for f in schema_file.load_schema(config.schema_file).feature]
    path, columns = encode.first_columns(source, config.data_format)
    missing = [name for name in expected if name not in columns]
    if missing:
        raise ValueError(
            f"{path} is not the {config.dataset} dataset (it lacks {', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}): for a table of your own, run with "
            f"--dataset table --set label_key=COLUMN")


PRODUCTION_MODEL = "production_model"
EVALUATOR = "Evaluator"
SPAN_RESOLVER = "span_resolver"


def eval_config(config: PipelineConfig) -> tfma.EvalConfig:
    """Bless the model only if it reaches the bounds of its task on the eval split of the raw
    examples, scored through the exported serving signature: min_accuracy (and min_auc) for a
    binary label, min_accuracy for multiclass, max_mse for regression; and, with a
    `baseline_tolerance`, only if its task metric is no worse than the latest blessed model's
    by more than that (the Evaluator ignores the change threshold while there is none)."""
    tolerance = config.baseline_tolerance

    def bound(lower: Optional[float] = None, upper: Optional[float] = None,
              better: Optional[str] = None) -> tfma.MetricThreshold:
        threshold = tfma.MetricThreshold(value_threshold=tfma.GenericValueThreshold(
            **({"lower_bound": {"value": lower}} if lower is not None else {}),
            **({"upper_bound": {"value": upper}} if upper is not None else {})))
        if better and tolerance is not None:
            # candidate - baseline >= -tolerance (higher is better), <= tolerance (lower).
            higher = better == "higher"
            threshold.change_threshold.CopyFrom(tfma.GenericChangeThreshold(
                direction=tfma.MetricDirection.HIGHER_IS_BETTER if higher
                else tfma.MetricDirection.LOWER_IS_BETTER,
                absolute={"value": -tolerance if higher else tolerance}))
        return threshold

    prediction_key = ""
    if config.task == tasks.MULTICLASS:
        metrics = [tfma.MetricConfig(class_name="SparseCategoricalAccuracy",
                                     threshold=bound(config.min_accuracy, better="higher"))]
        prediction_key = tasks.PROBABILITIES
    elif config.task == tasks.REGRESSION:
        metrics = [tfma.MetricConfig(class_name="MeanSquaredError",
                                     threshold=bound(upper=config.max_mse, better="lower"))]
    else:
        metrics = [tfma.MetricConfig(class_name="BinaryAccuracy",
                                     threshold=bound(config.min_accuracy, better="higher"))]
        if config.min_auc is not None:
            metrics.append(tfma.MetricConfig(class_name="AUC", threshold=bound(config.min_auc)))
    metrics.append(tfma.MetricConfig(class_name="ExampleCount"))

    def model_spec(name: str, **baseline) -> tfma.ModelSpec:
        return tfma.ModelSpec(name=name, signature_name="serving_default",
                              label_key=config.label_key, prediction_key=prediction_key,
                              preprocessing_function_names=[TRANSFORM_SIGNATURE], **baseline)

    specs = [model_spec(run_summary.CANDIDATE_MODEL)]
    if tolerance is not None:
        specs.append(model_spec(run_summary.BASELINE_MODEL, is_baseline=True))
    return tfma.EvalConfig(model_specs=specs, slicing_specs=[tfma.SlicingSpec()],
                           metrics_specs=[tfma.MetricsSpec(metrics=metrics)])


def span_resolver(example_gen, spans: int) -> Resolver:
    """The latest `spans` spans ExampleGen has written (their latest versions)."""
    resolver = Resolver(
        strategy_class=SpanRangeStrategy,
        config={"range_config": range_config_pb2.RangeConfig(
            rolling_range=range_config_pb2.RollingRange(num_spans=spans))},
        examples=channel.Channel(type=standard_artifacts.Examples,
                                 producer_component_id=example_gen.id),
    ).with_id(SPAN_RESOLVER)
    resolver.add_upstream_node(example_gen)
    return resolver


def _evaluator(config: PipelineConfig, example_gen, transform, trainer, production):
    """Ours or stock's Evaluator of the new model on ExampleGen's eval split. Given Transform
    (the same rows: no window of spans), ours scores its eval split through the model's
    layers after the graph, checked against serving_default."""
    return (Evaluator if config.evaluator == "fast" else StockEvaluator)(
        examples=example_gen.outputs["examples"], model=trainer.outputs["model"],
        baseline_model=production.outputs["model"]
        if production and config.baseline_tolerance is not None else None,
        eval_config=eval_config(config),
        **({"transformed_examples": transform.outputs["transformed_examples"]}
           if config.evaluator == "fast" and transform else {}),
    ).with_id(EVALUATOR)  # the run summary's name


def create_pipeline(
    config: PipelineConfig,
    metadata_connection_config: Optional[metadata_store_pb2.ConnectionConfig] = None,
    source: Optional[str] = None,
    local: bool = True,
) -> Pipeline:
    """The pipeline for `config`. It reads `source` (a path or a bundled source name), by
    default the configured data_root or the dataset's bundled data. `local`: built for a run
    now, on this machine, which can look at the serving folder; a compiled pipeline runs
    later, elsewhere."""
    example_gen_options = config.example_gen_options(source or datasets.source_for(config))
    # Spans and pre-split inputs are resolved first: the checks below read the first file.
    resolved = resolve_inputs(example_gen_options)
    first_input = resolved.input_patterns()[0][1]
    check_data_fits_dataset(config, first_input)
    config = settle_task(config, first_input)
    # A compiled pipeline runs later and again, on whatever the source holds then: its
    # driver task settles the spans and the fingerprint at each run, not this build.
    example_gen = ShardedExampleGen(resolved, settle=True) if local else \
        ShardedExampleGen(example_gen_options, settle=False)
    statistics_gen = StatisticsGen(examples=example_gen.outputs["examples"])
    if config.schema_file:
        schema_gen = ImportSchemaGen(schema_file=config.schema_file)
    else:
        schema_gen = SchemaGen(
            statistics=statistics_gen.outputs["statistics"], infer_feature_shape=False)
    example_validator = ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"])
    # A window of spans: each run's ExampleGen processes the new span, and Transform gets the
    # latest N spans ExampleGen has written (stock's span resolver).
    window = span_resolver(example_gen, config.spans) if config.spans > 1 else None
    transform = ShardedTransform(
        examples=window.outputs["examples"] if window else example_gen.outputs["examples"],
        schema=schema_gen.outputs["schema"],
        # The gate: with fail_on_anomalies, any anomaly stops the run here.
        anomalies=example_validator.outputs["anomalies"],
        options=config.transform_options())
    # The model in production (the latest push): the Evaluator's baseline, and the Trainer's
    # warm start.
    production = ProductionModel(
        config.production_model_options(),
        serving_state=serving_state(config.resolved_serving_dir) if local else None,
    ).with_id(PRODUCTION_MODEL) if config.baseline_tolerance is not None or config.warm_start \
        else None
    trainer = Trainer(
        run_fn=TRAINER_RUN_FN,
        base_model=production.outputs["model"] if production and config.warm_start else None,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        # The post-transform schema says what the examples hold and whether they are packed.
        schema=transform.outputs["post_transform_schema"],
        train_args=trainer_pb2.TrainArgs(num_steps=config.train_steps),
        eval_args=trainer_pb2.EvalArgs(num_steps=config.eval_steps),
        custom_config=config.trainer_options().as_custom_config(),
    )
    evaluator = _evaluator(config, example_gen, transform if not window else None, trainer,
                           production)
    # Stock's Pusher with our executor: each push a version folder of its own, marked
    # complete last (components/pusher/).
    pusher = Pusher(
        model=trainer.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        push_destination=pusher_pb2.PushDestination(
            filesystem=pusher_pb2.PushDestination.Filesystem(
                base_directory=config.resolved_serving_dir)),
    )
    return Pipeline(
        pipeline_name=config.pipeline_name,
        pipeline_root=config.resolved_pipeline_root,
        components=[example_gen, statistics_gen, schema_gen, example_validator,
                    *([window] if window else []), transform,
                    *([production] if production else []), trainer, evaluator, pusher],
        enable_cache=config.enable_cache,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=config.beam_pipeline_args,
    )
