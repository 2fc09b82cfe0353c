"""The columnar tf.Example encoder and decoder against tfx_bsl's as the references, and the
batched TFRecord framing against TensorFlow's writer and reader."""
from __future__ import annotations

import dataclasses
import gzip
import os
import tempfile

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings, strategies as st
from tensorflow_metadata.proto.v0 import schema_pb2
from tfx_bsl.coders import example_coder

from tfrecord_shards import record_index, tfrecord_io
from tfrecord_shards.codec import parser, serializer

TYPES = {"int": (pa.int64(), tf.int64, schema_pb2.INT),
         "float": (pa.float32(), tf.float32, schema_pb2.FLOAT),
         "bytes": (pa.binary(), tf.string, schema_pb2.BYTES)}
VALUES = {"int": st.integers(-2 ** 63, 2 ** 63 - 1),
          "float": st.floats(width=32, allow_nan=False),
          "bytes": st.binary(max_size=300)}  # any bytes, so non-UTF-8 and empty ones too


@st.composite
def tables(draw):
    """A batch of list<int64 | float32 | binary> columns, as `to_example_batch` makes them:
    null rows, empty lists, long lists and every value of each type."""
    rows = draw(st.integers(0, 12))
    names = draw(st.lists(st.text("abcdefghijklmnopqrstuvwxyz_.", min_size=1, max_size=150),
                          min_size=1, max_size=5, unique=True))
    arrays, kinds = [], {}
    for name in names:
        kind = draw(st.sampled_from(sorted(TYPES)))
        cells = draw(st.lists(st.none() | st.lists(VALUES[kind], max_size=6),
                              min_size=rows, max_size=rows))
        arrays.append(pa.array(cells, pa.list_(TYPES[kind][0])))
        kinds[name] = kind
    return pa.RecordBatch.from_arrays(arrays, names), kinds


def _schema(kinds: dict) -> schema_pb2.Schema:
    schema = schema_pb2.Schema()
    for name, kind in kinds.items():
        schema.feature.add(name=name, type=TYPES[kind][2])
    return schema


def _parsed(serialized: list[bytes], kinds: dict) -> dict:
    spec = {name: tf.io.VarLenFeature(TYPES[kind][1]) for name, kind in kinds.items()}
    parsed = tf.io.parse_example(tf.constant(serialized, tf.string), spec) if serialized \
        else {}
    return {name: (value.indices.numpy().tolist(), value.values.numpy().tolist())
            for name, value in parsed.items()}


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_encoder_equals_tfx_bsl_through_every_parser(table):
    batch, kinds = table
    ours = serializer.encode_examples(batch)
    reference = example_coder.RecordBatchToExamplesEncoder().encode(batch)
    assert len(ours) == len(reference) == batch.num_rows
    # TensorFlow's parser gives the same sparse values and positions.
    assert _parsed(ours, kinds) == _parsed(reference, kinds)
    # tfx_bsl's decoder (what StatisticsGen and Transform read with) gives the same table.
    schema = _schema(kinds)
    if batch.num_rows:
        assert parser.decode_examples(ours, schema).to_pydict() == \
            parser.decode_examples(reference, schema).to_pydict()
    # The protos are equal once the reference's empty Features (its nulls) are left out.
    for mine, theirs in zip(ours, reference):
        expected = tf.train.Example.FromString(theirs)
        for name in list(expected.features.feature):
            if expected.features.feature[name].WhichOneof("kind") is None:
                del expected.features.feature[name]
        assert tf.train.Example.FromString(mine) == expected
    # Rows written in a given order (ExampleGen groups a batch's rows by split this way) are
    # the same records, in that order.
    order = np.random.default_rng(batch.num_rows).permutation(batch.num_rows)
    assert serializer.encode_examples_array(batch, order).to_pylist() == \
        [ours[i] for i in order]


def test_null_is_an_absent_key_and_empty_list_an_empty_feature():
    batch = pa.RecordBatch.from_arrays(
        [pa.array([None, [], [7]], pa.list_(pa.int64()))], ["n"])
    examples = [tf.train.Example.FromString(e) for e in serializer.encode_examples(batch)]
    assert "n" not in examples[0].features.feature
    assert examples[1].features.feature["n"].WhichOneof("kind") == "int64_list"
    assert list(examples[1].features.feature["n"].int64_list.value) == []
    assert list(examples[2].features.feature["n"].int64_list.value) == [7]


