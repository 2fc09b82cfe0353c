"""The codec's writing half: Arrow record batches -> serialized tf.Examples, and the Schema a
profile of the data implies. It imports no TensorFlow, so encoding workers stay light.
"""
from __future__ import annotations

from typing import Optional

from tensorflow_metadata.proto.v0 import schema_pb2

# Column kinds, ordered so that merging two kinds takes the wider one (CSV cells and JSON values
# widen the same way TFX's CSV decoder does: bool < int < float < bytes). TIME (dates and
# timestamps) stands apart: it merges with nulls and itself only, anything else makes bytes.
NULL, BOOL, INT, FLOAT, BYTES, TIME = "null", "bool", "int", "float", "bytes", "time"
_KIND_ORDER = {NULL: 0, BOOL: 1, INT: 2, FLOAT: 3, BYTES: 4}
_KIND_TO_SCHEMA = {NULL: schema_pb2.BYTES, BOOL: schema_pb2.INT, INT: schema_pb2.INT,
                   FLOAT: schema_pb2.FLOAT, BYTES: schema_pb2.BYTES, TIME: schema_pb2.INT}
# Every date and timestamp becomes one int64: seconds since the epoch, UTC. The schema says so
# with this tag and a comment on the feature.
TIME_TAG = "tfrp.time=epoch_seconds"
TIME_COMMENT = ("int64: seconds since 1970-01-01T00:00:00Z (a date is its midnight UTC, a "
                "timestamp without a zone is read as UTC, fractions of a second are dropped)")
# Up to this many distinct values, a string column is recorded as a categorical domain.
MAX_DOMAIN_VALUES = 50


def widen(a: str, b: str) -> str:
    if a == b:
        return a
    if TIME in (a, b):
        return TIME if NULL in (a, b) else BYTES
    return a if _KIND_ORDER[a] >= _KIND_ORDER[b] else b


def arrow_kind(arrow_type) -> tuple[str, bool]:
    """(kind, is_list) of an Arrow type; nested lists and structs are not tf.Example values."""
    # pyarrow: 0.3 s to import; TIME_TAG's readers (components/transform) need none
    import pyarrow as pa

    is_list = pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or \
        pa.types.is_fixed_size_list(arrow_type)
    value_type = arrow_type.value_type if is_list else arrow_type
    if pa.types.is_null(value_type):
        return NULL, is_list
    if pa.types.is_boolean(value_type):
        return BOOL, is_list
    if pa.types.is_integer(value_type):
        return INT, is_list
    if pa.types.is_floating(value_type) or pa.types.is_decimal(value_type):
        return FLOAT, is_list
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type) or \
            pa.types.is_binary(value_type) or pa.types.is_large_binary(value_type) or \
            pa.types.is_dictionary(value_type):
        return BYTES, is_list
    if pa.types.is_timestamp(value_type) or pa.types.is_date(value_type):
        return TIME, is_list
    if pa.types.is_time(value_type):  # a time of day, with no date: kept as its text
        return BYTES, is_list
    raise TypeError(f"Arrow type {arrow_type} has no tf.Example equivalent")


def arrow_value_type(kind: str):
    """The Arrow type a column of `kind` is converted to before encoding."""
    # pyarrow: 0.3 s to import; TIME_TAG's readers (components/transform) need none
    import pyarrow as pa

    # float32 is what tf.train.FloatList stores: float64 sources are narrowed here, once.
    return {NULL: pa.binary(), BOOL: pa.int64(), INT: pa.int64(), FLOAT: pa.float32(),
            BYTES: pa.binary(), TIME: pa.int64()}[kind]


