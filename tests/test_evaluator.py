"""The fast Evaluator (components/evaluator/) against stock TFX's, run in the test on the same
models and eval rows: a binary taxi model with a baseline, a multiclass iris model and a
regression diabetes model, each metric per slice within 1e-4 of TFMA's; the same blessing and
failed thresholds; outputs that TFMA's readers and stock's Pusher read; a model trained by
stock TFX's Trainer (TFX's own taxi module) on stock ExampleGen's examples."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_model_analysis as tfma
from google.protobuf import text_format
from tfx.components.trainer.fn_args_utils import FnArgs
from tfx.types import artifact_utils, standard_artifacts
from tfx.utils import json_utils, proto_utils

from components.transform import taxi
from tfrecord_shards.codec import schema_file
from components.evaluator import evaluate, executor, stock_executor
from components.evaluator.config import check_config, metric_keys
from components.evaluator.options import UnsupportedSetting
from components.evaluator.options import EvaluatorOptions
from components.trainer import module

pytestmark = pytest.mark.slow

# Absolute, and relative for large values: Keras's metrics (the model's compiled loss, say)
# sum in float32, TFMA batch by batch and ours at once, so an MSE of 2,500 may differ in its
# seventh figure.
TOLERANCE, RELATIVE_TOLERANCE = 1e-4, 1e-6


# --- running both Evaluators on the same inputs ------------------------------------------------
def artifact(kind, uri: str, artifact_id: int = 0, **properties):
    made = kind()
    made.uri = str(uri)
    made.id = artifact_id
    for name, value in properties.items():
        setattr(made, name, value)
    return made


def run_evaluator(executor_class, folder, examples: str, eval_config, model: str,
                  baseline: str | None = None, schema: str | None = None,
                  options: EvaluatorOptions | None = None, transformed: str | None = None):
    """Runs an Evaluator executor as TFX would; returns (evaluation folder, blessing artifact).
    The model folders hold Format-Serving/, as a Trainer's Model artifact does."""
    os.makedirs(folder)
    inputs = {"examples": [artifact(standard_artifacts.Examples, examples, 1,
                                    split_names=artifact_utils.encode_split_names(
                                        ["train", "eval"]))],
              "model": [artifact(standard_artifacts.Model, model, 2)]}
    if baseline is not None:
        inputs["baseline_model"] = [artifact(standard_artifacts.Model, baseline, 3)]
    if schema is not None:
        inputs["schema"] = [artifact(standard_artifacts.Schema, schema, 4)]
    if transformed is not None:
        inputs["transformed_examples"] = [artifact(standard_artifacts.Examples, transformed, 5)]
    evaluation = artifact(standard_artifacts.ModelEvaluation, os.path.join(folder, "evaluation"))
    blessing = artifact(standard_artifacts.ModelBlessing, os.path.join(folder, "blessing"))
    os.makedirs(evaluation.uri)
    os.makedirs(blessing.uri)
    properties = {"eval_config": proto_utils.proto_to_json(eval_config),
                  "example_splits": json_utils.dumps(None),
                  "current_component_id": "Evaluator"}
    if options is not None:
        properties["options_json"] = options.to_json()
    executor_class().Do(inputs, {"evaluation": [evaluation], "blessing": [blessing]},
                        properties)
    return evaluation.uri, blessing


def both_evaluators(folder, *args, **kwargs) -> dict:
    """Stock's and ours on the same inputs: {"stock": (uri, blessing), "ours": ...}."""
    return {name: run_evaluator(cls, os.path.join(str(folder), name), *args, **kwargs)
            for name, cls in (("stock", stock_executor.Executor), ("ours", executor.Executor))}


def metric_table(uri: str) -> dict:
    """{(slice, metric key): value} of a ModelEvaluation, read with TFMA's loader."""
    table = {}
    for sliced in tfma.load_metrics(uri):
        where = text_format.MessageToString(sliced.slice_key, as_one_line=True)
        for item in sliced.metric_keys_and_values:
            key = text_format.MessageToString(item.key, as_one_line=True)
            value = item.value
            assert value.WhichOneof("type") in ("double_value", "array_value"), (key, value)
            table[(where, key)] = (value.double_value.value if value.HasField("double_value")
                                   else tuple(value.array_value.float64_values))
    return table


