"""TFRecord shards of tf.Example -> dicts of numpy arrays, with no TensorFlow.

For machines that carry PyTorch or JAX but not TensorFlow. It reads our shards (per-row or
packed, gzip or plain) and stock ExampleGen's, typed by `schema.pbtxt`:
- a scalar feature is a 1-D array, a missing value filled with the schema default (0, 0.0,
  b""), as the TensorFlow input function fills it;
- a feature with a fixed shape (always present) is [rows, *shape];
- a raw-pixel feature (bytes tagged `tfrp.raw_pixels=<h>x<w>x<c>`, as Transform stores
  images) is uint8 [rows, h, w, c], a view of the decoded bytes: no Python object per row;
- any other feature is its values flattened, plus `<name>__lengths` (values per row).

Records are read with the project's framing reader (`tfrecord_io`), so a damaged record is an
error naming the file and offset. `iter_batches` is the plain iterator (wrap it for JAX or
Grain); `TorchDataset` splits each epoch's rows across DataLoader workers and distributed
ranks in shares of whole batches, so that each row is read once per epoch and every batch but
the epoch's last is full. `rows_to_batch` makes the same batch from map-style rows
(`random_access.RowCollate`).
"""
from __future__ import annotations

import dataclasses
import functools
import random
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np
from tensorflow_metadata.proto.v0 import schema_pb2

from shard_readers import images
from shard_readers.batcher import Batcher
from tfrecord_shards import example_rows, fileio, record_index, tfrecord_io
from tfrecord_shards.codec import parser, schema_file
from tfrecord_shards.packing.arrow import RowDecoder
from tfrecord_shards.packing.layout import LENGTHS_SUFFIX, ROWS_KEY

# Rows decoded at a time (whole records: per-row records, or blocks of packed rows): each
# decode and unpack has a fixed cost per call, paid once for this many rows. Large rows (an
# image a row) close a group at this many record bytes instead, so that a reader does not hold
# thousands of them decoded before its first batch.
_ROWS_PER_DECODE = 65_536
_BYTES_PER_DECODE = 32 << 20
_NUMPY_TYPES = {schema_pb2.INT: np.int64, schema_pb2.FLOAT: np.float32, schema_pb2.BYTES: object}


@dataclasses.dataclass(frozen=True)
class _Column:
    name: str
    dtype: type
    default: object
    kind: str  # "scalar" | "fixed" | "pixels" | "ragged"
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
        pixels = images.raw_shape(feature) if feature.type == schema_pb2.BYTES else None
        if pixels is not None:
            columns.append(_Column(name, np.uint8, 0, "pixels", pixels))
            continue
        if parser.is_fixed(feature) and shape not in ((), (1,)):
            kind = "fixed"
        elif parser.is_scalar(feature):
            kind = "scalar"
        else:
            kind = "ragged"
        columns.append(_Column(name, _NUMPY_TYPES[feature.type], parser.default_value(feature),
                               kind, shape))
    return columns


def _column_values(column, decoded, group: list["_Record"]
                   ) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """(values, lengths or None) of one decoded column (a list per row, from
    `packing.arrow.RowDecoder`, packed or not) of `group`'s rows, in the form `iter_batches`
    gives."""
    offsets = decoded.offsets.to_numpy().astype(np.int64, copy=False)
    if column.kind == "pixels":
        return _pixel_values(column, decoded.values, offsets, group), None
    values = decoded.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_numpy(
        zero_copy_only=False)
    if values.dtype != column.dtype:
        values = values.astype(column.dtype)
    lengths = np.diff(offsets)
    if column.kind == "scalar":
        if len(values) == len(lengths) and (lengths == 1).all():
            return values, None
        dense = np.full(len(lengths), column.default, column.dtype)
        present = lengths > 0
        dense[present] = values[offsets[:-1][present] - offsets[0]]
        return dense, None
    if column.kind == "fixed":
        return values, None
    return values, lengths


