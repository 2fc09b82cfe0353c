"""Packed records (tfrecord_shards/packing/): the layout, the writer, and every reader of blocks
(the TensorFlow input function, the numpy reader, the Spark decoder, `tfrp inspect`) on both
layouts; the packed input chain's settings."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import packing
from tfrecord_shards.packing.layout import ROWS_KEY
from tfrecord_shards.packing.write import pack_batch
from components.trainer.input import _dataset_options, _prefetch, build_dataset
from components.trainer.options import InputConfig

ROW_SCHEMA = """
feature { name: "fare" type: FLOAT value_count { min: 1 max: 1 } presence { min_fraction: 0.5 } }
feature { name: "hour" type: INT shape { dim { size: 1 } } presence { min_fraction: 1.0 } }
feature { name: "company" type: BYTES value_count { min: 1 max: 1 } }
feature { name: "tags" type: BYTES }
feature { name: "point" type: FLOAT shape { dim { size: 2 } } presence { min_fraction: 1.0 } }
"""


ROW_SCHEMA_WITH_A_FIXED_STRING = ROW_SCHEMA + """
feature { name: "kind" type: BYTES shape { dim { size: 1 } } presence { min_fraction: 1.0 } }
"""


def pack(table, schema, rows: int, version: int = packing.layout.CURRENT_VERSION) -> list:
    """`table` packed `rows` to a block under the row `schema`, in layout `version`."""
    return pack_batch(table, packing.PackedLayout.from_schema(
        packing.annotate(schema, rows, version)))


PACKED_TABLE = pa.table({
    "fare": pa.array([1.5, None, 3.25, 4.0, None, 6.5, 7.0, 8.0, 9.5, None], pa.float32()),
    "hour": pa.array(list(range(10)), pa.int64()),
    "company": pa.array([b"a", b"b", None, b"d", b"\xff\xfe", None, b"a", b"", b"i", b"a"]),
    "tags": pa.array([[b"x"], [], None, [b"y", b"z"], [b"w"], [], [b"v"] * 3, None, [],
                      [b"\x80"]], pa.list_(pa.binary())),
    "point": pa.array([[float(i), -float(i)] for i in range(10)], pa.list_(pa.float32())),
    "kind": pa.array([b"cab", b"\xc3", b"cab", b"", b"van"] * 2),
})
# What every reader gives back. A block stores a missing list and an empty one alike (0
# values), so both read as []; a missing scalar is null where the reader has nulls (Spark,
# inspect) and the schema default where it has none (TensorFlow, numpy).
PACKED_EXPECTED = {
    "hour": list(range(10)),
    "company": PACKED_TABLE["company"].to_pylist(),
    "fare": PACKED_TABLE["fare"].to_pylist(),
    "tags": [v or [] for v in PACKED_TABLE["tags"].to_pylist()],
    "point": PACKED_TABLE["point"].to_pylist(),
    "kind": PACKED_TABLE["kind"].to_pylist(),
}


def _read_with_tensorflow(path, schema) -> dict:
    got = {k: [] for k in PACKED_EXPECTED}
    for features, label in build_dataset(path, schema, "hour", config=InputConfig(
            batch_size=3, training=False, num_epochs=1)):
        assert features["fare"].shape[1] == 1 and features["point"].shape[1] == 2
        got["hour"] += label.numpy().ravel().tolist()
        for name in ("fare", "company", "kind"):
            got[name] += features[name].numpy().ravel().tolist()
        got["tags"] += features["tags"].to_list()
        got["point"] += features["point"].numpy().tolist()
    return got


def _read_with_numpy(path, schema) -> dict:
    from shard_readers import numpy_reader

    got = {k: [] for k in PACKED_EXPECTED}
    for batch in numpy_reader.iter_batches([path], schema, batch_size=4):
        for name in ("hour", "fare", "company", "kind"):
            got[name] += batch[name].ravel().tolist()
        got["point"] += batch["point"].tolist()
        ends = np.cumsum(batch["tags__lengths"])
        got["tags"] += [batch["tags"][end - n:end].tolist()
                        for n, end in zip(batch["tags__lengths"], ends)]
    return got


def _read_with_spark_decoder(path, schema) -> dict:
    from spark_shards.read import _FileDecoder

    return pa.Table.from_batches(list(_FileDecoder(schema, os.path.dirname(path), [], [[path]])(
        [pa.record_batch([pa.array([0])], names=["task"])]))).to_pydict()


def _read_with_inspect(path, schema) -> dict:
    from tfrecord_shards import example_rows

    rows = list(example_rows.iter_rows(path, schema=schema))
    return {name: [row[name] for row in rows] for name in PACKED_EXPECTED}


def _with_defaults(expected: dict) -> dict:
    return {**expected, "fare": [v if v is not None else 0.0 for v in expected["fare"]],
            "company": [v or b"" for v in expected["company"]]}


PACKED_READERS = {
    "tensorflow": (_read_with_tensorflow, _with_defaults),
    "numpy": (_read_with_numpy, _with_defaults),
    "spark": (_read_with_spark_decoder, lambda expected: expected),
    "inspect": (_read_with_inspect, lambda expected: expected),
}


@pytest.mark.parametrize("reader", sorted(PACKED_READERS))
@pytest.mark.parametrize("version", [packing.layout.DICTIONARY_STRINGS,
                                     packing.layout.PLAIN_STRINGS])
def test_packed_round_trip_with_missing_lists_and_a_short_last_block(tmp_path, version, reader):
    """Every reader of packed blocks gives back the rows, in the current layout (strings
    dictionary-coded) and in the one before it (strings stored as they are), which must stay
    readable."""
    row_schema = text_format.Parse(ROW_SCHEMA_WITH_A_FIXED_STRING, schema_pb2.Schema())
    schema = packing.annotate(row_schema, 4, version)
    assert packing.packed_rows(schema) == 4
    blocks = pack(PACKED_TABLE, row_schema, 4, version)
    assert len(blocks) == 3  # 4 + 4 + 2
    last = tf.train.Example.FromString(blocks[-1])
    assert last.features.feature[ROWS_KEY].int64_list.value == [2]
    stored = set(last.features.feature)
    if version == packing.layout.DICTIONARY_STRINGS:
        assert {"kind__dictionary", "kind__codes", "tags__dictionary", "tags__lengths"} <= stored
        assert not stored & {"kind", "company", "tags"}
        # The last block's rows of "kind" (b"", b"van") and its padding (b"" again): each
        # distinct value stored once, the padding coded like the rows.
        assert sorted(last.features.feature["kind__dictionary"].bytes_list.value) == \
            [b"", b"van"]
        assert len(last.features.feature["kind__codes"].int64_list.value) == 4
    else:
        assert {"kind", "company", "tags"} <= stored and \
            not stored & {"kind__dictionary", "kind__codes"}
    path = str(tmp_path / "packed.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for block in blocks:
            writer.write(block)
    read, expected = PACKED_READERS[reader]
    assert read(path, schema) == expected(PACKED_EXPECTED)


@pytest.mark.parametrize("reader", sorted(PACKED_READERS))
def test_packed_round_trip_with_every_block_full(tmp_path, reader):
    """With no short block, every stored value of a fixed feature is a row's, which the
    unpacker takes as it is instead of picking them out: the same rows come back."""
    row_schema = text_format.Parse(ROW_SCHEMA_WITH_A_FIXED_STRING, schema_pb2.Schema())
    schema = packing.annotate(row_schema, 4, packing.layout.CURRENT_VERSION)
    blocks = pack(PACKED_TABLE.slice(0, 8), row_schema, 4)
    assert [tf.train.Example.FromString(b).features.feature[ROWS_KEY].int64_list.value[0]
            for b in blocks] == [4, 4]
    path = str(tmp_path / "packed.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for block in blocks:
            writer.write(block)
    read, expected = PACKED_READERS[reader]
    assert read(path, schema) == {name: values[:8]
                                  for name, values in expected(PACKED_EXPECTED).items()}


def test_packed_rows_come_out_shuffled_and_whole_in_the_tensorflow_input_function(tmp_path):
    row_schema = text_format.Parse(ROW_SCHEMA_WITH_A_FIXED_STRING, schema_pb2.Schema())
    path = str(tmp_path / "packed.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for block in pack(PACKED_TABLE, row_schema, 4):
            writer.write(block)
    shuffled = build_dataset(path, packing.annotate(row_schema, 4), "hour", config=InputConfig(
        batch_size=4, training=True, num_epochs=1))
    hours = [h for _, label in shuffled for h in label.numpy().ravel().tolist()]
    assert sorted(hours) == list(range(10))


def test_schemas_written_before_the_layout_version_tag_still_name_their_layout():
    schema = text_format.Parse(ROW_SCHEMA, schema_pb2.Schema())
    schema.annotation.tag.extend(["tfrp.packed_rows=8", "tfrp.packed_strings=dictionary"])
    layout = packing.PackedLayout.from_schema(schema)
    assert (layout.rows, layout.version) == (8, packing.layout.DICTIONARY_STRINGS)
    assert layout.feature("company").dictionary and not layout.feature("fare").dictionary
    schema.annotation.tag.remove("tfrp.packed_strings=dictionary")
    assert packing.PackedLayout.from_schema(schema).version == packing.layout.PLAIN_STRINGS
    assert packing.PackedLayout.from_schema(text_format.Parse(
        ROW_SCHEMA, schema_pb2.Schema())) is None
    # Annotating again replaces both tags.
    assert [t for t in packing.annotate(schema, 16).annotation.tag
            if t.startswith("tfrp.packed")] == ["tfrp.packed_rows=16", "tfrp.packed_layout=2"]


EXACT_SCHEMA = """
feature { name: "id" type: INT shape { dim { size: 1 } } presence { min_fraction: 1.0 } }
feature { name: "bits" type: FLOAT shape { dim { size: 1 } } presence { min_fraction: 1.0 } }
feature { name: "big" type: INT shape { dim { size: 1 } } presence { min_fraction: 1.0 } }
feature { name: "pair" type: FLOAT shape { dim { size: 2 } } presence { min_fraction: 1.0 } }
feature { name: "name" type: BYTES shape { dim { size: 1 } } presence { min_fraction: 1.0 } }
"""


def test_shuffled_unpack_moves_every_row_whole_and_bit_exact(tmp_path):
    """The shuffled unpack moves numbers by scattering their bit patterns: -0.0, NaNs with
    payloads, infinities and int64's extremes must come through bit for bit, each row's
    features must stay together, and the padding of short blocks must be dropped."""
    rows = 1000
    ids = np.arange(rows, dtype=np.int64)
    specials = np.array([0x80000000, 0x7FC00001, 0xFFC12345, 0x7F800000, 0x00000001],
                        np.uint32)  # -0.0, two NaN payloads, +inf, the smallest subnormal
    bits = np.where(ids % 7 == 0, specials[ids % 5], (ids * 2654435761) % (1 << 32))
    bits = bits.astype(np.uint32)
    # A signalling NaN is quieted by any float conversion on the way in, scatter or not.
    signalling = ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x7FFFFF) != 0)
    bits = np.where(signalling, bits | 0x400000, bits).astype(np.uint32).view(np.float32)
    big = np.where(ids % 2 == 0, np.iinfo(np.int64).min + ids, np.iinfo(np.int64).max - ids)
    pair = np.stack([bits, -bits], axis=1)
    table = pa.table({
        "id": pa.array(ids), "bits": pa.array(bits), "big": pa.array(big),
        "pair": pa.array(list(pair), pa.list_(pa.float32())),
        "name": pa.array([f"row {i} of a name longer than a short string".encode()
                          for i in ids])})
    schema = text_format.Parse(EXACT_SCHEMA, schema_pb2.Schema())
    paths = []
    for part in range(3):  # 3 files of 334, 333 and 333 rows: each ends in a short block
        path = str(tmp_path / f"packed-{part}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for block in pack(table.slice(part * 334, 334), schema, 64):
                writer.write(block)
        paths.append(path)

    config = InputConfig(batch_size=50, training=True, num_epochs=1, shuffle_buffer=256)
    seen = []
    for features, label in build_dataset(paths, packing.annotate(schema, 64), "id",
                                         config=config):
        row = label.numpy().ravel()
        assert features["bits"].numpy().view(np.uint32).ravel().tolist() == \
            bits.view(np.uint32)[row].tolist()
        assert features["big"].numpy().ravel().tolist() == big[row].tolist()
        assert features["pair"].numpy().view(np.uint32).tolist() == \
            pair.view(np.uint32)[row].tolist()
        assert features["name"].numpy().ravel().tolist() == \
            [f"row {i} of a name longer than a short string".encode() for i in row]
        seen += row.tolist()
    assert sorted(seen) == ids.tolist()
    assert seen != ids.tolist()  # shuffled, not merely read in order


def _two_rows_packed(folder, schema) -> str:
    """A file of one 64-row block of EXACT_SCHEMA holding two rows, ids 1 and 2."""
    path = str(folder / "packed.tfrecord")
    table = pa.table({"id": pa.array([1, 2], pa.int64()),
                      "bits": pa.array([0.5, 1.5], pa.float32()),
                      "big": pa.array([3, 4], pa.int64()),
                      "pair": pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32())),
                      "name": pa.array([b"a", b"b"])})
    with tf.io.TFRecordWriter(path) as writer:
        for block in pack_batch(table, packing.PackedLayout.from_schema(schema)):
            writer.write(block)
    return path


def test_tf_data_autotune_is_off_for_packed_records_and_on_for_per_row_ones(tmp_path):
    """Measured (bench/RESULTS.md): the packed first epoch is faster and steadier without the
    autotuner, the per-row one is not; a tf.data service client needs it; an explicit setting
    wins either way."""
    schema = packing.annotate(text_format.Parse(EXACT_SCHEMA, schema_pb2.Schema()), 64)
    path = _two_rows_packed(tmp_path, schema)
    per_row = text_format.Parse(EXACT_SCHEMA, schema_pb2.Schema())

    def autotuned(schema, **config):
        return build_dataset(path, schema, "id", config=InputConfig(
            num_epochs=1, **config)).options().autotune.enabled

    assert autotuned(schema) is False
    assert autotuned(per_row) is True
    # A tf.data service client needs the autotuner's model. (Building a dataset on a service
    # registers it with the dispatcher, so the rule is checked where it is made.)
    assert _dataset_options(InputConfig(data_service="grpc://127.0.0.1:1"),
                            packed=True).autotune.enabled is True
    assert autotuned(schema, autotune=True) is True
    assert autotuned(per_row, autotune=False) is False


def test_packed_records_read_directly_end_without_a_prefetch_and_with_one_thread_an_op(
        tmp_path):
    """Measured (bench/RESULTS.md): packed groups come out of the parallel map already
    buffered, so a final prefetch only adds a hand-over per batch, and ops that split their
    work over the pool only add wake-ups. Per-row records keep both, a tf.data service client
    keeps its prefetch, and an explicit setting wins either way."""
    schema = packing.annotate(text_format.Parse(EXACT_SCHEMA, schema_pb2.Schema()), 64)
    per_row = text_format.Parse(EXACT_SCHEMA, schema_pb2.Schema())
    path = _two_rows_packed(tmp_path, schema)

    def built(schema, **config):
        dataset = build_dataset(path, schema, "id", config=InputConfig(num_epochs=1, **config))
        graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
        return dataset, ("PrefetchDataset" in [node.op for node in graph.node],
                         dataset.options().threading.max_intra_op_parallelism)

    packed, settings = built(schema)
    assert settings == (False, 1)
    # The interleave and the map say themselves whether order may change, and the packed
    # chain needs no tf.data rewrites: none is left to run at each iterator's start.
    assert packed.options().deterministic is None
    assert packed.options().experimental_optimization.apply_default_optimizations is False
    assert sorted(int(v) for _, label in packed for v in label.numpy().ravel()) == [1, 2]
    assert built(per_row)[1] == (True, None)
    assert built(schema, prefetch=True, intra_op_threads=0)[1] == (True, None)
    assert built(per_row, prefetch=False, intra_op_threads=2)[1] == (False, 2)
    # Through a tf.data service the client keeps its prefetch (the rule is checked where it
    # is made: building a dataset on a service registers it with the dispatcher).
    ends_in = _prefetch(InputConfig(data_service="grpc://127.0.0.1:1"), packed=True)(
        tf.data.Dataset.range(3))
    assert isinstance(ends_in, type(tf.data.Dataset.range(3).prefetch(1)))


def test_packing_refuses_a_fixed_feature_of_the_wrong_length():
    schema = text_format.Parse(ROW_SCHEMA, schema_pb2.Schema())
    table = pa.table({"point": pa.array([[1.0, 2.0], [3.0]], pa.list_(pa.float32()))})
    with pytest.raises(ValueError, match="'point' is fixed at 2 value.*row 1 .* has 1"):
        pack(table, schema, 4)


def test_fixed_features_in_sliced_list_chunks_pack_as_their_scalars_do():
    """A transformed batch gives every fixed feature as a large_list column, a row's values
    each, often in several chunks sliced from larger ones (the rows one batch carries over
    to the next). Their values are taken straight from the lists: the blocks must be those
    the same rows give as scalar columns, which go through `to_example_column`."""
    schema = text_format.Parse(ROW_SCHEMA_WITH_A_FIXED_STRING, schema_pb2.Schema())
    scalars = PACKED_TABLE.select(["hour", "kind", "tags"])

    def one_a_row(column: pa.Array) -> pa.LargeListArray:
        return pa.LargeListArray.from_arrays(pa.array(np.arange(len(column) + 1)), column)

    lists = pa.Table.from_arrays(
        [one_a_row(PACKED_TABLE["hour"].combine_chunks()),
         one_a_row(PACKED_TABLE["kind"].combine_chunks().cast(pa.large_binary())),
         PACKED_TABLE["tags"].combine_chunks()], ["hour", "kind", "tags"])
    whole = lists.to_batches()[0]
    chunked = pa.Table.from_batches([whole.slice(0, 3), whole.slice(3, 4),
                                     whole.slice(7)])
    assert chunked["hour"].num_chunks == 3
    for version in (packing.layout.DICTIONARY_STRINGS, packing.layout.PLAIN_STRINGS):
        assert pack(chunked, schema, 4, version) == pack(scalars, schema, 4, version)
