"""The compiled pipeline's first task, `run-settings`: it runs every time the pipeline runs,
never from the cache, and settles what that run does, handing each task the parameters it
then takes:

- the runtime parameters (`RUNTIME_PARAMETERS`: data_root, train_steps, eval_steps,
  serving_dir and the blessing thresholds), which a user sets when submitting a run
  (`tfrp submit --param`, `create_run_from_pipeline_package(arguments=...)`), applied to the
  parameters of the tasks that use them, whose compiled values are this task's constants;
- ExampleGen's inputs, settled as of now (the latest span and its patterns, and a
  fingerprint of the files: `inputs.settle_inputs`), as stock ExampleGen's driver does.

Each task's cache key on Kubeflow Pipelines and Vertex then holds the values it really runs
with: unchanged data may come from the cache, replaced data never does, and a run with
another train_steps trains again. Stock TFX settles ExampleGen's inputs in a driver that
Vertex runs as a pre-cache-check hook; open-source Kubeflow Pipelines has no such hook, and
a task of its own works on both.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any, Callable, Optional, Sequence

from tfrecord_shards import fileio
from components.example_gen.inputs import settle_inputs
from components.example_gen.options import ExampleGenOptions
from tfrecord_shards.options import OPTIONS_KEY

TASK = "run-settings"
FLAG = "--run-settings"  # the task entrypoint's first argument for this task
ARGS = [FLAG, "--executor-input", "{{$}}"]
RUN_ID = "pipeline_run"  # the run's id: this task's cache key is new at every run
EXAMPLE_GEN = "ShardedExampleGen"
TRAINER, EVALUATOR, PUSHER = "Trainer", "Evaluator", "Pusher"
PRODUCTION_MODEL = "production_model"
ACCURACY_METRICS = ("BinaryAccuracy", "SparseCategoricalAccuracy")


@dataclasses.dataclass(frozen=True)
class RuntimeParameter:
    """A setting a run may change without compiling again: its PipelineConfig field, its KFP
    type, and where it goes: (task, parameter) -> how it changes that parameter's JSON."""

    name: str
    parameter_type: str  # KFP's: STRING, NUMBER_INTEGER, NUMBER_DOUBLE
    targets: dict[tuple[str, str], Callable[[Any, Any], Any]]


def _example_gen_source(options: dict, source: str) -> dict:
    # Whatever the compiled source resolved to is void for another one.
    return {**options, "source": source, "resolved_inputs": None, "resolved_spans": None,
            "source_fingerprint": None, "span": 0, "version": None}


def _num_steps(args: dict, steps: float) -> dict:
    return {**args, "num_steps": int(steps)}


def _base_directory(destination: dict, folder: str) -> dict:
    destination.setdefault("filesystem", {})["base_directory"] = folder
    return destination


def _thresholds(class_names: tuple[str, ...], change: Callable[[dict, float], None]
                ) -> Callable[[dict, float], dict]:
    def apply(eval_config: dict, value: float) -> dict:
        for spec in eval_config.get("metrics_specs", []):
            for metric in spec.get("metrics", []):
                if metric.get("class_name") in class_names and "threshold" in metric:
                    change(metric["threshold"], value)
        return eval_config
    return apply


def _lower_bound(threshold: dict, value: float) -> None:
    threshold.setdefault("value_threshold", {})["lower_bound"] = value


def _upper_bound(threshold: dict, value: float) -> None:
    threshold.setdefault("value_threshold", {})["upper_bound"] = value


def _tolerance(threshold: dict, value: float) -> None:
    change = threshold.get("change_threshold")
    if change is not None:  # higher is better: -tolerance; lower is better: +tolerance
        change["absolute"] = -value if change.get("direction") == "HIGHER_IS_BETTER" else value


RUNTIME_PARAMETERS = (
    RuntimeParameter("data_root", "STRING", {(EXAMPLE_GEN, OPTIONS_KEY): _example_gen_source}),
    RuntimeParameter("train_steps", "NUMBER_INTEGER", {(TRAINER, "train_args"): _num_steps}),
    RuntimeParameter("eval_steps", "NUMBER_INTEGER", {(TRAINER, "eval_args"): _num_steps}),
    RuntimeParameter("serving_dir", "STRING", {
        (PUSHER, "push_destination"): _base_directory,
        (PRODUCTION_MODEL, OPTIONS_KEY): lambda options, folder: {**options,
                                                                  "serving_dir": folder}}),
    RuntimeParameter("min_accuracy", "NUMBER_DOUBLE", {
        (EVALUATOR, "eval_config"): _thresholds(ACCURACY_METRICS, _lower_bound)}),
    RuntimeParameter("min_auc", "NUMBER_DOUBLE", {
        (EVALUATOR, "eval_config"): _thresholds(("AUC",), _lower_bound)}),
    RuntimeParameter("max_mse", "NUMBER_DOUBLE", {
        (EVALUATOR, "eval_config"): _thresholds(("MeanSquaredError",), _upper_bound)}),
    RuntimeParameter("baseline_tolerance", "NUMBER_DOUBLE", {
        (EVALUATOR, "eval_config"): _thresholds(
            (*ACCURACY_METRICS, "MeanSquaredError"), _tolerance)}),
)


def output_name(task: str, parameter: str) -> str:
    """This task's output (and input) parameter holding `task`'s `parameter`."""
    return f"{task}-{parameter}"


def settle(runtime_values: dict[str, Any], compiled: dict[str, str]) -> dict[str, str]:
    """Each task parameter (`output_name` -> its compiled JSON) with the runtime values
    applied, ExampleGen's inputs settled last."""
    settled = {name: json.loads(value) for name, value in compiled.items()}
    for parameter in RUNTIME_PARAMETERS:
        if parameter.name not in runtime_values:
            continue
        for (task, key), apply in parameter.targets.items():
            name = output_name(task, key)
            if name in settled:
                settled[name] = apply(settled[name], runtime_values[parameter.name])
    outputs = {name: json.dumps(value, indent=2, sort_keys=True)
               for name, value in settled.items()}
    example_gen = output_name(EXAMPLE_GEN, OPTIONS_KEY)
    if example_gen in outputs:
        outputs[example_gen] = settle_inputs(
            ExampleGenOptions.from_json(outputs[example_gen])).to_json()
    return outputs


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog=FLAG, description=__doc__.splitlines()[0])
    parser.add_argument("--executor-input", required=True,
                        help="KFP's executor input, as JSON ({{$}}).")
    executor_input = json.loads(parser.parse_args(argv).executor_input)
    given = executor_input["inputs"].get("parameterValues", {})
    runtime = {p.name: given[p.name] for p in RUNTIME_PARAMETERS if p.name in given}
    outputs = settle(runtime, {name: value for name, value in given.items()
                               if name not in runtime and name != RUN_ID})
    output_file = executor_input["outputs"]["outputFile"]
    fileio.makedirs(fileio.dirname(output_file))
    fileio.write_json(output_file, {"parameterValues": outputs})