def _pixel_values(column: _Column, binary, offsets: np.ndarray, group: list["_Record"]
                  ) -> np.ndarray:
    """The rows' raw pixels as one flat uint8 view of the decoded bytes (the rows' values lie
    back to back in the binary array's data), after checking that each row has one value of
    h * w * c bytes; a row that does not is named by its record's file and offset."""
    size = int(np.prod(column.shape))
    counts = np.diff(offsets)
    offset_type = np.int64 if str(binary.type) == "large_binary" else np.int32
    ends = np.frombuffer(binary.buffers()[1], offset_type)[
        binary.offset + offsets[0]:binary.offset + offsets[-1] + 1].astype(np.int64)
    bad = np.flatnonzero(counts != 1)
    if not len(bad) and len(ends) > 1:
        bad = np.flatnonzero(np.diff(ends) != size)
    if len(bad):
        row = int(bad[0])
        path, offset = _record_of_row(group, row)
        # With one value a row, value i is row i's.
        raise ValueError(f"{path}: record at byte offset {offset}: " + _not_pixels(
            column, int(counts[row]),
            int(ends[row + 1] - ends[row]) if counts[row] == 1 else 0))
    data = binary.buffers()[2]
    return np.frombuffer(data, np.uint8, count=int(ends[-1] - ends[0]), offset=int(ends[0])) \
        if data is not None else np.zeros(0, np.uint8)


def _not_pixels(column: _Column, values: int, size: int) -> str:
    """What is wrong with a row of `values` values (of `size` bytes, when one) in a raw-pixel
    feature."""
    shape = "x".join(map(str, column.shape))
    return (f"feature {column.name!r} is tagged raw pixels {shape} (one value of "
            f"{int(np.prod(column.shape))} bytes a row), but holds {values} value(s)"
            + (f" of {size} bytes" if values == 1 else ""))


def _record_of_row(group: list["_Record"], row: int) -> tuple[str, int]:
    """(file, byte offset) of the record that holds the group's kept row `row`."""
    kept = np.cumsum([record.rows - record.skip_head - record.skip_tail for record in group])
    record = group[int(np.searchsorted(kept, row, side="right"))]
    return record.path, record.stream_offset()


def _file_records(path: str, first: int = 0, end: Optional[int] = None
                  ) -> Iterator[tuple[int, bytes]]:
    """(offset, record) of the file's records numbered `first` up to `end` (all by default).

    A file with a stored index (our manifest's gzip members, an `.idx`) is read from the
    entry holding `first`, so a reader whose share starts late in a file inflates and checks
    none of the records before it; without one they are unframed but not decoded. A gzip file
    read from a member on does not know its records' offsets in the whole uncompressed
    stream: each is given as `-1 - record number`, and `_stream_offset` finds the true one
    when an error must name it."""
    start, number, from_member = 0, 0, False
    index = _stored_index(path, fileio.stat(path)) if first else None
    if index is not None and first < index.records:
        entry = index.entry_of(first)
        start, number = int(index.offsets[entry]), int(index.firsts[entry])
        from_member = index.gzip and start > 0
    try:
        for position, record in tfrecord_io.iter_records(path, start=start):
            if end is not None and number >= end:
                return
            if number >= first:
                yield (-1 - number if from_member else position), record
            number += 1
    except tfrecord_io.CorruptRecordError:
        if from_member:
            # Named at its place in the whole stream, as a read from the start names it.
            for _ in tfrecord_io.iter_records(path):
                pass
        raise


@functools.lru_cache(maxsize=1024)
def _stored_index(path: str, size_and_time: tuple) -> Optional[record_index.RecordIndex]:
    """The file's stored record index, looked up once per process and version of the file
    (a DataLoader worker reads it when its first share starts inside the file)."""
    return record_index.load(path)


def _stream_offset(path: str, number: int) -> int:
    """The uncompressed offset of record `number` of `path`, by reading up to it."""
    for found, (offset, _) in enumerate(tfrecord_io.iter_records(path)):
        if found == number:
            return offset
    raise IndexError(f"{path}: no record {number}")


