"""Cutting decoded columns into batches of a fixed number of rows: the numpy reader's
batcher, kept apart from the reading."""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from tfrecord_shards.packing.layout import LENGTHS_SUFFIX


class Batcher:
    """Collects rows column by column and cuts dicts of `batch_size` rows; `columns` name
    each column's `name`, `dtype`, `kind` ("scalar", "fixed", "pixels" or "ragged", whose
    lengths come apart) and `shape`."""

    def __init__(self, columns: Sequence, batch_size: int):
        self._columns, self._size = columns, batch_size
        self._parts: dict[str, list] = {c.name: [] for c in columns}
        self._lengths: dict[str, list] = {c.name: [] for c in columns if c.kind == "ragged"}
        self._rows = 0

    def add(self, rows: int, values: dict, lengths: dict) -> Iterator[dict]:
        for name, value in values.items():
            self._parts[name].append(value)
        for name, value in lengths.items():
            self._lengths[name].append(value)
        self._rows += rows
        while self._rows >= self._size:
            yield self._cut(self._size)

    def flush(self) -> Iterator[dict]:
        if self._rows:
            yield self._cut(self._rows)

    def _cut(self, rows: int) -> dict:
        # A batch is a view of what was added; only the part of it that spans two adds is
        # copied, so cutting a large decoded group copies next to nothing.
        batch = {}
        for column in self._columns:
            parts = self._parts[column.name]
            if column.kind == "ragged":
                lengths, self._lengths[column.name] = _head(
                    self._lengths[column.name], rows, np.int64)
                batch[column.name], self._parts[column.name] = _head(
                    parts, int(lengths.sum()), column.dtype)
                batch[column.name + LENGTHS_SUFFIX] = lengths
            else:
                width = int(np.prod(column.shape)) if column.kind != "scalar" else 1
                head, self._parts[column.name] = _head(parts, rows * width, column.dtype)
                batch[column.name] = head.reshape(rows, *column.shape) \
                    if column.kind != "scalar" else head
        self._rows -= rows
        return batch


def _head(parts: list, count: int, dtype) -> tuple[np.ndarray, list]:
    """The first `count` values of `parts` (arrays in order) as one array, and the parts
    left after them."""
    taken, held = 0, 0
    while taken < len(parts) and held + len(parts[taken]) <= count:
        held += len(parts[taken])
        taken += 1
    pieces, rest = parts[:taken], parts[taken:]
    if held < count:
        pieces.append(rest[0][:count - held])
        rest = [rest[0][count - held:], *rest[1:]]
    if len(pieces) == 1:
        return pieces[0], rest
    return (np.concatenate(pieces) if pieces else np.zeros(0, dtype)), rest
