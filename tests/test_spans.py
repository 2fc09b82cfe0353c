"""Spans: a ShardedExampleGen source with TFX's `{SPAN}`, `{VERSION}` and `{YYYY}{MM}{DD}`
specs processes the latest span (and its latest version), or a range of spans, or pre-split
inputs; puts span and version on the Examples artifact as stock ExampleGen does; and a
scheduled pipeline trains on a window of spans and pushes only a model no worse than
production. Real data: the raw penguins table (palmerpenguins), one span per nesting year."""
from __future__ import annotations

import csv
import os

import pytest

from testsupport import corpus
from components.example_gen.component import ShardedExampleGen
from components.example_gen.inputs import resolve_inputs
from components.example_gen.options import ExampleGenOptions
from pipeline import run_summary

pytestmark = pytest.mark.slow


def penguin_years() -> dict[str, list[list[str]]]:
    """The raw penguins' rows by the year of `Date Egg`, with the header first."""
    with open(corpus.penguins_raw(), newline="") as f:
        rows = list(csv.reader(f))
    header, column = rows[0], rows[0].index("Date Egg")
    years: dict[str, list[list[str]]] = {}
    for row in rows[1:]:
        years.setdefault(row[column][:4], [header]).append(row)
    assert sorted(years) == ["2007", "2008", "2009"]
    return years


def write_csv(path, rows) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)


def run_example_gen(root, pattern: str, **settings):
    """ShardedExampleGen alone in a LocalDagRunner pipeline; its run's summary."""
    # `tfx.v1` takes 9 s to import (its extensions import Vertex's SDK): only these parts,
    # and only when a test runs, not in every worker collecting the tests.
    from tfx.orchestration import metadata as tfx_metadata
    from tfx.orchestration import pipeline as tfx_pipeline
    from tfx.orchestration.local.local_dag_runner import LocalDagRunner

    gen = ShardedExampleGen(source=pattern, **settings)
    metadata = os.path.join(root, "metadata.db")
    LocalDagRunner().run(tfx_pipeline.Pipeline(
        pipeline_name="spans", pipeline_root=os.path.join(root, "root"), components=[gen],
        enable_cache=True,
        metadata_connection_config=tfx_metadata.sqlite_metadata_connection_config(metadata)))
    return run_summary.summarize(metadata, "spans")


def test_versions_and_dates(tmp_path):
    """The latest version of the latest span; a `{YYYY}-{MM}-{DD}` span is the day's number
    since 1970-01-01, as stock's."""
    from tfx.components.example_gen import utils

    years = penguin_years()
    for version, year in ((1, "2007"), (2, "2008")):
        write_csv(tmp_path / "v" / "span-7" / f"version-{version}" / "p.csv", years[year])
    write_csv(tmp_path / "v" / "span-6" / "version-9" / "p.csv", years["2009"])
    resolved = resolve_inputs(ExampleGenOptions(
        source=str(tmp_path / "v" / "span-{SPAN}" / "version-{VERSION}" / "*.csv")))
    assert (resolved.span, resolved.version) == (7, 2)
    assert resolved.source == str(tmp_path / "v" / "span-7" / "version-2" / "*.csv")
    assert resolved.source_fingerprint

    for day in ("2024-02-28", "2024-03-01", "2023-12-31"):
        write_csv(tmp_path / "d" / day / "p.csv", years["2007"])
    resolved = resolve_inputs(ExampleGenOptions(
        source=str(tmp_path / "d" / "{YYYY}-{MM}-{DD}" / "*.csv")))
    assert resolved.span == utils.date_to_span_number(2024, 3, 1)
    assert resolved.source == str(tmp_path / "d" / "2024-03-01" / "*.csv")
    with pytest.raises(ValueError, match="span-{SPAN}"):
        resolve_inputs(ExampleGenOptions(source=str(tmp_path / "none" / "span-{SPAN}" / "*")))