@pytest.mark.parametrize("lengths", [[0], [1, 0, 127, 128, 300, 70_000], list(range(200))])
def test_framing_is_byte_identical_to_tensorflows_writer(tmp_path, lengths):
    rng = np.random.default_rng(len(lengths))
    records = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    framed, ends = tfrecord_io.frame_records(pa.array(records, pa.binary()))
    path = str(tmp_path / "reference.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    with open(path, "rb") as f:
        assert framed.tobytes() == f.read()
    assert ends.tolist() == np.cumsum([n + 16 for n in lengths]).tolist()


def test_both_crc32c_paths_agree_with_google_crc32c():
    """Framing uses the CPU's CRC32 instruction where there is one and a table elsewhere;
    both must give the library's checksum, at every length and misalignment."""
    import google_crc32c

    from tfrecord_shards.codec import framing

    data = np.random.default_rng(7).integers(0, 256, 4_096, dtype=np.uint8)
    for start, count in [(0, 0), (0, 1), (3, 7), (1, 8), (5, 9), (0, 64), (13, 1_000)]:
        expected = google_crc32c.value(data[start:start + count].tobytes())
        assert framing.crc32c_by_table(data, start, count, framing.CRC32C_TABLE) == expected
        if framing._has_crc32_instruction():
            assert framing._crc32c_by_instruction(data, start, count, framing.CRC32C_TABLE) == \
                expected


def _blocks_decoded(records: list[bytes], schema, compression: str, block_bytes: int,
                    max_records: int = 1 << 20):
    """The records framed into a file, then read back a block at a time and decoded, at most
    `max_records` records at a time."""
    framed, _ = tfrecord_io.frame_records(pa.array(records, pa.binary()))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "data.tfrecord")
        with (gzip.open if compression == "gzip" else open)(path, "wb") as f:
            f.write(framed.tobytes())
        batches = [parser.decode_record_block(part, schema)
                   for block in tfrecord_io.iter_record_blocks(path, block_bytes)
                   for part in block.parts(max_records)]
    assert all(len(b) for b in batches)
    return batches


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), st.sampled_from(["gzip", "none"]), st.sampled_from([64, 1_000, 1 << 20]),
       st.sampled_from([1, 3, 1 << 20]))
def test_block_decoder_equals_tfx_bsls_decoder(table, compression, block_bytes, max_records):
    """Every type, null, empty list and non-UTF-8 value decodes as tfx_bsl's decoder (what
    StatisticsGen and Transform read with) decodes it, whatever the block size (records
    split across blocks included) and however many records are decoded at a time, from gzip
    and plain files."""
    batch, kinds = table
    schema = _schema(kinds)
    records = serializer.encode_examples(batch)
    if not records:
        return
    # The schema may hold a feature no record has: it decodes as nulls, as tfx_bsl's does.
    schema.feature.add(name="not in any record", type=schema_pb2.FLOAT)
    decoded = pa.Table.from_batches(_blocks_decoded(records, schema, compression,
                                                    block_bytes, max_records))
    assert decoded.num_rows == len(records)
    expected = pa.Table.from_batches([parser.decode_examples(records, schema)])
    assert decoded.schema == expected.schema
    assert decoded.to_pydict() == expected.to_pydict()


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_block_decoder_reads_every_valid_encoding_as_tfx_bsl_does():
    """Encodings our encoder never writes but other writers may: numbers one field each
    (unpacked), unknown fields, a Feature with no list (absent), keys in any order, a
    feature outside the schema."""
    unpacked_ints = b"".join(b"\x08" + _varint(v) for v in (5, -1, 2 ** 63 - 1))
    unpacked_floats = b"".join(b"\x0d" + np.float32(v).tobytes() for v in (1.5, -2.0))
    def entry(name: bytes, feature: bytes) -> bytes:
        return _field(1, _field(1, name) + _field(2, feature))
    records = [
        _field(1, entry(b"f", _field(2, unpacked_floats)) + entry(b"i", _field(3, unpacked_ints))
               + entry(b"extra", _field(1, _field(1, b"x")))),
        _field(1, entry(b"i", _field(3, _field(1, _varint(7)) + b"\x08\x09"))
               + b"\x10\x01"  # an unknown varint field inside Features
               + entry(b"b", _field(1, _field(1, b"\xff") + _field(1, b""))) + entry(b"f", b"")),
        b"\x18\x05" + _field(1, entry(b"b", _field(1, b""))),  # an unknown field of Example
        b"",  # an Example with no features at all
    ]
    schema = _schema({"i": "int", "f": "float", "b": "bytes"})
    [decoded] = _blocks_decoded(records, schema, "none", 1 << 20)
    expected = parser.decode_examples(records, schema)
    assert decoded.to_pydict() == expected.to_pydict()
    assert decoded.to_pydict()["i"] == [[5, -1, 2 ** 63 - 1], [7, 9], None, None]


