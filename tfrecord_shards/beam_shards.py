"""The sharded write as one Beam transform: chunks in, shards out.

ExampleGen and Transform both end with it; the planning and writing themselves are the
engine-neutral functions of `tfrecord_shards/shards.py`.
"""
from __future__ import annotations

import apache_beam as beam

from tfrecord_shards import shards


class WriteShards(beam.PTransform):
    """PCollection[shards.Chunk] -> PCollection[shards.Shard], written under `staging`.

    The plan needs every chunk's size, so it runs once over the gathered chunk list (metadata
    only); the shards are then spread over workers and written in parallel."""

    def __init__(self, staging: str, sharding: shards.ShardingOptions):
        super().__init__()
        self._staging, self._sharding = staging, sharding

    def expand(self, chunks):
        return (
            chunks
            | "AllChunks" >> beam.combiners.ToList()
            | "Plan" >> beam.FlatMap(shards.plan_shards, self._sharding)
            | "Spread" >> beam.Reshuffle()
            | "Write" >> beam.Map(shards.write_shard, self._staging, self._sharding)
        )
