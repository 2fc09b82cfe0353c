"""A compiled pipeline run task by task as a Kubeflow Pipelines backend runs it, on kfp's own
local-execution pieces (`kfp.local`: the topological order, the placeholder substitution), in
one of two modes:

- `KFP_OSS`: what open-source Kubeflow Pipelines 2.5's API server, v2 driver and launcher do
  (kubeflow/pipelines at tag 2.5.0, `backend/src/...`; each rule below names its source):
  the root's parameters typed and defaulted, each task's parameters resolved and typed, input
  artifacts rebuilt from ML Metadata, output URIs provisioned with an `executor-logs` output,
  the cache keyed and honoured, inputs copied to the pod and outputs back, retries.
- `VERTEX`: each task gets its producers' artifacts as they were declared and as the
  producer's executor output updated them (URI, properties), types included, which is what
  Vertex AI passes on.

kfp 2.7's `kfp.local` runs a spec's DAG itself, but hands each task's input artifacts on as
generic `system.Artifact`s, so TFX's entrypoint cannot load them; hence this module. Each
task's resolved container command runs through `execute(command, image, env)`, on this machine's
interpreter or in the image, which returns the finished process (its status and output).

What no stand-in reproduces is listed in docs/DEPLOYMENT.md ("What a test reproduces").
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import posixpath
import subprocess
import uuid
from typing import Callable, Optional

import yaml
from google.protobuf import json_format, struct_pb2
from kfp.client import client as kfp_client
from kfp.local import graph_utils, placeholder_utils
from kfp.pipeline_spec import pipeline_spec_pb2

from tfrecord_shards import fileio

EXECUTOR_OUTPUT_FILE = "executor_output.json"
VERTEX, KFP_OSS = "vertex", "kfp-oss"
MODES = (VERTEX, KFP_OSS)
# The launcher's local path of an artifact URI (component/launcher_v2.go, LocalPathForURI):
# the schemes an open-source root may have. Vertex takes gs:// alone.
LOCAL_MOUNTS = {"gs://": "gcs", "s3://": "s3", "minio://": "minio", "oci://": "oci"}
ROOT_SCHEMES = {KFP_OSS: tuple(LOCAL_MOUNTS), VERTEX: ("gs://",)}
# driver.go, provisionOutputs: `if publishOutput == "true"` adds this output, of
# `SchemaTitle: "system.Artifact"`, to every task; the API server's manifest sets
# PUBLISH_LOGS "true" (manifests/kustomize/base/pipeline/ml-pipeline-apiserver-deployment.yaml).
LOGS_OUTPUT = "executor-logs"


class TaskFailed(RuntimeError):
    pass


class RunRefused(ValueError):
    """What the API server answers a run it will not start."""


@dataclasses.dataclass
class Run:
    """One run of a spec: its id, each task's folder (a cached task's is the folder of the
    run that produced its outputs), the tasks that came from the cache, the attempts each
    task took, and where each task's executor output is."""

    name: str
    run_id: str
    folders: dict[str, str]
    cached: set[str]
    attempts: dict[str, int] = dataclasses.field(default_factory=dict)
    executor_outputs: dict[str, str] = dataclasses.field(default_factory=dict)
    logs: dict[str, str] = dataclasses.field(default_factory=dict)

    def __getitem__(self, task: str) -> str:
        return self.folders[task]

    def __iter__(self):
        return iter(self.folders)

    def __len__(self) -> int:
        return len(self.folders)

    def values(self):
        return self.folders.values()


def load_package(spec_file: str) -> tuple[pipeline_spec_pb2.PipelineSpec, dict]:
    """The PipelineSpec of a compiled file and its Kubernetes platform spec's executors ({}
    without one): JSON, or the YAML package kfp's client takes (the spec, then any platform
    spec, as documents of one stream)."""
    with open(spec_file, encoding="utf-8") as f:
        text = f.read()
    if spec_file.endswith((".yaml", ".yml")):
        document, *platforms = list(yaml.safe_load_all(text))
    else:
        document, platforms = json.loads(text), []
    kubernetes = {}
    for platform in platforms:
        kubernetes.update(platform.get("platforms", {}).get("kubernetes", {})
                          .get("deploymentSpec", {}).get("executors", {}))
    return json_format.ParseDict(document, pipeline_spec_pb2.PipelineSpec()), kubernetes


