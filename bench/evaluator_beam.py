"""The fast Evaluator in process against its Beam pipeline (DirectRunner, multi_processing), each
run as the pipeline runs it: our executor on Examples and two Model artifacts, in a whole
fresh process (imports included), timed from outside.

    python -m bench.evaluator_beam prepare ROOT
    python -m bench.evaluator_beam run ROOT taxi|million [BEAM_ARG ...]
    python -m bench.evaluator_beam pipeline-run RUN raw|transformed [BEAM_ARG ...]

`prepare` makes, once: the bundled taxi sample (15,002 trips) through our ExampleGen (its
eval split: a third of them, one gzip shard); 1M taxi-like rows (testsupport/data.py's fixed
seed) all but a thousandth in the eval split, in 8 gzip shards; our Transform on the taxi
sample and two models trained on it as the pipeline trains them (150 and 10 steps). `run`
evaluates one of the eval splits with the candidate against the baseline: the metrics of
tests/test_evaluator_beam.py, overall and on four slicing specs, with thresholds; with no
Beam args (in process) or with the ones given.

`pipeline-run` evaluates the eval split of a kept `bench pipeline` run (`--keep-runs`: its
ExampleGen's and Transform's outputs and its Trainer's model) with the candidate alone and
no slices (a raw slicing column would send both paths to the raw records): `raw` on the raw
records through serving_default, `transformed` on Transform's split through
score_transformed, checked on the first raw rows.
"""
from __future__ import annotations

import os
import sys
import time


def prepare(root: str) -> None:
    from components.transform import taxi
    from tfrecord_shards.codec import schema_file
    from components.example_gen import beam_job as example_gen
    from components.example_gen.options import ExampleGenOptions
    from components.example_gen.sources.locate import taxi_csv_path
    from tfrecord_shards.options import from_flat
    from components.trainer import module
    from components.transform import beam_job as transform
    from components.transform.options import TransformOptions
    from testsupport.data import write_taxi_csv
    from tfx.components.trainer.fn_args_utils import FnArgs

    os.makedirs(root, exist_ok=True)
    taxi_folder = os.path.join(root, "taxi-csv")
    os.makedirs(taxi_folder, exist_ok=True)
    if not os.path.exists(os.path.join(taxi_folder, "data.csv")):
        os.symlink(taxi_csv_path(), os.path.join(taxi_folder, "data.csv"))
    examples = {"taxi": os.path.join(root, "taxi"), "million": os.path.join(root, "million")}
    if not os.path.isdir(examples["taxi"]):
        example_gen.run(ExampleGenOptions(source=os.path.join(taxi_folder, "data.csv")),
                        examples["taxi"])
    if not os.path.isdir(examples["million"]):
        csv = write_taxi_csv(1_000_000, os.path.join(root, "million-csv"))
        example_gen.run(from_flat(ExampleGenOptions, {
            "source": csv, "splits": "train:1,eval:999", "num_shards": 8}), examples["million"])
    graph, transformed = os.path.join(root, "graph"), os.path.join(root, "transformed")
    if not os.path.isdir(graph):
        transform.run(TransformOptions(preprocessing_fn=taxi.PREPROCESSING_FN,
                                       label_key=taxi.TAXI_LABEL, task="binary"),
                      examples["taxi"], schema_file.load_schema(examples["taxi"]), graph,
                      transformed)
    for name, steps in (("candidate", 150), ("baseline", 10)):
        folder = os.path.join(root, name)
        if os.path.isdir(os.path.join(folder, "Format-Serving")):
            continue
        module.run_fn(FnArgs(
            train_files=[os.path.join(transformed, "Split-train", "*")],
            eval_files=[os.path.join(transformed, "Split-eval", "*")],
            schema_path=os.path.join(transformed, "schema.pbtxt"),
            transform_graph_path=graph, model_run_dir=os.path.join(folder, "run"),
            serving_model_dir=os.path.join(folder, "Format-Serving"), train_steps=steps,
            eval_steps=2, custom_config={**taxi.TRAINER_SETTINGS, "batch_size": 64}))


def eval_config():
    import tensorflow_model_analysis as tfma

    from components.transform import taxi

    def bound(**kwargs):
        threshold = tfma.MetricThreshold()
        if "lower" in kwargs:
            threshold.value_threshold.lower_bound.value = kwargs["lower"]
        if "change" in kwargs:
            threshold.change_threshold.absolute.value = kwargs["change"]
            threshold.change_threshold.direction = tfma.MetricDirection.HIGHER_IS_BETTER
        return threshold

    specs = [tfma.ModelSpec(name=name, signature_name="serving_default",
                            label_key=taxi.TAXI_LABEL, is_baseline=name == "baseline",
                            preprocessing_function_names=["transform_features"])
             for name in ("candidate", "baseline")]
    metrics = [tfma.MetricConfig(class_name="BinaryAccuracy",
                                 threshold=bound(lower=0.0, change=-1.0)),
               tfma.MetricConfig(class_name="AUC", threshold=bound(lower=0.5)),
               tfma.MetricConfig(class_name="AUC", config='{"curve": "PR", "name": "auc_pr"}'),
               tfma.MetricConfig(class_name="Precision"), tfma.MetricConfig(class_name="Recall"),
               tfma.MetricConfig(class_name="BinaryCrossentropy"),
               tfma.MetricConfig(class_name="Calibration"),
               tfma.MetricConfig(class_name="MeanLabel"),
               tfma.MetricConfig(class_name="MeanPrediction"),
               tfma.MetricConfig(class_name="ExampleCount")]
    slices = [tfma.SlicingSpec(), tfma.SlicingSpec(feature_keys=["payment_type"]),
              tfma.SlicingSpec(feature_keys=["trip_start_hour"]),
              tfma.SlicingSpec(feature_keys=["payment_type", "trip_start_day"]),
              tfma.SlicingSpec(feature_values={"payment_type": "Cash"})]
    return tfma.EvalConfig(model_specs=specs, slicing_specs=slices,
                           metrics_specs=[tfma.MetricsSpec(metrics=metrics)])