def _groups(records: Iterator["_Record"], size: int,
            max_bytes: int = _BYTES_PER_DECODE) -> Iterator[list]:
    """`records` in lists of `size`, or fewer where they reach `max_bytes` of data first."""
    group, held = [], 0
    for record in records:
        group.append(record)
        held += len(record.data)
        if len(group) == size or held >= max_bytes:
            yield group
            group, held = [], 0
    if group:
        yield group


@dataclasses.dataclass(frozen=True)
class _Record:
    """A record as read, with the rows of it a reader keeps: all but `skip_head` at the
    start and `skip_tail` at the end (only a packed block where one reader's share of rows
    ends and the next one's begins is cut)."""
    path: str
    offset: int
    data: bytes
    rows: int = 1
    skip_head: int = 0
    skip_tail: int = 0

    def stream_offset(self) -> int:
        """Its framing offset in the file's uncompressed stream; for a record read from a
        gzip member on (offset `-1 - record number`), found by reading up to it."""
        return self.offset if self.offset >= 0 else _stream_offset(self.path, -1 - self.offset)


def _decode(decoder: RowDecoder, group: list[_Record]):
    """The group's records decoded together, less the rows they do not keep; when one is
    bad, decoded one by one again so that the error names its own file and offset."""
    try:
        decoded = decoder.decode(tfrecord_io.RecordBlock.of_records(
            group[0].path, group[0].offset, [record.data for record in group]))
    except ValueError:
        for record in group:
            try:
                decoder.decode(tfrecord_io.RecordBlock.of_records(
                    record.path, max(record.offset, 0), [record.data]))
            except ValueError:
                if record.offset >= 0:
                    raise
                decoder.decode(tfrecord_io.RecordBlock.of_records(
                    record.path, record.stream_offset(), [record.data]))
                raise
        raise
    if not any(record.skip_head or record.skip_tail for record in group):
        return decoded
    firsts = np.cumsum([0] + [record.rows for record in group])
    kept = np.concatenate([np.arange(first + record.skip_head,
                                     first + record.rows - record.skip_tail)
                           for first, record in zip(firsts.tolist(), group)])
    return decoded.take(kept)


def _shuffled(records: Iterator, buffer: int, rng: random.Random) -> Iterator:
    """Records in random order through a buffer of `buffer` records (blocks, when packed)."""
    pool: list = []
    for record in records:
        if len(pool) < buffer:
            pool.append(record)
            continue
        index = rng.randrange(buffer)
        yield pool[index]
        pool[index] = record
    rng.shuffle(pool)
    yield from pool


def block_rows(path: str) -> np.ndarray:
    """The rows of each packed block of a file, in one compiled pass reading only
    `__rows__`."""
    only_rows = schema_pb2.Schema()
    only_rows.feature.add(name=ROWS_KEY, type=schema_pb2.INT)
    counts = []
    for block in tfrecord_io.iter_record_blocks(path):
        column = parser.decode_record_block(block, only_rows).column(0)
        counts.append(np.asarray(column.flatten().to_numpy(zero_copy_only=False), np.int64))
    return np.concatenate(counts) if counts else np.zeros(0, np.int64)


@dataclasses.dataclass(frozen=True)
class FileRows:
    """How many rows a file holds, and for packed records where each block starts: what a
    reader needs to read a range of rows without decoding the rows before it."""
    path: str
    rows: int
    block_starts: Optional[np.ndarray] = None  # packed: first row of each block, then `rows`

    @classmethod
    def of(cls, path: str, packed: bool) -> "FileRows":
        """Per-row records counted from the manifest or a stored index (read only when
        there is neither); packed blocks by one pass over their `__rows__`."""
        if not packed:
            return cls(path, record_index.count(path)[0])
        starts = np.concatenate([[0], np.cumsum(block_rows(path))]).astype(np.int64)
        return cls(path, int(starts[-1]), starts)

    def records(self, first_row: int, end_row: int) -> Iterator[_Record]:
        """The records holding rows [first_row, end_row) of this file, each cut to them."""
        if self.block_starts is None:
            for offset, data in _file_records(self.path, first_row, end_row):
                yield _Record(self.path, offset, data)
            return
        starts = self.block_starts
        first = int(np.searchsorted(starts, first_row, side="right")) - 1
        end = int(np.searchsorted(starts, end_row, side="left"))
        for number, (offset, data) in enumerate(_file_records(self.path, first, end), first):
            begins, ends = int(starts[number]), int(starts[number + 1])
            yield _Record(self.path, offset, data, ends - begins,
                          max(0, first_row - begins), max(0, ends - end_row))


