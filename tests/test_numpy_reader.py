"""The TensorFlow-free reader: same values as the TensorFlow input function, every row once
per epoch under a PyTorch DataLoader, and shards the PyPI `tfrecord` package reads."""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

from shard_readers import numpy_reader
from tfrecord_shards import record_index, tfrecord_io
from tfrecord_shards.codec import parser, schema_file, serializer
from components.example_gen import beam_job
from components.example_gen.options import ExampleGenOptions
from tfrecord_shards.shards import ShardingOptions
from components.trainer.input import build_dataset
from components.trainer.options import InputConfig
from components.transform import beam_job as transform_job
from components.transform.options import TransformOptions
from conftest import packed_copy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shards(folder, split="train") -> list[str]:
    return sorted(glob.glob(os.path.join(str(folder), f"Split-{split}", "*")))


def rows_of(batches, names) -> collections.Counter:
    """Every row as a tuple of its scalar values, counted."""
    found = collections.Counter()
    for batch in batches:
        columns = [np.asarray(batch[n]).reshape(-1) for n in names]
        found.update(zip(*[c.tolist() for c in columns]))
    return found


def scalar_names(schema) -> list[str]:
    return [f.name for f in schema.feature if parser.is_scalar(f)]


def write_train_split(folder, batch, schema) -> str:
    """`batch` as our tf.Examples in `folder`/Split-train/data.tfrecord, with `schema` beside
    them; the file's path."""
    path = folder / "Split-train" / "data.tfrecord"
    path.parent.mkdir()
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in serializer.encode_examples(batch):
            writer.write(record)
    schema_file.write_schema(schema, str(folder / "schema.pbtxt"))
    return str(path)


@pytest.fixture(scope="module")
def three_shards(taxi_slice_dir, tmp_path_factory):
    """The taxi slice in three gzip shards per split."""
    out = tmp_path_factory.mktemp("reader") / "examples"
    beam_job.run(ExampleGenOptions(source=os.path.join(taxi_slice_dir, "data.csv"),
                                   sharding=ShardingOptions(num_shards=3)), str(out))
    return out


@pytest.fixture(scope="module")
def packed(taxi_examples, tmp_path_factory):
    """Transform's packed output (256 rows per block, plain files) of the taxi slice."""
    out = tmp_path_factory.mktemp("reader_packed")
    transform_job.run(TransformOptions(packed_rows=256, sharding=ShardingOptions(
        num_shards=2, compression="none")), taxi_examples,
        schema_file.load_schema(taxi_examples), str(out / "graph"), str(out / "examples"))
    return out / "examples"


@pytest.mark.parametrize("which", ["per-row gzip", "packed plain"])
def test_ranges_of_a_files_records_read_back_the_whole_file(which, three_shards, packed):
    """A file read as consecutive ranges of its records (the Evaluator's pieces of a shard)
    gives the rows the whole file gives, in order; with two files, a range is taken of
    each."""
    folder = three_shards if which == "per-row gzip" else packed
    paths = shards(folder)[:2]
    schema = schema_file.load_schema(str(folder))
    names = scalar_names(schema)
    records = tfrecord_io.count_records(paths[0])
    assert records >= 3

    def rows(files: list, **kwargs) -> list[tuple]:
        found = []
        for batch in numpy_reader.iter_batches(files, schema, batch_size=100, **kwargs):
            found += list(zip(*[np.asarray(batch[n]).reshape(-1).tolist() for n in names]))
        return found

    whole = rows(paths[:1])
    cuts = [0, 1, records // 2, records]
    pieces = [row for first, end in zip(cuts, cuts[1:])
              for row in rows(paths[:1], records=(first, end))]
    assert pieces == whole and len(whole) > records // 2
    assert rows(paths[:1], records=(records, records + 5)) == []
    assert rows(paths, records=(1, 2)) == \
        rows(paths[:1], records=(1, 2)) + rows(paths[1:], records=(1, 2)) != []


def test_imports_and_reads_with_tensorflow_blocked(three_shards):
    """The numpy reader, the record index, the map-style source and the device stage, with
    no TensorFlow."""
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "from shard_readers import numpy_reader\n"
            f"files = {shards(three_shards)!r}\n"
            "print(sum(len(b['fare']) for b in numpy_reader.iter_batches(files)))\n"
            "from shard_readers import device_feed, random_access; from tfrecord_shards import record_index\n"
            "source = random_access.ExampleSource(files)\n"
            "assert len(source) == sum(record_index.count(f)[0] for f in files)\n"
            "assert source[len(source) - 1]['fare'].shape in ((0,), (1,))\n"
            "assert not any(m == 'tensorflow' or m.startswith('tensorflow.') "
            "for m in sys.modules if sys.modules[m] is not None)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    manifest_rows = sum(1 for f in shards(three_shards)
                        for _ in tf.data.TFRecordDataset(f, "GZIP"))
    assert int(result.stdout.split()[-1]) == manifest_rows