def artifact(kind, uri: str, artifact_id: int, **properties):
    made = kind()
    made.uri, made.id = uri, artifact_id
    for name, value in properties.items():
        setattr(made, name, value)
    return made


def run_executor(inputs: dict, config, out: str, beam_args: list[str]):
    """Our Evaluator's executor on `inputs` (TFX artifacts by key) with `config`, writing
    under `out`, with `beam_args` (none: in process), as TFX runs it: (seconds, the
    evaluation artifact, the blessing artifact)."""
    from tfx.dsl.components.base import base_beam_executor
    from tfx.types import standard_artifacts
    from tfx.utils import json_utils, proto_utils

    from components.evaluator import executor

    evaluation = artifact(standard_artifacts.ModelEvaluation, os.path.join(out, "evaluation"), 4)
    blessing = artifact(standard_artifacts.ModelBlessing, os.path.join(out, "blessing"), 5)
    context = base_beam_executor.BaseBeamExecutor.Context(
        beam_pipeline_args=beam_args + ["--sdk_container_image=unused"] if beam_args else None,
        tmp_dir=os.path.join(out, "tmp"), unique_id="1")
    started = time.perf_counter()
    executor.Executor(context).Do(
        inputs, {"evaluation": [evaluation], "blessing": [blessing]},
        {"eval_config": proto_utils.proto_to_json(config),
         "example_splits": json_utils.dumps(None), "current_component_id": "Evaluator"})
    return time.perf_counter() - started, evaluation, blessing


def examples_artifact(uri: str):
    from tfx.types import artifact_utils, standard_artifacts

    return artifact(standard_artifacts.Examples, uri, 1,
                    split_names=artifact_utils.encode_split_names(["train", "eval"]))


def run(root: str, examples: str, beam_args: list[str]) -> None:
    import shutil
    import tempfile

    from tfx.types import standard_artifacts

    out = tempfile.mkdtemp(prefix="evaluator-bench-", dir=root)
    try:
        inputs = {"examples": [examples_artifact(os.path.join(root, examples))],
                  "model": [artifact(standard_artifacts.Model,
                                     os.path.join(root, "candidate"), 2)],
                  "baseline_model": [artifact(standard_artifacts.Model,
                                              os.path.join(root, "baseline"), 3)]}
        seconds, _, blessing = run_executor(inputs, eval_config(), out, beam_args)
        print(f"executor {seconds:.2f} s; {os.listdir(blessing.uri)}", file=sys.stderr)
    finally:
        shutil.rmtree(out)


def run_pipeline_output(run_dir: str, scored: str, beam_args: list[str]) -> None:
    import glob
    import shutil
    import tempfile

    import tensorflow_model_analysis as tfma
    from tfx.types import standard_artifacts

    from components.transform import taxi

    def only(pattern: str) -> str:
        (found,) = glob.glob(os.path.join(run_dir, "pipelines", "*", pattern))
        return found

    config = eval_config()
    del config.model_specs[1:]
    config.model_specs[0].ClearField("is_baseline")
    del config.slicing_specs[:]
    config.slicing_specs.append(tfma.SlicingSpec())
    config.metrics_specs[0].metrics[0].threshold.ClearField("change_threshold")
    out = tempfile.mkdtemp(prefix="evaluator-bench-")
    try:
        inputs = {"examples": [examples_artifact(only("ShardedExampleGen/examples/*"))],
                  "model": [artifact(standard_artifacts.Model, only("Trainer/model/*"), 2)]}
        if scored == "transformed":
            inputs["transformed_examples"] = [artifact(
                standard_artifacts.Examples, only("ShardedTransform/transformed_examples/*"),
                3)]
        seconds, evaluation, blessing = run_executor(inputs, config, out, beam_args)
        checked = os.path.exists(os.path.join(evaluation.uri, "serving_check.json"))
        (overall,) = [m for m in tfma.load_metrics(evaluation.uri) if not m.slice_key.
                      single_slice_keys]
        auc = [item.value.double_value.value for item in overall.metric_keys_and_values
               if item.key.name == "auc"]
        print(f"executor {seconds:.2f} s; {os.listdir(blessing.uri)}; serving check "
              f"{'written' if checked else 'none'}; auc {auc[0]:.6f} ({taxi.TAXI_LABEL})",
              file=sys.stderr)
    finally:
        shutil.rmtree(out)


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    elif sys.argv[1] == "pipeline-run":
        run_pipeline_output(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        run(sys.argv[2], sys.argv[3], sys.argv[4:])