def assert_same_metrics(runs: dict) -> dict:
    """Every metric key of every slice in both outputs, and each value within the tolerance
    of TFMA's; returns TFMA's table."""
    stock, ours = metric_table(runs["stock"][0]), metric_table(runs["ours"][0])
    assert sorted(ours) == sorted(stock)
    far = {key: (stock[key], ours[key]) for key in stock
           if not np.allclose(stock[key], ours[key], atol=TOLERANCE, rtol=RELATIVE_TOLERANCE,
                              equal_nan=True)}
    assert not far, far
    return stock


def failures(uri: str) -> dict:
    """The failed thresholds of a validation result: {(slice, failure without its value):
    the metric's value}."""
    result = tfma.load_validation_result(uri)
    found = {}
    for sliced in result.metric_validations_per_slice:
        for failure in sliced.failures:
            failure = type(failure).FromString(failure.SerializeToString())
            value = failure.metric_value.double_value.value
            failure.ClearField("metric_value")
            found[(text_format.MessageToString(sliced.slice_key, as_one_line=True),
                   text_format.MessageToString(failure, as_one_line=True))] = value
    return found


def blessing_facts(blessing) -> tuple:
    """The blessing's files and custom properties."""
    files = sorted(os.listdir(blessing.uri))
    properties = {name: getattr(value, value.WhichOneof("value"))
                  for name, value in blessing.mlmd_artifact.custom_properties.items()}
    return files, properties


# --- models: real tables through our ExampleGen and Trainer ------------------------------------
def fn_args(examples: str, folder, steps: int, custom_config: dict,
            graph: str | None = None) -> FnArgs:
    return FnArgs(train_files=[os.path.join(examples, "Split-train", "*")],
                  eval_files=[os.path.join(examples, "Split-eval", "*")],
                  schema_path=os.path.join(examples, "schema.pbtxt"),
                  transform_graph_path=graph, model_run_dir=str(folder / "run"),
                  serving_model_dir=str(folder / "Format-Serving"), train_steps=steps,
                  eval_steps=2, custom_config=custom_config)


def table_examples(folder, frame, compression: str) -> str:
    """A pandas table as CSV through our ExampleGen (train 2 : eval 1)."""
    from components.example_gen import engine
    from components.example_gen.options import ExampleGenOptions
    from tfrecord_shards.options import from_flat

    source = folder / "data" / "table.csv"
    source.parent.mkdir(parents=True)
    frame.to_csv(source, index=False)
    out = str(folder / "examples")
    engine.run(from_flat(ExampleGenOptions, {"source": str(source), "compression": compression}),
               out)
    return out


@pytest.fixture(scope="module")
def iris_models(tmp_path_factory) -> tuple[str, str, str]:
    """scikit-learn's iris, its class id 0..2 as the label, gzip shards; two multiclass models
    trained on the raw rows (no Transform: the label is the raw feature), 300 and 30 steps.
    (examples, model, baseline)"""
    from sklearn import datasets

    folder = tmp_path_factory.mktemp("evaluator-iris")
    frame = datasets.load_iris(as_frame=True).frame
    frame.columns = [c.replace(" (cm)", "").replace(" ", "_") for c in frame.columns]
    examples = table_examples(folder, frame, "gzip")
    for name, steps in (("model", 300), ("baseline", 30)):
        module.run_fn(fn_args(examples, folder / name, steps,
                              {"label_key": "target", "task": "multiclass", "num_classes": 3,
                               "batch_size": 16}))
    return examples, str(folder / "model"), str(folder / "baseline")


@pytest.fixture(scope="module")
def diabetes_model(tmp_path_factory) -> tuple[str, str]:
    """scikit-learn's diabetes (a float target), plain (uncompressed) shards; a regression
    model trained on the raw rows. (examples, model)"""
    from sklearn import datasets

    folder = tmp_path_factory.mktemp("evaluator-diabetes")
    examples = table_examples(folder, datasets.load_diabetes(as_frame=True).frame, "none")
    module.run_fn(fn_args(examples, folder / "model", 300,
                          {"label_key": "target", "task": "regression", "batch_size": 16}))
    return examples, str(folder / "model")


