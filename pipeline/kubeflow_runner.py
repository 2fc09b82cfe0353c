"""Compiles the pipeline to a Kubeflow Pipelines v2 / Vertex AI Pipelines JSON file."""
from __future__ import annotations

import json
import logging
import os
import posixpath
import tempfile
from typing import Any

import yaml
from tfx.orchestration.kubeflow.v2.kubeflow_v2_dag_runner import (
    KubeflowV2DagRunner, KubeflowV2DagRunnerConfig)

from tfrecord_shards import fileio
from tfrecord_shards.options import OPTIONS_KEY
from components.production_model.component import SERVING_STATE
from pipeline import datasets, kubernetes_platform, resources, run_settings, task_entrypoint
from pipeline.configs import PipelineConfig
from pipeline.kubernetes_platform import DEFAULT_TARGET, KFP, TARGETS, VERTEX
from pipeline.pipeline import PRODUCTION_MODEL, create_pipeline

JOB_FILE = "pipeline_job.json"
# Output names written as YAML: the PipelineSpec, then the platform spec's document if any,
# the package kfp's client takes (.yaml, .yml, .zip or .tar.gz). Any other name: JSON.
YAML_SUFFIXES = (".yaml", ".yml")
# The run's id, which both backends' drivers put in place of this constant input parameter
# before they compute the task's cache key (kubeflow/pipelines backend/src/v2/driver/
# driver.go, resolveInputParameter: `case "{{$.pipeline_job_uuid}}"`; kfp's
# dsl.PIPELINE_JOB_ID_PLACEHOLDER on Vertex).
RUN_ID_PLACEHOLDER = "{{$.pipeline_job_uuid}}"


def container_config(config: PipelineConfig) -> PipelineConfig:
    """The config as the containers see it: schemas from the image's copy of the project, and
    a serving folder beside the pipeline root unless one is set."""
    pipeline_root = config.resolved_pipeline_root
    if "://" not in pipeline_root:
        logging.warning("pipeline_root %s is not on shared storage; set it (gs://...) in the "
                        "config, or pass --pipeline-root to submit", pipeline_root)
    return config.replace(
        schemas_dir=posixpath.join(config.image_workdir, "schemas"),
        pipeline_root=pipeline_root,
        serving_dir=config.serving_dir or posixpath.join(pipeline_root, "serving"))