def test_records_per_decode_bounds_the_decoders_working_memory():
    wide = _schema({f"f{i}": "float" for i in range(1_000)})
    assert parser.records_per_decode(wide) * 1_000 <= parser.DECODE_CELLS
    assert parser.records_per_decode(_schema({"n": "int"})) == parser.DECODE_CELLS


def test_block_decoder_names_the_file_and_offset_of_a_bad_record(tmp_path):
    good = serializer.encode_examples(pa.RecordBatch.from_arrays(
        [pa.array([[1]] * 3, pa.list_(pa.int64()))], ["n"]))
    bad = b"\x0a\x05\x0a\x09"  # a Features message longer than the record
    framed, ends = tfrecord_io.frame_records(pa.array(good + [bad], pa.binary()))
    path = str(tmp_path / "data.tfrecord")
    framed.tofile(path)
    schema = _schema({"n": "int"})
    [block] = tfrecord_io.iter_record_blocks(path)
    for part in (block, list(block.parts(2))[1]):  # a part names the file's offset too
        with pytest.raises(ValueError, match=f"^{path}: record at byte offset {ends[2]} is "
                                             "not a tf.Example$"):
            parser.decode_record_block(part, schema)
    wrong = _schema({"n": "float"})
    with pytest.raises(ValueError, match=f"^{path}: record at byte offset 0: feature 'n' is "
                                         "not a float_list, which its schema type FLOAT"):
        parser.decode_record_block(block, wrong)


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_block_reader_reads_through_the_object_store_route_too(tmp_path, compression):
    """A URI (gs://, s3://) is opened through pyarrow.fs, whose files are not Python's; a
    file:// path takes the same route on this machine."""
    records = [bytes([i % 256]) * (i * 37 % 500) for i in range(300)]
    framed, _ = tfrecord_io.frame_records(pa.array(records, pa.binary()))
    path = str(tmp_path / "data.tfrecord")
    with (gzip.open if compression == "gzip" else open)(path, "wb") as f:
        f.write(framed.tobytes())
    ranges = record_index.RecordIndex.build(path).ranges(70)
    assert len(ranges) == (1 if compression == "gzip" else 5)  # gzip.open: one member
    for where in (path, "file://" + path):
        read = [block.buffer[start:end].tobytes()
                for block in tfrecord_io.iter_record_blocks(where, block_bytes=4_096)
                for start, end in zip(block.starts, block.ends)]
        assert read == records
        # Ranges of it, each read from its own bytes alone, as a Beam worker reads a piece.
        read = [block.buffer[start:end].tobytes() for piece in ranges
                for block in tfrecord_io.iter_record_blocks(
                    dataclasses.replace(piece, path=where), block_bytes=4_096)
                for start, end in zip(block.starts, block.ends)]
        assert read == records


@pytest.mark.parametrize("level", [1, 3, 6, 9])  # ISA-L's levels, then zlib's
def test_gzip_members_at_every_level_read_back_through_tensorflow(tmp_path, level):
    from tfrecord_shards import shards

    records = [bytes([i % 256]) * (i * 53 % 900) for i in range(400)]
    framed, ends = tfrecord_io.frame_records(pa.array(records, pa.binary()))
    data = framed.tobytes()
    members = [shards.gzip_member(data[start:end], level)
               for start, end in zip([0, int(ends[150])], [int(ends[150]), len(data)])]
    assert members == [shards.gzip_member(data[start:end], level)
                       for start, end in zip([0, int(ends[150])], [int(ends[150]), len(data)])]
    path = str(tmp_path / "data.tfrecord.gz")
    with open(path, "wb") as f:
        f.write(b"".join(members))
    assert gzip.decompress(b"".join(members)) == data
    read = [r.numpy() for r in tf.data.TFRecordDataset(path, "GZIP")]
    assert read == records
