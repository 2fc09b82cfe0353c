"""ExampleGen's options: one frozen dataclass shared by the component, executor and CLI."""
from __future__ import annotations

import dataclasses
import json
from typing import Optional

from components.shards import ShardingOptions

DEFAULT_SPLITS = "train:2,eval:1"  # the same 2:1 hash split stock ExampleGen uses


@dataclasses.dataclass(frozen=True)
class ExampleGenOptions:
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

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ExampleGenOptions":
        data = json.loads(text)
        data["sharding"] = ShardingOptions(**data["sharding"])
        return cls(**data)


def parse_splits(text: str) -> list[tuple[str, int]]:
    """'train:8,eval:2' -> [('train', 8), ('eval', 2)], checked."""
    splits = []
    for part in text.split(","):
        name, _, buckets = part.strip().partition(":")
        if not name or not buckets.isdigit() or int(buckets) < 1:
            raise ValueError(f"--splits wants name:weight pairs like train:8,eval:2, got {text!r}")
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"split name {name!r} must be letters, digits, '-' or '_'")
        splits.append((name, int(buckets)))
    if len({n for n, _ in splits}) != len(splits):
        raise ValueError(f"--splits names a split twice: {text!r}")
    return splits