# --- configs -----------------------------------------------------------------------------------
def bound(lower=None, upper=None, change=None, higher_is_better=True, relative=None):
    threshold = tfma.MetricThreshold()
    if lower is not None or upper is not None:
        threshold.value_threshold.CopyFrom(tfma.GenericValueThreshold(
            **({"lower_bound": {"value": lower}} if lower is not None else {}),
            **({"upper_bound": {"value": upper}} if upper is not None else {})))
    if change is not None or relative is not None:
        threshold.change_threshold.CopyFrom(tfma.GenericChangeThreshold(
            direction=tfma.MetricDirection.HIGHER_IS_BETTER if higher_is_better
            else tfma.MetricDirection.LOWER_IS_BETTER,
            **({"absolute": {"value": change}} if change is not None else {}),
            **({"relative": {"value": relative}} if relative is not None else {})))
    return threshold


def model_specs(label_key: str, baseline: bool, **spec) -> list:
    specs = [tfma.ModelSpec(name="candidate", signature_name="serving_default",
                            label_key=label_key, **spec)]
    if baseline:
        specs.append(tfma.ModelSpec(name="baseline", signature_name="serving_default",
                                    label_key=label_key, is_baseline=True, **spec))
    return specs


def taxi_config(metrics: list, slicing_specs: list | None = None) -> tfma.EvalConfig:
    return tfma.EvalConfig(
        model_specs=model_specs(taxi.TAXI_LABEL, True,
                                preprocessing_function_names=["transform_features"]),
        slicing_specs=slicing_specs or [tfma.SlicingSpec()],
        metrics_specs=[tfma.MetricsSpec(metrics=metrics)])


TAXI_SLICES = [tfma.SlicingSpec(),
               tfma.SlicingSpec(feature_keys=["payment_type"]),  # bytes
               tfma.SlicingSpec(feature_keys=["trip_start_hour"]),  # int
               tfma.SlicingSpec(feature_keys=["payment_type", "trip_start_day"]),  # a cross
               tfma.SlicingSpec(feature_values={"payment_type": "Cash"}),
               tfma.SlicingSpec(feature_keys=["trip_start_day"],
                                feature_values={"company": "Taxi Affiliation Services"})]


def binary_taxi_metrics() -> list:
    """Every kind of binary metric, with thresholds that pass and fail: a value bound the
    candidate meets (accuracy) and one it misses (AUC 0.99), a change it meets (accuracy,
    absolute) and changes it misses (its loss must fall by 0.5; its mean prediction rise by
    a factor of 10)."""
    return [tfma.MetricConfig(class_name="BinaryAccuracy",
                              threshold=bound(lower=0.0, change=-1.0)),
            tfma.MetricConfig(class_name="AUC", threshold=bound(lower=0.99)),
            tfma.MetricConfig(class_name="AUC", config='{"curve": "PR", "name": "auc_pr"}'),
            tfma.MetricConfig(class_name="AUC", config='{"num_thresholds": 200, '
                                                       '"name": "auc_200"}'),
            tfma.MetricConfig(class_name="Precision"), tfma.MetricConfig(class_name="Recall"),
            tfma.MetricConfig(class_name="Precision",
                              config='{"thresholds": [0.25, 0.75], "name": "precision_at"}'),
            # Keras's, through TFMA's wrapper.
            tfma.MetricConfig(class_name="BinaryCrossentropy",
                              threshold=bound(change=-0.5, higher_is_better=False)),
            tfma.MetricConfig(class_name="Calibration"),
            tfma.MetricConfig(class_name="MeanLabel"),
            tfma.MetricConfig(class_name="MeanPrediction", threshold=bound(relative=10.0)),
            tfma.MetricConfig(class_name="ExampleCount", threshold=bound(upper=1e9))]


# --- parity -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def binary_runs(taxi_examples, taxi_models, tmp_path_factory) -> dict:
    """Both evaluators on the taxi models, with thresholds that pass and fail: a value bound
    the candidate meets (accuracy) and one it misses (AUC 0.99), a change it meets (accuracy,
    absolute) and changes it misses (its loss must fall by 0.5; its mean prediction rise by
    a factor of 10), on every slice."""
    metrics = binary_taxi_metrics()
    return both_evaluators(tmp_path_factory.mktemp("binary"), taxi_examples,
                           taxi_config(metrics, TAXI_SLICES), taxi_models["candidate"],
                           taxi_models["baseline"])