def read_sources(summary, data) -> tuple:
    """(the Examples artifact, its manifest's source files relative to `data`)."""
    (examples,) = summary.artifacts["Examples"]
    manifest = run_summary.read_manifest(examples.uri)
    return examples, [os.path.relpath(s["path"], data) for s in manifest["sources"]]


def test_a_static_range_of_several_spans_is_read_into_one_artifact(tmp_path):
    """Stock ExampleGen's static range must start and end on one span (tfx #5462); ours reads
    spans 1-2 of three, and the artifact carries the last span and the range."""
    years = penguin_years()
    data = tmp_path / "data"
    for span, year in ((1, "2007"), (2, "2008"), (3, "2009")):
        write_csv(data / f"span-{span}" / "penguins.csv", years[year])
    from tfx.proto import range_config_pb2

    summary = run_example_gen(  # stock's RangeConfig, as a stock pipeline would give it
        str(tmp_path), str(data / "span-{SPAN}" / "*.csv"),
        range_config=range_config_pb2.RangeConfig(static_range=range_config_pb2.StaticRange(
            start_span_number=1, end_span_number=2)))
    examples, sources = read_sources(summary, data)
    assert examples.properties["span"].int_value == 2
    assert examples.custom_properties["spans"].string_value == "1,2"
    # Stock's fingerprint of both spans' files, as stock's driver records it.
    fingerprint = examples.custom_properties["input_fingerprint"].string_value
    assert fingerprint.count("split:source,num_files:1,") == 2, fingerprint
    assert sources == [os.path.join(f"span-{s}", "penguins.csv") for s in (1, 2)]
    assert sum(summary.rows_per_split.values()) == \
        len(years["2007"]) - 1 + len(years["2008"]) - 1
    assert summary.spans == (1, 2) and "Spans: 1-2" in summary.format()
    with pytest.raises(ValueError, match=r"no files for span\(s\) \[4\] of the range 3-4"):
        resolve_inputs(ExampleGenOptions(source=str(data / "span-{SPAN}" / "*.csv"),
                                         range_config={"start_span_number": 3,
                                                       "end_span_number": 4}))


def test_a_rolling_range_of_dated_folders_reads_the_latest_days(tmp_path):
    """`{YYYY}-{MM}-{DD}` folders, the latest two days: their span numbers are days since
    1970-01-01, as stock's; the older day is not read."""
    from tfx.components.example_gen import utils

    years = penguin_years()
    data = tmp_path / "data"
    days = {"2024-02-28": "2007", "2024-02-29": "2008", "2024-03-01": "2009"}
    for day, year in days.items():
        write_csv(data / day / "penguins.csv", years[year])
    summary = run_example_gen(str(tmp_path), str(data / "{YYYY}-{MM}-{DD}" / "*.csv"),
                              range_config={"num_spans": 2})
    examples, sources = read_sources(summary, data)
    last = utils.date_to_span_number(2024, 3, 1)
    assert examples.properties["span"].int_value == last
    assert examples.custom_properties["spans"].string_value == f"{last - 1},{last}"
    assert sources == [os.path.join(day, "penguins.csv") for day in ("2024-02-29", "2024-03-01")]
    assert sum(summary.rows_per_split.values()) == \
        len(years["2008"]) - 1 + len(years["2009"]) - 1


