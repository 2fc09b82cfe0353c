"""The Examples a Transform reads: each split's files, each input's key in the analyzer cache,
and their rows as Arrow batches (the codec's compiled decoder) and tensors (tf.Transform's own
adapter for tf.Examples)."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import queue
import threading
import uuid
from typing import Iterator, Optional, Union

from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import fileio, tfrecord_io
from tfrecord_shards.codec import parser

# Rows a batch holds at most: large enough that TensorFlow's per-call cost vanishes, small
# enough that a wide schema's batch stays in tens of MB.
BATCH_ROWS = 1 << 16


def split_files(examples_dir: str, split: str) -> str:
    return fileio.join(examples_dir, f"Split-{split}", "*")


def split_paths(examples_dir: str, split: str) -> list[str]:
    return sorted(fileio.glob(split_files(examples_dir, split)))


def dataset_key(examples_dir: str) -> str:
    """The analyzer cache's name for one input's analysis: stable for the same Examples
    artifact (its folder), so a span seen in an earlier window is found again."""
    return "examples-" + hashlib.sha256(examples_dir.rstrip("/").encode()).hexdigest()[:16]


def analysis_key(options, raw_schema: schema_pb2.Schema) -> str:
    """Everything besides an input's rows (`dataset_key`) and the traced graph that an
    analyzer cache entry's result depends on: the analyzed split, the schema, the settings
    that choose and shape the preprocessing_fn (a module file by its content) and the versions
    of the libraries that compute the statistics (tf.Transform, TensorFlow, tfx_bsl, ours).
    A change to any of them misses the cache."""
    # tensorflow, tf.Transform, tfx_bsl (the analysis's sketches import it): 2.2 s to import;
    # only the cache key needs them.
    import tensorflow as tf
    import tensorflow_transform as tft
    import tfx_bsl

    from components.transform.statistics import THINNING_SHARE

    try:
        ours = importlib.metadata.version("tfrecord-pipeline")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        ours = "unknown"
    module = hashlib.sha256(fileio.read_bytes(options.module_file)).hexdigest() \
        if options.module_file else None
    parts = {
        "analyze_split": options.analyze_split, "analysis": options.analysis,
        "preprocessing_fn": options.preprocessing_fn, "module_file": module,
        "label_key": options.label_key, "task": options.task,
        "piece_records": options.piece_records,
        "image_storage": options.image_storage, "image_shape": options.image_shape,
        "schema": hashlib.sha256(_analysed_schema(raw_schema).SerializeToString(
            deterministic=True)).hexdigest(),
        "versions": [tft.__version__, tf.__version__, tfx_bsl.__version__, ours],
        # A kept sketch is merged only with one fed the same way.
        "quantiles_thinning": THINNING_SHARE}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _analysed_schema(schema: schema_pb2.Schema) -> schema_pb2.Schema:
    """`schema` without what only validation reads: the values of string domains (a rolling
    window's inferred schema gains one with each new value seen, and a vocabulary is counted
    from the rows, not the domain), drift and skew comparators, distribution constraints,
    value counts, and the presence of a feature without a shape (a span with a missing value
    where the last had none infers another min_fraction; tf.Transform parses such a feature
    as variable-length whatever its presence)."""
    kept = schema_pb2.Schema()
    kept.CopyFrom(schema)
    for domain in kept.string_domain:
        del domain.value[:]
    for feature in kept.feature:
        for name in ("string_domain", "drift_comparator", "skew_comparator",
                     "distribution_constraints", "value_count", "value_counts"):
            feature.ClearField(name)
        if not feature.HasField("shape"):
            feature.ClearField("presence")
    return kept


def tensor_adapter_config(raw_schema: schema_pb2.Schema):
    """How raw examples become tensors: tfx_bsl's TFXIO for tf.Examples, whose adapter
    tf.Transform's own analysis uses."""
    # tfx_bsl.public.tfxio: 1.4 s to import (TensorFlow); only the tensor adapter needs it.
    from tfx_bsl.public import tfxio

    return tfxio.TFExampleRecord(file_pattern="unused", schema=raw_schema,
                                 telemetry_descriptors=["tfrp", "transform"]
                                 ).TensorAdapterConfig()


