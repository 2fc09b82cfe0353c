"""A compiled pipeline run task by task as Kubeflow Pipelines' launcher runs it, on kfp's own
local-execution pieces (`kfp.local`: the topological order, the placeholder substitution).

kfp 2.7's `kfp.local` runs a spec's DAG itself, but hands each task's input artifacts on as
generic `system.Artifact`s: a TFX artifact's type (its `instanceSchema`, `tfx.Examples`, …)
is lost on the way, and TFX's entrypoint then cannot load the input (`Could not import
system.Artifact`). Here each task gets its producers' artifacts as they were declared and as
the producer's executor output updated them (URI, properties), which is what KFP's backend
passes. Each task's resolved container command runs through `execute`: on this machine's
interpreter, or in the image.
"""
from __future__ import annotations

import datetime
import json
import os
import posixpath
from typing import Callable, Optional

from google.protobuf import json_format, struct_pb2
from kfp.local import graph_utils, placeholder_utils
from kfp.pipeline_spec import pipeline_spec_pb2

EXECUTOR_OUTPUT_FILE = "executor_output.json"


class TaskFailed(RuntimeError):
    pass


def run_spec(spec_file: str, pipeline_root: str,
             execute: Callable[[list[str], str], int],
             outputs_dir: Optional[str] = None) -> dict[str, str]:
    """Runs every task of the PipelineSpec in `spec_file` in dependency order, writing under
    `pipeline_root/<pipeline>-<time>/<task>/` (a folder, or a bucket's URI). `execute(command,
    image)` runs one task and returns its exit status. Each task's executor output is a local
    file, as KFP's launcher gives it: under `outputs_dir` (default: the pipeline root).
    Returns {task: its folder's path or URI}, the executor output being in
    `<outputs_dir>/<pipeline>-<time>/<task>/`; raises TaskFailed at the first task that fails,
    as KFP stops a run."""
    with open(spec_file, encoding="utf-8") as f:
        spec = json_format.ParseDict(json.load(f), pipeline_spec_pb2.PipelineSpec())
    executors = json_format.MessageToDict(spec.deployment_spec)["executors"]
    run_name = (f"{spec.pipeline_info.name}-"
                f"{datetime.datetime.now().strftime('%Y-%m-%d-%H-%M-%S-%f')}")
    tasks = dict(spec.root.dag.tasks)
    produced: dict[str, dict[str, pipeline_spec_pb2.ArtifactList]] = {}
    folders = {}
    stack = graph_utils.topological_sort_tasks(tasks)
    while stack:
        name = stack.pop()
        task = tasks[name]
        component = spec.components[task.component_ref.name]
        container = executors[component.executor_label]["container"]
        task_root = posixpath.join(pipeline_root, run_name, name)
        local_root = os.path.join(outputs_dir or pipeline_root, run_name, name)
        os.makedirs(local_root, exist_ok=True)
        executor_input = pipeline_spec_pb2.ExecutorInput(
            inputs=pipeline_spec_pb2.ExecutorInput.Inputs(
                parameter_values={key: _constant(name, key, value)
                                  for key, value in task.inputs.parameters.items()},
                artifacts={key: produced[value.task_output_artifact.producer_task][
                    value.task_output_artifact.output_artifact_key]
                    for key, value in task.inputs.artifacts.items()}),
            outputs=pipeline_spec_pb2.ExecutorInput.Outputs(
                artifacts={key: pipeline_spec_pb2.ArtifactList(artifacts=[
                    pipeline_spec_pb2.RuntimeArtifact(
                        name=key, type=definition.artifact_type,
                        uri=posixpath.join(task_root, key), metadata=struct_pb2.Struct())])
                    for key, definition in component.output_definitions.artifacts.items()},
                output_file=os.path.join(local_root, EXECUTOR_OUTPUT_FILE)))
        command = placeholder_utils.replace_placeholders(
            full_command=[*container.get("command", []), *container.get("args", [])],
            executor_input_dict=json_format.MessageToDict(executor_input),
            pipeline_resource_name=run_name, task_resource_name=name,
            pipeline_root=pipeline_root, unique_pipeline_id=run_name)
        status = execute(command, container["image"])
        if status != 0:
            raise TaskFailed(f"task {name} exited with status {status}")
        produced[name] = _outputs_after(executor_input)
        folders[name] = task_root
    return folders


def run_twice(folder: str, execute: Callable[[list[str], str], int], *settings: str,
              outputs_dir: Optional[str] = None,
              list_folder: Callable[[str], list[str]] = None
              ) -> list[tuple[dict[str, str], list[str]]]:
    """The compiled default pipeline, then the same trained for one step (a worse model), each
    compiled with `settings` and run into `folder/<first|worse>` with one serving folder,
    `folder/serving`: [(its task folders, the pushed versions after it)] for the two runs.
    `folder` may be a bucket's URI: the specs and executor outputs are then written under
    `outputs_dir/<first|worse>`, and `list_folder(uri)` names what a bucket's folder holds."""
    from conftest import tfrp

    remote = "://" in folder
    list_folder = list_folder or (lambda path: os.listdir(path) if os.path.isdir(path) else [])
    serving = posixpath.join(folder, "serving")
    runs = []
    for name, extra in (("first", ()), ("worse", ("--set", "train_steps=1"))):
        pipeline_root = posixpath.join(folder, name)
        local = os.path.join(outputs_dir, name) if remote else pipeline_root
        os.makedirs(local)
        spec = local + ".json"
        tfrp("compile", "--output", spec, "--pipeline-root", pipeline_root,
             "--set", f"serving_dir={serving}", *settings, *extra)
        tasks = run_spec(spec, pipeline_root, execute, outputs_dir=local if remote else None)
        runs.append((tasks, sorted(list_folder(serving))))
    return runs


def executor_output(tasks: dict[str, str], task: str, outputs_dir: Optional[str] = None
                    ) -> dict:
    """The executor output a task of `run_spec` wrote (as JSON): beside its artifacts, or for
    a run on a bucket under `outputs_dir`."""
    if outputs_dir is None:
        path = os.path.join(tasks[task], EXECUTOR_OUTPUT_FILE)
    else:
        run_folder = posixpath.basename(posixpath.dirname(tasks[task]))
        path = os.path.join(outputs_dir, run_folder, task, EXECUTOR_OUTPUT_FILE)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _constant(task: str, key: str, value) -> struct_pb2.Value:
    if not value.runtime_value.HasField("constant"):
        raise ValueError(f"task {task}: parameter {key} is not a plain constant (schema 2.1); "
                         f"open-source Kubeflow Pipelines takes no other")
    return value.runtime_value.constant


def _outputs_after(executor_input: pipeline_spec_pb2.ExecutorInput
                   ) -> dict[str, pipeline_spec_pb2.ArtifactList]:
    """The task's output artifacts as downstream tasks get them: as declared, updated by what
    its executor output says (URIs, properties), keeping the declared types."""
    outputs = {key: pipeline_spec_pb2.ArtifactList.FromString(value.SerializeToString())
               for key, value in executor_input.outputs.artifacts.items()}
    path = executor_input.outputs.output_file
    if not os.path.exists(path):
        return outputs
    with open(path, encoding="utf-8") as f:
        written = json_format.Parse(f.read(), pipeline_spec_pb2.ExecutorOutput(),
                                    ignore_unknown_fields=True)
    for key, artifacts in written.artifacts.items():
        if key not in outputs:
            continue
        declared = outputs[key].artifacts[0].type
        for artifact in artifacts.artifacts:
            if not artifact.HasField("type"):
                artifact.type.CopyFrom(declared)
        outputs[key] = artifacts
    return outputs
