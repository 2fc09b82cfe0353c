"""ExampleGen's one entry: `run` picks the engine (Beam or Spark); the CLI, the TFX executor
and the benchmarks all call it. It lives here, not in the package's `__init__`, so that
importing any module of the package (as the Spark job does) never imports an engine.
"""
from __future__ import annotations

from typing import Callable, Optional

from components.example_gen import inputs, spark_job
from components.example_gen.options import ExampleGenOptions
from components.example_gen.sources.base import input_error_line


class InputError(Exception):
    """A run refused because of its input or settings (a bad row, a missing file, no Java for
    Spark): the message is the one line the user sees, naming the file and row or offset."""


def run(options: ExampleGenOptions, output_dir: str, *,
        beam_pipeline_args: Optional[list[str]] = None,
        make_pipeline: Optional[Callable] = None, progress: bool = False) -> dict:
    """ExampleGen into `output_dir` on `options.engine`; returns the manifest. Beam takes
    `beam_pipeline_args` or the TFX executor's `make_pipeline`; Spark takes its master and
    settings from the options."""
    try:
        if inputs.needs_resolving(options):  # the CLI's and the bench's; TFX's are resolved
            options = inputs.resolve_inputs(options)
        if options.engine == "spark":
            return spark_job.run(options, output_dir)
        # apache_beam: 1.8 s to import; a Spark run never needs it.
        from components.example_gen import beam_job

        return beam_job.run(options, output_dir, beam_pipeline_args=beam_pipeline_args,
                            make_pipeline=make_pipeline, progress=progress)
    except Exception as error:
        line = _setup_error_line(error) or input_error_line(error)
        if line is None:
            raise
        raise InputError(line) from error


def _setup_error_line(error: Exception) -> Optional[str]:
    if type(error).__name__ == "SparkSetupError":  # no Java, or pyspark missing
        return str(error)
    return None