class RawTensorAdapter:
    """A batch of decoded raw rows -> the tensors tf.Transform's adapter for tf.Examples
    (tfx_bsl's `TensorAdapter`, configured by `tensor_adapter_config`) makes of it, with a
    faster way for the commonest column: a feature of one number or string at most a row
    (a var-len SparseTensor of width 1). Its coordinates come from the row lengths in numpy
    (one shared tensor for every column present in each row), and a string column's values
    are cut from the Arrow data buffer by one `tf.strings.substr`, instead of tfx_bsl's
    coordinates for every value and a Python bytes object a string. On the taxi columns,
    34.5k rows a batch: 8.4 ms against 14.5 ms a batch. A column with a row of several
    values, and any other representation, goes through tfx_bsl's adapter for that tensor
    alone; a test holds the two to the same tensors."""

    def __init__(self, raw_schema: schema_pb2.Schema):
        # tfx_bsl, pyarrow, TensorFlow: only Transform's passes need them.
        import pyarrow as pa
        from tfx_bsl.tfxio import tensor_adapter

        config = tensor_adapter_config(raw_schema)
        self._arrow_schema = config.arrow_schema
        # tfx_bsl's adapter for each tensor alone: a column the faster way cannot take costs
        # its own conversion, not every column's again.
        self._one_tensor = {
            name: tensor_adapter.TensorAdapter(tensor_adapter.TensorAdapterConfig(
                self._arrow_schema, {name: representation}))
            for name, representation in config.tensor_representations.items()}
        # {tensor name: its column's index}, for the var-len columns of numbers and strings.
        self._columns: dict[str, int] = {}
        for name, representation in config.tensor_representations.items():
            if representation.WhichOneof("kind") != "varlen_sparse_tensor":
                continue
            index = self._arrow_schema.get_field_index(
                representation.varlen_sparse_tensor.column_name)
            kind = self._arrow_schema.field(index).type if index >= 0 else None
            if kind is not None and pa.types.is_large_list(kind) and (
                    kind.value_type in (pa.float32(), pa.int64())
                    or pa.types.is_large_binary(kind.value_type)):
                self._columns[name] = index

    def type_specs(self) -> dict:
        """{tensor name: tf.TypeSpec}, in the order of tfx_bsl's adapter for them all."""
        return {name: adapter.TypeSpecs()[name] for name, adapter in self._one_tensor.items()}

    def to_tensors(self, batch) -> dict:
        """{tensor name: eager tensor} of `batch` (a RecordBatch of the raw schema's
        columns, as `record_batches` gives them)."""
        # numpy 0.06 s, TensorFlow 2.6 s to import: only Transform's passes need them.
        import numpy as np
        import tensorflow as tf

        if not batch.schema.equals(self._arrow_schema):
            raise ValueError(f"a batch of columns {batch.schema.names} where the raw schema "
                             f"has {self._arrow_schema.names}")
        rows = batch.num_rows
        every_row = None  # (coordinates, dense shape) of a column present in every row
        tensors = {}
        for name, index in self._columns.items():
            array = batch.column(index)
            offsets = array.offsets.to_numpy()
            lengths = np.diff(offsets)
            present = int(offsets[-1] - offsets[0])
            if present == rows and rows:
                if not (lengths == 1).all():
                    continue  # several values in a row: tfx_bsl's way
                if every_row is None:
                    coordinates = np.zeros((rows, 2), np.int64)
                    coordinates[:, 0] = np.arange(rows)
                    every_row = (tf.constant(coordinates), tf.constant([rows, 1], tf.int64))
                indices, shape = every_row
            else:
                if lengths.max(initial=0) > 1:
                    continue
                coordinates = np.zeros((present, 2), np.int64)
                coordinates[:, 0] = np.flatnonzero(lengths)
                indices = tf.constant(coordinates)
                shape = tf.constant([rows, 1 if present else 0], tf.int64)
            tensors[name] = tf.SparseTensor(indices, _values(array.values.slice(
                int(offsets[0]), present)), shape)
        for name, adapter in self._one_tensor.items():
            if name not in tensors:
                tensors[name] = adapter.ToBatchTensors(batch, produce_eager_tensors=True)[name]
        return tensors


def _values(values):
    """An Arrow array of numbers or large_binary (no nulls) as one eager tensor."""
    # numpy 0.06 s, TensorFlow 2.6 s to import: only Transform's passes need them.
    import numpy as np
    import tensorflow as tf

    if str(values.type) != "large_binary":
        return tf.constant(values.to_numpy())
    ends = np.frombuffer(values.buffers()[1], np.int64, len(values) + 1, values.offset * 8)
    data = values.buffers()[2]
    blob = bytes(memoryview(data)[ends[0]:ends[-1]]) if data is not None else b""
    return tf.strings.substr(tf.constant(blob), tf.constant(ends[:-1] - ends[0]),
                             tf.constant(np.diff(ends)))


