"""Transformed rows -> serialized tf.Examples (one per row, or packed N rows per Example) in
chunk files for the sharding writer. It imports no TFX.

`SplitEncoder` is used two ways. The general path (tf.Transform's TransformDataset) encodes
whatever batches a Beam bundle holds, under a random writer id: its rows keep no order. The
columnar path encodes each input file on its own, under the file's place among the split's
files, so the transformed split lists its rows in the order of the input split
(`manifest.ROW_ORDER_INPUT`), which lets the Evaluator pair them with the raw rows.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import pyarrow as pa
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import fileio, packing, shards
from tfrecord_shards.codec import serializer
from tfrecord_shards.packing.write import pack_batch

# The tagged output of the encoding DoFns that carries (split, rows, records) counts.
ROW_COUNTS = "row_counts"


class SplitEncoder:
    """Encodes one split's transformed record batches into chunks under `staging`; packing
    carries rows over from batch to batch, so only the last block (at `close`) can be
    short."""

    def __init__(self, split: str, schema: schema_pb2.Schema, staging: str,
                 sharding: shards.ShardingOptions, writer_id: int):
        self.split = split
        self._layout = packing.PackedLayout.from_schema(schema)
        self._packed = self._layout.rows if self._layout else 0
        self._writer = shards.ChunkWriter(fileio.join(staging, "_chunks"), writer_id, sharding)
        self._pending: list = []
        self._pending_rows = 0
        self.rows = self.records = 0

    def add(self, batch) -> None:
        self.rows += batch.num_rows
        if not self._packed:
            columns = {n: serializer.arrow_kind(t) for n, t in zip(batch.schema.names,
                                                                  batch.schema.types)}
            self._writer.add("", self.split, serializer.encode_examples_array(
                serializer.to_example_batch(batch, columns)))
            self.records += batch.num_rows
            return
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        if self._pending_rows >= self._packed:
            table = pa.Table.from_batches(self._pending)
            full = (table.num_rows // self._packed) * self._packed
            self._writer.add("", self.split, pack_batch(table.slice(0, full), self._layout))
            self.records += full // self._packed
            rest = table.slice(full)
            self._pending = rest.to_batches() if rest.num_rows else []
            self._pending_rows = rest.num_rows

    def close(self) -> list[shards.Chunk]:
        """Writes what is left; the chunks written, in their order."""
        if self._pending_rows:
            self._writer.add("", self.split, pack_batch(pa.Table.from_batches(self._pending),
                                                        self._layout))
            self.records += 1
            self._pending, self._pending_rows = [], 0
        return self._writer.close()


class EncodingThread:
    """A SplitEncoder fed on a thread of its own, one batch behind its caller: the columnar
    transform's main thread, the pass's bottleneck, applies the graph to the next batch
    while the last one is packed and gzipped (Arrow, numpy and zlib let go of the GIL for
    most of that). One batch is in flight at a time; an encoding error is raised by the next
    `add` or by `close`. A context manager: leaving it waits for the batch in flight."""

    def __init__(self, encoder: SplitEncoder):
        self.encoder = encoder
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="encode")
        self._in_flight: Optional[Future] = None

    def __enter__(self) -> "EncodingThread":
        return self

    def __exit__(self, *failure) -> None:
        self._pool.shutdown(wait=True)

    def add(self, batch) -> None:
        self._wait()
        self._in_flight = self._pool.submit(self.encoder.add, batch)

    def close(self) -> list[shards.Chunk]:
        """Waits for the batch in flight, then closes the encoder: its chunks, in order."""
        self._wait()
        return self.encoder.close()

    def _wait(self) -> None:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()
