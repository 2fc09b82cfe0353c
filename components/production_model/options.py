"""ProductionModel's options."""
from __future__ import annotations

import dataclasses

from tfrecord_shards.options import JsonOptions


@dataclasses.dataclass(frozen=True)
class ProductionModelOptions(JsonOptions):
    # The Pusher's push destination (PipelineConfig's resolved serving_dir): the model in
    # production is its newest version folder.
    serving_dir: str
