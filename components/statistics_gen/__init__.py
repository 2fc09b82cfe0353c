"""StatisticsGen: stock StatisticsGen's ExampleStatistics artifact, computed in process on the
local DirectRunner, as a Beam job of our own on other runners.

- `stats_job`: the engine (no TFX): each split's shards read, decoded and summarised a block
  at a time, and the DatasetFeatureStatisticsList stock writes; its parts: `plan` (which
  features, read how; schema inference), `kernels` (the compiled loops), `accumulators` (a
  block's summary, a split's statistics folded or merged) and `proto` (the protos, as TFDV
  1.16 builds them);
- `beam_job`: the same engine as a Beam job (no TFX): a piece of a shard per element, the
  summaries merged per split in any order;
- `engine`: the one entry, which picks `stats_job` here or `beam_job` by the Beam args;
- `executor`: the TFX executor (stock's, for the StatsOptions the engine does not cover);
- `component`: `StatisticsGen`, stock's component with this executor.
"""