def test_binary_metrics_match_tfma_per_slice_with_a_baseline(binary_runs):
    """Every metric, of both models and their diffs, on every slice (bytes, int, crossed and
    feature-value slices): TFMA's keys, values within 1e-4."""
    stock = assert_same_metrics(binary_runs)
    slices = {where for where, _ in stock}
    assert len(slices) > 20  # overall, 2+ payment types, 24 hours, their crosses, ...
    names = {key for _, key in stock}
    for name in ("binary_accuracy", "auc", "auc_pr", "auc_200", "precision", "recall",
                 "precision_at", "binary_crossentropy", "calibration", "mean_label",
                 "mean_prediction", "example_count", "loss", "accuracy"):
        # (the last two: the model's compiled metrics, which TFMA adds by default)
        for model_name in ("candidate", "baseline"):
            assert any(f'name: "{name}" model_name: "{model_name}"' in key for key in names), \
                (name, model_name)
        assert any(f'name: "{name}" model_name: "candidate"' in key and "is_diff: true" in key
                   for key in names), name
    overall = {key: value for (where, key), value in stock.items() if not where}
    auc = overall['name: "auc" model_name: "candidate" example_weighted { }']
    baseline_auc = overall['name: "auc" model_name: "baseline" example_weighted { }']
    assert auc > baseline_auc  # 150 steps beat 10: the diffs are not zero


def test_failed_value_and_change_thresholds_are_stocks(binary_runs):
    """Not blessed by either, with the same failures: the missed bounds and changes on each
    slice, and none of the met ones."""
    (stock_uri, stock_blessing), (ours_uri, ours_blessing) = \
        binary_runs["stock"], binary_runs["ours"]
    assert blessing_facts(ours_blessing) == blessing_facts(stock_blessing)
    files, properties = blessing_facts(ours_blessing)
    assert files == ["NOT_BLESSED"] and properties["blessed"] == 0
    assert properties["current_model_id"] == 2 and properties["baseline_model_id"] == 3
    ours, stock = failures(ours_uri), failures(stock_uri)
    assert sorted(ours) == sorted(stock)
    assert np.allclose([ours[k] for k in sorted(ours)], [stock[k] for k in sorted(ours)],
                       atol=TOLERANCE, rtol=RELATIVE_TOLERANCE, equal_nan=True)
    failed = {(text.split('name: "')[1].split('"')[0], "is_diff: true" in text)
              for _, text in ours}
    assert failed == {("auc", False), ("binary_crossentropy", True), ("mean_prediction", True)}


@pytest.fixture(scope="module")
def multiclass_runs(iris_models, tmp_path_factory) -> dict:
    """The 300-step iris model against the 30-step one: bounds and a change they meet."""
    examples, model, baseline = iris_models
    config = tfma.EvalConfig(
        model_specs=model_specs("target", True, prediction_key="probabilities"),
        slicing_specs=[tfma.SlicingSpec(), tfma.SlicingSpec(feature_keys=["petal_width"])],
        metrics_specs=[
            tfma.MetricsSpec(metrics=[
                tfma.MetricConfig(class_name="SparseCategoricalAccuracy",
                                  threshold=bound(lower=0.0, change=-1.0)),
                tfma.MetricConfig(class_name="SparseCategoricalCrossentropy"),
                tfma.MetricConfig(class_name="ExampleCount")]),
            # One-vs-rest, class by class.
            tfma.MetricsSpec(metrics=[tfma.MetricConfig(class_name=name) for name in
                                      ("AUC", "BinaryAccuracy", "Precision", "Recall",
                                       "MeanLabel", "MeanPrediction")],
                             binarize=tfma.BinarizationOptions(class_ids={"values": [0, 1, 2]}))])
    return both_evaluators(tmp_path_factory.mktemp("multiclass"), examples, config, model,
                           baseline)


def test_multiclass_metrics_match_tfma_per_class_and_slice(multiclass_runs):
    from tensorflow_model_analysis.metrics import metric_types

    stock = assert_same_metrics(multiclass_runs)
    keys = {key for _, key in stock}
    for class_id in (0, 1, 2):
        key = metric_types.MetricKey("auc", model_name="candidate", example_weighted=False,
                                     sub_key=metric_types.SubKey(class_id=class_id))
        assert text_format.MessageToString(key.to_proto(), as_one_line=True) in keys
    assert any('name: "sparse_categorical_accuracy" model_name: "candidate"' in key and
               "is_diff: true" in key for key in keys)
    assert len({where for where, _ in stock}) > 5  # float slice values
    facts = blessing_facts(multiclass_runs["ours"][1])
    assert facts == blessing_facts(multiclass_runs["stock"][1])
    assert facts[0] == ["BLESSED"] and facts[1]["baseline_model_id"] == 3