def test_pre_split_inputs_keep_their_files_in_their_splits(tmp_path):
    """TFX's input_config with a pattern per split, each under `{SPAN}`: every row of a
    train file is in Split-train, every row of an eval file in Split-eval, none hashed;
    the latest span's files alone are read."""
    years = penguin_years()
    data = tmp_path / "data"
    write_csv(data / "span-1" / "train" / "p.csv", years["2007"])
    write_csv(data / "span-2" / "train" / "p.csv", years["2008"])
    write_csv(data / "span-2" / "eval" / "p.csv", years["2009"])
    write_csv(data / "span-1" / "eval" / "p.csv", years["2009"][:10])
    from tfx.proto import example_gen_pb2

    summary = run_example_gen(str(tmp_path), str(data), input_config=example_gen_pb2.Input(
        splits=[example_gen_pb2.Input.Split(name="train", pattern="span-{SPAN}/train/*.csv"),
                example_gen_pb2.Input.Split(name="eval", pattern="span-{SPAN}/eval/*.csv")]))
    examples, sources = read_sources(summary, data)
    assert examples.properties["span"].int_value == 2
    assert examples.properties["split_names"].string_value == '["eval", "train"]'
    assert sorted(sources) == [os.path.join("span-2", s, "p.csv") for s in ("eval", "train")]
    assert summary.rows_per_split == {"train": len(years["2008"]) - 1,
                                      "eval": len(years["2009"]) - 1}
    from tfrecord_shards import example_rows

    column = years["2008"][0].index("Individual ID")
    for split, year in (("train", "2008"), ("eval", "2009")):
        ids = sorted(row["Individual ID"].decode() for row in example_rows.iter_rows(
            os.path.join(examples.uri, f"Split-{split}")))
        assert ids == sorted(r[column] for r in years[year][1:]), split


