"""Every setting of a pipeline run, in one dataclass."""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

DEFAULT_ROOT = "tfrp_runs"


@dataclasses.dataclass
class PipelineConfig:
    pipeline_name: str = "tfrp-taxi"
    # A source file or folder, or None for the taxi sample bundled in the tfx wheel.
    data_root: Optional[str] = None
    data_format: str = "auto"
    splits: str = "train:2,eval:1"
    num_shards: Optional[int] = None
    shard_size_mb: Optional[float] = None
    compression: str = "gzip"
    # Transform writes this many rows per tf.Example (0: one row per Example).
    packed_rows: int = 1024
    on_bad_record: str = "fail"
    # Everything a run writes goes below this one folder (ignored by git).
    output_root: str = DEFAULT_ROOT
    train_steps: int = 1000
    eval_steps: int = 100
    batch_size: int = 256
    # Passed to every Beam-based component; switch runner here (Dataflow, Flink, Spark).
    beam_args: list[str] = dataclasses.field(default_factory=list)
    enable_cache: bool = True

    @property
    def pipeline_root(self) -> str:
        return os.path.join(self.output_root, "pipelines", self.pipeline_name)

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.output_root, "metadata", self.pipeline_name, "metadata.db")

    @property
    def serving_dir(self) -> str:
        return os.path.join(self.output_root, "serving", self.pipeline_name)
