"""Runs the pipeline with TFX's LocalDagRunner and SQLite metadata, then summarises the run."""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

from tfx import v1 as tfx

from pipeline.configs import PipelineConfig
from pipeline.pipeline import create_pipeline
from pipeline import run_summary


def run(config: PipelineConfig) -> run_summary.RunSummary:
    os.makedirs(os.path.dirname(config.metadata_path), exist_ok=True)
    connection = tfx.orchestration.metadata.sqlite_metadata_connection_config(
        config.metadata_path)
    tfx.orchestration.LocalDagRunner().run(create_pipeline(config, connection))
    return run_summary.summarize(config.metadata_path, config.pipeline_name)