def record_batches(path: Union[str, tfrecord_io.RecordRange], raw_schema: schema_pb2.Schema,
                   keep: Optional[str] = None) -> Iterator:
    """A file's (or a range of one's) tf.Examples as Arrow record batches of at most
    BATCH_ROWS rows, decoded by the codec's compiled decoder in a thread of their own, a
    batch or two ahead of the caller:
    inflating, unframing and decoding release the GIL, as the caller's TensorFlow graph
    does, so the two share the cores. With `keep` (a path or URI), that thread also writes
    the batches there in their compact form (`ArrowCopy`), for `kept_batches` to give back
    without decoding again; the copy appears only once every batch has been read."""
    per_decode = min(BATCH_ROWS, parser.records_per_decode(raw_schema))

    def decoded() -> Iterator:
        for block in tfrecord_io.iter_record_blocks(path):
            for part in block.parts(per_decode):
                yield parser.decode_record_block(part, raw_schema)

    def decoded_and_kept() -> Iterator:
        with ArrowCopy(keep) as copy:
            for batch in decoded():
                copy.write(batch)
                yield batch

    return read_ahead(decoded_and_kept() if keep else decoded(), READ_AHEAD)


def kept_batches(path: str) -> Iterator:
    """The record batches an `ArrowCopy` kept at `path`, read a batch or two ahead of the
    caller in a thread of their own (reading releases the GIL), one batch in memory at a
    time."""
    return read_ahead(_read_copy(path), READ_AHEAD)


def _read_copy(path: str) -> Iterator:
    # pyarrow, numpy: 0.2 s to import; only the Arrow copy of a split needs them.
    import pyarrow as pa
    from components.transform.compact_batches import expanded

    size = fileio.size(path)
    decoded_schemas: dict = {}
    with (pa.OSFile(path, "rb") if not fileio.is_remote(path)
          else fileio.open_file(path, "rb")) as source:
        # One stream a batch (`ArrowCopy`), one after another; none in a file without records.
        while source.tell() < size:
            for stored in pa.ipc.open_stream(source):
                yield expanded(stored, decoded_schemas)


class ArrowCopy:
    """Writes record batches to `path` (a path or URI) in their compact form
    (`compact_batches`), each an Arrow IPC stream of its own (its schema says its form),
    uncompressed: reading it back is a copy of the bytes, against inflating, unframing and
    decoding the tf.Examples again. A context manager: the file appears under its name only
    when the block ends without an error (on a disk written beside it and renamed; on an
    object store an object appears whole when it is closed), and a failed or abandoned copy
    is removed, so a reader finds a complete copy or none. A file without records gives an
    empty file."""

    def __init__(self, path: str):
        self.path = path
        self._remote = fileio.is_remote(path)
        self._partial = path if self._remote else f"{path}.{uuid.uuid4().hex[:8]}.partial"
        self._sink = None

    def __enter__(self) -> "ArrowCopy":
        # pyarrow: 0.1 s to import; only the Arrow copy of a split needs it.
        import pyarrow as pa

        self._sink = fileio.open_file(self._partial, "wb") if self._remote \
            else pa.OSFile(self._partial, "wb")
        return self

    def write(self, batch) -> None:
        # pyarrow, numpy: 0.2 s to import; only the Arrow copy of a split needs them.
        import pyarrow as pa
        from components.transform.compact_batches import compact

        stored = compact(batch)
        with pa.ipc.new_stream(self._sink, stored.schema) as writer:
            writer.write_batch(stored)

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:
            self._sink.close()
            if not self._remote:
                fileio.rename(self._partial, self.path)
            return
        # An error, or the reader stopped early (GeneratorExit): nothing may look complete.
        try:
            self._sink.close()
        finally:
            if fileio.exists(self._partial):
                fileio.remove(self._partial)


READ_AHEAD = 2


def read_ahead(items: Iterator, depth: int) -> Iterator:
    """`items`, made by a thread of its own at most `depth` ahead of the caller; an error is
    raised where the item it stopped would have been. Closing the iterator early ends the
    thread."""
    done = object()
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def fill() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    # The caller stopped: end `items` here, in the thread that runs it, so
                    # what it holds open (a file being kept) is let go of now.
                    getattr(items, "close", lambda: None)()
                    return
            put((done, None))
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            put((done, error))

    thread = threading.Thread(target=fill, name="read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = slots.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item
    finally:
        stop.set()
        thread.join()