def task_environment(container: dict, kubernetes: dict, secrets: dict[str, dict[str, str]]
                     ) -> dict[str, str]:
    """The environment a task's pod gets from the spec: the container's `env`, then each
    `secretAsEnv` of its executor's Kubernetes config, read from `secrets` (the cluster's, by
    name: {secret: {key: value}}), as the kubelet fills them in. A secret or key the
    cluster lacks stops the pod (CreateContainerConfigError)."""
    env = {variable["name"]: variable.get("value", "") for variable in container.get("env", [])}
    for secret in kubernetes.get("secretAsEnv", []):
        for mapping in secret.get("keyToEnv", []):
            try:
                env[mapping["envVar"]] = secrets[secret["secretName"]][mapping["secretKey"]]
            except KeyError:
                raise TaskFailed(f"CreateContainerConfigError: secret {secret['secretName']!r} "
                                 f"has no key {mapping['secretKey']!r} here") from None
    return env


def run_spec(spec_file: str, pipeline_root: str,
             execute: Callable[[list[str], str, dict[str, str]], subprocess.CompletedProcess],
             outputs_dir: str, mode: str = KFP_OSS,
             parameters: Optional[dict] = None, cache_dir: Optional[str] = None,
             enable_caching: Optional[bool] = None, publish_logs: bool = True,
             copy: Optional[Callable[[str, str], None]] = None,
             through: Optional[set[str]] = None,
             secrets: Optional[dict[str, dict[str, str]]] = None) -> Run:
    """Runs every task of the spec in `spec_file` in dependency order under `pipeline_root`
    (a bucket's URI: the schemes its backend takes). Each task's executor output and the
    launcher's local copies (`pod/`) are local files under `outputs_dir/<run>/<task>/`.
    `parameters` are the run's `arguments`; `cache_dir` turns KFP's cache on (kept there,
    across runs); `enable_caching` overrides every task's cache setting as kfp's Client and
    Vertex's PipelineJob do when given it at submit; `publish_logs` is the API server's
    PUBLISH_LOGS. `copy(source, destination)` makes the launcher's copies (default: our file
    layer, in this process). `through` runs only those tasks and the tasks they depend on.
    `execute(command, image, env)` runs a task's command with `env`, what its pod gets from
    the spec (`task_environment`, from the cluster's `secrets`), over its own.
    Raises RunRefused for a run the API server refuses, TaskFailed at the first task that
    fails after its retries, as KFP stops a run."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    if not pipeline_root.startswith(ROOT_SCHEMES[mode]):
        # objectstore.ParseBucketConfig takes these schemes alone; Vertex takes gs:// alone.
        raise RunRefused(f"pipeline root {pipeline_root}: {mode} takes only "
                         f"{', '.join(ROOT_SCHEMES[mode])} roots")
    copy = copy or _copy_existing
    spec, kubernetes = load_package(spec_file)
    if enable_caching is not None:
        # kfp 2.7 client.py, create_run_from_pipeline_package -> _override_caching_options;
        # aiplatform's PipelineJob(enable_caching=...) sets every task's the same way.
        kfp_client._override_caching_options(spec, enable_caching)
    executors = json_format.MessageToDict(spec.deployment_spec)["executors"]
    run_id = str(uuid.uuid4())
    pipeline_name = spec.pipeline_info.name
    run_name = f"{pipeline_name}-{datetime.datetime.now().strftime('%Y%m%d%H%M%S%f')}"
    # metadata/client.go, GetPipeline: the run's root is GenerateOutputURI(pipelineRoot,
    # [pipelineName, runID]); Vertex's is <root>/<project number>/<job name>.
    run_root = _join_uri(pipeline_root, pipeline_name, run_id) if mode == KFP_OSS \
        else _join_uri(pipeline_root, run_name)
    pipeline_parameters = runtime_parameters(spec, parameters or {}, mode)
    tasks = dict(spec.root.dag.tasks)
    produced: dict[str, dict[str, pipeline_spec_pb2.ArtifactList]] = {}
    produced_parameters: dict[str, dict[str, struct_pb2.Value]] = {}
    run = Run(run_name, run_id, {}, set())
    placeholders = {  # driver.go, resolveInputParameter's constants
        "{{$.pipeline_job_name}}": run_name, "{{$.pipeline_job_resource_name}}": run_name,
        "{{$.pipeline_job_uuid}}": run_id}
    stack = graph_utils.topological_sort_tasks(tasks)
    needed = _with_dependencies(tasks, through) if through else set(tasks)
    while stack:
        name = stack.pop()
        if name not in needed:
            continue
        task = tasks[name]
        component = spec.components[task.component_ref.name]
        container = executors[component.executor_label]["container"]
        local_root = os.path.join(outputs_dir, run_name, name)
        os.makedirs(local_root, exist_ok=True)
        task_placeholders = {**placeholders, "{{$.pipeline_task_name}}": name,
                             "{{$.pipeline_task_uuid}}": str(uuid.uuid4().int >> 80)}
        inputs = pipeline_spec_pb2.ExecutorInput.Inputs(
            parameter_values={key: _parameter(name, key, value, pipeline_parameters,
                                              produced_parameters, task_placeholders)
                              for key, value in task.inputs.parameters.items()},
            artifacts={key: _as_received(produced[value.task_output_artifact.producer_task][
                value.task_output_artifact.output_artifact_key], mode)
                for key, value in task.inputs.artifacts.items()})
        if mode == KFP_OSS:
            _check_parameter_types(name, inputs, component)
        task_root = _join_uri(run_root, name, str(uuid.uuid4())) if mode == KFP_OSS \
            else _join_uri(run_root, name)
        executor_input = pipeline_spec_pb2.ExecutorInput(
            inputs=inputs, outputs=_provision_outputs(
                component, task_root, local_root, publish_logs and mode == KFP_OSS))
        key = cache_key(executor_input, component, container) \
            if cache_dir and task.caching_options.enable_cache else None
        cached = _cached(cache_dir, key)
        if cached:
            produced[name] = {k: json_format.ParseDict(v, pipeline_spec_pb2.ArtifactList())
                              for k, v in cached["artifacts"].items()}
            produced_parameters[name] = {k: json_format.ParseDict(v, struct_pb2.Value())
                                         for k, v in cached["parameters"].items()}
            run.folders[name] = cached["folder"]
            run.executor_outputs[name] = cached["executor_output"]
            run.cached.add(name)
            continue
        command = placeholder_utils.replace_placeholders(
            full_command=[*container.get("command", []), *container.get("args", [])],
            executor_input_dict=json_format.MessageToDict(executor_input),
            pipeline_resource_name=run_name, task_resource_name=name,
            pipeline_root=pipeline_root, unique_pipeline_id=run_id)
        pod = os.path.join(local_root, "pod")
        env = task_environment(container, kubernetes.get(component.executor_label, {}),
                               secrets or {})
        _run_with_retries(run, name, task.retry_policy, command, container["image"], env,
                          executor_input, pod, execute, copy, mode)
        produced[name], produced_parameters[name] = _outputs_after(executor_input)
        run.folders[name] = task_root
        run.executor_outputs[name] = executor_input.outputs.output_file
        if key:
            _remember(cache_dir, key, task_root, executor_input.outputs.output_file,
                      produced[name], produced_parameters[name])
    return run


def _run_with_retries(run: Run, name: str,
                      policy: pipeline_spec_pb2.PipelineTaskSpec.RetryPolicy,
                      command: list[str], image: str, env: dict[str, str],
                      executor_input: pipeline_spec_pb2.ExecutorInput, pod: str,
                      execute: Callable, copy: Callable, mode: str) -> None:
    """The task's pod, and as many more as its retry policy allows while it fails: Argo
    retries the pod the driver made (compiler/argocompiler/container.go, the retryStrategy
    from `retryPolicy.maxRetryCount`), so each attempt gets the same executor input and
    output URIs. The stand-in waits no backoff."""
    attempts = 1 + max(policy.max_retry_count, 0)
    for attempt in range(1, attempts + 1):
        run.attempts[name] = attempt
        if mode == KFP_OSS:
            _download_inputs(executor_input, pod, copy)
            _prepare_output_folders(executor_input, pod)
        finished = execute(command, image, env)
        if mode == KFP_OSS:
            _write_log(executor_input, pod, finished)
        if finished.returncode == 0:
            if mode == KFP_OSS:
                _upload_outputs(executor_input, pod, copy)
            return
        if attempt == attempts:
            raise TaskFailed(f"task {name} exited with status {finished.returncode} "
                             f"(attempt {attempt} of {attempts})")


def _join_uri(base: str, *parts: str) -> str:
    # metadata/client.go, GenerateOutputURI: "%s/%s", the root's trailing slashes trimmed.
    return base.rstrip("/") + "/" + posixpath.join(*parts)


def _provision_outputs(component: pipeline_spec_pb2.ComponentSpec, task_root: str,
                       local_root: str, publish_logs: bool
                       ) -> pipeline_spec_pb2.ExecutorInput.Outputs:
    """driver.go, provisionOutputs: each declared output artifact (and, with PUBLISH_LOGS,
    `executor-logs`) at `<task root>/<name>`, named after its output key, with its declared
    type and metadata; each output parameter a file."""
    declared = dict(component.output_definitions.artifacts)
    if publish_logs:
        declared[LOGS_OUTPUT] = pipeline_spec_pb2.ComponentOutputsSpec.ArtifactSpec(
            artifact_type=pipeline_spec_pb2.ArtifactTypeSchema(schema_title="system.Artifact"))
    return pipeline_spec_pb2.ExecutorInput.Outputs(
        artifacts={key: pipeline_spec_pb2.ArtifactList(artifacts=[
            pipeline_spec_pb2.RuntimeArtifact(
                name=key, type=definition.artifact_type, uri=_join_uri(task_root, key),
                metadata=definition.metadata)])
            for key, definition in declared.items()},
        parameters={key: pipeline_spec_pb2.ExecutorInput.OutputParameter(
            output_file=os.path.join(local_root, "parameters", key))
            for key in component.output_definitions.parameters},
        output_file=os.path.join(local_root, EXECUTOR_OUTPUT_FILE))


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


_NUMBERS = (pipeline_spec_pb2.ParameterType.NUMBER_DOUBLE,
            pipeline_spec_pb2.ParameterType.NUMBER_INTEGER)


def runtime_parameters(spec: pipeline_spec_pb2.PipelineSpec, given: dict, mode: str
                       ) -> dict[str, struct_pb2.Value]:
    """The run's root parameters. Open-source KFP's API server refuses a value of the wrong
    type and a missing required one (apiserver/template/v2_template.go, "requires type
    double or integer, but the parameter value is not of number value type"), ignores a name
    the root does not declare, and fills each default (compiler/argocompiler/argo.go, "fill
    root component default parameters"). Vertex refuses an unknown name too."""
    declared = spec.root.input_definitions.parameters
    unknown = sorted(set(given) - set(declared))
    if unknown and mode == VERTEX:
        raise RunRefused(f"no runtime parameter {unknown} in the spec (it has "
                         f"{sorted(declared)})")
    values = {}
    for name, definition in declared.items():
        if name in given:
            value = json_format.ParseDict(given[name], struct_pb2.Value())
            if definition.parameter_type in _NUMBERS and \
                    value.WhichOneof("kind") != "number_value":
                raise RunRefused(f"input parameter {name} requires type double or integer, "
                                 "but the parameter value is not of number value type")
            values[name] = value
        elif definition.HasField("default_value"):
            values[name] = definition.default_value
        elif not definition.is_optional:
            raise RunRefused(f"parameter {name} is not optional, yet has neither default "
                             "value nor user provided value")
    return values


def _check_parameter_types(task: str, inputs: pipeline_spec_pb2.ExecutorInput.Inputs,
                           component: pipeline_spec_pb2.ComponentSpec) -> None:
    """driver.go, resolveInputs' handleParamTypeValidationAndConversion: a STRING parameter
    given another kind becomes its text (metadata/converter.go, PbValueToText); any other
    type must be given its own kind."""
    kinds = {"string_value": pipeline_spec_pb2.ParameterType.STRING,
             "bool_value": pipeline_spec_pb2.ParameterType.BOOLEAN,
             "list_value": pipeline_spec_pb2.ParameterType.LIST,
             "struct_value": pipeline_spec_pb2.ParameterType.STRUCT}
    for name, definition in component.input_definitions.parameters.items():
        if name not in inputs.parameter_values:
            if not definition.is_optional and not definition.HasField("default_value"):
                raise TaskFailed(f"task {task}: neither value nor default value provided for "
                                 f"non-optional parameter {name!r}")
            continue
        value = inputs.parameter_values[name]
        kind = value.WhichOneof("kind")
        expected = definition.parameter_type
        if expected == pipeline_spec_pb2.ParameterType.STRING:
            if kind != "string_value":
                inputs.parameter_values[name].CopyFrom(
                    struct_pb2.Value(string_value=_as_text(value)))
            continue
        if kind == "null_value":
            raise TaskFailed(f"task {task}: got null for input parameter {name!r}")
        if (kind == "number_value" and expected not in _NUMBERS) or \
                (kind != "number_value" and kinds.get(kind) != expected):
            raise TaskFailed(
                f"task {task}: input parameter {name!r} type mismatch: expect "
                f"{pipeline_spec_pb2.ParameterType.ParameterTypeEnum.Name(expected)}, got "
                f"{kind.replace('_value', '').replace('number', 'number')}")


def _as_text(value: struct_pb2.Value) -> str:
    kind = value.WhichOneof("kind")
    if kind == "number_value":  # strconv.FormatFloat(v, 'f', -1, 64)
        number = value.number_value
        return str(int(number)) if number.is_integer() else repr(number)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "null_value":
        return ""
    return json.dumps(json_format.MessageToDict(value), separators=(",", ":"))


def cache_key(executor_input: pipeline_spec_pb2.ExecutorInput,
              component: pipeline_spec_pb2.ComponentSpec, container: dict) -> str:
    """The fingerprint KFP's driver gives a task (cacheutils/cache.go, GenerateCacheKey, then
    GenerateFingerPrint): what it reads (input artifacts by name, input parameters by
    value, placeholders resolved), what it writes (outputs' names and types, URIs wiped) and
    its container (image, command and args as the spec holds them, unresolved)."""
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


def _remember(cache_dir: str, key: str, folder: str, executor_output: str,
              artifacts: dict[str, pipeline_spec_pb2.ArtifactList],
              parameters: dict[str, struct_pb2.Value]) -> None:
    os.makedirs(cache_dir, exist_ok=True)
    with open(os.path.join(cache_dir, f"{key}.json"), "w", encoding="utf-8") as f:
        json.dump({"folder": folder, "executor_output": executor_output,
                   "artifacts": {k: json_format.MessageToDict(v) for k, v in artifacts.items()},
                   "parameters": {k: json_format.MessageToDict(v)
                                  for k, v in parameters.items()}}, f)


def _parameter(task: str, key: str, value: pipeline_spec_pb2.TaskInputsSpec.InputParameterSpec,
               pipeline_parameters: dict[str, struct_pb2.Value],
               produced: dict[str, dict[str, struct_pb2.Value]],
               placeholders: dict[str, str]) -> struct_pb2.Value:
    kind = value.WhichOneof("kind")
    if kind == "runtime_value" and value.runtime_value.HasField("constant"):
        constant = value.runtime_value.constant
        if constant.WhichOneof("kind") == "string_value" and \
                constant.string_value in placeholders:
            return struct_pb2.Value(string_value=placeholders[constant.string_value])
        return constant
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
    open-source KFP rebuilt from ML Metadata (driver.go, resolveInputs: `toRuntimeArtifact`
    of the stored artifact; metadata/client.go's `Schema: ""`): named by the artifact's id,
    no type, and metadata that went through ML Metadata's values (`_through_mlmd`)."""
    received = pipeline_spec_pb2.ArtifactList.FromString(artifacts.SerializeToString())
    if mode == KFP_OSS:
        for artifact in received.artifacts:
            artifact.type.Clear()
            stored = {name: _through_mlmd(value)
                      for name, value in json_format.MessageToDict(artifact.metadata).items()}
            artifact.metadata.Clear()
            artifact.metadata.update(stored)
    return received


def _through_mlmd(value):
    """A metadata value stored as an ML Metadata custom property and read back
    (metadata/converter.go, StructValueToMLMDValue then toRuntimeArtifact): numbers stay
    numbers (doubles), a bool becomes the number 0 or 1, a list becomes {"list": [...]} and a
    struct {"struct": {...}}."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, list):
        return {"list": value}
    if isinstance(value, dict):
        return {"struct": value}
    return value


def local_path(uri: str, pod_root: str) -> Optional[str]:
    """Where the open-source launcher keeps an artifact's local copy (launcher_v2.go,
    LocalPathForURI), below `pod_root`."""
    for prefix, mount in LOCAL_MOUNTS.items():
        if uri.startswith(prefix):
            rest = uri[len(prefix):]
            if prefix == "oci://":
                return os.path.join(pod_root, mount, rest.replace("/", "_"), "models")
            return os.path.join(pod_root, mount, rest)
    return None


def _copy_existing(source: str, destination: str) -> None:
    """The launcher's copy of a file or a folder (`executor-logs` is a file)."""
    if not fileio.exists(source):  # an artifact may hold nothing (no production model yet)
        return
    if fileio.isdir(source):
        fileio.copy_tree(source, destination)
    else:
        fileio.copy_file(source, destination)


def _download_inputs(executor_input: pipeline_spec_pb2.ExecutorInput, pod_root: str,
                     copy: Callable[[str, str], None]) -> None:
    for artifacts in executor_input.inputs.artifacts.values():
        for artifact in artifacts.artifacts[:1]:  # launcher_v2.go copies the first
            path = local_path(artifact.uri, pod_root)
            if path and not os.path.exists(path):
                copy(artifact.uri, path)


def _prepare_output_folders(executor_input: pipeline_spec_pb2.ExecutorInput,
                            pod_root: str) -> None:
    """launcher_v2.go, prepareOutputFolders: the parent folder of each output's local path."""
    for artifacts in executor_input.outputs.artifacts.values():
        for artifact in artifacts.artifacts:
            os.makedirs(os.path.dirname(local_path(artifact.uri, pod_root)), exist_ok=True)


def _write_log(executor_input: pipeline_spec_pb2.ExecutorInput, pod_root: str,
               finished: subprocess.CompletedProcess) -> None:
    """launcher_v2.go, getLogWriter: the command's output also goes to the local path of the
    `executor-logs` output, which is uploaded with the other outputs."""
    logs = executor_input.outputs.artifacts.get(LOGS_OUTPUT)
    if logs is None:
        return
    with open(local_path(logs.artifacts[0].uri, pod_root), "w", encoding="utf-8") as f:
        f.write((finished.stdout or "") + (finished.stderr or ""))


def _upload_outputs(executor_input: pipeline_spec_pb2.ExecutorInput, pod_root: str,
                    copy: Callable[[str, str], None]) -> None:
    """Output artifacts the task wrote to their local path, copied to their URIs; a task
    that wrote to the URI itself (as TFX's executors do) leaves an empty folder there."""
    for artifacts in executor_input.outputs.artifacts.values():
        for artifact in artifacts.artifacts:
            path = local_path(artifact.uri, pod_root)
            if os.path.isfile(path) or (os.path.isdir(path) and os.listdir(path)):
                copy(path, artifact.uri)


def executor_output(run: Run, task: str) -> dict:
    """The executor output a task of `run_spec` wrote (as JSON)."""
    with open(run.executor_outputs[task], encoding="utf-8") as f:
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
