"""The codec's writing half: Arrow record batches -> serialized tf.Examples, and the Schema a
profile of the data implies. It imports no TensorFlow, so encoding workers stay light.
"""
from __future__ import annotations

from typing import Optional

from tensorflow_metadata.proto.v0 import schema_pb2

# Column kinds, ordered so that merging two kinds takes the wider one (CSV cells and JSON values
# widen the same way TFX's CSV decoder does: bool < int < float < bytes).
NULL, BOOL, INT, FLOAT, BYTES = "null", "bool", "int", "float", "bytes"
_KIND_ORDER = {NULL: 0, BOOL: 1, INT: 2, FLOAT: 3, BYTES: 4}
_KIND_TO_SCHEMA = {NULL: schema_pb2.BYTES, BOOL: schema_pb2.INT, INT: schema_pb2.INT,
                   FLOAT: schema_pb2.FLOAT, BYTES: schema_pb2.BYTES}
# Up to this many distinct values, a string column is recorded as a categorical domain.
MAX_DOMAIN_VALUES = 50


def widen(a: str, b: str) -> str:
    return a if _KIND_ORDER[a] >= _KIND_ORDER[b] else b


def arrow_kind(arrow_type) -> tuple[str, bool]:
    """(kind, is_list) of an Arrow type; nested lists and structs are not tf.Example values."""
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
        return INT, is_list
    raise TypeError(f"Arrow type {arrow_type} has no tf.Example equivalent")


def arrow_value_type(kind: str):
    """The Arrow type a column of `kind` is converted to before encoding."""
    import pyarrow as pa

    # float32 is what tf.train.FloatList stores: float64 sources are narrowed here, once.
    return {NULL: pa.binary(), BOOL: pa.int64(), INT: pa.int64(), FLOAT: pa.float32(),
            BYTES: pa.binary()}[kind]


