"""A compiled pipeline run task by task as a Kubeflow Pipelines backend runs it, on kfp's own
local-execution pieces (`kfp.local`: the topological order, the placeholder substitution), in
one of two modes:

- `VERTEX`: each task gets its producers' artifacts as they were declared and as the
  producer's executor output updated them (URI, properties), types included, which is what
  Vertex AI passes on.
- `KFP_OSS`: what open-source Kubeflow Pipelines' v2 driver and launcher do
  (backend/src/v2/driver, backend/src/v2/component/launcher_v2.go): an input artifact is
  rebuilt from ML Metadata, named by its id, with the properties it was recorded with and an
  empty type (`metadata/client.go` passes `Schema: ""`); before the command runs, the
  launcher copies each input artifact to its local path (`/gcs/…`, `/s3/…`, `/minio/…`,
  under `pod_root`), and after it, uploads an output's local path to its URI if the task
  wrote one there.

Both take the spec's runtime parameters (the root's input definitions, their defaults
overridden by `parameters`) and a task's output parameters (`taskOutputParameter`). With a
`cache_dir`, KFP's cache is on: a task whose caching is enabled is keyed as the backend keys
it (`cacheutils.GenerateCacheKey`: its input artifacts' names, its input parameters' values,
its outputs' names and types, its image and unresolved command), and a key seen before
reuses that execution's outputs, artifacts and parameters, without running anything.

kfp 2.7's `kfp.local` runs a spec's DAG itself, but hands each task's input artifacts on as
generic `system.Artifact`s, so TFX's entrypoint cannot load them; hence this module. Each
task's resolved container command runs through `execute`: on this machine's interpreter, or
in the image.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import posixpath
import uuid
from typing import Callable, Optional

from google.protobuf import json_format, struct_pb2
from kfp.local import graph_utils, placeholder_utils
from kfp.pipeline_spec import pipeline_spec_pb2

from components import fileio

EXECUTOR_OUTPUT_FILE = "executor_output.json"
VERTEX, KFP_OSS = "vertex", "kfp-oss"
MODES = (VERTEX, KFP_OSS)
# The open-source launcher's local path of an artifact URI (LocalPathForURI).
LOCAL_MOUNTS = {"gs://": "gcs", "s3://": "s3", "minio://": "minio"}


class TaskFailed(RuntimeError):
    pass


@dataclasses.dataclass
class Run:
    """One run of a spec: each task's folder (a cached task's is the folder of the run that
    produced its outputs), and the tasks that came from the cache."""

    name: str
    folders: dict[str, str]
    cached: set[str]

    def __getitem__(self, task: str) -> str:
        return self.folders[task]

    def __iter__(self):
        return iter(self.folders)

    def __len__(self) -> int:
        return len(self.folders)

    def values(self):
        return self.folders.values()


def run_spec(spec_file: str, pipeline_root: str,
             execute: Callable[[list[str], str], int],
             outputs_dir: Optional[str] = None, mode: str = VERTEX,
             parameters: Optional[dict] = None, cache_dir: Optional[str] = None,
             pod_root: Optional[str] = None,
             copy: Optional[Callable[[str, str], None]] = None,
             through: Optional[set[str]] = None) -> Run:
    """Runs every task of the PipelineSpec in `spec_file` in dependency order, writing under
    `pipeline_root/<pipeline>-<time>/<task>/` (a folder, or a bucket's URI). `execute(command,
    image)` runs one task and returns its exit status. Each task's executor output is a local
    file, as KFP's launcher gives it: under `outputs_dir` (default: the pipeline root), in
    `<pipeline>-<time>/<task>/`. `parameters` set the spec's runtime parameters; `cache_dir`
    turns KFP's cache on (kept there, across runs); `pod_root` is where `KFP_OSS` puts the
    launcher's local copies (default: beside the executor outputs), made by `copy(source,
    destination)`. `through` runs only those tasks and the tasks they depend on (a test
    that asserts nothing of the rest). Raises TaskFailed at the first task that fails, as
    KFP stops a run."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    copy = copy or _copy_existing
    with open(spec_file, encoding="utf-8") as f:
        spec = json_format.ParseDict(json.load(f), pipeline_spec_pb2.PipelineSpec())
    executors = json_format.MessageToDict(spec.deployment_spec)["executors"]
    run_name = (f"{spec.pipeline_info.name}-"
                f"{datetime.datetime.now().strftime('%Y-%m-%d-%H-%M-%S-%f')}")
    pipeline_parameters = runtime_parameters(spec, parameters or {})
    tasks = dict(spec.root.dag.tasks)
    produced: dict[str, dict[str, pipeline_spec_pb2.ArtifactList]] = {}
    produced_parameters: dict[str, dict[str, struct_pb2.Value]] = {}
    run = Run(run_name, {}, set())
    stack = graph_utils.topological_sort_tasks(tasks)
    needed = _with_dependencies(tasks, through) if through else set(tasks)
    while stack:
        name = stack.pop()
        if name not in needed:
            continue
        task = tasks[name]
        component = spec.components[task.component_ref.name]
        container = executors[component.executor_label]["container"]
        task_root = posixpath.join(pipeline_root, run_name, name)
        local_root = os.path.join(outputs_dir or pipeline_root, run_name, name)
        os.makedirs(local_root, exist_ok=True)
        executor_input = pipeline_spec_pb2.ExecutorInput(
            inputs=pipeline_spec_pb2.ExecutorInput.Inputs(
                parameter_values={key: _parameter(name, key, value, pipeline_parameters,
                                                  produced_parameters)
                                  for key, value in task.inputs.parameters.items()},
                artifacts={key: _as_received(produced[value.task_output_artifact.producer_task][
                    value.task_output_artifact.output_artifact_key], mode)
                    for key, value in task.inputs.artifacts.items()}),
            outputs=pipeline_spec_pb2.ExecutorInput.Outputs(
                artifacts={key: pipeline_spec_pb2.ArtifactList(artifacts=[
                    pipeline_spec_pb2.RuntimeArtifact(
                        name=key, type=definition.artifact_type,
                        uri=posixpath.join(task_root, key), metadata=struct_pb2.Struct())])
                    for key, definition in component.output_definitions.artifacts.items()},
                parameters={key: pipeline_spec_pb2.ExecutorInput.OutputParameter(
                    output_file=os.path.join(local_root, "parameters", key))
                    for key in component.output_definitions.parameters},
                output_file=os.path.join(local_root, EXECUTOR_OUTPUT_FILE)))
        key = cache_key(executor_input, component, container) \
            if cache_dir and task.caching_options.enable_cache else None
        cached = _cached(cache_dir, key)
        if cached:
            produced[name] = {k: json_format.ParseDict(v, pipeline_spec_pb2.ArtifactList())
                              for k, v in cached["artifacts"].items()}
            produced_parameters[name] = {k: json_format.ParseDict(v, struct_pb2.Value())
                                         for k, v in cached["parameters"].items()}
            run.folders[name] = cached["folder"]
            run.cached.add(name)
            continue
        command = placeholder_utils.replace_placeholders(
            full_command=[*container.get("command", []), *container.get("args", [])],
            executor_input_dict=json_format.MessageToDict(executor_input),
            pipeline_resource_name=run_name, task_resource_name=name,
            pipeline_root=pipeline_root, unique_pipeline_id=run_name)
        pod = pod_root or os.path.join(local_root, "pod")
        if mode == KFP_OSS:
            _download_inputs(executor_input, pod, copy)
        status = execute(command, container["image"])
        if status != 0:
            raise TaskFailed(f"task {name} exited with status {status}")
        if mode == KFP_OSS:
            _upload_outputs(executor_input, pod, copy)
        produced[name], produced_parameters[name] = _outputs_after(executor_input)
        run.folders[name] = task_root
        if key:
            _remember(cache_dir, key, task_root, produced[name], produced_parameters[name])
    return run


def _with_dependencies(tasks: dict, names: set[str]) -> set[str]:
    unknown = names - set(tasks)
    if unknown:
        raise ValueError(f"no task {sorted(unknown)} in the spec")
    needed, pending = set(), list(names)
    while pending:
        name = pending.pop()
        if name not in needed:
            needed.add(name)
            pending.extend(tasks[name].dependent_tasks)
    return needed


def runtime_parameters(spec: pipeline_spec_pb2.PipelineSpec, given: dict
                       ) -> dict[str, struct_pb2.Value]:
    """The pipeline's runtime parameters: each declared one's default, or the given value
    (as `create_run_from_pipeline_package(arguments=...)` sets it); an unknown name or a
    required one left out is refused, as the backend refuses the run."""
    declared = spec.root.input_definitions.parameters
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ValueError(f"no runtime parameter {unknown} in the spec (it has "
                         f"{sorted(declared)})")
    values = {}
    for name, definition in declared.items():
        if name in given:
            values[name] = json_format.ParseDict(given[name], struct_pb2.Value())
        elif definition.HasField("default_value"):
            values[name] = definition.default_value
        elif not definition.is_optional:
            raise ValueError(f"runtime parameter {name} has no default and was not given")
    return values


def cache_key(executor_input: pipeline_spec_pb2.ExecutorInput,
              component: pipeline_spec_pb2.ComponentSpec, container: dict) -> str:
    """The fingerprint KFP's driver gives a task (cacheutils.GenerateCacheKey, then
    GenerateFingerPrint): what it reads (input artifacts by name, input parameters by
    value), what it writes (outputs' names and types, URIs wiped) and its container (image,
    command and args as the spec holds them, placeholders unresolved)."""
    inputs, outputs = executor_input.inputs, executor_input.outputs
    key = {
        "inputArtifactNames": {name: {"artifactNames": [a.name for a in artifacts.artifacts]}
                               for name, artifacts in inputs.artifacts.items()},
        "inputParameterValues": {name: json_format.MessageToDict(value)
                                 for name, value in inputs.parameter_values.items()},
        "outputArtifactsSpec": {name: json_format.MessageToDict(pipeline_spec_pb2.RuntimeArtifact(
            name=artifacts.artifacts[0].name, type=artifacts.artifacts[0].type,
            metadata=artifacts.artifacts[0].metadata))
            for name, artifacts in outputs.artifacts.items() if artifacts.artifacts},
        "outputParametersSpec": {
            name: pipeline_spec_pb2.ParameterType.ParameterTypeEnum.Name(
                definition.parameter_type)
            for name, definition in component.output_definitions.parameters.items()},
        "containerSpec": {"image": container["image"],
                          "cmdArgs": [*container.get("command", []),
                                      *container.get("args", [])]},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _cached(cache_dir: Optional[str], key: Optional[str]) -> Optional[dict]:
    if not key:
        return None
    path = os.path.join(cache_dir, f"{key}.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _remember(cache_dir: str, key: str, folder: str,
              artifacts: dict[str, pipeline_spec_pb2.ArtifactList],
              parameters: dict[str, struct_pb2.Value]) -> None:
    os.makedirs(cache_dir, exist_ok=True)
    with open(os.path.join(cache_dir, f"{key}.json"), "w", encoding="utf-8") as f:
        json.dump({"folder": folder,
                   "artifacts": {k: json_format.MessageToDict(v) for k, v in artifacts.items()},
                   "parameters": {k: json_format.MessageToDict(v)
                                  for k, v in parameters.items()}}, f)


def _parameter(task: str, key: str, value: pipeline_spec_pb2.TaskInputsSpec.InputParameterSpec,
               pipeline_parameters: dict[str, struct_pb2.Value],
               produced: dict[str, dict[str, struct_pb2.Value]]) -> struct_pb2.Value:
    kind = value.WhichOneof("kind")
    if kind == "runtime_value" and value.runtime_value.HasField("constant"):
        return value.runtime_value.constant
    if kind == "component_input_parameter":
        return pipeline_parameters[value.component_input_parameter]
    if kind == "task_output_parameter":
        output = value.task_output_parameter
        return produced[output.producer_task][output.output_parameter_key]
    raise ValueError(f"task {task}: parameter {key} is {kind}, which this launcher does not "
                     f"take")


def _as_received(artifacts: pipeline_spec_pb2.ArtifactList, mode: str
                 ) -> pipeline_spec_pb2.ArtifactList:
    """A producer's artifacts as a consumer receives them: as they are on Vertex; on
    open-source KFP as the driver rebuilds them from ML Metadata, with no type."""
    received = pipeline_spec_pb2.ArtifactList.FromString(artifacts.SerializeToString())
    if mode == KFP_OSS:
        for artifact in received.artifacts:
            artifact.type.Clear()
    return received


def local_path(uri: str, pod_root: str) -> Optional[str]:
    """Where the open-source launcher keeps an artifact's local copy (LocalPathForURI),
    below `pod_root`; None for a URI it has no mount for (a local folder)."""
    for prefix, mount in LOCAL_MOUNTS.items():
        if uri.startswith(prefix):
            return os.path.join(pod_root, mount, uri[len(prefix):])
    return None


def _copy_existing(source: str, destination: str) -> None:
    if fileio.exists(source):  # an artifact may hold nothing (no production model yet)
        fileio.copy_tree(source, destination)


def _download_inputs(executor_input: pipeline_spec_pb2.ExecutorInput, pod_root: str,
                     copy: Callable[[str, str], None]) -> None:
    for artifacts in executor_input.inputs.artifacts.values():
        for artifact in artifacts.artifacts[:1]:  # the launcher copies the first
            path = local_path(artifact.uri, pod_root)
            if path and not os.path.exists(path):
                copy(artifact.uri, path)


def _upload_outputs(executor_input: pipeline_spec_pb2.ExecutorInput, pod_root: str,
                    copy: Callable[[str, str], None]) -> None:
    """Output artifacts the task wrote to their local path, copied to their URIs; a task
    that wrote to the URI itself (as TFX's executors do) leaves no local path, and the
    launcher logs that and goes on."""
    for artifacts in executor_input.outputs.artifacts.values():
        for artifact in artifacts.artifacts:
            path = local_path(artifact.uri, pod_root)
            if path and os.path.exists(path):
                copy(path, artifact.uri)


def run_twice(folder: str, execute: Callable[[list[str], str], int], *settings: str,
              outputs_dir: Optional[str] = None,
              list_folder: Callable[[str], list[str]] = None, mode: str = VERTEX,
              ) -> list[tuple[Run, list[str]]]:
    """The compiled default pipeline, then the same trained for one step (a worse model), each
    compiled with `settings` and run into `folder/<first|worse>` with one serving folder,
    `folder/serving`: [(the run, the pushed versions after it)] for the two runs. `folder`
    may be a bucket's URI: the specs and executor outputs are then written under
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
        run = run_spec(spec, pipeline_root, execute, outputs_dir=local if remote else None,
                       mode=mode)
        runs.append((run, sorted(list_folder(serving))))
    return runs


def executor_output(run: Run, task: str, outputs_dir: Optional[str] = None) -> dict:
    """The executor output a task of `run_spec` wrote (as JSON): beside its artifacts, or for
    a run on a bucket under `outputs_dir`."""
    if outputs_dir is None:
        path = os.path.join(run[task], EXECUTOR_OUTPUT_FILE)
    else:
        run_folder = posixpath.basename(posixpath.dirname(run[task]))
        path = os.path.join(outputs_dir, run_folder, task, EXECUTOR_OUTPUT_FILE)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _outputs_after(executor_input: pipeline_spec_pb2.ExecutorInput
                   ) -> tuple[dict[str, pipeline_spec_pb2.ArtifactList],
                              dict[str, struct_pb2.Value]]:
    """The task's output artifacts as downstream tasks get them: as declared, updated by what
    its executor output says (URIs, properties), keeping the declared types, each named as
    ML Metadata records it (a new id); and its output parameters, from the executor output
    or else each parameter's own file."""
    outputs = {key: pipeline_spec_pb2.ArtifactList.FromString(value.SerializeToString())
               for key, value in executor_input.outputs.artifacts.items()}
    written = pipeline_spec_pb2.ExecutorOutput()
    path = executor_input.outputs.output_file
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            json_format.Parse(f.read(), written, ignore_unknown_fields=True)
    for key, artifacts in written.artifacts.items():
        if key not in outputs:
            continue
        declared = outputs[key].artifacts[0].type
        for artifact in artifacts.artifacts:
            if not artifact.HasField("type"):
                artifact.type.CopyFrom(declared)
        outputs[key] = artifacts
    for artifacts in outputs.values():
        for artifact in artifacts.artifacts:
            artifact.name = str(uuid.uuid4().int >> 80)  # ML Metadata's id, unique
    parameters = dict(written.parameter_values)
    for key, output in executor_input.outputs.parameters.items():
        if key not in parameters and os.path.exists(output.output_file):
            with open(output.output_file, encoding="utf-8") as f:
                parameters[key] = struct_pb2.Value(string_value=f.read())
    return outputs, parameters
