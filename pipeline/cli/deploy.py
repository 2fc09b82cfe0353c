"""`tfrp compile` and `tfrp submit`: the pipeline for Kubeflow Pipelines or Vertex AI, and a
run of it on Vertex."""
from __future__ import annotations

import json

import click

from pipeline.cli.group import config_options, load_config, main
from pipeline.kubernetes_platform import DEFAULT_TARGET, TARGETS
from pipeline import vertex_runner

# Where `compile` writes and `submit` reads: a YAML package, which kfp's client and Vertex take.
COMPILED_PIPELINE = "build/pipeline.yaml"


@main.command("compile")
@config_options
@click.option("--target", type=click.Choice(list(TARGETS)), default=DEFAULT_TARGET,
              show_default=True,
              help="The backend: kfp, open-source Kubeflow Pipelines (kubeflow is the same); "
                   "vertex, Vertex AI Pipelines. Each takes its own accelerator names; kfp's "
                   "file carries the tasks' Kubernetes secrets and node selectors.")
@click.option("--output", default=COMPILED_PIPELINE, show_default=True,
              help="A .yaml (or .yml) file is the package kfp's client uploads and runs, and "
                   "Vertex takes; any other name, the spec as JSON. A path or a bucket's URI.")
def compile_command(config_file, assignments, target, output, **named) -> None:
    """Compile the pipeline for Kubeflow Pipelines v2 or Vertex AI, every component in the
    configured image (a task given an accelerator, its GPU image)."""
    config = load_config(config_file, assignments, **named)
    # kubeflow_runner: 6.4 s to import (TFX, kfp); `tfrp --help` and other commands need none.
    from pipeline import kubeflow_runner

    try:
        path = kubeflow_runner.compile_pipeline(config, output, target)
    except ValueError as e:
        raise click.ClickException(str(e))
    click.echo(f"Compiled {config.pipeline_name} ({target}, image {config.image_uri}) to {path}")


@main.command()
@click.option("--template", default=COMPILED_PIPELINE, show_default=True,
              help="The output of `tfrp compile --target vertex` (YAML or JSON; a path, or "
                   "gs://...).")
@click.option("--project", required=True, help="Google Cloud project.")
@click.option("--region", required=True, help="Vertex AI region, e.g. us-central1.")
@click.option("--pipeline-root", required=True,
              help="gs:// folder for this run's artifacts.")
@click.option("--service-account", default=None, help="Run the pipeline as this account.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A runtime parameter of this run (data_root, train_steps, eval_steps, "
                   "serving_dir, the blessing thresholds); repeat for several.")
@click.option("--dry-run", is_flag=True,
              help="Print the job instead: no credentials, no network.")
def submit(template, project, region, pipeline_root, service_account, params,
           dry_run) -> None:
    """Submit the compiled pipeline to Vertex AI Pipelines."""
    given = {}
    for param in params:
        key, found, value = param.partition("=")
        if not found or not key:
            raise click.ClickException(f"--param {param}: give KEY=VALUE")
        given[key] = value
    try:
        parameters = vertex_runner.parameter_values(template, given)
    except (vertex_runner.ParameterError, vertex_runner.TemplateError,
            FileNotFoundError) as error:
        raise click.ClickException(str(error))
    if dry_run:
        job = vertex_runner.dry_run_job(template, project, region, pipeline_root, parameters)
        click.echo(json.dumps(vertex_runner.describe(job, service_account), indent=2,
                              sort_keys=True))
        return
    job = vertex_runner.build_job(template, project, region, pipeline_root,
                                  parameters=parameters)
    click.echo(f"Submitted {vertex_runner.submit(job, service_account)}")