@pytest.fixture(scope="module")
def regression_runs(diabetes_model, tmp_path_factory) -> dict:
    """Against an empty baseline folder (a ProductionModel before the first push): both drop
    the baseline and its change threshold, and judge by the value threshold alone."""
    examples, model = diabetes_model
    empty = tmp_path_factory.mktemp("no-production-model")
    config = tfma.EvalConfig(
        model_specs=model_specs("target", True),
        slicing_specs=[tfma.SlicingSpec(), tfma.SlicingSpec(feature_keys=["sex"])],
        metrics_specs=[tfma.MetricsSpec(metrics=[
            tfma.MetricConfig(class_name="MeanSquaredError",
                              threshold=bound(upper=1e9, change=0.0, higher_is_better=False)),
            tfma.MetricConfig(class_name="MeanAbsoluteError"),
            tfma.MetricConfig(class_name="MeanAbsolutePercentageError"),
            tfma.MetricConfig(class_name="RootMeanSquaredError"),  # Keras's
            tfma.MetricConfig(class_name="MeanLabel"),
            tfma.MetricConfig(class_name="MeanPrediction"),
            tfma.MetricConfig(class_name="ExampleCount")])])
    return both_evaluators(tmp_path_factory.mktemp("regression"), examples, config, model,
                           baseline=str(empty))


def test_regression_metrics_match_tfma_on_plain_files_without_a_baseline_yet(
        regression_runs, diabetes_model):
    examples, _ = diabetes_model
    assert not glob.glob(os.path.join(examples, "Split-eval", "*.gz"))  # plain TFRecords
    stock = assert_same_metrics(regression_runs)
    keys = {key for _, key in stock}
    assert 'name: "root_mean_squared_error" example_weighted { }' in keys
    assert not any("baseline" in key or "is_diff" in key for key in keys)
    facts = blessing_facts(regression_runs["ours"][1])
    assert facts == blessing_facts(regression_runs["stock"][1])
    assert facts[0] == ["BLESSED"] and "baseline_model" not in facts[1]


# --- readers ----------------------------------------------------------------------------------
def test_tfma_reads_our_evaluation_and_stock_pusher_pushes_what_we_blessed(
        binary_runs, multiclass_runs, iris_models, taxi_models, tmp_path):
    from tfx.components.pusher import executor as pusher
    from tfx.proto import pusher_pb2

    uri, _ = binary_runs["ours"]
    for model_name, location in (("candidate", taxi_models["candidate"]),
                                 ("baseline", taxi_models["baseline"])):
        result = tfma.load_eval_result(uri, model_name=model_name)
        assert len(result.slicing_metrics) == len(list(tfma.load_metrics(uri)))
        assert result.model_location == location + "/Format-Serving"
        names = {name for _, by_output in result.slicing_metrics
                 for name in by_output[""][""]}
        assert {"binary_accuracy", "auc", "example_count"} <= names
    _, blessing = multiclass_runs["ours"]
    _, model, _ = iris_models
    pushed = artifact(standard_artifacts.PushedModel, tmp_path / "pushed")
    destination = pusher_pb2.PushDestination(
        filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=str(tmp_path / "serve")))
    pusher.Executor().Do({"model": [artifact(standard_artifacts.Model, model, 2)],
                          "model_blessing": [blessing]}, {"pushed_model": [pushed]},
                         {"push_destination": proto_utils.proto_to_json(destination)})
    assert pushed.get_int_custom_property("pushed") == 1
    assert len(glob.glob(str(tmp_path / "serve" / "*" / "saved_model.pb"))) == 1


