"""Spans: a ShardedExampleGen source with TFX's `{SPAN}`, `{VERSION}` and `{YYYY}{MM}{DD}`
specs processes the latest span (and its latest version), puts span and version on the
Examples artifact as stock ExampleGen does, and a run with nothing new is reused from the
cache. Real data: the raw penguins table (palmerpenguins), one span per nesting year."""
from __future__ import annotations

import csv
import os

import pytest
from tfx import v1 as tfx

from bench import corpus
from components.example_gen.component import ShardedExampleGen, resolve_span
from components.example_gen.options import ExampleGenOptions
from pipeline import run_summary


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


def run_example_gen(root, pattern: str):
    """ShardedExampleGen alone in a LocalDagRunner pipeline; its run's summary."""
    gen = ShardedExampleGen(source=pattern)
    metadata = os.path.join(root, "metadata.db")
    tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
        pipeline_name="spans", pipeline_root=os.path.join(root, "root"), components=[gen],
        enable_cache=True, metadata_connection_config=tfx.orchestration.metadata
        .sqlite_metadata_connection_config(metadata)))
    return run_summary.summarize(metadata, "spans")


def test_the_latest_span_is_processed_and_a_run_with_nothing_new_is_reused(tmp_path):
    years = penguin_years()
    data = tmp_path / "data"
    for span, year in ((1, "2007"), (2, "2008")):
        write_csv(data / f"span-{span}" / "penguins.csv", years[year])
    pattern = str(data / "span-{SPAN}" / "*.csv")

    first = run_example_gen(str(tmp_path), pattern)
    (examples,) = first.artifacts["Examples"]
    assert (examples.properties["span"].int_value, examples.properties["version"].int_value) \
        == (2, 0)
    assert sum(first.rows_per_split.values()) == len(years["2008"]) - 1

    write_csv(data / "span-3" / "penguins.csv", years["2009"])
    second = run_example_gen(str(tmp_path), pattern)
    assert second.components == {"ShardedExampleGen": "ran"}
    (examples,) = second.artifacts["Examples"]
    assert examples.properties["span"].int_value == 3
    assert sum(second.rows_per_split.values()) == len(years["2009"]) - 1
    assert second.span == (3, 0) and "Span: 3" in second.format()
    manifest = run_summary.read_manifest(examples.uri)
    assert [os.path.relpath(s["path"], data) for s in manifest["sources"]] == \
        [os.path.join("span-3", "penguins.csv")]

    third = run_example_gen(str(tmp_path), pattern)
    assert third.components == {"ShardedExampleGen": "cached"}


def test_versions_and_dates(tmp_path):
    """The latest version of the latest span; a `{YYYY}-{MM}-{DD}` span is the day's number
    since 1970-01-01, as stock's."""
    from tfx.components.example_gen import utils

    years = penguin_years()
    for version, year in ((1, "2007"), (2, "2008")):
        write_csv(tmp_path / "v" / "span-7" / f"version-{version}" / "p.csv", years[year])
    write_csv(tmp_path / "v" / "span-6" / "version-9" / "p.csv", years["2009"])
    resolved = resolve_span(ExampleGenOptions(
        source=str(tmp_path / "v" / "span-{SPAN}" / "version-{VERSION}" / "*.csv")))
    assert (resolved.span, resolved.version) == (7, 2)
    assert resolved.source == str(tmp_path / "v" / "span-7" / "version-2" / "*.csv")
    assert resolved.source_fingerprint

    for day in ("2024-02-28", "2024-03-01", "2023-12-31"):
        write_csv(tmp_path / "d" / day / "p.csv", years["2007"])
    resolved = resolve_span(ExampleGenOptions(
        source=str(tmp_path / "d" / "{YYYY}-{MM}-{DD}" / "*.csv")))
    assert resolved.span == utils.date_to_span_number(2024, 3, 1)
    assert resolved.source == str(tmp_path / "d" / "2024-03-01" / "*.csv")
    with pytest.raises(ValueError, match="span-{SPAN}"):
        resolve_span(ExampleGenOptions(source=str(tmp_path / "none" / "span-{SPAN}" / "*")))