def compile_pipeline(config: PipelineConfig, output_path: str,
                     target: str = DEFAULT_TARGET) -> str:
    """Writes the pipeline for `config` to `output_path` as a KFP v2 PipelineSpec (schema 2.1:
    parameters are plain constants) for `target`, open-source Kubeflow Pipelines (kfp) or
    Vertex AI (vertex); every component runs config.image_uri, and a task given an
    accelerator config.gpu_image_uri. It has no `resolver` task (the production model is a
    step of ours), so open-source Kubeflow Pipelines runs it as well as Vertex.

    TFX's runner writes a Vertex PipelineJob (the spec wrapped with a runtime config). We keep
    the spec itself, with the pipeline root as its default: that is the file Kubeflow
    Pipelines uploads and kfp's loader reads, and Vertex's PipelineJob takes it as well. A
    `.yaml` output is kfp's package, the spec and then, for kfp, the Kubernetes platform spec
    (secrets as environment variables, node selectors), which a JSON file cannot hold.
    """
    if target not in TARGETS:
        raise ValueError(f"target {target!r}: compile for {' or '.join(sorted(TARGETS))}")
    target = TARGETS[target]
    if config.spans > 1:
        # TFX 1.16's KFP v2 compiler knows only the latest-artifact and latest-blessed-model
        # resolvers (kubeflow/v2/step_builder.py); stock's span window cannot be compiled.
        raise ValueError(f"spans={config.spans}: a window of spans needs stock's "
                         "SpanRangeStrategy resolver, which TFX's Kubeflow v2 / Vertex "
                         "compiler cannot compile; run it on LocalDagRunner, or set spans=1 "
                         "(the latest span) for Kubeflow and Vertex")
    check_target(config, target, output_path)
    config = container_config(config)
    warn_without_registry(config.image_uri)
    output_path = fileio.absolute(output_path)
    # TFX's runner writes its job file on this machine; the spec goes to output_path, which
    # may be a bucket's URI.
    with tempfile.TemporaryDirectory() as workdir:
        runner = KubeflowV2DagRunner(
            config=KubeflowV2DagRunnerConfig(
                default_image=config.image_uri, use_pipeline_spec_2_1=True),
            output_dir=workdir, output_filename=JOB_FILE)
        runner.run(create_pipeline(config, source=datasets.source_for(config, local=False),
                                   local=False))
        with open(os.path.join(workdir, JOB_FILE), encoding="utf-8") as f:
            job = json.load(f)
    spec = job["pipelineSpec"]
    spec["defaultPipelineRoot"] = job["runtimeConfig"]["gcsOutputDirectory"]
    # The model in production changes with every push, while the step's inputs do not: a
    # cached result would be the serving folder as it was at the first run. Caching switched
    # off in the spec is not enough: `enable_caching=True` at submit (kfp's Client, Vertex's
    # PipelineJob) turns every task's cache on, so the step's serving state is the run's id,
    # a key no later run repeats.
    production = spec["root"]["dag"]["tasks"].get(PRODUCTION_MODEL)
    if production:
        production["cachingOptions"] = {"enableCache": False}
        production["inputs"]["parameters"][SERVING_STATE] = {
            "runtimeValue": {"constant": RUN_ID_PLACEHOLDER}}
    add_run_settings(spec, config)
    resources.apply(spec, config.resources)
    set_gpu_images(spec, config)
    set_retry_policy(spec, config)
    platform = deploy_on(spec, config, target)
    use_task_entrypoint(spec)
    text = package_text(spec, platform, output_path)
    if fileio.is_remote(output_path):
        fileio.write_text(output_path, text)  # an object appears whole or not at all
    else:
        fileio.makedirs(fileio.dirname(output_path))
        partial = output_path + ".partial"  # a failed write never leaves a plausible file
        fileio.write_text(partial, text)
        fileio.rename(partial, output_path)
    return output_path


def use_task_entrypoint(spec: dict) -> None:
    """Every TFX task runs our task entrypoint (pipeline/task_entrypoint.py), told the output
    artifacts its component declares: a backend may hand a task more (open-source KFP's
    driver adds `executor-logs`), which TFX's entrypoint cannot load."""
    declared = {component["executorLabel"]: sorted(
        component.get("outputDefinitions", {}).get("artifacts", {}))
        for component in spec["components"].values() if "executorLabel" in component}
    for label, executor in spec["deploymentSpec"]["executors"].items():
        container = executor.get("container", {})
        if container.get("command") == ["python", "-m", task_entrypoint.TFX_ENTRYPOINT]:
            container["command"] = ["python", "-m", task_entrypoint.__name__]
            container["args"] = [*container.get("args", []), task_entrypoint.OUTPUTS_FLAG,
                                 json.dumps(declared.get(label, []))]


def _minio(config: PipelineConfig) -> bool:
    return kubernetes_platform.on_minio(config.resolved_pipeline_root, config.data_root,
                                        config.serving_dir)