def to_example_column(array, kind: str, is_list: bool):
    """Converts one Arrow column to the list<T> layout the tfx_bsl encoder takes.

    A null scalar becomes a null list, which the encoder writes as an empty Feature: parsers
    (tf.io.parse_example, tfx_bsl's decoder, TFDV) treat it as absent, as they do for stock
    CsvExampleGen output.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    target = arrow_value_type(kind)
    # tf.Example decoders give lists even for scalars; keep the data's own layout.
    if is_list or pa.types.is_list(array.type) or pa.types.is_large_list(array.type) or \
            pa.types.is_fixed_size_list(array.type):
        if pa.types.is_large_list(array.type) or pa.types.is_fixed_size_list(array.type):
            array = array.cast(pa.list_(array.type.value_type))
        values = _cast_values(array.values, kind, target)
        return pa.ListArray.from_arrays(array.offsets, values, mask=array.is_null()) \
            if array.null_count else pa.ListArray.from_arrays(array.offsets, values)
    values = _cast_values(array, kind, target)
    offsets = np.arange(len(values) + 1, dtype=np.int32)
    if values.null_count:
        valid = np.asarray(values.is_valid())
        offsets[1:] = np.cumsum(valid, dtype=np.int32)
        values = pc.drop_null(values)
        return pa.ListArray.from_arrays(pa.array(offsets), values,
                                        mask=pa.array(~valid))
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _cast_values(values, kind: str, target):
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if kind == BOOL and pa.types.is_boolean(values.type):
        return values.cast(pa.int8()).cast(pa.int64())
    if (pa.types.is_timestamp(values.type) or pa.types.is_date(values.type)):
        return values.cast(pa.int64())
    if kind == BYTES and not (pa.types.is_binary(values.type) or pa.types.is_string(values.type)
                              or pa.types.is_large_binary(values.type)
                              or pa.types.is_large_string(values.type)):
        values = pc.cast(values, pa.string())
    return values.cast(target)


def to_example_batch(batch, columns: dict[str, tuple[str, bool]]):
    """A RecordBatch of list<T> columns, ready for `encode_examples`.

    `columns` maps name -> (kind, is_list) from the whole-dataset profile; a column the batch
    lacks (a file without it) is all null.
    """
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
    return encode_examples_array(example_batch).to_pylist()


# ---------------------------------------------------------------------------------------------
# The columnar encoder
# ---------------------------------------------------------------------------------------------
# A tf.Example is Example{features: Features{map<string, Feature> feature}}, and a Feature holds
# one of BytesList (field 1), FloatList (2, packed float32) or Int64List (3, packed varints).
# Serialized, each row is
#   0x0A len(features) | per feature: 0x0A len(entry) 0x0A len(name) name 0x12 len(feature)
#                                     kind len(list) [0x0A len(packed values)] values
# Every length and header is computed for all rows of a column at once with numpy, the values
# are Arrow's own buffers, and Arrow's C++ string kernels concatenate the pieces row by row.
# A null row writes no entry at all, so readers outside TensorFlow (which choke on an empty
# Feature) read it as absent, exactly as TensorFlow's parsers do.
_LIST_TAG = {INT: 0x1A, FLOAT: 0x12, BYTES: 0x0A}  # Feature.kind field, wire type 2


def _varint_sizes(values):
    import numpy as np

    values = np.asarray(values, dtype=np.uint64)
    sizes = np.ones(len(values), np.int64)
    top = int(values.max()) if len(values) else 0
    k = 1
    while k < 10 and top >= 1 << (7 * k):  # only as many passes as the largest value needs
        sizes += values >= np.uint64(1 << (7 * k))
        k += 1
    return sizes


def _put_varints(out, positions, values, sizes) -> None:
    """Writes each value as a protobuf varint of `sizes` bytes at `positions` of `out`."""
    import numpy as np

    values = np.asarray(values, dtype=np.uint64)
    for k in range(int(sizes.max()) if len(sizes) else 0):
        here = sizes > k
        shifted = (values[here] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = np.where(sizes[here] > k + 1, 0x80, 0).astype(np.uint64)
        out[positions[here] + k] = (shifted | more).astype(np.uint8)


def _binary(data, offsets, valid=None):
    """A pyarrow binary array over a uint8 buffer and int64 row offsets, without copying;
    rows where `valid` is False are null."""
    import numpy as np
    import pyarrow as pa

    kind = pa.large_binary() if offsets[-1] >= 2 ** 31 else pa.binary()
    offsets = offsets.astype(np.int64 if kind == pa.large_binary() else np.int32)
    validity = None if valid is None or valid.all() else \
        pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(kind, len(offsets) - 1,
                                 [validity, pa.py_buffer(offsets), pa.py_buffer(data)])


def _layout(rows: int, parts: list[tuple]):
    """Per-row byte strings made of constant bytes and varints, laid out back to back.

    Each part is (bytes constant or uint64 varint values, mask); a row whose mask is False
    (None: every row) leaves the part out. Returns (uint8 data, int64 row offsets)."""
    import numpy as np

    sizes = []
    for value, mask in parts:
        size = np.full(rows, len(value), np.int64) if isinstance(value, bytes) \
            else _varint_sizes(value)
        sizes.append(size if mask is None else np.where(mask, size, 0))
    if rows and all(size.min() == size.max() for size in sizes):
        return _uniform_layout(rows, parts, [int(size[0]) for size in sizes])
    offsets = np.zeros(rows + 1, np.int64)
    np.cumsum(np.sum(sizes, axis=0), out=offsets[1:])
    data = np.zeros(int(offsets[-1]), np.uint8)
    position = offsets[:-1].copy()
    for (value, _), size in zip(parts, sizes):
        if isinstance(value, bytes):
            written = size > 0
            for k, byte in enumerate(value):
                data[position[written] + k] = byte
        else:
            _put_varints(data, position, value, size)
        position += size
    return data, offsets


def _uniform_layout(rows: int, parts: list[tuple], widths: list[int]):
    """`_layout` when every row has the same shape (the usual case: lengths under 128 are one
    varint byte): a [rows, width] array filled a column at a time."""
    import numpy as np

    template = np.zeros(sum(widths), np.uint8)
    position = 0
    for (value, _), width in zip(parts, widths):
        if isinstance(value, bytes) and width:
            template[position:position + width] = np.frombuffer(value, np.uint8)
        position += width
    out = np.empty((rows, len(template)), np.uint8)
    out[:] = template  # every constant at once; the varints are written over it
    position = 0
    for (value, _), width in zip(parts, widths):
        if not isinstance(value, bytes):
            value = np.asarray(value, np.uint64)
            for k in range(width):
                byte = (value >> np.uint64(7 * k)) & np.uint64(0x7F)
                out[:, position + k] = byte | np.uint64(0x80 if k + 1 < width else 0)
        position += width
    return out.ravel(), np.arange(rows + 1, dtype=np.int64) * out.shape[1]


def _list_payload(column, kind: str):
    """(payload binary array, its bytes per row, values per row) of one list column: the
    packed values of a number list (without their length header) or the repeated entries of a
    bytes list."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets = column.offsets.to_numpy().astype(np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    offsets -= start
    values = column.values.slice(start, end - start)
    counts = np.diff(offsets)
    if kind == FLOAT:
        raw = np.ascontiguousarray(values.to_numpy(zero_copy_only=False), np.float32)
        return _binary(raw.view(np.uint8), offsets * 4), counts * 4, counts
    if kind == INT:
        numbers = values.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
        sizes = _varint_sizes(numbers)
        ends = np.zeros(len(numbers) + 1, np.int64)
        np.cumsum(sizes, out=ends[1:])
        data = np.zeros(int(ends[-1]), np.uint8)
        _put_varints(data, ends[:-1], numbers, sizes)
        row_ends = ends[offsets]
        return _binary(data, row_ends), np.diff(row_ends), counts
    if pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type):
        values = values.cast(pa.binary())
    lengths = pc.binary_length(values).to_numpy(zero_copy_only=False).astype(np.uint64)
    heads = _binary(*_layout(len(lengths), [(b"\x0a", None), (lengths, None)]))
    entries = pc.binary_join_element_wise(heads, values.cast(pa.binary()), b"")
    entry_ends = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(1 + _varint_sizes(lengths) + lengths.astype(np.int64), out=entry_ends[1:])
    per_row = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), entries)
    return pc.binary_join(per_row, b""), np.diff(entry_ends[offsets]), counts


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_examples_array(example_batch):
    """Serialized tf.Examples as one Arrow binary array, one per row.

    Parsed by tf.io.parse_example or tfx_bsl, the result equals what tfx_bsl's
    RecordBatchToExamplesEncoder gives for the same batch (tests/test_codec.py checks this on
    random tables), except that a null row leaves its feature out instead of writing an empty
    Feature; both read as absent."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = example_batch.num_rows
    pieces, total = [], np.zeros(rows, np.int64)
    for name, column in zip(example_batch.schema.names, example_batch.columns):
        kind, _ = arrow_kind(column.type)
        kind = BYTES if kind == NULL else (INT if kind == BOOL else kind)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        present = column.is_valid().to_numpy(zero_copy_only=False)
        payload, payload_bytes, counts = _list_payload(column, kind)
        # A number list is one packed field (0x0A, length, values), left out when empty.
        packed = (counts > 0) if kind != BYTES else np.zeros(rows, bool)
        list_bytes = payload_bytes + np.where(packed, 1 + _varint_sizes(payload_bytes), 0)
        feature_bytes = 1 + _varint_sizes(list_bytes) + list_bytes
        key = _varint(len(name.encode("utf-8"))) + name.encode("utf-8")
        entry_bytes = 1 + len(key) + 1 + _varint_sizes(feature_bytes) + feature_bytes
        # Headers are laid out for every row and then marked null where the row is null, which
        # keeps the layout uniform; the final join skips nulls. (A null row's list may still
        # own values in Arrow; then its payload is blanked too.)
        has_values = packed | ~present
        nonempty = None if has_values.all() else has_values
        header_parts = [
            (b"\x0a", None), (entry_bytes.astype(np.uint64), None),
            (b"\x0a" + key + b"\x12", None), (feature_bytes.astype(np.uint64), None),
            (bytes([_LIST_TAG[kind]]), None), (list_bytes.astype(np.uint64), None)]
        if packed.any():
            header_parts += [(b"\x0a", nonempty), (payload_bytes.astype(np.uint64), nonempty)]
        headers = _binary(*_layout(rows, header_parts), valid=present)
        if counts[~present].any():
            payload = pc.if_else(pa.array(present), payload, pa.scalar(b"", payload.type))
        pieces += [headers, payload]
        total += np.where(present, 1 + _varint_sizes(entry_bytes) + entry_bytes, 0)
    head = _binary(*_layout(rows, [(b"\x0a", None), (total.astype(np.uint64), None)]))
    if not pieces:
        return head
    return pc.binary_join_element_wise(head, *pieces, b"", null_handling="skip")


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
