"""StatisticsGen: stock StatisticsGen's ExampleStatistics artifact, computed without Beam.

- `stats_job`: the engine (no TFX): each split's shards read, decoded and summarised a block
  at a time, and the DatasetFeatureStatisticsList stock writes;
- `executor`: the TFX executor (stock's, for the StatsOptions the engine does not cover);
- `component`: `StatisticsGen`, stock's component with this executor.
"""
