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
    # Where the work runs: "beam" (the pipeline's Beam args) or "spark" (a Spark cluster, or
    # local[*] without a master). spark_conf: Spark settings, such as spark.executor.memory.
    engine: str = "beam"
    spark_master: Optional[str] = None
    spark_conf: Optional[dict] = None
    # Sizes and modification times of local source files, taken when the pipeline is built:
    # an edited source changes the component's parameters, so a cached run re-reads it.
    source_fingerprint: Optional[str] = None

    def __post_init__(self):
        if self.on_bad_record not in ("fail", "quarantine"):
            raise ValueError("--on-bad-record must be fail or quarantine")
        if self.engine not in ("beam", "spark"):
            raise ValueError(f"--engine must be beam or spark, not {self.engine!r}")
        parse_splits(self.splits)
