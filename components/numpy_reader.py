"""TFRecord shards of tf.Example -> dicts of numpy arrays, with no TensorFlow.

For machines that carry PyTorch or JAX but not TensorFlow. It reads our shards (per-row or
packed, gzip or plain) and stock ExampleGen's, typed by `schema.pbtxt`:
- a scalar feature is a 1-D array, a missing value filled with the schema default (0, 0.0,
  b""), as the TensorFlow input function fills it;
- a feature with a fixed shape (always present) is [rows, *shape];
- any other feature is its values flattened, plus `<name>__lengths` (values per row).

Records are read with the project's framing reader (`tfrecord_io`), so a damaged record is an
error naming the file and offset. `iter_batches` is the plain iterator (wrap it for JAX or
Grain); `TorchDataset` splits files across DataLoader workers and distributed ranks so that
each row is read once per epoch.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Iterator, Optional, Sequence

import numpy as np
from tensorflow_metadata.proto.v0 import schema_pb2

from components import example_rows, tfrecord_io
from components.codec import parser, schema_file
from components.packing.arrow import RowDecoder
from components.packing.layout import LENGTHS_SUFFIX

# Rows decoded at a time (whole records: per-row records, or blocks of packed rows): each
# decode and unpack has a fixed cost per call, paid once for this many rows.
_ROWS_PER_DECODE = 65_536
_NUMPY_TYPES = {schema_pb2.INT: np.int64, schema_pb2.FLOAT: np.float32,
                schema_pb2.BYTES: object}


@dataclasses.dataclass(frozen=True)
class _Column:
    name: str
    dtype: type
    default: object
    kind: str  # "scalar" | "fixed" | "ragged"
    shape: tuple = ()


def _columns(schema: schema_pb2.Schema, names: Optional[Sequence[str]]) -> list[_Column]:
    features = parser.feature_by_name(schema)
    wanted = list(names) if names is not None else list(features)
    missing = sorted(set(wanted) - set(features))
    if missing:
        raise KeyError(f"features {missing} are not in the schema (it has {sorted(features)})")
    columns = []
    for name in wanted:
        feature = features[name]
        shape = tuple(d.size for d in feature.shape.dim)
        if parser.is_fixed(feature) and shape not in ((), (1,)):
            kind = "fixed"
        elif parser.is_scalar(feature):
            kind = "scalar"
        else:
            kind = "ragged"
        columns.append(_Column(name, _NUMPY_TYPES[feature.type], parser.default_value(feature),
                               kind, shape))
    return columns


class _Batcher:
    """Collects rows column by column and cuts dicts of `batch_size` rows."""

    def __init__(self, columns: list[_Column], batch_size: int):
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
        # A batch is a view of what was added; arrays are joined only where a batch spans
        # two adds, so cutting a large decoded group copies nothing.
        batch = {}
        for column in self._columns:
            values = _joined(self._parts[column.name], column.dtype)
            if column.kind == "ragged":
                lengths = _joined(self._lengths[column.name], np.int64)
                take = int(lengths[:rows].sum())
                batch[column.name], batch[column.name + LENGTHS_SUFFIX] = \
                    values[:take], lengths[:rows]
                self._parts[column.name], self._lengths[column.name] = \
                    [values[take:]], [lengths[rows:]]
            else:
                width = int(np.prod(column.shape)) if column.kind == "fixed" else 1
                head = values[:rows * width]
                batch[column.name] = head.reshape(rows, *column.shape) \
                    if column.kind == "fixed" else head
                self._parts[column.name] = [values[rows * width:]]
        self._rows -= rows
        return batch


def _joined(parts: list, dtype) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _column_values(column, decoded) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """(values, lengths or None) of one decoded column (a list per row, from
    `packing.arrow.RowDecoder`, packed or not), in the form `iter_batches` gives."""
    offsets = decoded.offsets.to_numpy().astype(np.int64)
    values = decoded.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_numpy(
        zero_copy_only=False)
    if values.dtype != column.dtype:
        values = values.astype(column.dtype)
    lengths = np.diff(offsets)
    if column.kind == "scalar":
        dense = np.full(len(lengths), column.default, column.dtype)
        present = lengths > 0
        dense[present] = values[offsets[:-1][present] - offsets[0]]
        return dense, None
    if column.kind == "fixed":
        return values, None
    return values, lengths


def _file_records(path: str, stride: int = 1, offset: int = 0
                  ) -> Iterator[tuple[int, bytes]]:
    for index, (position, record) in enumerate(tfrecord_io.iter_records(path)):
        if index % stride == offset:
            yield position, record


def _groups(records: Iterator, size: int) -> Iterator[list]:
    group = []
    for record in records:
        group.append(record)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def _decode(decoder: RowDecoder, group: list[tuple[str, int, bytes]]):
    """The group's records decoded together; when one is bad, decoded one by one again so
    that the error names its own file and offset."""
    try:
        return decoder.decode(tfrecord_io.RecordBlock.of_records(
            group[0][0], group[0][1], [record for _, _, record in group]))
    except ValueError:
        for path, offset, record in group:
            decoder.decode(tfrecord_io.RecordBlock.of_records(path, offset, [record]))
        raise


def _shuffled(records: Iterator, buffer: int, rng: random.Random) -> Iterator:
    """Records in random order through a buffer of `buffer` records (blocks, when packed)."""
    pool: list[bytes] = []
    for record in records:
        if len(pool) < buffer:
            pool.append(record)
            continue
        index = rng.randrange(buffer)
        yield pool[index]
        pool[index] = record
    rng.shuffle(pool)
    yield from pool


def iter_batches(files: Sequence[str], schema: Optional[schema_pb2.Schema] = None,
                 batch_size: int = 1024, features: Optional[Sequence[str]] = None,
                 record_stride: int = 1, record_offset: int = 0, shuffle_buffer: int = 0,
                 seed: Optional[int] = None) -> Iterator[dict]:
    """Batches of `batch_size` rows (the last may be short) from `files`.

    `schema` defaults to the schema.pbtxt stored beside the shards. With `record_stride`
    k > 1, only records whose index in their file is `record_offset` modulo k are read, so k
    readers can share files between them. `shuffle_buffer` > 1 shuffles records (whole blocks
    of packed data) through a buffer of that many, seeded by `seed`; otherwise records come in
    file order. `files` may also be one folder of shards (`example_rows.record_files`)."""
    files = example_rows.record_files(files) if isinstance(files, str) else list(files)
    if schema is None:
        schema = schema_file.find_schema(files[0]) if files else None
        if schema is None:
            raise FileNotFoundError(f"no schema.pbtxt beside {files[:1]}; pass schema=")
    columns = _columns(schema, features)
    decoder = RowDecoder(schema, [c.name for c in columns])
    batcher = _Batcher(columns, batch_size)
    records = ((path, offset, record) for path in files
               for offset, record in _file_records(path, record_stride, record_offset))
    if shuffle_buffer > 1:
        records = _shuffled(records, shuffle_buffer, random.Random(seed))
    group_size = max(1, _ROWS_PER_DECODE // max(1, decoder.layout.rows if decoder.layout
                                                else 1))
    for group in _groups(records, group_size):
        decoded = _decode(decoder, group)
        values, lengths = {}, {}
        for column, array in zip(columns, decoded.columns):
            values[column.name], found = _column_values(column, array)
            if found is not None:
                lengths[column.name] = found
        yield from batcher.add(decoded.num_rows, values, lengths)
    yield from batcher.flush()


def shard_files(files: Sequence[str], reader: int, readers: int, seed: Optional[int] = None,
                epoch: int = 0) -> tuple[list[str], int, int]:
    """(files, record stride, record offset) for reader `reader` of `readers`: whole files
    when there are enough to go round, else every file with every `readers`-th record.
    With a seed the file order is shuffled, differently each epoch, identically on every
    reader (so the split stays a partition)."""
    files = sorted(files)
    if seed is not None:
        random.Random(seed * 1_000_003 + epoch).shuffle(files)
    if len(files) >= readers:
        return files[reader::readers], 1, 0
    return files, readers, reader


class TorchDataset:
    """A PyTorch IterableDataset of numpy batches (use DataLoader(batch_size=None)).

    Files are split across DataLoader workers and distributed ranks, so each row is read once
    per epoch in all; call `set_epoch(n)` before each epoch for a new seeded file order. The
    class is built on first use, so importing this module needs no torch."""

    def __new__(cls, *args, **kwargs):
        import torch.utils.data

        class _Dataset(torch.utils.data.IterableDataset):
            def __init__(self, files: Sequence[str], schema=None, batch_size: int = 1024,
                         features=None, seed: Optional[int] = None, shuffle_buffer: int = 16,
                         rank: Optional[int] = None, world_size: Optional[int] = None):
                super().__init__()
                self.files = example_rows.record_files(files) if isinstance(files, str) \
                    else list(files)
                self.schema, self.batch_size = schema, batch_size
                self.features, self.seed, self.epoch = features, seed, 0
                self.shuffle_buffer = shuffle_buffer if seed is not None else 0
                self.rank, self.world_size = rank, world_size

            def set_epoch(self, epoch: int) -> None:
                self.epoch = epoch

            def __iter__(self):
                import torch.distributed as dist

                rank, world = self.rank, self.world_size
                if rank is None:
                    initialised = dist.is_available() and dist.is_initialized()
                    rank = dist.get_rank() if initialised else 0
                    world = dist.get_world_size() if initialised else 1
                info = torch.utils.data.get_worker_info()
                worker, workers = (info.id, info.num_workers) if info else (0, 1)
                files, stride, offset = shard_files(self.files, rank * workers + worker,
                                                    world * workers, self.seed, self.epoch)
                schema = self.schema if self.schema is not None else \
                    schema_file.find_schema(self.files[0])
                reader_seed = None if self.seed is None else \
                    hash((self.seed, self.epoch, rank, worker)) & 0xFFFFFFFF
                return iter_batches(files, schema, self.batch_size, self.features,
                                    stride, offset, self.shuffle_buffer, reader_seed)

        return _Dataset(*args, **kwargs)
