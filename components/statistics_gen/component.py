"""The StatisticsGen TFX component: stock StatisticsGen's spec and constructor, our executor."""
from __future__ import annotations

from tfx.components.statistics_gen import component as stock
from tfx.dsl.components.base import executor_spec

from components.statistics_gen import executor


class StatisticsGen(stock.StatisticsGen):
    """Stock StatisticsGen (the same inputs `examples` and optional `schema`, output
    `statistics`, parameters `stats_options`/`stats_options_json` and `exclude_splits`, and
    the same ExampleStatistics artifact), whose executor computes the statistics in its own
    process on the local DirectRunner and as its own Beam job on any other runner (or the
    DirectRunner's worker processes): `StatisticsGen(examples=example_gen.outputs["examples"])`.
    StatsOptions it does not compute itself run stock's Beam job, with the pipeline's Beam
    arguments."""

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)
