"""ExampleGen's options: one frozen dataclass shared by the component, the Beam job and the CLI."""
from __future__ import annotations

import dataclasses
from typing import Optional

from components.example_gen.splits import DEFAULT_SPLITS, parse_splits
from components.options import JsonOptions
from components.shards import ShardingOptions


@dataclasses.dataclass(frozen=True)
class ExampleGenOptions(JsonOptions):
    source: str
    format: str = "auto"
    splits: str = DEFAULT_SPLITS
    split_key: Optional[str] = None
    partition_by: Optional[str] = None
    on_bad_record: str = "fail"  # "fail" | "quarantine"
    sharding: ShardingOptions = ShardingOptions()
    # Sizes and modification times of local source files, taken when the pipeline is built:
    # an edited source changes the component's parameters, so a cached run re-reads it.
    source_fingerprint: Optional[str] = None

    def __post_init__(self):
        if self.on_bad_record not in ("fail", "quarantine"):
            raise ValueError("--on-bad-record must be fail or quarantine")
        parse_splits(self.splits)