def to_example_column(array, kind: str, is_list: bool):
    """Converts one Arrow column to the list<T> layout the tfx_bsl encoder takes.

    A null scalar becomes a null list, which the encoder writes as an empty Feature: parsers
    (tf.io.parse_example, tfx_bsl's decoder, TFDV) treat it as absent, as they do for stock
    CsvExampleGen output.
    """
    # pyarrow(.compute): 0.5 s to import; TIME_TAG's readers (components/transform) need none
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    # tf.Example decoders give lists even for scalars; keep the data's own layout.
    if is_list or pa.types.is_list(array.type) or pa.types.is_large_list(array.type) or \
            pa.types.is_fixed_size_list(array.type):
        if pa.types.is_large_list(array.type) or pa.types.is_fixed_size_list(array.type):
            array = array.cast(pa.list_(array.type.value_type))
        values = cast_values(array.values, kind)
        return pa.ListArray.from_arrays(array.offsets, values, mask=array.is_null()) \
            if array.null_count else pa.ListArray.from_arrays(array.offsets, values)
    values = cast_values(array, kind)
    offsets = np.arange(len(values) + 1, dtype=np.int32)
    if values.null_count:
        valid = np.asarray(values.is_valid())
        offsets[1:] = np.cumsum(valid, dtype=np.int32)
        values = pc.drop_null(values)
        return pa.ListArray.from_arrays(pa.array(offsets), values,
                                        mask=pa.array(~valid))
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def cast_values(values, kind: str):
    """A flat Arrow array of a column's values in the type the encoder takes for `kind`."""
    # pyarrow(.compute): 0.5 s to import; TIME_TAG's readers (components/transform) need none
    import pyarrow as pa
    import pyarrow.compute as pc

    target = arrow_value_type(kind)
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if kind == BOOL and pa.types.is_boolean(values.type):
        return values.cast(pa.int8()).cast(pa.int64())
    if pa.types.is_timestamp(values.type) or pa.types.is_date(values.type):
        if kind == BYTES:  # a column that is not all times keeps its dates as text
            return pc.cast(values, pa.string()).cast(target)
        return epoch_seconds(values)
    if kind == BYTES and not (pa.types.is_binary(values.type) or pa.types.is_string(values.type)
                              or pa.types.is_large_binary(values.type)
                              or pa.types.is_large_string(values.type)):
        values = pc.cast(values, pa.string())
    if kind == FLOAT and pa.types.is_integer(values.type):
        # A column that is float elsewhere: its ints are stored as float32, like its floats
        # (a checked cast refuses ints above 2**24, which float32 rounds).
        return pc.cast(values, target, safe=False)
    return values.cast(target)


def epoch_seconds(values):
    """Dates and timestamps (any unit, any zone) as int64 seconds since the epoch, UTC, floored
    (a cast alone would round times before 1970 up)."""
    # numpy + pyarrow: 0.3 s to import; TIME_TAG's readers (components/transform) need neither
    import numpy as np
    import pyarrow as pa

    if pa.types.is_date(values.type):
        counts, per_unit = values.cast(pa.date32()).cast(pa.int32()), 86_400
    else:
        counts, per_unit = values.cast(pa.timestamp("us", values.type.tz)).cast(pa.int64()), None
    numbers = counts.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    seconds = numbers * per_unit if per_unit else np.floor_divide(numbers, 1_000_000)
    return pa.array(seconds, pa.int64(), mask=np.asarray(counts.is_null()) if counts.null_count
                    else None)


def to_example_batch(batch, columns: dict[str, tuple[str, bool]]):
    """A RecordBatch of list<T> columns, ready for `encode_examples`.

    `columns` maps name -> (kind, is_list) from the whole-dataset profile; a column the batch
    lacks (a file without it) is all null.
    """
    # pyarrow: 0.3 s to import; TIME_TAG's readers (components/transform) need none
    import pyarrow as pa

    arrays, names = [], []
    for name, (kind, is_list) in columns.items():
        index = batch.schema.get_field_index(name)
        if index < 0:
            arrays.append(pa.nulls(batch.num_rows, pa.list_(arrow_value_type(kind))))
        else:
            arrays.append(to_example_column(batch.column(index), kind, is_list))
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names)


def encode_examples(example_batch) -> list[bytes]:
    """Serialized tf.Examples, one per row of a batch from `to_example_batch`."""
    records = encode_examples_array(example_batch)
    # Arrow's to_numpy makes the bytes objects in C++: ~0.35 us a row, against ~0.9 us for
    # slicing one bytes object in a Python loop and ~1.2 us for to_pylist (measured).
    return records.to_numpy(zero_copy_only=False).tolist()