@pytest.mark.slow
@pytest.mark.parametrize("data", ["per-row", "packed"])
def test_values_equal_the_tensorflow_input_function(data, three_shards, packed):
    folder = three_shards if data == "per-row" else packed
    schema = schema_file.load_schema(str(folder))
    names = scalar_names(schema)
    ours = rows_of(numpy_reader.iter_batches(shards(folder), schema, batch_size=100), names)
    theirs = rows_of(
        (dict(features) for features in build_dataset(
            shards(folder), schema, None, feature_keys=names,
            config=InputConfig(batch_size=100, training=False, num_epochs=1))
         .as_numpy_iterator()), names)
    assert sum(ours.values()) > 1000
    assert ours == theirs


def test_variable_length_features_come_as_values_and_lengths(tmp_path):
    batch = pa.RecordBatch.from_arrays(
        [pa.array([[1, 2], [], None, [3]], pa.list_(pa.int64())),
         pa.array([[0.5], None, [1.5], [2.5]], pa.list_(pa.float32()))], ["tags", "score"])
    path = write_train_split(tmp_path, batch, serializer.schema_from_profile(
        {"tags": (serializer.INT, True), "score": (serializer.FLOAT, False)}, 4,
        {"tags": 3, "score": 3}, {}))
    (only,) = list(numpy_reader.iter_batches([path]))
    assert only["tags"].tolist() == [1, 2, 3]
    assert only["tags__lengths"].tolist() == [2, 0, 0, 1]
    assert only["score"].tolist() == [0.5, 0.0, 1.5, 2.5]  # a missing scalar is the default


@pytest.mark.parametrize("batch_size", [1, 7, 50, 1000])
def test_batches_cut_across_many_decoded_groups_hold_every_value_in_order(
        tmp_path, monkeypatch, batch_size):
    """Lists of any length, missing scalars and full ones, decoded 13 records at a time, so
    that a batch may start and end inside a group or span many of them."""
    rng = np.random.default_rng(5)
    count = 600
    tags = [rng.integers(0, 9, rng.integers(0, 4)).tolist() for _ in range(count)]
    score = [None if i % 11 == 0 else [float(i)] for i in range(count)]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(tags, pa.list_(pa.int64())), pa.array(score, pa.list_(pa.float32())),
         pa.array([[i] for i in range(count)], pa.list_(pa.int64()))], ["tags", "score", "n"])
    path = write_train_split(tmp_path, batch, serializer.schema_from_profile(
        {"tags": (serializer.INT, True), "score": (serializer.FLOAT, False),
         "n": (serializer.INT, False)}, count, {"tags": count, "score": count, "n": count},
        {}))
    monkeypatch.setattr(numpy_reader, "_ROWS_PER_DECODE", 13)
    batches = list(numpy_reader.iter_batches([path], batch_size=batch_size))
    assert [len(b["n"]) for b in batches[:-1]] == [batch_size] * (len(batches) - 1)
    assert np.concatenate([b["n"] for b in batches]).tolist() == list(range(count))
    assert np.concatenate([b["score"] for b in batches]).tolist() == \
        [0.0 if s is None else s[0] for s in score]
    lengths = np.concatenate([b["tags__lengths"] for b in batches])
    assert lengths.tolist() == [len(t) for t in tags]
    values = np.concatenate([b["tags"] for b in batches])
    assert values.tolist() == [v for t in tags for v in t]
    assert all(len(b["tags"]) == b["tags__lengths"].sum() for b in batches)
    # Map-style rows (`random_access`) batched by rows_to_batch give the same batch.
    rows = [{"tags": np.array(t, np.int64), "score": np.array(s or [], np.float32),
             "n": np.array([i], np.int64)} for i, (t, s) in enumerate(zip(tags, score))]
    (whole,) = list(numpy_reader.iter_batches([path], batch_size=count))
    collated = numpy_reader.rows_to_batch(rows, schema_file.load_schema(str(tmp_path)))
    assert {k: v.tolist() for k, v in collated.items()} == \
        {k: v.tolist() for k, v in whole.items()}