def check_target(config: PipelineConfig, target: str, output_path: str) -> None:
    """What `target` cannot run, refused in one line before anything is compiled: an
    accelerator named as the other backend names it; on Vertex, which runs no Kubernetes
    objects of ours, secrets and node selectors; a Kubernetes platform spec in a JSON file."""
    resources.check_accelerators(config.resources, vertex=target == VERTEX)
    selectors = [f"{prefix}_node_selector" for prefix in resources.TASKS
                 if getattr(config.resources, f"{prefix}_node_selector", None)]
    if target == VERTEX:
        if selectors:
            raise ValueError(f"{selectors[0]}: Vertex AI picks a task's machine from its "
                             f"accelerator and takes no node selector; compile with --target "
                             f"kfp for open-source Kubeflow Pipelines")
        if config.environment.task_secret_env:
            raise ValueError("task_secret_env: Vertex AI mounts no Kubernetes secrets; its "
                             "tasks reach Google Cloud as the job's service account (tfrp "
                             "submit --service-account); compile with --target kfp for "
                             "open-source Kubeflow Pipelines")
        return
    secrets = kubernetes_platform.task_secret_env(config.environment, _minio(config))
    if (secrets or selectors) and not output_path.endswith(YAML_SUFFIXES):
        what = "secrets as environment variables" if secrets else selectors[0]
        raise ValueError(f"{output_path}: {what} go in the Kubernetes platform spec, which "
                         f"only a YAML package holds (kfp's client takes .yaml); write "
                         f"{posixpath.splitext(output_path)[0]}.yaml")


def set_gpu_images(spec: dict, config: PipelineConfig) -> None:
    """A task given an accelerator runs the GPU image (TensorFlow's CUDA build); every other
    task keeps the CPU image, which is far smaller and needs no CUDA node."""
    for executor in spec["deploymentSpec"]["executors"].values():
        container = executor["container"]
        if "accelerator" in container.get("resources", {}):
            container["image"] = config.gpu_image_uri


def set_retry_policy(spec: dict, config: PipelineConfig) -> None:
    """Every task's retryPolicy, as kfp's `set_retry(task_retries, task_retry_backoff)`
    writes it (each wait twice the last, within kfp's one-hour cap); none at 0 retries.
    Open-source KFP compiles it into Argo's retryStrategy; Vertex retries the task itself.
    A retry runs in the URIs the first attempt had: ExampleGen and Transform clear what an
    earlier attempt left there (docs/RELIABILITY.md)."""
    if not config.task_retries:
        return
    policy = {"maxRetryCount": config.task_retries,
              "backoffDuration": f"{config.task_retry_backoff}s", "backoffFactor": 2.0,
              "backoffMaxDuration": "3600s"}
    for task in spec["root"]["dag"]["tasks"].values():
        task["retryPolicy"] = dict(policy)


def deploy_on(spec: dict, config: PipelineConfig, target: str) -> dict:
    """Every task's environment in its container, and for kfp the platform spec: each
    executor's secrets as environment variables and its task's node selector. Returns the
    platform spec, {} for none."""
    minio = target == KFP and _minio(config)
    kubernetes_platform.set_env(spec, kubernetes_platform.task_env(config.environment, minio))
    if target != KFP:
        return {}
    secrets = kubernetes_platform.task_secret_env(config.environment, minio)
    configs = {}
    for task_name, task in spec["root"]["dag"]["tasks"].items():
        label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
        configs[label] = kubernetes_platform.executor_config(
            secrets, config.resources.node_selector(task_name))
    return kubernetes_platform.platform_spec(configs)


def package_text(spec: dict, platform: dict, output_path: str) -> str:
    """The file's text: for a .yaml or .yml name kfp's package, the spec and then the platform
    spec's document (when there is one); else the spec as JSON."""
    if output_path.endswith(YAML_SUFFIXES):
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        return yaml.dump_all([spec, platform] if platform else [spec], Dumper=dumper,
                             sort_keys=True)
    return json.dumps(spec, indent=2, sort_keys=True)


def warn_without_registry(image: str) -> None:
    """One line when the image names no registry host: a cluster would pull it from Docker
    Hub, where it is not."""
    first = image.split("/")[0]
    if "/" not in image or not ("." in first or ":" in first or first == "localhost"):
        logging.warning("image %s names no registry host, so a cluster would pull it from "
                        "Docker Hub; push it to your registry and compile with --set "
                        "image=REGISTRY/PROJECT/%s", image, image.split(":")[0].split("/")[-1])