# ---------------------------------------------------------------------------------------------
# The columnar encoder
# ---------------------------------------------------------------------------------------------
# Each column is sized and then written for all rows by compiled loops (codec/example_loops.py) over
# Arrow's own buffers. A null row writes no entry at all, so readers outside TensorFlow (which
# choke on an empty Feature) read it as absent, exactly as TensorFlow's parsers do.


def _binary(data, offsets):
    """A pyarrow binary array over a uint8 buffer and int64 row offsets, without copying."""
    # numpy + pyarrow: 0.3 s to import; TIME_TAG's readers (components/transform) need neither
    import numpy as np
    import pyarrow as pa

    kind = pa.large_binary() if offsets[-1] >= 2 ** 31 else pa.binary()
    offsets = offsets.astype(np.int64 if kind == pa.large_binary() else np.int32)
    return pa.Array.from_buffers(kind, len(offsets) - 1,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _binary_buffers(values):
    """(int64 value offsets, uint8 data) of a binary or string array, without copying data."""
    # numpy + pyarrow: 0.3 s to import; TIME_TAG's readers (components/transform) need neither
    import numpy as np
    import pyarrow as pa

    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        values = values.cast(pa.large_binary() if pa.types.is_large_string(values.type)
                             else pa.binary())
    width = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    offsets = np.frombuffer(values.buffers()[1], width)[
        values.offset:values.offset + len(values) + 1].astype(np.int64)
    data = values.buffers()[2]
    return offsets, np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)


class _Column:
    """One list column's arrays in the form the compiled loops take: offsets from 0 and only
    the values this batch's rows own."""

    def __init__(self, name: str, column):
        # numpy + pyarrow: 0.3 s to import; TIME_TAG's readers (components/transform) need neither
        import numpy as np
        import pyarrow as pa

        # codec.wire (numba): 0.5 s to import; only encoding needs it, not TIME_TAG's readers
        from tfrecord_shards.codec import wire

        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        kind, _ = arrow_kind(column.type)
        kind = BYTES if kind == NULL else (INT if kind == BOOL else kind)
        self.kind = {FLOAT: wire.FLOAT_KIND, INT: wire.INT_KIND, BYTES: wire.BYTES_KIND}[kind]
        name_bytes = name.encode("utf-8")
        self.key = b"\x0a" + _varint(len(name_bytes)) + name_bytes + b"\x12"
        self.present = wire.frozen(column.is_valid().to_numpy(zero_copy_only=False))
        offsets = column.offsets.to_numpy().astype(np.int64)
        values = column.values.slice(offsets[0], offsets[-1] - offsets[0])
        self.offsets = wire.frozen(offsets - offsets[0])
        # The compiled loops take every array; a kind leaves the others empty.
        self.ints = wire.frozen(np.zeros(0, np.uint64))
        self.value_offsets = wire.frozen(np.zeros(0, np.int64))
        if kind == FLOAT:
            numbers = values.to_numpy(zero_copy_only=False)
            self.values = wire.frozen(np.ascontiguousarray(numbers, np.float32).view(np.uint8))
        elif kind == INT:
            numbers = values.to_numpy(zero_copy_only=False)
            self.values = self.ints = wire.frozen(numbers.astype(np.int64).view(np.uint64))
        else:
            value_offsets, data = _binary_buffers(values)
            self.values = wire.frozen(data[value_offsets[0]:value_offsets[-1]])
            self.value_offsets = wire.frozen(value_offsets - value_offsets[0])

    def payload(self):
        """Payload bytes per row (-1: absent)."""
        # codec.wire (numba): 0.5 s to import; only encoding needs it, not TIME_TAG's readers
        from tfrecord_shards.codec import example_loops

        return example_loops.payload_bytes(self.kind, self.offsets, self.present, self.ints,
                                           self.value_offsets)