def test_tfrp_examplegen_takes_the_patterns_and_range_as_flags(tmp_path):
    """The command line: gzipped CSV spans, pre-split, the latest two spans of three, plain
    output. Every file of spans 2 and 3 is read into its split, span 1's are not."""
    import gzip

    from tfrecord_shards import shards
    from conftest import tfrp

    years = penguin_years()
    data = tmp_path / "data"
    for span, year in ((1, "2007"), (2, "2008"), (3, "2009")):
        rows = years[year]
        half = len(rows) // 2
        for split, part in (("train", rows[:half]), ("eval", [rows[0]] + rows[half:])):
            os.makedirs(data / f"span-{span}" / split)
            with gzip.open(data / f"span-{span}" / split / "p.csv.gz", "wt", newline="") as f:
                csv.writer(f).writerows(part)
    out = tmp_path / "out"
    tfrp("examplegen", str(data), str(out), "--input-config", "train=span-{SPAN}/train/*",
         "--input-config", "eval=span-{SPAN}/eval/*", "--range-config", "num_spans=2",
         "--compression", "none")
    manifest = shards.read_manifest(str(out))
    assert manifest["spans"] == [2, 3]
    assert sorted(os.path.relpath(s["path"], data) for s in manifest["sources"]) == sorted(
        os.path.join(f"span-{span}", split, "p.csv.gz")
        for span in (2, 3) for split in ("train", "eval"))
    expected = {"train": sum(len(years[y]) // 2 - 1 for y in ("2008", "2009")),
                "eval": sum(len(years[y]) - len(years[y]) // 2 for y in ("2008", "2009"))}
    assert {s: v["rows"] for s, v in manifest["splits"].items()} == expected
    assert manifest["rows_in"] == manifest["rows_written"] == sum(expected.values())
    assert all(not p.endswith(".gz") for split in manifest["splits"].values()
               for p in (s["path"] for s in split["shards"]))


@pytest.mark.pipeline
def test_three_days_of_spans_train_on_a_window_and_push_only_a_better_model(tmp_path):
    """The raw penguins, a span a nesting year, through `tfrp run` with a window of two spans:
    day 1, spans 1 and 2 have landed; day 2, span 3 lands; day 3, nothing new, and a
    deliberately worse model on the same data (one training step, the absolute bound at 0,
    so only the comparison with production can refuse it). Checked from ML Metadata and the
    files."""
    from conftest import tfrp

    years = penguin_years()
    data = tmp_path / "data"
    for span, year in ((1, "2007"), (2, "2008")):
        write_csv(data / f"span-{span}" / "penguins.csv", years[year])
    name, metadata = "penguin-days", str(tmp_path / "metadata" / "penguin-days" / "metadata.db")

    def day(*settings: str):
        result = tfrp("run", "--dataset", "table", "--data-root",
                      str(data / "span-{SPAN}" / "*.csv"), "--output-root", str(tmp_path),
                      "--pipeline-name", name, "--set", "label_key=Species",
                      "--set", "spans=2", "--set", "fail_on_anomalies=false",
                      "--set", "batch_size=16", "--eval-steps", "5", *settings)
        return result.stdout, run_summary.summarize(metadata, name)

    def outputs(summary, component: str):
        (found,) = [a for a in summary.artifacts["Examples"] if f"{os.sep}{component}{os.sep}"
                    in a.uri]
        return found

    def sources(examples) -> list[str]:
        return [os.path.relpath(s["path"], data)
                for s in run_summary.read_manifest(examples.uri)["sources"]]

    train = ("--train-steps", "200")
    _, first = day(*train)
    gen = outputs(first, "ShardedExampleGen")
    assert gen.properties["span"].int_value == 2
    assert sources(gen) == [os.path.join("span-2", "penguins.csv")]
    assert first.blessed and first.pushed_model

    write_csv(data / "span-3" / "penguins.csv", years["2009"])
    stdout, second = day(*train)
    gen, transformed = outputs(second, "ShardedExampleGen"), outputs(second, "ShardedTransform")
    assert second.components["ShardedExampleGen"] == "ran"
    assert gen.properties["span"].int_value == 3
    assert sources(gen) == [os.path.join("span-3", "penguins.csv")]
    assert sum(second.rows_per_split.values()) == len(years["2009"]) - 1
    assert second.span == (3, 0) and "Span: 3" in stdout
    # Transform read the window of spans 2 and 3, and analysed span 3 alone: span 2's
    # analysis came from the analyzer cache (one hit).
    assert transformed.custom_properties["spans"].string_value == "2,3"
    assert (second.analysed_spans, second.cached_spans) == ((3,), (2,))
    assert "Transform: analysed span(s) 3; 2 from the analyzer cache" in stdout
    manifest = run_summary.read_manifest(transformed.uri)
    assert manifest["rows_in"] == manifest["rows_written"] == \
        len(years["2008"]) - 1 + len(years["2009"]) - 1
    assert second.blessed and second.baseline_model == first.pushed_model

    # No new span: the same inputs, so ExampleGen and Transform are reused; only the
    # Trainer, whose setting changed, runs (a run with nothing changed reuses the Trainer
    # too: tests/test_runners.py).
    serving = os.path.dirname(second.pushed_model)
    pushed = sorted(os.listdir(serving))
    stdout, third = day("--train-steps", "1", "--set", "min_accuracy=0")
    for component in ("ShardedExampleGen", "ShardedTransform"):
        assert third.components[component] == "cached", third.components
    assert third.components["Trainer"] == "ran"
    # Production is the latest push: the second run's.
    assert third.baseline_model == os.path.join(serving, pushed[-1]) == second.pushed_model
    new = third.evaluation["sparse_categorical_accuracy"]
    production = third.baseline_evaluation["sparse_categorical_accuracy"]
    print(f"day 3: candidate accuracy {new:.3f}, production {production:.3f}")
    assert new < production
    assert third.blessed is False and third.pushed_model is None
    assert "not blessed: sparse_categorical_accuracy change=" in stdout
    assert sorted(os.listdir(serving)) == pushed

    # The report of the last run: its span and the production model's metrics beside its own,
    # the refusal, and the task metric of every run, one row and point each.
    import re

    with open(tmp_path / "reports" / name / "report.html", encoding="utf-8") as f:
        page = f.read()
    assert "ExampleGen read span 3" in page and third.baseline_model in page
    assert re.search(r'<ul id="refusals"><li class="bad">[^<]*worse than the latest blessed', page)
    history = re.search(r'<table id="metric-history">(.*?)</table>', page).group(1)
    rows = re.findall(r"<tr><td>[^<]+</td><td>(\d+)</td><td>sparse_categorical_accuracy</td>"
                      r"<td>([\d.]+)</td><td>(yes|no)</td><td>(yes|no)</td></tr>", history)
    assert [(span, blessed) for span, _, blessed, _ in rows] == \
        [("2", "yes"), ("3", "yes"), ("3", "no")]
    assert float(rows[-1][1]) == pytest.approx(new, abs=1e-3)
    assert 'id="metric-history-chart"' in page
