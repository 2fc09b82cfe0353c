"""shuffle=global: every epoch in a seeded permutation of all the rows, read by index.

The order is a function of (seed, position in the stream of every epoch's rows) alone, so a
run stopped anywhere resumes there with no buffer to restore, on any number of input
pipelines (`RowStream`). Per-row records are permuted record by record (`global_records`);
packed records block by block, and each block's rows among themselves (`global_blocks`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfrecord_shards import record_index
from shard_readers import numpy_reader
from components.trainer.options import InputConfig

AUTOTUNE = tf.data.AUTOTUNE



# A global order without num_epochs runs on; its row stream stops here, far past any run.
_UNBOUNDED_ROWS = 1 << 62


@dataclasses.dataclass(frozen=True)
class RowStream:
    """Where a global order starts and stops in the stream of every epoch's rows one after
    another, and the share of it one input pipeline reads. Pipeline w of W reads the units
    (`batch` rows each) w, w + W, ...; in step with the others, after each has read k units
    the pipelines together have read exactly the first k * W units: the stream's rows up to
    one number, whatever W was, so a run resumes from that number on any W."""

    start: int
    stop: int
    batch: int
    pipelines: int
    pipeline: int

    @classmethod
    def of(cls, rows_per_epoch: int, config: InputConfig,
           input_context: Optional[tf.distribute.InputContext]) -> "RowStream":
        return cls(config.start_epoch * rows_per_epoch + config.start_position,
                   _UNBOUNDED_ROWS if config.num_epochs is None
                   else config.num_epochs * rows_per_epoch, config.batch_size,
                   input_context.num_input_pipelines if input_context else 1,
                   input_context.input_pipeline_id if input_context else 0)

    def unit_starts(self) -> tf.data.Dataset:
        return tf.data.Dataset.range(self.start + self.pipeline * self.batch, self.stop,
                                     self.pipelines * self.batch)

    def batches(self, drop_remainder: bool) -> Optional[int]:
        """This pipeline's batches (a unit each, a short last one left out with
        `drop_remainder`); None for a stream without end."""
        if self.stop == _UNBOUNDED_ROWS:
            return None
        first = self.start + self.pipeline * self.batch
        units = max(0, -(-(self.stop - first) // (self.pipelines * self.batch)))
        last = first + (units - 1) * self.pipelines * self.batch
        return units - (drop_remainder and units > 0 and last + self.batch > self.stop)


def global_records(files: Sequence[str], config: InputConfig,
                  input_context: Optional[tf.distribute.InputContext]
                  ) -> tuple[tf.data.Dataset, RowStream]:
    """Per-row records, each epoch in a seeded permutation of all of them
    (`tf.random.experimental.index_shuffle`, keyed by the seed and the epoch): every record
    exactly once an epoch, read by its index, in units of `batch_size` records that this
    pipeline takes from the row stream (`RowStream`). The order is a function of (seed,
    stream position) alone, so a run stopped anywhere resumes there with no buffer to
    restore (`start_epoch`, `start_position`), on any number of input pipelines."""
    records = record_index.FileRecords(files)
    count = len(records)
    if not count:
        raise ValueError(f"shuffle=global: no records in {len(files)} file(s)")
    stream = RowStream.of(count, config, input_context)
    seed = tf.constant(config.seed or 0, tf.int64)
    last = tf.constant(count - 1, tf.int64)

    def unit_records(first: tf.Tensor) -> tf.Tensor:
        rows = tf.range(first, tf.minimum(first + stream.batch, stream.stop))
        epoch, position = rows // count, rows % count
        # A unit spans at most two epochs.
        return tf.where(epoch == first // count,
                        tf.random.experimental.index_shuffle(
                            position, tf.stack([seed, first // count]), last),
                        tf.random.experimental.index_shuffle(
                            position, tf.stack([seed, first // count + 1]), last))

    def read(numbers: tf.Tensor) -> tf.Tensor:
        return tf.numpy_function(records.read, [numbers], tf.string, stateful=False)

    return (stream.unit_starts()
            .map(unit_records)
            .map(read, num_parallel_calls=AUTOTUNE, deterministic=True)
            .unbatch()), stream


BLOCKS_PER_READ = 32


REMOTE_BYTES_PER_READ = 32 << 20


class BlockOrder:
    """Packed records in a global order: each epoch a seeded permutation of the blocks
    (numpy's PCG64, keyed by the seed and the epoch), each block's rows in an order keyed by
    the seed, the epoch and the block. A unit of the row stream is cut from the blocks it
    falls in as (block, epoch, first row, end row) segments."""

    def __init__(self, rows_per_block: np.ndarray, seed: int):
        self.rows = rows_per_block
        self.total = int(rows_per_block.sum())
        self.seed = seed
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if epoch not in self._epochs:
            if len(self._epochs) > 2:  # a run reads at most two epochs at once
                self._epochs.pop(min(self._epochs))
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
            self._epochs[epoch] = (order, np.cumsum(self.rows[order]))
        return self._epochs[epoch]

    def segments(self, firsts: np.ndarray, batch: int, stop: int) -> np.ndarray:
        """(block, epoch, first row, end row) of the units starting at `firsts`, a block
        read once for consecutive rows of it."""
        out: list[list[int]] = []
        for first in firsts.tolist():
            row, end = first, min(first + batch, stop)
            while row < end:
                epoch, within = divmod(row, self.total)
                order, ends = self._epoch(epoch)
                k = int(np.searchsorted(ends, within, side="right"))
                block = int(order[k])
                lo = within - (int(ends[k]) - int(self.rows[block]))
                hi = min(int(self.rows[block]), lo + end - row)
                if out and out[-1][:2] == [block, epoch] and out[-1][3] == lo:
                    out[-1][3] = hi
                else:
                    out.append([block, epoch, lo, hi])
                row += hi - lo
        return np.array(out, np.int64).reshape(-1, 4)


def global_blocks(files: Sequence[str], config: InputConfig,
                   input_context: Optional[tf.distribute.InputContext],
                   parse: Callable) -> tuple[tf.data.Dataset, RowStream]:
    """Packed records in a global order (`BlockOrder`): the rows this pipeline takes from the
    row stream, parsed block by block. A block that units of other pipelines share is read
    by each of them; within one pipeline, once."""
    records = record_index.FileRecords(files)
    order = BlockOrder(np.concatenate([numpy_reader.block_rows(f) for f in files]),
                        config.seed or 0)
    if not order.total:
        raise ValueError(f"shuffle=global: no rows in {len(files)} file(s)")
    stream = RowStream.of(order.total, config, input_context)
    seed = tf.constant(config.seed or 0, tf.int64)

    # Units enough to cover about BLOCKS_PER_READ blocks (on an object store, blocks of about
    # REMOTE_BYTES_PER_READ) are read in one call. Their ranges are fetched together, merged
    # where they lie close and concurrently (FileRecords.read): on a store an epoch costs a
    # request per merged span, and the more blocks a call asks for, the closer they lie.
    blocks_per_read = BLOCKS_PER_READ
    if records.remote:
        blocks_per_read = max(BLOCKS_PER_READ, REMOTE_BYTES_PER_READ * len(order.rows) //
                              max(1, records.stored_bytes()))
    units_per_read = max(1, -(-blocks_per_read * order.total // len(order.rows) //
                               stream.batch))

    def segments_and_blocks(firsts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cut = order.segments(firsts, stream.batch, stream.stop)
        return cut, records.read(cut[:, 0])

    def segments(firsts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        cut, blocks = tf.numpy_function(segments_and_blocks, [firsts], (tf.int64, tf.string),
                                        stateful=False)
        return tf.reshape(cut, [-1, 4]), tf.reshape(blocks, [-1])

    def rows_of(segment: tf.Tensor, serialized: tf.Tensor):
        block, epoch, lo, hi = tf.unstack(segment, num=4)
        parsed = parse(tf.reshape(serialized, [1]))
        size = tf.shape(tf.nest.flatten(parsed)[0], out_type=tf.int64)[0]
        # This epoch's order of the block's rows, the same wherever the block is read.
        keys = tf.random.stateless_uniform([size], tf.stack([seed ^ block, epoch]))
        taken = tf.argsort(keys)[lo:hi]
        return tf.nest.map_structure(lambda t: tf.gather(t, taken), parsed)

    return (stream.unit_starts()
            .batch(units_per_read)
            .map(segments, num_parallel_calls=AUTOTUNE, deterministic=True)
            .unbatch()
            .map(rows_of, num_parallel_calls=AUTOTUNE, deterministic=True)), stream