def encode_examples_array(example_batch, order=None):
    """Serialized tf.Examples as one Arrow binary array, one per row, in the batch's order or
    in `order` (row indices) when given.

    Parsed by tf.io.parse_example or tfx_bsl, the result equals what tfx_bsl's
    RecordBatchToExamplesEncoder gives for the same batch (tests/test_codec.py checks this on
    random tables), except that a null row leaves its feature out instead of writing an empty
    Feature; both read as absent."""
    # numpy: 0.1 s to import; TIME_TAG's readers (components/transform) need none
    import numpy as np

    # codec.wire (numba): 0.5 s to import; only encoding needs it, not TIME_TAG's readers
    from tfrecord_shards.codec import example_loops, wire

    rows = example_batch.num_rows
    columns = [_Column(name, column)
               for name, column in zip(example_batch.schema.names, example_batch.columns)]
    totals = np.zeros(rows, np.int64)
    payload = np.empty((len(columns), rows), np.int64)
    offsets = np.empty((len(columns), rows + 1), np.int64)
    # Each kind's values go end to end in one array, and each column's offsets are moved to
    # where its values start there.
    parts: dict[int, list] = {wire.FLOAT_KIND: [], wire.INT_KIND: [], wire.BYTES_KIND: []}
    bases = {wire.FLOAT_KIND: 0, wire.INT_KIND: 0, wire.BYTES_KIND: 0}
    value_offsets, data_base = [], 0
    for index, column in enumerate(columns):
        payload[index] = column.payload()
        example_loops.add_entry_sizes(totals, payload[index], column.kind != wire.BYTES_KIND,
                             len(column.key))
        offsets[index] = column.offsets + bases[column.kind]
        parts[column.kind].append(column.values)
        if column.kind == wire.FLOAT_KIND:
            bases[column.kind] += len(column.values) // 4
        elif column.kind == wire.INT_KIND:
            bases[column.kind] += len(column.values)
        else:
            value_offsets.append(column.value_offsets + data_base)
            bases[column.kind] += len(column.value_offsets)
            data_base += len(column.values)

    def joined(arrays: list, dtype):
        return wire.frozen(np.concatenate(arrays) if arrays else np.zeros(0, dtype))

    keys = [column.key for column in columns]
    key_offsets = np.zeros(len(keys) + 1, np.int64)
    np.cumsum([len(key) for key in keys], out=key_offsets[1:])
    out, ends = example_loops.write_rows(
        wire.frozen(totals), wire.frozen(np.array([column.kind for column in columns], np.int64)),
        wire.frozen(payload), wire.frozen(offsets),
        joined(parts[wire.FLOAT_KIND], np.uint8), joined(parts[wire.INT_KIND], np.uint64),
        joined(value_offsets, np.int64), joined(parts[wire.BYTES_KIND], np.uint8),
        wire.frozen(np.frombuffer(b"".join(keys), np.uint8)), wire.frozen(key_offsets),
        wire.frozen(np.arange(rows, dtype=np.int64) if order is None
                    else np.asarray(order, np.int64)))
    return _binary(out, ends)


def schema_from_profile(columns: dict[str, tuple[str, bool]], rows: int,
                        non_null: dict[str, int],
                        string_values: dict[str, Optional[set]]) -> schema_pb2.Schema:
    """A tensorflow_metadata Schema for the profiled columns.

    Presence records how often a value was there; scalars get value_count 1..1 (which is how
    our readers, and stock SchemaGen, tell a scalar from a list); string columns with at most
    MAX_DOMAIN_VALUES distinct values get a string domain.
    """
    schema = schema_pb2.Schema()
    for name, (kind, is_list) in columns.items():
        feature = schema.feature.add(name=name, type=_KIND_TO_SCHEMA[kind])
        present = non_null.get(name, 0)
        feature.presence.min_count = 1 if present else 0
        feature.presence.min_fraction = (present / rows) if rows else 0.0
        if not is_list:
            feature.value_count.min = 1
            feature.value_count.max = 1
        if kind == BOOL:
            feature.int_domain.min, feature.int_domain.max = 0, 1
            feature.int_domain.is_categorical = True
        if kind == TIME:
            feature.annotation.tag.append(TIME_TAG)
            feature.annotation.comment.append(TIME_COMMENT)
        values = string_values.get(name)
        texts = _utf8_texts(values) if kind == BYTES and values and \
            len(values) <= MAX_DOMAIN_VALUES else None
        if texts:
            domain = schema.string_domain.add(name=name)
            domain.value.extend(sorted(texts))
            feature.domain = name
    return schema


def _utf8_texts(values) -> Optional[list[str]]:
    """The values as text, or None when one is not UTF-8: binary data (image bytes, hashes)
    gets no string domain, which could not hold its values."""
    try:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
    except UnicodeDecodeError:
        return None
