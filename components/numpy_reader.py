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
import functools
import random
from typing import Iterator, Optional, Sequence

import numpy as np
from tensorflow_metadata.proto.v0 import schema_pb2

from components import packing, tfrecord_io
from components.codec import parser, schema_file

LENGTHS_SUFFIX = packing.LENGTHS_SUFFIX
# Up to this many values, iterating the protobuf container beats decoding its wire form.
_SHORT_LIST = 32
_NUMPY_TYPES = {schema_pb2.INT: np.int64, schema_pb2.FLOAT: np.float32,
                schema_pb2.BYTES: object}


@functools.lru_cache(maxsize=None)
def example_class():
    """tf.train.Example as a protobuf class of its own (same wire format), built from the
    three-message definition in a private descriptor pool, so it needs no TensorFlow and never
    clashes with TensorFlow's own registration when both are loaded."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="tfrp_example.proto", package="tensorflow",
                                               syntax="proto3")
    label = descriptor_pb2.FieldDescriptorProto
    for name, kind in (("BytesList", label.TYPE_BYTES), ("FloatList", label.TYPE_FLOAT),
                       ("Int64List", label.TYPE_INT64)):
        message = proto.message_type.add(name=name)
        field = message.field.add(name="value", number=1, type=kind,
                                  label=label.LABEL_REPEATED)
        if kind != label.TYPE_BYTES:
            field.options.packed = True
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, name in ((1, "bytes_list"), (2, "float_list"), (3, "int64_list")):
        feature.field.add(name=name, number=number, type=label.TYPE_MESSAGE,
                          label=label.LABEL_OPTIONAL, oneof_index=0,
                          type_name=".tensorflow." + name.title().replace("_", ""))
    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=label.TYPE_STRING, label=label.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=label.TYPE_MESSAGE,
                    label=label.LABEL_OPTIONAL, type_name=".tensorflow.Feature")
    features.field.add(name="feature", number=1, type=label.TYPE_MESSAGE,
                       label=label.LABEL_REPEATED,
                       type_name=".tensorflow.Features.FeatureEntry")
    example = proto.message_type.add(name="Example")
    example.field.add(name="features", number=1, type=label.TYPE_MESSAGE,
                      label=label.LABEL_OPTIONAL, type_name=".tensorflow.Features")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def _values(feature, dtype) -> np.ndarray:
    """A Feature's values as a numpy array. Number lists are read from their packed wire form
    (one memcpy for floats, vectorised varints for ints): iterating the protobuf container
    element by element costs several times more."""
    kind = feature.WhichOneof("kind")
    if kind is None:
        return np.zeros(0, dtype)
    message = getattr(feature, kind)
    if dtype is object:
        values = message.value
        return np.array(list(values), dtype=object) if values else np.zeros(0, object)
    if len(message.value) <= _SHORT_LIST:
        return np.fromiter(message.value, dtype, count=len(message.value))
    wire = message.SerializeToString()  # 0x0A, varint length, packed values
    start = 2
    while wire[start - 1] & 0x80:  # the length's varint ends at the first byte below 0x80
        start += 1
    if dtype == np.float32:
        return np.frombuffer(wire, "<f4", offset=start).copy()
    return _varints(np.frombuffer(wire, np.uint8, offset=start)).view(np.int64)


def _varints(data: np.ndarray) -> np.ndarray:
    """Protobuf varints back to back in `data` -> uint64 values, without a Python loop."""
    if not len(data) or data.max() < 0x80:  # every value below 128: one byte each
        return data.astype(np.uint64)
    last = data < 0x80
    starts = np.flatnonzero(np.concatenate([[True], last[:-1]]))
    group = np.cumsum(np.concatenate([[0], last[:-1]]))
    position = np.arange(len(data)) - starts[group]
    parts = (data & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    return np.add.reduceat(parts, starts)  # the 7-bit parts never overlap: add is or


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
        always = feature.HasField("presence") and feature.presence.min_fraction >= 1.0
        shape = tuple(d.size for d in feature.shape.dim)
        if feature.HasField("shape") and always and shape not in ((), (1,)):
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
        batch = {}
        for column in self._columns:
            values = np.concatenate(self._parts[column.name]) if self._parts[column.name] \
                else np.zeros(0, column.dtype)
            if column.kind == "ragged":
                lengths = np.concatenate(self._lengths[column.name])
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


def _row_values(example, column: _Column):
    """(values as stored for one row, count) of one per-row Example."""
    feature = example.features.feature.get(column.name)
    values = _values(feature, column.dtype) if feature is not None \
        else np.zeros(0, column.dtype)
    if column.kind == "scalar":
        return (values[:1] if len(values) else np.array([column.default], column.dtype)), 1
    return values, len(values)


def _stored_values(example, column: _Column) -> np.ndarray:
    """A block's values of one column as stored, dictionary-coded strings decoded."""
    features = example.features.feature
    dictionary = features.get(column.name + packing.DICTIONARY_SUFFIX)
    if dictionary is not None:
        codes = _values(features[column.name + packing.CODES_SUFFIX], np.int64)
        return _values(dictionary, object)[codes] if len(codes) else np.zeros(0, object)
    feature = features.get(column.name)
    return _values(feature, column.dtype) if feature is not None \
        else np.zeros(0, column.dtype)


def _block_values(example, column: _Column, rows: int):
    """(values, lengths or None) of one column of a packed block's `rows` real rows."""
    values = _stored_values(example, column)
    if column.kind == "fixed" or (column.kind == "scalar" and
                                  column.name + LENGTHS_SUFFIX not in example.features.feature):
        width = int(np.prod(column.shape)) if column.kind == "fixed" else 1
        return values[:rows * width], None
    lengths = _values(example.features.feature[column.name + LENGTHS_SUFFIX],
                      np.int64)[:rows]
    values = values[:int(lengths.sum())]
    if column.kind == "scalar":  # nullable scalar: 0 or 1 value per row
        dense = np.full(rows, column.default, column.dtype)
        dense[lengths > 0] = values
        return dense, None
    return values, lengths


def _file_records(path: str, stride: int = 1, offset: int = 0) -> Iterator[bytes]:
    for index, (_, record) in enumerate(tfrecord_io.iter_records(path)):
        if index % stride == offset:
            yield record


def _shuffled(records: Iterator[bytes], buffer: int, rng: random.Random) -> Iterator[bytes]:
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
    file order."""
    files = list(files)
    if schema is None:
        schema = schema_file.find_schema(files[0]) if files else None
        if schema is None:
            raise FileNotFoundError(f"no schema.pbtxt beside {files[:1]}; pass schema=")
    columns = _columns(schema, features)
    rows_per_block = packing.packed_rows(schema)
    example_type = example_class()
    batcher = _Batcher(columns, batch_size)
    records = (record for path in files
               for record in _file_records(path, record_stride, record_offset))
    if shuffle_buffer > 1:
        records = _shuffled(records, shuffle_buffer, random.Random(seed))
    for record in records:
        example = example_type.FromString(record)
        if rows_per_block:
            rows = int(_values(example.features.feature[packing.ROWS_KEY], np.int64)[0])
            values, lengths = {}, {}
            for column in columns:
                values[column.name], found = _block_values(example, column, rows)
                if found is not None:
                    lengths[column.name] = found
        else:
            rows, values, lengths = 1, {}, {}
            for column in columns:
                values[column.name], count = _row_values(example, column)
                if column.kind == "ragged":
                    lengths[column.name] = np.array([count], np.int64)
        yield from batcher.add(rows, values, lengths)
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
                self.files, self.schema, self.batch_size = list(files), schema, batch_size
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
