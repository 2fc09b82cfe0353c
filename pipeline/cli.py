"""`tfrp`: a thin command line over the runners and components."""
from __future__ import annotations

import logging
import os
import warnings

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import click  # noqa: E402

# google-api-core warns once per imported client module about Python 3.11's end of life.
warnings.filterwarnings("ignore", category=FutureWarning, module="google")


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
def main(verbose: bool) -> None:
    """tfrecord-pipeline: sharded TFRecords, fast input, TFX pipelines."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--data-root", default=None,
              help="Folder of CSV files. Default: the taxi sample shipped in the tfx wheel.")
@click.option("--output-root", default="tfrp_runs", show_default=True,
              help="Every output of the run goes below this folder.")
@click.option("--pipeline-name", default="tfrp-taxi", show_default=True)
@click.option("--train-steps", default=1000, show_default=True, type=int)
@click.option("--eval-steps", default=100, show_default=True, type=int)
def run(data_root, output_root, pipeline_name, train_steps, eval_steps) -> None:
    """Run the pipeline locally (LocalDagRunner, SQLite metadata)."""
    from pipeline.configs import PipelineConfig
    from pipeline import local_runner

    config = PipelineConfig(pipeline_name=pipeline_name, data_root=data_root,
                            output_root=output_root, train_steps=train_steps,
                            eval_steps=eval_steps)
    click.echo(local_runner.run(config).format())


if __name__ == "__main__":
    main()