# --- a stock TFX Trainer's model ----------------------------------------------------------------
@pytest.fixture(scope="module")
def stock_trained_model(taxi_examples, tmp_path_factory) -> tuple[str, str, str]:
    """TFX's own taxi pipeline swapped in on our outputs: its module (taxi_utils_native_keras:
    `serving_default` on serialized examples, a `transform_features` signature, label
    `tips_xf`) run by our ShardedTransform (its preprocessing_fn calls tf.Transform's
    analyzers, so it takes tf.Transform's path; one row per Example, as stock's Trainer
    reads) on our ExampleGen's gzip shards, then a few steps of stock's Trainer on our
    TransformGraph and transformed examples. (examples, schema folder, model)"""
    from tfx.components.trainer import executor as trainer
    from tfx.examples.chicago_taxi_pipeline import taxi_utils_native_keras
    from tfx.proto import trainer_pb2

    from tfrecord_shards.codec import schema_file
    from components.transform import beam_job
    from components.transform.options import TransformOptions

    root = tmp_path_factory.mktemp("stock-trainer")
    module_file = taxi_utils_native_keras.__file__
    beam_job.run(TransformOptions(module_file=module_file, packed_rows=0), taxi_examples,
                 schema_file.load_schema(taxi_examples), str(root / "graph"),
                 str(root / "transformed"))
    (root / "schema").mkdir()  # a Schema artifact's folder holds the one file
    schema_path = root / "schema" / "schema.pbtxt"
    schema_file.write_schema(schema_file.load_schema(taxi_examples), str(schema_path))
    schema_artifact = artifact(standard_artifacts.Schema, root / "schema", 2)
    graph = artifact(standard_artifacts.TransformGraph, root / "graph", 3)
    transformed = artifact(standard_artifacts.Examples, root / "transformed", 4,
                           split_names=artifact_utils.encode_split_names(["train", "eval"]))
    model = artifact(standard_artifacts.Model, root / "model", 5)
    model_run = artifact(standard_artifacts.ModelRun, root / "model_run", 6)
    trainer.GenericExecutor().Do(
        {"examples": [transformed], "transform_graph": [graph], "schema": [schema_artifact]},
        {"model": [model], "model_run": [model_run]},
        {"module_file": module_file,
         "train_args": proto_utils.proto_to_json(trainer_pb2.TrainArgs(num_steps=30)),
         "eval_args": proto_utils.proto_to_json(trainer_pb2.EvalArgs(num_steps=2))})
    return taxi_examples, str(schema_path), model.uri


def test_blesses_a_model_trained_by_stock_tfx_trainer(stock_trained_model, tmp_path):
    """TFX's taxi pipeline's own eval config (label tips_xf from `transform_features`,
    BinaryAccuracy), with a bound the few-step model reaches, on our ExampleGen's gzip eval
    split: stock's Trainer trained on our TransformGraph, and both Evaluators bless its model
    with the same metrics."""
    examples, schema, model = stock_trained_model
    assert glob.glob(os.path.join(examples, "Split-eval", "*.gz"))
    config = tfma.EvalConfig(
        model_specs=[tfma.ModelSpec(signature_name="serving_default", label_key="tips_xf",
                                    preprocessing_function_names=["transform_features"])],
        slicing_specs=[tfma.SlicingSpec(), tfma.SlicingSpec(feature_keys=["trip_start_hour"])],
        metrics_specs=[tfma.MetricsSpec(metrics=[
            tfma.MetricConfig(class_name="BinaryAccuracy", threshold=bound(lower=0.5)),
            tfma.MetricConfig(class_name="AUC"), tfma.MetricConfig(class_name="ExampleCount")])])
    runs = both_evaluators(tmp_path, examples, config, model, schema=os.path.dirname(schema))
    assert_same_metrics(runs)
    facts = blessing_facts(runs["ours"][1])
    assert facts == blessing_facts(runs["stock"][1]) and facts[0] == ["BLESSED"]


# --- our counting against TFMA's own ----------------------------------------------------------
def test_histogram_confusion_matrices_are_tfmas(taxi_examples, taxi_models):
    """Confusion matrices at num_thresholds counted our way (one bincount, one searchsorted)
    equal TFMA's combiner, `rebin` and `_histogram_to_binary_confusion_matrices` on the taxi
    model's predictions, with predictions on bucket edges and at 0 and 1 added."""
    from tensorflow_model_analysis.metrics import binary_confusion_matrices as tfma_bcm
    from tensorflow_model_analysis.metrics import calibration_histogram, metric_types

    from components.evaluator import confusion

    serve = tf.saved_model.load(taxi_models["candidate"] + "/Format-Serving")
    records = [r.numpy() for r in tf.data.TFRecordDataset(
        glob.glob(os.path.join(taxi_examples, "Split-eval", "*")), compression_type="GZIP")]
    predictions = serve.signatures["serving_default"](
        examples=tf.constant(records))["probability"].numpy().ravel().astype(np.float64)
    labels = serve.signatures["transform_features"](
        examples=tf.constant(records))[taxi.TAXI_LABEL].numpy().ravel().astype(np.float64)
    edges = np.array([0.0, 1.0, 0.5, 0.25, 0.0001, 0.9999, 1 / 3])
    predictions = np.concatenate([predictions, edges, edges])
    labels = np.concatenate([labels, np.zeros(len(edges)), np.ones(len(edges))])
    combiner = calibration_histogram.calibration_histogram()[0].combiner
    accumulator = combiner.create_accumulator()
    for label, prediction in zip(labels, predictions):
        accumulator = combiner.add_input(accumulator, metric_types.StandardMetricInputs(
            label=np.array([label]), prediction=np.array([prediction]),
            example_weight=np.array([1.0])))
    histogram = next(iter(combiner.extract_output(accumulator).values()))
    for count in (10_000, 200, 7):
        thresholds = confusion.interpolated_thresholds(count)
        rebinned = calibration_histogram.rebin(
            [t + confusion.EPSILON if t != 0 else t for t in thresholds], histogram)
        expected = tfma_bcm._histogram_to_binary_confusion_matrices(thresholds, rebinned)
        tp, tn, fp, fn = confusion.matrices_from_histogram(
            confusion.Counts.of(labels, predictions), thresholds)
        for ours, theirs in ((tp, expected.tp), (tn, expected.tn), (fp, expected.fp),
                             (fn, expected.fn)):
            np.testing.assert_allclose(ours, theirs, atol=1e-9)


