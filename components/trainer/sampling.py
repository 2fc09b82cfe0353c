"""The scaling pass's sample of a large train split: runs of whole records spread evenly over
its files, found by their stored indexes (our manifest's gzip members), so that the pass
reads about the same rows at 30M as at 3M, and still reads every part of a sorted table.

At 30M taxi rows the pass over every training row was the Trainer's whole growth from 3M
(6.1 s against 0.9 s on the Intel host, 11.0 against 1.8 on the AMD one), most of it
inflating gzip; moments of 2M rows spread over the split scale the inputs as well as 18M.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from tfrecord_shards import record_index, tfrecord_io

# The rows a piece holds at least: large enough that opening a piece costs little beside
# inflating it, small enough that a sample of 2M rows takes hundreds of pieces from all over
# the split (8 packed taxi blocks, or 8 of its gzip members)...
PIECE_ROWS = 8_192
# ... and a smaller sample at least this many pieces, where the split's index allows.
SAMPLE_PIECES = 64


@dataclasses.dataclass(frozen=True)
class RecordSample:
    """Every `every`-th piece (`RecordIndex.ranges`: whole gzip members, or whole records of
    a plain file) of some files taken in order, the middle one of each run of `every`."""

    pieces: tuple[tfrecord_io.RecordRange, ...]
    every: int
    records: int  # the records in the pieces
    of_records: int  # the records of every file

    @classmethod
    def of(cls, files: Sequence[str], rows: int, wanted_rows: int
           ) -> Optional["RecordSample"]:
        """A sample of at least `wanted_rows` of the `rows` rows of `files`; None when they
        hold fewer than twice that many (every row is read), or a file has no stored index
        (building one reads the whole file, which is what the sample saves)."""
        every = rows // wanted_rows if wanted_rows > 0 else 0
        if every < 2:
            return None
        indexes = record_index.load_all(files)
        if not indexes or any(index is None for index in indexes):
            return None
        of_records = sum(index.records for index in indexes)
        piece_rows = min(PIECE_ROWS, wanted_rows // SAMPLE_PIECES)
        records_per_piece = max(1, piece_rows * of_records // max(rows, 1))
        ranges = [piece for index in indexes if index.records
                  for piece in index.ranges(records_per_piece)]
        pieces = tuple(ranges[every // 2::every])
        if not pieces:
            return None
        return cls(pieces, every, sum(piece.records for piece in pieces), of_records)

    def share(self) -> float:
        """The share of every file's records that the pieces hold."""
        return self.records / self.of_records

    def records_dataset(self) -> tf.data.Dataset:
        """The pieces' serialized records, piece after piece (pieces read in parallel)."""
        pieces = self.pieces

        def read_piece(number: np.ndarray) -> np.ndarray:
            records = [block.buffer[start:end].tobytes()
                       for block in tfrecord_io.iter_record_blocks(pieces[int(number)])
                       for start, end in zip(block.starts.tolist(), block.ends.tolist())]
            return np.array(records, dtype=object)

        def read(number: tf.Tensor) -> tf.Tensor:
            records = tf.numpy_function(read_piece, [number], tf.string, stateful=False)
            return tf.ensure_shape(records, [None])

        return (tf.data.Dataset.range(len(pieces))
                .map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
                .unbatch())