def runtime_defaults(spec: dict, config: PipelineConfig) -> dict[str, Any]:
    """The runtime parameters this spec takes (`run_settings.RUNTIME_PARAMETERS` that reach a
    task of it: a threshold only where the eval config has one), each defaulting to the
    value it was compiled with."""
    tasks = spec["root"]["dag"]["tasks"]
    example_gen = tasks[run_settings.EXAMPLE_GEN]["inputs"]["parameters"][OPTIONS_KEY]
    compiled = {"data_root": json.loads(example_gen["runtimeValue"]["constant"])["source"]}
    defaults = {}
    for parameter in run_settings.RUNTIME_PARAMETERS:
        value = compiled.get(parameter.name, getattr(config, parameter.name, None))
        if value is None:
            continue
        for (task, key), apply in parameter.targets.items():
            template = tasks.get(task, {}).get("inputs", {}).get("parameters", {}).get(key)
            if template is None:
                continue
            before = json.loads(template["runtimeValue"]["constant"])
            # A parameter applies where setting it to another value changes the task's.
            if apply(json.loads(json.dumps(before)), _other(value)) != before:
                defaults[parameter.name] = value
    return defaults


def _other(value: Any) -> Any:
    return f"{value}-other" if isinstance(value, str) else value + 1


def add_run_settings(spec: dict, config: PipelineConfig) -> None:
    """Puts the `run-settings` task (`pipeline/run_settings.py`) first: it runs every time,
    never from the cache, and hands each task whose parameters a runtime parameter changes
    (and ExampleGen, its inputs settled then) the values of this run. The root declares the
    runtime parameters, with the compiled values as defaults."""
    tasks = spec["root"]["dag"]["tasks"]
    defaults = runtime_defaults(spec, config)
    kinds = {p.name: p.parameter_type for p in run_settings.RUNTIME_PARAMETERS}
    spec["root"]["inputDefinitions"] = {"parameters": {
        name: {"parameterType": kinds[name], "defaultValue": value}
        for name, value in defaults.items()}}
    targets = {(run_settings.EXAMPLE_GEN, OPTIONS_KEY)} | {
        target for p in run_settings.RUNTIME_PARAMETERS if p.name in defaults
        for target in p.targets if target[0] in tasks}
    settled = {run_settings.output_name(task, key): (task, key) for task, key in sorted(targets)}
    task_name = run_settings.TASK
    executor = f"{task_name}_executor"
    strings = {name: {"parameterType": "STRING"} for name in settled}
    spec["components"][task_name] = {
        "executorLabel": executor,
        "inputDefinitions": {"parameters": {
            run_settings.RUN_ID: {"parameterType": "STRING"},
            **{name: {"parameterType": kinds[name]} for name in defaults}, **strings}},
        "outputDefinitions": {"parameters": strings}}
    spec["deploymentSpec"]["executors"][executor] = {"container": {
        "image": config.image_uri, "command": ["python", "-m", task_entrypoint.__name__],
        "args": run_settings.ARGS}}
    # Never from the cache, even with every task's cache forced on at submit: its run-id
    # parameter makes each run's key new, so each run settles its inputs afresh.
    tasks[task_name] = {
        "cachingOptions": {"enableCache": False}, "componentRef": {"name": task_name},
        "inputs": {"parameters": {
            run_settings.RUN_ID: {"runtimeValue": {"constant": RUN_ID_PLACEHOLDER}},
            **{name: {"componentInputParameter": name} for name in defaults},
            **{name: tasks[task]["inputs"]["parameters"][key]
               for name, (task, key) in settled.items()}}},
        "taskInfo": {"name": task_name}}
    for name, (task, key) in settled.items():
        tasks[task]["inputs"]["parameters"][key] = {"taskOutputParameter": {
            "producerTask": task_name, "outputParameterKey": name}}
        tasks[task]["dependentTasks"] = sorted({*tasks[task].get("dependentTasks", []),
                                                task_name})