# --- what TFMA cannot: R² ------------------------------------------------------------------------
def test_r2_score_is_kerass_coefficient_of_determination(diabetes_model, tmp_path):
    """TFMA 0.47 has no R² of its own, and its Keras wrapper fails on Keras's R2Score (it
    sets the weights of a metric not built yet). Ours computes R2Score with Keras's object:
    1 - SS_res / SS_tot on each slice, as scikit-learn's r2_score on the same rows."""
    from sklearn.metrics import r2_score

    examples, model = diabetes_model
    config = tfma.EvalConfig(
        model_specs=model_specs("target", False),
        slicing_specs=[tfma.SlicingSpec(), tfma.SlicingSpec(feature_keys=["sex"])],
        metrics_specs=[tfma.MetricsSpec(metrics=[tfma.MetricConfig(class_name="R2Score")])])
    uri, _ = run_evaluator(executor.Executor, tmp_path / "r2", examples, config, model)
    records = [r.numpy() for r in tf.data.TFRecordDataset(
        glob.glob(os.path.join(examples, "Split-eval", "*")))]
    spec = {"target": tf.io.FixedLenFeature([], tf.float32),
            "sex": tf.io.FixedLenFeature([], tf.float32)}
    rows = tf.io.parse_example(tf.constant(records), spec)
    served = tf.saved_model.load(model + "/Format-Serving").signatures["serving_default"]
    predicted = served(examples=tf.constant(records))["prediction"].numpy().ravel()
    found = {}
    for sliced in tfma.load_metrics(uri):
        (item,) = [i for i in sliced.metric_keys_and_values if i.key.name == "r2_score"]
        keys = sliced.slice_key.single_slice_keys
        found[keys[0].float_value if keys else None] = item.value.double_value.value
    labels, sex = rows["target"].numpy(), rows["sex"].numpy()
    assert len(found) == 1 + len(set(sex.tolist()))
    for value, r2 in found.items():
        rows_in = np.ones(len(labels), bool) if value is None else \
            sex == np.float32(value)
        assert r2 == pytest.approx(r2_score(labels[rows_in], predicted[rows_in]), abs=1e-4)


# --- settings, bad input, layout -----------------------------------------------------------------
def test_batch_size_does_not_change_the_metrics(iris_models, multiclass_runs, tmp_path):
    from google.protobuf import json_format

    examples, model, baseline = iris_models
    with open(os.path.join(multiclass_runs["ours"][0], "eval_config.json")) as f:
        config = json_format.ParseDict(json.load(f)["evalConfig"], tfma.EvalConfig())
    small, _ = run_evaluator(executor.Executor, tmp_path / "small", examples, config, model,
                             baseline, options=EvaluatorOptions(batch_rows=7))
    small, default = metric_table(small), metric_table(multiclass_runs["ours"][0])
    assert sorted(small) == sorted(default)
    # Losses are float32 sums whose order follows the batches: CI saw 10 ulps (1.2e-6) apart.
    # 1e-5 relative is far below what one dropped or doubled row would move (about 3% here).
    for key, value in default.items():
        assert np.allclose(small[key], value, atol=1e-6, rtol=1e-5, equal_nan=True), key