def reader_shares(rows: int, batch_size: int, ranks: int = 1, workers: int = 1,
                  drop_last: bool = False) -> list[tuple[int, int]]:
    """[first, end) of the rows each reader reads, reader `rank * workers + worker`: whole
    batches, split between ranks first and then between each rank's workers, as evenly as
    they go round, and the rows short of a batch at the end of the last share. So an epoch has
    at most one short batch, and ranks differ by at most one batch. With `drop_last` every
    rank gets the same number of full batches (what DDP needs: a rank with one step more
    waits forever in its all-reduce), and the epoch's last `full batches % ranks` batches and
    its short one are dropped, as DistributedSampler(drop_last=True) drops them."""
    full, rest = divmod(rows, batch_size)
    if drop_last:
        full, rest = full - full % ranks, 0
    per_rank = _split_batches(full, ranks)
    shares, first = [], 0
    for rank, batches in enumerate(per_rank):
        short = rest if rank == ranks - 1 else 0
        for worker, worker_batches in enumerate(_split_batches(batches, workers)):
            end = first + worker_batches * batch_size + (short if worker == workers - 1 else 0)
            shares.append((first, end))
            first = end
    return shares


def _split_batches(batches: int, parts: int) -> list[int]:
    each, extra = divmod(batches, parts)
    return [each + (part < extra) for part in range(parts)]


def _share_records(files: Sequence[FileRows], first: int, end: int) -> Iterator[_Record]:
    """The records holding rows [first, end) of `files` read one after another."""
    file_first = 0
    for file in files:
        file_end = file_first + file.rows
        if file_first < end and first < file_end:
            yield from file.records(max(first, file_first) - file_first,
                                    min(end, file_end) - file_first)
        file_first = file_end


def _batches_of(records: Iterator[_Record], decoder: RowDecoder, columns: list[_Column],
                batch_size: int, shuffle_buffer: int, seed: Optional[int]) -> Iterator[dict]:
    if shuffle_buffer > 1:
        records = _shuffled(records, shuffle_buffer, random.Random(seed))
    batcher = Batcher(columns, batch_size)
    group_size = max(1, _ROWS_PER_DECODE // max(1, decoder.layout.rows if decoder.layout
                                                else 1))
    for group in _groups(records, group_size):
        decoded = _decode(decoder, group)
        values, lengths = {}, {}
        for column, array in zip(columns, decoded.columns):
            values[column.name], found = _column_values(column, array, group)
            if found is not None:
                lengths[column.name] = found
        yield from batcher.add(decoded.num_rows, values, lengths)
    yield from batcher.flush()


def _schema_of(files: list[str], schema: Optional[schema_pb2.Schema]) -> schema_pb2.Schema:
    if schema is None:
        schema = schema_file.find_schema(files[0]) if files else None
        if schema is None:
            raise FileNotFoundError(f"no schema.pbtxt beside {files[:1]}; pass schema=")
    return schema


def _file_list(files: Union[str, Sequence[str]]) -> list[str]:
    return example_rows.record_files(files) if isinstance(files, str) else list(files)


def iter_batches(files: Union[str, Sequence[str]], schema: Optional[schema_pb2.Schema] = None,
                 batch_size: int = 1024, features: Optional[Sequence[str]] = None,
                 shuffle_buffer: int = 0, seed: Optional[int] = None,
                 records: Optional[tuple[int, int]] = None) -> Iterator[dict]:
    """Batches of `batch_size` rows (the last may be short) from `files`, rows carried from
    one file into the next.

    `schema` defaults to the schema.pbtxt stored beside the shards. `shuffle_buffer` > 1
    shuffles records (whole blocks of packed data) through a buffer of that many, seeded by
    `seed`; otherwise records come in file order. `files` may also be one folder of shards
    (`example_rows.record_files`). `records`: only records [first, end) of each file."""
    files = _file_list(files)
    schema = _schema_of(files, schema)
    columns = _columns(schema, features)
    read = (_Record(path, offset, data) for path in files
            for offset, data in _file_records(path, *(records or (0, None))))
    return _batches_of(read, RowDecoder(schema, [c.name for c in columns]), columns,
                       batch_size, shuffle_buffer, seed)


