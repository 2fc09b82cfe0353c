"""The `tfrp` group: its verbosity flag, and the pipeline settings that `run`, `report` and
`compile` take (a YAML file, `--set key=value`, a flag per declared setting). Each command
group's module adds its commands to `main`."""
from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import click  # noqa: E402

from pipeline.cli.options import given_settings, setting_options, usage_error  # noqa: E402
from pipeline.cli.output import Commands, configure_output, verbose_option  # noqa: E402


@click.group(cls=Commands)
@verbose_option
def main(verbose: bool) -> None:
    """tfrecord-pipeline: sharded TFRecords, fast input, TFX pipelines."""
    configure_output(verbose)


def config_options(command):
    """Settings of the pipeline: a YAML file, `--set key=value` for any setting, and a flag
    for each setting `PipelineConfig` declares with help (sharding's included). Later wins:
    defaults < YAML < --set < flags."""
    # pipeline.configs: 0.22 s to import; `tfrp --help` and light commands need none of it.
    from pipeline.configs import PipelineConfig

    command = setting_options(PipelineConfig)(command)
    for option in reversed([
            click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
                         help="YAML file of settings (see pipeline/configs.py)."),
            click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
                         help="Any setting, e.g. --set packed_rows=0 --set beam_runner="
                              "DataflowRunner. Repeatable.")]):
        command = option(command)
    return command


def load_config(config_file, assignments, **named):
    # pipeline.configs: 0.22 s to import; `tfrp --help` and light commands need none of it.
    from pipeline.configs import PipelineConfig, parse_assignments

    flags = given_settings(PipelineConfig, named)
    try:
        overrides = parse_assignments(list(assignments))
        overrides.update(flags)
        return PipelineConfig.create(config_file, overrides)
    except (KeyError, ValueError, TypeError) as e:
        raise usage_error(e, flags) from None