def test_a_record_without_its_label_is_named_by_file_and_offset(iris_models, tmp_path):
    examples, model, _ = iris_models
    split = tmp_path / "examples" / "Split-eval"
    split.mkdir(parents=True)
    records = [r.numpy() for r in tf.data.TFRecordDataset(
        glob.glob(os.path.join(examples, "Split-eval", "*")), compression_type="GZIP")]
    unlabelled = tf.train.Example.FromString(records[3])
    del unlabelled.features.feature["target"]
    records[3] = unlabelled.SerializeToString()
    path = str(split / "part-0.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    offset = sum(len(r) + 16 for r in records[:3])
    config = tfma.utils.update_eval_config_with_defaults(tfma.EvalConfig(
        model_specs=model_specs("target", False, prediction_key="probabilities"),
        metrics_specs=[tfma.MetricsSpec(metrics=[tfma.MetricConfig(class_name="ExampleCount")])]))
    (spec,) = config.model_specs
    with pytest.raises(ValueError) as raised:
        evaluate.evaluate(config, [path], {spec.name: model + "/Format-Serving"},
                          str(tmp_path / "out"), schema=schema_file.load_schema(examples))
    assert str(raised.value) == (f"{path}: record at byte offset {offset} has no value for "
                                 f"the label 'target'")


def test_a_record_the_model_cannot_score_is_named_by_file_and_offset(taxi_examples,
                                                                   taxi_models, tmp_path):
    """A framed record that is no tf.Example: TensorFlow's parser refuses the whole batch;
    the error names the record."""
    records = [r.numpy() for r in tf.data.TFRecordDataset(
        glob.glob(os.path.join(taxi_examples, "Split-eval", "*")), compression_type="GZIP")]
    records = records[:40] + [b"not a tf.Example"] + records[40:80]
    path = str(tmp_path / "part-0.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    offset = sum(len(r) + 16 for r in records[:40])
    config = tfma.utils.update_eval_config_with_defaults(taxi_config(
        [tfma.MetricConfig(class_name="ExampleCount")]), has_baseline=False)
    (spec,) = config.model_specs
    model = taxi_models["candidate"] + "/Format-Serving"
    with pytest.raises(ValueError) as raised:
        evaluate.evaluate(config, [path], {spec.name: model}, str(tmp_path / "out"))
    message = str(raised.value)
    assert message.startswith(f"{path}: record at byte offset {offset}: the model at {model} "
                              f"cannot score it: ")
    assert "\n" not in message


@pytest.mark.parametrize("change, what", [
    ({"example_weight_key": "weight"}, "example weights"),
    ({"slicing_sql": True}, "slice_keys_sql"),
    ({"plot": True}, "plots (calibration_plot)")])
def test_settings_it_does_not_implement_are_refused_in_one_line(change, what):
    config = tfma.EvalConfig(model_specs=[tfma.ModelSpec(
        label_key="y", example_weight_key=change.get("example_weight_key", ""))],
        metrics_specs=[tfma.MetricsSpec(metrics=[tfma.MetricConfig(
            class_name="CalibrationPlot" if change.get("plot") else "ExampleCount")])])
    if change.get("slicing_sql"):
        config.slicing_specs.add(slice_keys_sql="SELECT 1")
    config = tfma.utils.update_eval_config_with_defaults(config)
    with pytest.raises(UnsupportedSetting, match=r"^the fast Evaluator does not support "
                       + "|^plots") as raised:
        check_config(config)
        metric_keys(config)
    assert what in str(raised.value) and "\n" not in str(raised.value)


def test_the_engine_imports_no_tfx():
    """The engine, with TFMA's pieces it uses, runs without TFX (as the Beam jobs do)."""
    code = ("import sys, tensorflow_model_analysis as tfma\n"
            "from components.evaluator import evaluate\n"
            "from components.evaluator.config import check_config, metric_keys\n"
            "config = tfma.utils.update_eval_config_with_defaults(tfma.EvalConfig(\n"
            "    model_specs=[tfma.ModelSpec(label_key='y')], metrics_specs=[tfma.MetricsSpec(\n"
            "    metrics=[tfma.MetricConfig(class_name='AUC')])]))\n"
            "check_config(config); metric_keys(config)\n"
            "loaded = sorted(m for m in sys.modules if m == 'tfx' or m.startswith('tfx.'))\n"
            "print(loaded); sys.exit(1 if loaded else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
