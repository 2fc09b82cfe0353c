"""ExampleGen's options: one frozen dataclass shared by the component, the Beam job and the CLI."""
from __future__ import annotations

import dataclasses
from typing import Optional

from components.example_gen.splits import DEFAULT_SPLITS, parse_splits
from components.example_gen.sources.registry import FORMATS
from components.options import JsonOptions, setting
from components.shards import ShardingOptions


@dataclasses.dataclass(frozen=True)
class ExampleGenOptions(JsonOptions):
    source: str = setting(flag=False)
    format: str = setting("auto", "The source's format; auto: from the file extensions.",
                          choices=("auto", *FORMATS))
    splits: str = setting(DEFAULT_SPLITS, "Deterministic hash split, name:weight pairs.")
    split_key: Optional[str] = setting(None, "Hash this column instead of the whole row.")
    partition_by: Optional[str] = setting(None, "Write COL=<value>/Split-... folders.")
    on_bad_record: str = setting("fail", "fail names the file and row; quarantine sets bad "
                                 "rows aside with counts.", choices=("fail", "quarantine"))
    # A training label: a row whose value in this column is null has nothing to learn from
    # or be scored on, so it is left out and counted (`rows_unlabelled` in the manifest).
    label_key: Optional[str] = setting(
        None, "Leave out rows whose value in this column is null, counted as unlabelled.")
    sharding: ShardingOptions = dataclasses.field(default_factory=ShardingOptions)
    # Where the work runs: "beam" (the pipeline's Beam args) or "spark" (a Spark cluster, or
    # local[*] without a master).
    engine: str = setting("beam", "Where the work runs.", choices=("beam", "spark"))
    spark_master: Optional[str] = setting(
        None, "With engine spark: local[N], spark://host:7077, yarn (unset: local[*]).")
    spark_conf: Optional[dict] = setting(
        None, "With engine spark: a Spark setting, such as spark.executor.memory=4g.",
        metavar="KEY=VALUE")
    # Sizes and modification times of local source files, taken when the pipeline is built:
    # an edited source changes the component's parameters, so a cached run re-reads it.
    source_fingerprint: Optional[str] = None
    # The span and version a `{SPAN}`/`{YYYY}{MM}{DD}`/`{VERSION}` source resolved to when the
    # pipeline was built (the component resolves it, as stock ExampleGen's driver does); set
    # on the Examples artifact. Span 0 and no version for a source without them.
    span: int = 0
    version: Optional[int] = None

    def __post_init__(self):
        super().__post_init__()
        parse_splits(self.splits)