@pytest.mark.parametrize("data", ["three files", "one file"])
def test_torch_dataloader_with_two_workers_reads_every_row_once(data, three_shards,
                                                                taxi_examples):
    torch = pytest.importorskip("torch")
    folder = three_shards if data == "three files" else taxi_examples
    files = shards(folder)
    schema = schema_file.load_schema(str(folder))
    names = scalar_names(schema)
    expected = rows_of(numpy_reader.iter_batches(files, schema), names)
    dataset = numpy_reader.TorchDataset(files, schema, batch_size=64, seed=7)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        batches = [{k: v.numpy() if hasattr(v, "numpy") else v for k, v in batch.items()}
                   for batch in loader]
        assert rows_of(batches, names) == expected


TFRECORD_PACKAGE_CHECK = """
import collections, sys
sys.modules["tensorflow"] = None  # the package's own Example proto clashes with TensorFlow's
import numpy as np
from tfrecord.reader import tfrecord_loader
from shard_readers import numpy_reader
from tfrecord_shards import tfrecord_io
from tfrecord_shards.codec import parser, schema_file

files, folder = sys.argv[1:-1], sys.argv[-1]
schema = schema_file.load_schema(folder)
names = [f.name for f in schema.feature if parser.is_scalar(f)]
defaults = {f.name: parser.default_value(f) for f in schema.feature}
theirs = collections.Counter()
for path in files:
    for record in tfrecord_loader(path, None, compression_type="gzip"):
        row = []
        for name in names:
            value = record.get(name)
            if value is None:
                row.append(defaults[name])
            elif isinstance(value, (bytes, list)):  # a bytes feature: the value(s) as bytes
                row.append(value if isinstance(value, bytes) else value[0])
            else:
                row.append(value.tolist()[0])
        theirs[tuple(row)] += 1
ours = collections.Counter()
for batch in numpy_reader.iter_batches(files, schema):
    ours.update(zip(*[batch[n].tolist() for n in names]))
assert theirs == ours, (len(theirs), len(ours))
print(sum(theirs.values()))
"""