def epoch_files(files: Sequence[str], seed: Optional[int] = None, epoch: int = 0) -> list[str]:
    """`files` in name order, or with a seed shuffled, differently each epoch and identically
    on every reader (so that their shares of the rows stay a partition)."""
    files = sorted(files)
    if seed is not None:
        random.Random(seed * 1_000_003 + epoch).shuffle(files)
    return files


def rows_to_batch(rows: Sequence[dict], schema: schema_pb2.Schema,
                  features: Optional[Sequence[str]] = None) -> dict:
    """Rows as `random_access.ExampleSource` gives them (each feature an array of the row's
    values, empty when missing) -> the batch `iter_batches` would give for them: a missing
    scalar filled with the schema default, fixed shapes stacked, other features as flat
    values plus `<name>__lengths`."""
    batch = {}
    for column in _columns(schema, features if features is not None else list(rows[0])):
        values = [row[column.name] for row in rows]
        if column.kind == "scalar":
            batch[column.name] = np.array(
                [value[0] if len(value) else column.default for value in values], column.dtype)
        elif column.kind == "pixels":
            batch[column.name] = _row_pixels(column, values)
        elif column.kind == "fixed":
            batch[column.name] = np.stack(values).astype(column.dtype).reshape(
                len(rows), *column.shape)
        else:
            batch[column.name] = np.concatenate(
                [np.asarray(v, column.dtype) for v in values] or [np.zeros(0, column.dtype)])
            batch[column.name + LENGTHS_SUFFIX] = np.array([len(v) for v in values], np.int64)
    return batch


def _row_pixels(column: _Column, values: list) -> np.ndarray:
    size = int(np.prod(column.shape))
    pixels = np.empty((len(values), size), np.uint8)
    for index, value in enumerate(values):
        if len(value) != 1 or len(value[0]) != size:
            raise ValueError(f"row {index} of the batch: " + _not_pixels(
                column, len(value), len(value[0]) if len(value) == 1 else 0))
        pixels[index] = np.frombuffer(value[0], np.uint8)
    return pixels.reshape(len(values), *column.shape)


class StackFeatures:
    """A `TorchDataset` transform for numeric models: the features `names` (scalars, or
    fixed shapes flattened) as one [rows, columns] array of `dtype` under `into`, in that
    order; the batch's other features as they were.

    A DataLoader hands each array from a worker to the training process through a shared
    memory segment of its own, and that per-array cost, not the decode, bounds a reader with
    workers on narrow rows: one matrix instead of 15 features tripled the rows a second here
    (`python -m bench gpu-feed`'s two reader rows, bench/RESULTS.md)."""

    def __init__(self, names: Sequence[str], into: str = "features", dtype=np.float32):
        if not names:
            raise ValueError("StackFeatures needs at least one feature name")
        self.names, self.into, self.dtype = list(names), into, np.dtype(dtype)

    def __call__(self, batch: dict) -> dict:
        missing = [name for name in self.names if name not in batch]
        if missing:
            raise KeyError(f"StackFeatures: features {missing} are not in the batch (it has "
                           f"{sorted(batch)})")
        parts = []
        for name in self.names:
            values = batch[name]
            if name + LENGTHS_SUFFIX in batch:
                raise ValueError(f"StackFeatures: {name!r} has several values a row, which "
                                 f"have no fixed columns")
            if values.dtype == object:
                raise ValueError(f"StackFeatures: {name!r} is bytes, not numbers")
            parts.append(values.reshape(len(values), -1))
        rows = len(parts[0])
        stacked = np.empty((rows, sum(part.shape[1] for part in parts)), self.dtype)
        column = 0
        for part in parts:
            stacked[:, column:column + part.shape[1]] = part
            column += part.shape[1]
        kept = {name: values for name, values in batch.items() if name not in self.names}
        return {**kept, self.into: stacked}


