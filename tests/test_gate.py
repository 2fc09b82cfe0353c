"""The validation gate: ExampleValidator's anomalies stop a run before Transform, unless the
pipeline says to go on (fail_on_anomalies=false)."""
from __future__ import annotations

import csv
import glob
import json
import os
import re

import numpy as np
import pyarrow.csv as pacsv
import pytest

from components.example_gen.splits import hash_rows, parse_splits, split_index
from components.example_gen.options import ExampleGenOptions
from conftest import tfrp

pytestmark = pytest.mark.pipeline

SPLIT_KEY = "trip_start_timestamp"


def eval_rows(path: str) -> np.ndarray:
    """Which rows of the CSV the default splits put in eval, hashing the split key as
    ExampleGen does."""
    batch = pacsv.read_csv(path).select([SPLIT_KEY]).combine_chunks().to_batches()[0]
    names, weights = zip(*parse_splits(ExampleGenOptions.splits))
    return split_index(hash_rows(batch, [SPLIT_KEY]), list(weights)) == names.index("eval")


def altered_slice(taxi_slice_dir: str, folder, column: str, value: str) -> str:
    """The slice with `column` set to `value` in every 10th eval row."""
    source = os.path.join(taxi_slice_dir, "data.csv")
    in_eval = eval_rows(source)
    folder.mkdir()
    with open(source, newline="") as f, open(folder / "data.csv", "w", newline="") as g:
        reader = csv.DictReader(f)
        writer = csv.DictWriter(g, reader.fieldnames)
        writer.writeheader()
        for i, row in enumerate(reader):
            if in_eval[i] and i % 10 == 0:
                row[column] = value
            writer.writerow(row)
    return str(folder)


def run(data_root: str, output_root: str, *settings: str):
    return tfrp("run", "--data-root", data_root, "--output-root", output_root,
                "--set", f"split_key={SPLIT_KEY}", "--train-steps", "20", "--eval-steps", "2",
                "--set", "min_accuracy=0", "--set", "min_auc=0", *settings, check=False)


@pytest.fixture(scope="module")
def new_payment_type(taxi_slice_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    return altered_slice(taxi_slice_dir, root / "data", "payment_type", "Bitcoin"), root


def test_a_new_string_value_in_eval_stops_the_run_before_transform(new_payment_type):
    data_root, root = new_payment_type
    result = run(data_root, str(root / "out"))
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, result.stderr[-2000:]
    assert "ExampleValidator found 1 anomalies, so Transform did not run" in error[0]
    assert "eval: payment_type: Unexpected string values" in error[0] and "Bitcoin" in error[0]
    assert "train: payment_type" not in error[0]  # only eval rows were altered
    assert "Traceback" not in result.stderr
    assert re.search(r"^  ShardedTransform +failed ", result.stdout, re.M), result.stdout
    for later in ("Trainer", "Evaluator", "Pusher"):
        assert later not in result.stdout


@pytest.mark.spark
def test_with_fail_on_anomalies_false_the_run_goes_on_and_lists_them(new_payment_type):
    """This run also puts ExampleGen on Spark, on a standalone cluster (a master and a worker,
    separate JVMs on 127.0.0.1, with its secret, given as a config file as a user would), so
    the one whole-pipeline run checks both: the LocalDagRunner pipeline's ExampleGen runs on
    the cluster, and stock StatisticsGen and the rest read its output through to a pushed
    model."""
    import yaml

    from local_cluster.spark import LocalCluster

    data_root, root = new_payment_type
    with LocalCluster(workers=1, work_dir=str(root / "cluster")) as cluster:
        settings = root / "spark.yaml"
        settings.write_text(yaml.safe_dump({"engine": "spark", "spark_master": cluster.master,
                                            "spark_conf": cluster.conf}))
        result = run(data_root, str(root / "out"), "--set", "fail_on_anomalies=false",
                     "--config", str(settings))
        with open(os.path.join(cluster.work_dir, "master.log"), errors="replace") as f:
            master_log = f.read()
    assert "Registering app tfrecord-pipeline" in master_log, master_log[-2000:]
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Anomalies found: 1" in result.stdout
    assert "  eval: payment_type: Unexpected string values" in result.stdout
    assert re.search(r"StatisticsGen +ran .* statistics of eval, train", result.stdout)
    assert re.search(r"Pusher +ran .* pushed", result.stdout), result.stdout
    manifests = [json.load(open(path)) for path in glob.glob(
        str(root / "out" / "pipelines" / "**" / "ShardedExampleGen" / "**" / "manifest.json"),
        recursive=True)]
    assert sorted(m["engine"] for m in manifests) == ["beam", "spark"]


def test_a_type_flip_stops_the_run(taxi_slice_dir, tmp_path):
    data_root = altered_slice(taxi_slice_dir, tmp_path / "data", "trip_miles", "n/a")
    result = run(data_root, str(tmp_path / "out"))
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "ExampleValidator found" in error[0], result.stderr[-2000:]
    assert "trip_miles" in error[0] and "Traceback" not in result.stderr