@pytest.mark.slow
def test_pypi_tfrecord_package_reads_every_record_of_our_shards(three_shards):
    files = shards(three_shards)
    result = subprocess.run([sys.executable, "-c", TFRECORD_PACKAGE_CHECK, *files,
                             str(three_shards)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = sum(1 for f in files for _ in tf.data.TFRecordDataset(f, "GZIP"))
    assert int(result.stdout.split()[-1]) == expected > 1000


def test_absent_and_empty_feature_nulls_read_the_same(tmp_path):
    """Our null (an absent key) and tfx_bsl's (an empty Feature) mean the same to every reader:
    TensorFlow's parser, tfx_bsl's decoder, TFDV's statistics and ours."""
    import tensorflow_data_validation as tfdv
    from tfx_bsl.coders import example_coder

    batch = pa.RecordBatch.from_arrays(
        [pa.array([[1], None, [3], None], pa.list_(pa.int64())),
         pa.array([None, [b"\xff"], [b"b"], None], pa.list_(pa.binary()))], ["n", "s"])
    schema = serializer.schema_from_profile(
        {"n": (serializer.INT, False), "s": (serializer.BYTES, False)}, 4, {"n": 2, "s": 2}, {})
    forms = {"absent": serializer.encode_examples(batch),
             "empty": example_coder.RecordBatchToExamplesEncoder().encode(batch)}
    assert forms["absent"] != forms["empty"]
    results = {}
    for form, records in forms.items():
        folder = tmp_path / form
        (folder / "Split-train").mkdir(parents=True)
        path = str(folder / "Split-train" / "data.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for record in records:
                writer.write(record)
        schema_file.write_schema(schema, str(folder / "schema.pbtxt"))
        spec = parser.feature_spec_from_schema(schema)
        parsed = tf.io.parse_example(tf.constant(records), spec)
        stats = tfdv.generate_statistics_from_tfrecord(path)
        numeric = {f.path.step[0]: (f.num_stats.common_stats.num_non_missing,
                                    f.num_stats.common_stats.num_missing)
                   for f in stats.datasets[0].features if f.HasField("num_stats")}
        strings = {f.path.step[0]: (f.string_stats.common_stats.num_non_missing,
                                    f.string_stats.common_stats.num_missing)
                   for f in stats.datasets[0].features if f.HasField("string_stats")}
        results[form] = {
            "tf": {k: (v.indices.numpy().tolist(), v.values.numpy().tolist())
                   for k, v in parsed.items()},
            "tfx_bsl": parser.decode_examples(records, schema).to_pydict(),
            "tfdv": (numeric, strings),
            "ours": [{k: v.tolist() for k, v in b.items()}
                     for b in numpy_reader.iter_batches([path], schema)],
        }
    assert results["absent"] == results["empty"]
    assert results["absent"]["tfdv"] == ({"n": (2, 2)}, {"s": (2, 2)})


def test_long_number_lists_read_back_exactly(tmp_path):
    """Every varint size, negative ints (ten bytes) and float32 specials, in lists long
    enough to be stored packed on the wire."""
    ints = [0, 1, 127, 128, 300, -1, -2 ** 63, 2 ** 63 - 1, 1_427_722_200] * 9
    floats = [0.0, -0.0, 1.5, float("inf"), -3.4e38, 1e-45] * 9
    batch = pa.RecordBatch.from_arrays([pa.array([ints], pa.list_(pa.int64())),
                                        pa.array([floats], pa.list_(pa.float32()))],
                                       ["i", "f"])
    path = str(tmp_path / "lists.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(serializer.encode_examples(batch)[0])
    schema = serializer.schema_from_profile(
        {"i": (serializer.INT, True), "f": (serializer.FLOAT, True)}, 1, {"i": 1, "f": 1}, {})
    (only,) = list(numpy_reader.iter_batches([path], schema))
    assert only["i"].tolist() == ints and only["i__lengths"].tolist() == [len(ints)]
    assert only["f"].tobytes() == np.array(floats, np.float32).tobytes()


@pytest.mark.parametrize("compression", ["GZIP", ""])
def test_a_damaged_record_is_named_by_file_and_offset(tmp_path, compression):
    """Records are decoded in groups; a bad one is still named on its own, at its offset in
    the uncompressed stream, gzip or plain."""
    batch = pa.RecordBatch.from_arrays([pa.array([[1]] * 5, pa.list_(pa.int64()))], ["n"])
    records = serializer.encode_examples(batch)
    records[3] = serializer.encode_examples(pa.RecordBatch.from_arrays(
        [pa.array([[b"text"]], pa.list_(pa.binary()))], ["n"]))[0]
    path = str(tmp_path / "mixed.tfrecord")
    with tf.io.TFRecordWriter(path, tf.io.TFRecordOptions(compression_type=compression)) \
            as writer:
        for record in records:
            writer.write(record)
    offsets = [offset for offset, _ in tfrecord_io.iter_records(path)]
    assert offsets[1] == offsets[0] + 16 + len(records[0])  # uncompressed, gzip or not
    schema = serializer.schema_from_profile({"n": (serializer.INT, False)}, 5, {"n": 5}, {})
    with pytest.raises(ValueError, match=f"mixed.tfrecord: record at byte offset "
                                         f"{offsets[3]}: feature 'n' is not a int64_list"):
        list(numpy_reader.iter_batches([path], schema))


@pytest.mark.parametrize("compression", ["GZIP", ""])
def test_a_raw_pixel_row_of_the_wrong_size_is_named_by_file_and_offset(tmp_path, compression):
    """Raw-pixel features come as uint8 [rows, h, w, c]; a row whose value is not h * w * c
    bytes (or that has none, or two) is named at its record's offset, gzip or plain."""
    from shard_readers import images

    good = [bytes([i] * 12) for i in range(6)]
    rows = {"short": good[:2] + [b"\x01" * 11] + good[3:],
            "missing": good[:4] + [None] + good[5:],
            "two": good[:1] + [[b"\x00" * 12, b"\x00" * 12]] + good[2:]}
    schema = images.mark_raw(serializer.schema_from_profile(
        {"image": (serializer.BYTES, False)}, 6, {"image": 6}, {}), ["image"],
        images.ImageSpec(2, 2, 3))
    for case, values in rows.items():
        path = str(tmp_path / f"{case}.tfrecord")
        column = pa.array([None if v is None else v if isinstance(v, list) else [v]
                           for v in values], pa.list_(pa.binary()))
        records = serializer.encode_examples(pa.RecordBatch.from_arrays([column], ["image"]))
        with tf.io.TFRecordWriter(path, tf.io.TFRecordOptions(compression_type=compression)) \
                as writer:
            for record in records:
                writer.write(record)
        bad = next(i for i, v in enumerate(values) if v is None or isinstance(v, list)
                   or len(v) != 12)
        offset = [offset for offset, _ in tfrecord_io.iter_records(path)][bad]
        with pytest.raises(ValueError, match=(
                rf"{case}.tfrecord: record at byte offset {offset}: feature 'image' is tagged "
                rf"raw pixels 2x2x3 \(one value of 12 bytes a row\), but holds "
                rf"{ {'short': '1 value.s. of 11 bytes', 'missing': '0', 'two': '2'}[case]}")):
            list(numpy_reader.iter_batches([path], schema, batch_size=4))
    path = str(tmp_path / "good.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in serializer.encode_examples(pa.RecordBatch.from_arrays(
                [pa.array([[v] for v in good], pa.list_(pa.binary()))], ["image"])):
            writer.write(record)
    batches = list(numpy_reader.iter_batches([path], schema, batch_size=4))
    assert [b["image"].shape for b in batches] == [(4, 2, 2, 3), (2, 2, 2, 3)]
    assert np.concatenate([b["image"] for b in batches]).reshape(6, 12).tolist() == \
        [list(v) for v in good]


@pytest.mark.slow
def test_reads_stock_csv_example_gen_shards_like_the_tensorflow_input_function(
        stock_taxi_examples):
    """Stock shards write a null as an empty Feature and keep no schema beside them: the
    reader takes SchemaGen's and gives the same values as the TensorFlow input function."""
    examples, schema_path = stock_taxi_examples
    schema = schema_file.load_schema(schema_path)
    files = shards(examples)
    names = scalar_names(schema)
    ours = rows_of(numpy_reader.iter_batches(files, schema, batch_size=100), names)
    theirs = rows_of(
        (dict(features) for features in build_dataset(
            files, schema, None, feature_keys=names,
            config=InputConfig(batch_size=100, training=False, num_epochs=1))
         .as_numpy_iterator()), names)
    assert sum(ours.values()) > 1000
    assert ours == theirs


def test_torch_dataset_splits_rows_across_ranks_and_workers(three_shards):
    """Two ranks with two DataLoader workers each: four readers, each row read by one."""
    torch = pytest.importorskip("torch")
    files = shards(three_shards)
    schema = schema_file.load_schema(str(three_shards))
    names = scalar_names(schema)
    expected = rows_of(numpy_reader.iter_batches(files, schema), names)
    per_rank = []
    for rank in range(2):
        dataset = numpy_reader.TorchDataset(files, schema, batch_size=64, seed=3, rank=rank,
                                            world_size=2)
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
        per_rank.append(rows_of(({k: v.numpy() if hasattr(v, "numpy") else v
                                  for k, v in batch.items()} for batch in loader), names))
    assert per_rank[0] and per_rank[1]
    assert per_rank[0] + per_rank[1] == expected


def airquality_data(examples: str, kind: str, tmp_path) -> tuple[list[str], object]:
    """Every split's files of the airquality shards, or the same rows packed 7 to a block
    in two plain files (so that readers' shares begin and end inside blocks)."""
    if kind == "packed":
        return packed_copy(os.path.join(examples, "Split-train"), tmp_path / "packed")
    return sorted(glob.glob(os.path.join(examples, "Split-*", "*"))), \
        schema_file.load_schema(examples)


def assert_one_size_epoch(sizes: list[int], ids: list[int], all_ids: list[int],
                          batch_size: int, drop_last: bool, ranks: int) -> None:
    short = [size for size in sizes if size != batch_size]
    if drop_last:
        full = len(all_ids) // batch_size
        assert short == [] and len(ids) == len(set(ids)) == \
            (full - full % ranks) * batch_size and set(ids) <= set(all_ids)
    else:
        assert len(short) <= 1 and sorted(ids) == sorted(all_ids)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["per-row", "packed"])
def test_an_epoch_on_any_number_of_workers_has_one_batch_size_but_one(
        airquality_examples, kind, tmp_path):
    """0 to 3 DataLoader workers, two ranks of two workers, unseeded and seeded, two epochs
    each: every batch is full except at most one per epoch, every row comes once (gzip and
    plain shards of 6 files; packed blocks of 7 rows in 2 files, shares cut inside blocks);
    with `drop_last` that one is dropped and no row comes twice."""
    torch = pytest.importorskip("torch")
    if kind == "packed" and not tfrecord_io.is_gzip(shards(airquality_examples)[0]):
        pytest.skip("the packed copy is the same from gzip or plain shards")
    files, schema = airquality_data(airquality_examples, kind, tmp_path)
    all_ids = [int(i) for batch in numpy_reader.iter_batches(files, schema)
               for i in batch["column_1"]]
    assert len(all_ids) == len(set(all_ids)) and len(all_ids) % 8 != 0
    layouts = [(1, 0), (1, 1), (1, 2), (1, 3), (2, 2)]  # (ranks, workers)
    for (ranks, workers), seed, drop_last in zip(
            layouts * 2, [None] * 5 + [11, 12, 13, 14, 15], [False] * 7 + [True] * 3):
        datasets = [numpy_reader.TorchDataset(files, schema, batch_size=8, seed=seed,
                                              rank=rank, world_size=ranks, drop_last=drop_last)
                    for rank in range(ranks)]
        for epoch in range(2):
            sizes, ids, steps = [], [], []
            for dataset in datasets:
                dataset.set_epoch(epoch)
                steps.append(0)
                for batch in torch.utils.data.DataLoader(dataset, batch_size=None,
                                                         num_workers=workers):
                    sizes.append(len(batch["column_1"]))
                    ids += batch["column_1"].tolist()
                    steps[-1] += 1
            assert_one_size_epoch(sizes, ids, all_ids, 8, drop_last, ranks)
            assert max(steps) - min(steps) <= (0 if drop_last else 1), steps


def test_reader_shares_are_whole_batches_but_the_last():
    for rows, ranks, workers, batch in [(153, 1, 4, 8), (7, 1, 3, 8), (64, 3, 1, 8),
                                        (153, 2, 2, 8), (10**6, 3, 5, 8192), (10**6, 4, 15, 8192),
                                        (100, 3, 2, 8)]:
        shares = numpy_reader.reader_shares(rows, batch, ranks, workers)
        assert len(shares) == ranks * workers
        assert shares[0][0] == 0 and shares[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
        assert all((end - first) % batch == 0 for first, end in shares[:-1])
        counts = [-(-(end - first) // batch) for first, end in shares]
        assert max(counts) - min(counts) <= 1
        per_rank = [sum(counts[r * workers:(r + 1) * workers]) for r in range(ranks)]
        assert max(per_rank) - min(per_rank) <= 1, per_rank
        dropped = numpy_reader.reader_shares(rows, batch, ranks, workers, drop_last=True)
        full = rows // batch
        assert dropped[-1][1] == (full - full % ranks) * batch
        per_rank = [sum((end - first) // batch for first, end in
                        dropped[r * workers:(r + 1) * workers]) for r in range(ranks)]
        assert len(set(per_rank)) == 1 and per_rank[0] == full // ranks, per_rank


DDP_EPOCHS = """
import datetime, json, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from shard_readers import numpy_reader
# A rank with a step more than another waits in its all-reduce: fail then, not hang.
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(1, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
dataset = numpy_reader.TorchDataset(sys.argv[1:], batch_size=8, seed=5, drop_last=True)
steps = []
for epoch in range(2):
    dataset.set_epoch(epoch)
    for batch in torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2):
        temperature = torch.as_tensor(batch["Temp"], dtype=torch.float32).reshape(-1, 1)
        loss = model(temperature / 100).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps.append([epoch, batch["column_1"].tolist()])
dist.barrier()
print(json.dumps(steps))
"""


@pytest.mark.slow
def test_ddp_ranks_with_two_workers_each_take_the_same_steps_and_every_row_once(
        airquality_examples):
    """Two DDP processes (gloo on 127.0.0.1), two DataLoader workers each, two epochs of R's
    airquality (153 rows: 19 batches of 8 and a short one): with `drop_last` each rank takes
    9 steps an epoch, so no rank waits in an all-reduce the other never joins, and no row
    comes twice. Split between four readers alone, rank 0 would have had 10 steps."""
    pytest.importorskip("torch")
    from local_cluster.listening import free_ports

    files = sorted(glob.glob(os.path.join(airquality_examples, "Split-*", "*")))
    port = free_ports(1)[0]
    ranks = [subprocess.Popen(
        [sys.executable, "-c", DDP_EPOCHS, *files], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "RANK": str(rank), "WORLD_SIZE": "2"}) for rank in range(2)]
    finished = [rank.communicate(timeout=300) for rank in ranks]
    for rank, (out, err) in zip(ranks, finished):
        assert rank.returncode == 0, err[-3000:]
    steps = [json.loads(out.strip().splitlines()[-1]) for out, _ in finished]
    for epoch in range(2):
        per_rank = [[ids for e, ids in rank_steps if e == epoch] for rank_steps in steps]
        assert [len(s) for s in per_rank] == [9, 9]
        ids = [i for rank_steps in per_rank for batch in rank_steps for i in batch]
        assert all(len(batch) == 8 for rank_steps in per_rank for batch in rank_steps)
        assert len(ids) == len(set(ids)) == 144


def numbered_records(count: int) -> list[bytes]:
    """tf.Examples whose one int64 feature `n` is the record's number."""
    return serializer.encode_examples(pa.RecordBatch.from_arrays(
        [pa.array([[i] for i in range(count)], pa.list_(pa.int64()))], ["n"]))


def indexed_records_file(folder, compression: str, records: list[bytes]) -> str:
    """`records` in a plain file or a gzip file of many members (5 records each), with the
    record index `tfrp index` writes for it."""
    framed, ends = tfrecord_io.frame_records(records)
    data = framed.tobytes()
    path = os.path.join(str(folder), f"records-{compression}.tfrecord")
    with open(path, "wb") as f:
        if compression == "none":
            f.write(data)
        else:
            bounds = [0] + ends.tolist()
            for first in range(0, len(records), 5):
                last = min(first + 5, len(records))
                f.write(gzip.compress(data[bounds[first]:bounds[last]], 1))
    record_index.RecordIndex.build(path).save()
    return path


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_a_share_starting_inside_an_indexed_file_is_read_from_there(tmp_path, compression):
    """A reader whose share begins at record 50 of an indexed file starts at the member or
    record holding it: it gets exactly records [first, end), and damage before its share,
    which a read from the start of the file stops at, is never read."""
    records = numbered_records(100)
    path = indexed_records_file(tmp_path, compression, records)
    offsets = [offset for offset, _ in tfrecord_io.iter_records(path)]
    file_rows = numpy_reader.FileRows.of(path, packed=False)
    for first, end in [(0, 100), (1, 7), (5, 10), (37, 99), (50, 100), (99, 100), (13, 13)]:
        read = list(file_rows.records(first, end))
        assert [r.data for r in read] == records[first:end], (first, end)
        if compression == "none":  # a plain file's offsets are the file's own
            assert [r.offset for r in read] == offsets[first:end]
    damaged = bytearray(open(path, "rb").read())
    damaged[30] ^= 0xFF  # inside the first member, or the first record's data
    with open(path, "wb") as f:  # same size: the index still holds
        f.write(bytes(damaged))
    with pytest.raises(tfrecord_io.CorruptRecordError):
        list(file_rows.records(0, 100))
    assert [r.data for r in file_rows.records(50, 100)] == records[50:]


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_a_bad_record_in_a_share_read_from_a_member_is_named_at_its_stream_offset(
        tmp_path, compression):
    """Rank 1 of 2 reads records [50, 100) of an indexed gzip file from the member holding
    record 50; record 60, of the wrong type, is named at its offset in the whole
    uncompressed stream, as a read from the start names it."""
    pytest.importorskip("torch")
    records = numbered_records(100)
    records[60] = serializer.encode_examples(pa.RecordBatch.from_arrays(
        [pa.array([[b"text"]], pa.list_(pa.binary()))], ["n"]))[0]
    path = indexed_records_file(tmp_path, compression, records)
    offsets = [offset for offset, _ in tfrecord_io.iter_records(path)]
    schema = serializer.schema_from_profile({"n": (serializer.INT, False)}, 100, {"n": 100}, {})
    dataset = numpy_reader.TorchDataset([path], schema, batch_size=10, rank=1, world_size=2)
    with pytest.raises(ValueError, match=f"records-{compression}.tfrecord: record at byte "
                                         f"offset {offsets[60]}: feature 'n' is not a"):
        list(dataset)
