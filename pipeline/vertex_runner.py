"""Submits a compiled pipeline to Vertex AI Pipelines as an `aiplatform.PipelineJob`."""
from __future__ import annotations

import json
from typing import Any, Optional


def build_job(template_path: str, project: str, region: str, pipeline_root: str,
              credentials: Any = None, enable_caching: Optional[bool] = None):
    """The PipelineJob for the compiled JSON at `template_path`. Building it reads only the
    file: with explicit `credentials` nothing touches the network until `.submit()`."""
    from google.cloud import aiplatform

    with open(template_path, encoding="utf-8") as f:
        display_name = json.load(f)["pipelineInfo"]["name"]
    return aiplatform.PipelineJob(
        display_name=display_name, template_path=template_path,
        pipeline_root=pipeline_root, project=project, location=region,
        credentials=credentials, enable_caching=enable_caching)


def dry_run_job(template_path: str, project: str, region: str, pipeline_root: str):
    """The job as it would be submitted, built with anonymous credentials."""
    from google.auth.credentials import AnonymousCredentials

    return build_job(template_path, project, region, pipeline_root,
                     credentials=AnonymousCredentials())


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
