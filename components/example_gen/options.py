"""ExampleGen's options: one frozen dataclass shared by the component, the Beam job and the CLI."""
from __future__ import annotations

import dataclasses
from typing import Optional

from components.example_gen.splits import DEFAULT_SPLITS, parse_splits
from components.example_gen.sources.registry import FORMATS
from tfrecord_shards.options import JsonOptions, SettingError, setting
from tfrecord_shards.shards import ShardingOptions


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
    # On Spark, and on a Beam runner outside this process, a plain CSV larger than this is
    # read in byte ranges of this size, one task each, so one large file spreads over the
    # workers (`csv_ranges`). The local DirectRunner reads each file whole, as its one worker
    # would.
    piece_bytes: int = setting(256 << 20, "On Spark or a distributed Beam runner, read a "
                               "plain CSV larger than this in ranges of this many bytes.",
                               minimum=1)
    # Where the work runs: "beam" (the pipeline's Beam args) or "spark" (a Spark cluster, or
    # local[*] without a master).
    engine: str = setting("beam", "Where the work runs.", choices=("beam", "spark"))
    spark_master: Optional[str] = setting(
        None, "With engine spark: local[N], spark://host:7077, yarn (unset: local[*]).")
    spark_conf: Optional[dict] = setting(
        None, "With engine spark: a Spark setting, such as spark.executor.memory=4g.",
        metavar="KEY=VALUE")
    # TFX's input_config, pre-split: each split's own files. With it, `source` is the base
    # folder (stock's input_base) the patterns are under, and no row is hash-split.
    input_config: Optional[dict] = setting(
        None, "Pre-split inputs: a split and the pattern of its files under the source "
        "folder (train=train/*); may hold {SPAN}, {VERSION}, {YYYY}{MM}{DD}.",
        metavar="SPLIT=PATTERN")
    # TFX's RangeConfig as its JSON: {"static_range": {"start_span_number": 1,
    # "end_span_number": 3}} or {"rolling_range": {"num_spans": 3}}, or those fields flat
    # (the command line's --range-config num_spans=3). Unlike stock, a range may hold several
    # spans; they are read together into one Examples artifact.
    range_config: Optional[dict] = setting(
        None, "Which spans to read: start_span_number=A and end_span_number=B (a static "
        "range), or num_spans=N (the latest N); unset: the latest span.",
        metavar="FIELD=NUMBER")
    # What the patterns resolved to when the pipeline was built: per split ("" for hash
    # splits), the resolved patterns, one per span. Unset when `source` is read as it is.
    resolved_inputs: Optional[dict] = None
    resolved_spans: Optional[list] = None
    # A fingerprint of the source files (`inputs.settle_inputs`), taken when the pipeline is
    # built or, compiled, when its run starts: an edited source changes the component's
    # parameters, so a cached run re-reads it, and a run stops if its files no longer match.
    source_fingerprint: Optional[str] = None
    # The span and version a `{SPAN}`/`{YYYY}{MM}{DD}`/`{VERSION}` source resolved to when the
    # pipeline was built (the component resolves it, as stock ExampleGen's driver does); set
    # on the Examples artifact. Span 0 and no version for a source without them.
    span: int = 0
    version: Optional[int] = None

    def __post_init__(self):
        super().__post_init__()
        parse_splits(self.splits)
        if self.range_config is not None:
            object.__setattr__(self, "range_config", normalize_range_config(self.range_config))

    def input_patterns(self) -> list[tuple[Optional[str], str]]:
        """(split, path or pattern) of each input: the resolved patterns when there are any
        (split None: hash-split rows), else the source itself."""
        if not self.resolved_inputs:
            return [(None, self.source)]
        return [(split or None, pattern) for split, patterns in self.resolved_inputs.items()
                for pattern in patterns]

    @property
    def split_names(self) -> list[str]:
        """The output's splits: the pre-split inputs' names, or the hash splits'."""
        if self.input_config:
            return list(self.input_config)
        return [name for name, _ in parse_splits(self.splits)]


_RANGE_FIELDS = {"static_range": ("start_span_number", "end_span_number"),
                 "rolling_range": ("num_spans", "start_span_number")}


def normalize_range_config(config: dict) -> dict:
    """`config` in RangeConfig's JSON form with whole numbers, from that form or its fields
    given flat; a SettingError names what does not fit."""
    if len(config) == 1 and next(iter(config)) in _RANGE_FIELDS:
        (kind, fields), = config.items()
    elif "num_spans" in config:
        kind, fields = "rolling_range", config
    else:
        kind, fields = "static_range", config
    unknown = sorted(set(fields) - set(_RANGE_FIELDS[kind]))
    if unknown:
        raise SettingError(["range_config"], f"{{0}}: {kind} has no {unknown}; it takes "
                           f"{' and '.join(_RANGE_FIELDS[kind])}")
    given = ", ".join(f"{k}={v}" for k, v in fields.items())  # no braces: it is a template
    try:
        numbers = {k: int(v) for k, v in fields.items()}
    except (TypeError, ValueError):
        raise SettingError(["range_config"], f"{{0}}: span numbers are whole numbers, not "
                           f"{given}") from None
    if kind == "static_range" and (len(numbers) != 2 or
                                   numbers["start_span_number"] > numbers["end_span_number"]):
        raise SettingError(["range_config"], "{0}: a static range takes start_span_number "
                           f"<= end_span_number, not {given}")
    if kind == "rolling_range" and numbers.get("num_spans", 1) < 1:
        raise SettingError(["range_config"], f"{{0}}: num_spans must be at least 1, not "
                           f"{numbers['num_spans']}")
    return {kind: numbers}
