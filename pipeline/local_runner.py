"""Runs the pipeline with TFX's LocalDagRunner and SQLite metadata, then summarises the run."""
from __future__ import annotations

import sys
from typing import Callable, Optional

from tfx.orchestration import metadata
from tfx.orchestration.local.local_dag_runner import LocalDagRunner

from components import fileio, tf_filesystems
from pipeline import progress, run_summary
from pipeline.configs import PipelineConfig
from pipeline.pipeline import create_pipeline


def local_config(config: PipelineConfig) -> PipelineConfig:
    """The config with every local folder absolute (TFX records artifact URIs as given) and
    every URI (gs://, s3://) as it is. ML Metadata's SQLite file is always local."""
    metadata_path = config.resolved_metadata_path
    if fileio.is_remote(metadata_path):
        raise ValueError(f"metadata_path {metadata_path}: ML Metadata's SQLite file must be "
                         "on a local disk; the pipeline root and serving folder may be URIs")
    return config.replace(
        pipeline_root=fileio.absolute(config.resolved_pipeline_root),
        serving_dir=fileio.absolute(config.resolved_serving_dir),
        metadata_path=fileio.absolute(metadata_path))


def run(config: PipelineConfig, echo: Optional[Callable[[str], None]] = None
        ) -> run_summary.RunSummary:
    """Runs the pipeline; with `echo`, each component's line is passed to it as it finishes."""
    config = local_config(config)
    fileio.makedirs(fileio.dirname(config.metadata_path))
    # The components run in this process and the stock ones open the pipeline's URIs with
    # tf.io.gfile. Beam's DirectRunner workers (direct_num_workers) inherit S3_ENDPOINT from
    # this process's environment and load tensorflow-io with tf.Transform and TFMA.
    tf_filesystems.register_for(config.pipeline_root, config.data_root, config.serving_dir)
    connection = metadata.sqlite_metadata_connection_config(config.metadata_path)
    pipeline = create_pipeline(config, connection)
    # TFX's Beam executors parse sys.argv with absl's flags, where `tfrp -v run` reads as
    # `--verbosity=run` and stops the Evaluator; the pipeline takes nothing from the command
    # line, so the executors see the program name alone.
    command_line, sys.argv = sys.argv, sys.argv[:1]
    try:
        if echo is None:
            LocalDagRunner().run(pipeline)
        else:
            with progress.RunProgress(config.metadata_path, echo):
                LocalDagRunner().run(pipeline)
    finally:
        sys.argv = command_line
    return run_summary.summarize(config.metadata_path, config.pipeline_name)