class TorchDataset:
    """A PyTorch IterableDataset of numpy batches (use DataLoader(batch_size=None)).

    The rows of an epoch are split across DataLoader workers and distributed ranks as
    contiguous ranges of whole batches over the files (in name order, or with a seed in a new
    order each epoch: call `set_epoch(n)` before each epoch), so each row is read once, every
    batch is full but at most one per epoch, the last (dropped with `drop_last=True`), and
    each reader reads its files front to back. Ranks differ by at most one batch; under DDP
    set `drop_last=True`, which gives every rank the same number of steps (`reader_shares`).
    The rows per file are counted once, when the
    dataset is made: from the manifest or an index for per-row records, by reading each
    block's row count for packed ones. The class is built on first use, so importing this
    module needs no torch.

    `transform`, when given, is applied to each batch in the reader that cut it (a DataLoader
    worker), and what it returns is what the loader yields: work on whole batches that should
    run in the workers beside the reading, such as decoding images
    (`jpeg_crops.JpegCropsOnHost`) or stacking a numeric model's features into one matrix
    (`StackFeatures`, which a reader with workers needs to keep up with a GPU on narrow
    rows). It sees batches already cut, so their sizes stay as above as long as it keeps one
    output per row. With worker
    processes started by spawn or forkserver it is pickled: a module-level function or an
    instance of a module-level class."""

    def __new__(cls, *args, **kwargs):
        import torch.utils.data  # torch: 1.6 s to import, optional; the reader needs none

        class _Dataset(torch.utils.data.IterableDataset):
            def __init__(self, files: Union[str, Sequence[str]],
                         schema: Optional[schema_pb2.Schema] = None, batch_size: int = 1024,
                         features: Optional[Sequence[str]] = None, seed: Optional[int] = None,
                         shuffle_buffer: int = 16, rank: Optional[int] = None,
                         world_size: Optional[int] = None, drop_last: bool = False,
                         transform: Optional[Callable[[dict], Any]] = None):
                super().__init__()
                self.transform = transform
                self.files = _file_list(files)
                self.schema = _schema_of(self.files, schema)
                self.batch_size, self.drop_last = batch_size, drop_last
                self.features, self.seed, self.epoch = features, seed, 0
                self.shuffle_buffer = shuffle_buffer if seed is not None else 0
                self.rank, self.world_size = rank, world_size
                packed = RowDecoder(self.schema).layout is not None
                self.file_rows = {path: FileRows.of(path, packed) for path in self.files}

            def set_epoch(self, epoch: int) -> None:
                self.epoch = epoch

            def __iter__(self) -> Iterator:
                import torch.distributed as dist  # torch: 3 s to import, optional

                rank, world = self.rank, self.world_size
                if rank is None:
                    initialised = dist.is_available() and dist.is_initialized()
                    rank = dist.get_rank() if initialised else 0
                    world = dist.get_world_size() if initialised else 1
                info = torch.utils.data.get_worker_info()
                worker, workers = (info.id, info.num_workers) if info else (0, 1)
                files = [self.file_rows[path]
                         for path in epoch_files(self.files, self.seed, self.epoch)]
                first, end = reader_shares(sum(f.rows for f in files), self.batch_size,
                                           world, workers, self.drop_last)[
                    rank * workers + worker]
                columns = _columns(self.schema, self.features)
                reader_seed = None if self.seed is None else \
                    hash((self.seed, self.epoch, rank, worker)) & 0xFFFFFFFF
                batches = _batches_of(_share_records(files, first, end),
                                      RowDecoder(self.schema, [c.name for c in columns]),
                                      columns, self.batch_size, self.shuffle_buffer,
                                      reader_seed)
                return batches if self.transform is None else map(self.transform, batches)

        return _Dataset(*args, **kwargs)
