"""`tfrp run` and `tfrp report`: a local run of the pipeline, and a run's page."""
from __future__ import annotations

import logging

import click

from tfrecord_shards import fileio
from pipeline.cli.group import config_options, load_config, main
from pipeline.cli.output import one_line


@main.command()
@config_options
def run(config_file, assignments, **named) -> None:
    """Run the pipeline locally (LocalDagRunner, SQLite metadata). Unchanged components are
    reused from the cache of earlier runs."""
    config = load_config(config_file, assignments, **named)
    # local_runner: 5.9 s to import (TFX); `tfrp --help` and light commands need none.
    from pipeline import local_runner

    click.echo(f"Running {config.pipeline_name} (LocalDagRunner):")
    try:
        summary = local_runner.run(config, echo=click.echo)
    except Exception as e:
        # A component's error (bad data, anomalies, a bad setting) is the message; with -v
        # the traceback shows where it came from.
        if logging.getLogger().isEnabledFor(logging.INFO):
            raise
        raise click.ClickException(f"the run failed: {one_line(e)}") from e
    click.echo(summary.format(components=False))  # the progress printed each one
    # report: 8 s to import (TFX, TFMA); only a run asked for one needs it.
    from pipeline import report

    config = local_runner.local_config(config)
    # This run's page, not the latest run's: another may have started since this one ended.
    path = report.write_report(config.metadata_path, config.pipeline_name,
                               report.default_path(config.output_root, config.pipeline_name),
                               summary.run_id)
    click.echo(f"Report: {fileio.absolute(path)}")


@main.command("report")
@config_options
@click.argument("run_id", required=False)
@click.option("--output", default=None,
              help="Where to write the page (default <output_root>/reports/<pipeline>/"
                   "report.html).")
def report_command(config_file, assignments, run_id, output, **named) -> None:
    """Write one self-contained HTML page for a run (default: the latest) of the pipeline the
    settings name: statistics, schema, anomalies, metrics and the input-wait chart."""
    config = load_config(config_file, assignments, **named)
    # local_runner, report: 8 s to import (TFX, TFMA); `tfrp --help` needs neither.
    from pipeline import local_runner, report

    config = local_runner.local_config(config)
    try:
        path = report.write_report(
            config.metadata_path, config.pipeline_name,
            output or report.default_path(config.output_root, config.pipeline_name), run_id)
    except LookupError as e:
        raise click.ClickException(str(e))
    click.echo(fileio.absolute(path))
