"""The columnar tf.Example encoder against tfx_bsl's encoder as the reference, and the batched
TFRecord framing against TensorFlow's writer."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings, strategies as st
from tensorflow_metadata.proto.v0 import schema_pb2
from tfx_bsl.coders import example_coder

from components import tfrecord_io
from components.codec import parser, serializer

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

    from components.codec import wire

    data = np.random.default_rng(7).integers(0, 256, 4_096, dtype=np.uint8)
    for start, count in [(0, 0), (0, 1), (3, 7), (1, 8), (5, 9), (0, 64), (13, 1_000)]:
        expected = google_crc32c.value(data[start:start + count].tobytes())
        assert wire.crc32c_by_table(data, start, count, wire.CRC32C_TABLE) == expected
        if wire._has_crc32_instruction():
            assert wire._crc32c_by_instruction(data, start, count, wire.CRC32C_TABLE) == \
                expected
