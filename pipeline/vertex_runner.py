"""Submits a compiled pipeline to Vertex AI Pipelines as an `aiplatform.PipelineJob`, its
runtime parameters set (`pipeline/run_settings.py` lists them; the spec's root declares them
with their compiled defaults)."""
from __future__ import annotations

import json
import tempfile
from typing import Any, Mapping, Optional

import yaml

from tfrecord_shards import fileio


_KIND_NAMES = {"NUMBER_INTEGER": "an integer", "NUMBER_DOUBLE": "a number",
               "BOOLEAN": "true or false", "STRING": "a string"}


class ParameterError(ValueError):
    """A --param the compiled pipeline does not take, or a value of the wrong type."""


class TemplateError(ValueError):
    """A compiled pipeline Vertex cannot run: one compiled for open-source Kubeflow."""


def runtime_parameters(template_path: str) -> dict[str, dict]:
    """{name: its definition (parameterType, defaultValue)} of the spec's runtime
    parameters."""
    spec = _spec(template_path)
    return dict(spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {}))


def parameter_values(template_path: str, given: Mapping[str, str]) -> dict[str, Any]:
    """`KEY=VALUE` strings typed as the spec declares each parameter (an integer, a number,
    a string); an unknown name or a value of the wrong type is a ParameterError naming it."""
    declared = runtime_parameters(template_path)
    values = {}
    for name, text in given.items():
        if name not in declared:
            raise ParameterError(f"{template_path} takes no runtime parameter {name!r}; it "
                                 f"takes {', '.join(sorted(declared)) or 'none'}")
        kind = declared[name].get("parameterType", "STRING")
        try:
            values[name] = {"NUMBER_INTEGER": int, "NUMBER_DOUBLE": float,
                            "BOOLEAN": _boolean}.get(kind, str)(text)
        except ValueError:
            raise ParameterError(f"--param {name}={text}: {name} is "
                                 f"{_KIND_NAMES.get(kind, kind.lower())}") from None
    return values


def _boolean(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower() == "true"


def _spec(template_path: str) -> dict:
    """The PipelineSpec of a compiled file, JSON or YAML. A YAML package whose spec is
    followed by a Kubernetes platform spec (secrets, node selectors) was compiled for
    open-source Kubeflow Pipelines, as was one naming a Kubernetes accelerator
    (nvidia.com/gpu): Vertex runs neither, so it is refused in one line."""
    if not fileio.exists(template_path):
        raise FileNotFoundError(f"no compiled pipeline at {template_path}; run `tfrp "
                                f"compile` first")
    text = fileio.read_text(template_path)
    if text.lstrip().startswith("{"):
        documents = [json.loads(text)]
    else:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        documents = [doc for doc in yaml.load_all(text, Loader=loader) if doc is not None]
    spec = documents[0]
    accelerators = sorted({
        executor.get("container", {}).get("resources", {}).get("accelerator", {}).get("type")
        for executor in spec.get("deploymentSpec", {}).get("executors", {}).values()} - {None})
    kubernetes = [name for name in accelerators if "/" in name]
    if len(documents) > 1 or kubernetes:
        what = f"accelerator {kubernetes[0]}" if kubernetes else "Kubernetes platform spec"
        raise TemplateError(f"{template_path} was compiled for open-source Kubeflow "
                             f"Pipelines (its {what}); compile it with --target vertex")
    return spec


def build_job(template_path: str, project: str, region: str, pipeline_root: str,
              credentials: Any = None, enable_caching: Optional[bool] = None,
              parameters: Optional[Mapping[str, Any]] = None):
    """The PipelineJob for the compiled file at `template_path` (a path or a bucket's URI),
    with `parameters` set. Building it reads only the file: with explicit `credentials`
    nothing else touches the network until `.submit()`."""
    # aiplatform: 5.6 s to import; only a submitted job needs it, not `tfrp compile`.
    from google.cloud import aiplatform

    spec = _spec(template_path)
    # aiplatform reads a local file or gs:// with its own client; ours reads any store. It
    # reads the file when the job is made, so the copy goes with its folder after that.
    with tempfile.TemporaryDirectory(prefix="tfrp-submit-") as folder:
        local = fileio.join(folder, "pipeline.json")
        fileio.write_text(local, json.dumps(spec))
        return aiplatform.PipelineJob(
            display_name=spec["pipelineInfo"]["name"], template_path=local,
            pipeline_root=pipeline_root, project=project, location=region,
            credentials=credentials, enable_caching=enable_caching,
            parameter_values=dict(parameters or {}))


def dry_run_job(template_path: str, project: str, region: str, pipeline_root: str,
                parameters: Optional[Mapping[str, Any]] = None):
    """The job as it would be submitted, built with anonymous credentials."""
    # google.auth: 0.1 s to import; only a dry run needs it.
    from google.auth.credentials import AnonymousCredentials

    return build_job(template_path, project, region, pipeline_root,
                     credentials=AnonymousCredentials(), parameters=parameters)


def describe(job, service_account: Optional[str] = None) -> dict:
    """What `submit` would send: the job resource as JSON-ready data, with the service account
    that submit sets on it."""
    resource = job.to_dict()
    if service_account:
        resource["serviceAccount"] = service_account
    return resource


def submit(job, service_account: Optional[str] = None) -> str:
    """Submits `job` with the caller's Google credentials; returns the job's resource name."""
    job.submit(service_account=service_account)
    return job.resource_name
