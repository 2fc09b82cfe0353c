"""`python -m bench pipeline` (bench/pipeline.py): the CSV both sides read, the stock side's
pipeline, and our side run through the command at a small size, its stages read back from
the run's ML Metadata."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pytest
from conftest import bench

from bench import display
from testsupport import data
from bench import pipeline as bench_pipeline


def test_the_bare_header_is_what_stock_csv_example_gen_names_its_features(tmp_path):
    """Stock CsvExampleGen takes its column names from the header line split on commas: a
    header as pyarrow writes it keeps its quotes in every name; ours gives the table's names,
    and every row arrives as an Example with those features."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that
    from tfx.components.example_gen.csv_example_gen import executor
    from tfx.utils import io_utils

    rows = 300
    folder = str(tmp_path / "csv")
    path = data.write_taxi_csv(rows, folder)
    table = data.taxi_like_table(rows)
    assert io_utils.load_csv_column_names(path) == table.column_names
    assert pacsv.read_csv(path).equals(pacsv.read_csv(_written_by_pyarrow(table, tmp_path)))

    quoted = io_utils.load_csv_column_names(_written_by_pyarrow(table, tmp_path))
    assert quoted != table.column_names
    assert [name.strip('"') for name in quoted] == table.column_names

    def has_the_tables_features(examples):
        assert len(examples) == rows
        for example in examples:
            assert set(example.features.feature) <= set(table.column_names)
        named = set().union(*(example.features.feature for example in examples))
        assert named == set(table.column_names)
        fares = [example.features.feature["fare"].float_list.value[0] for example in examples]
        assert sum(fares) == pytest.approx(pc.sum(table["fare"]).as_py(), rel=1e-5)

    with beam.Pipeline() as pipeline:
        examples = pipeline | executor._CsvToExample({"input_base": folder}, "*")
        assert_that(examples, has_the_tables_features)

    stamp_before = os.stat(path).st_mtime_ns
    assert data.write_taxi_csv(rows, folder) == path
    assert os.stat(path).st_mtime_ns == stamp_before  # written once per (rows, seed)


def _written_by_pyarrow(table: pa.Table, tmp_path) -> str:
    path = str(tmp_path / "pyarrow" / "data.csv")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pacsv.write_csv(table, path)
    return path


def test_the_stock_side_is_the_tfx_example_pointed_at_the_run(tmp_path):
    """The example's own pipeline, its Trainer's steps as the bench states them, every
    component mapped to a stage, the data and metadata where the bench points them; another
    step count reaches its Trainer."""
    data_dir, run_dir = str(tmp_path / "data"), str(tmp_path / "run")
    pipeline = bench_pipeline.stock_pipeline(data_dir, run_dir)
    assert bench_pipeline.trainer_steps(pipeline) == (bench_pipeline.STOCK_TRAIN_STEPS,
                                                      bench_pipeline.STOCK_EVAL_STEPS)
    ids = [component.id for component in pipeline.components]
    assert not set(ids) - set(bench_pipeline.STAGE_OF), ids
    assert {bench_pipeline.STAGE_OF[i] for i in ids} == set(bench_pipeline.STAGES)
    example_gen = next(c for c in pipeline.components if c.id == "CsvExampleGen")
    assert example_gen.exec_properties["input_base"] == data_dir
    assert pipeline.pipeline_info.pipeline_root == os.path.join(run_dir, "root")
    assert pipeline.metadata_connection_config.sqlite.filename_uri == os.path.join(
        run_dir, bench_pipeline.METADATA_FILE)
    # What the runner gets: the compiled pipeline's Trainer parameters.
    from tfx.dsl.compiler import compiler

    fewer = compiler.Compiler().compile(
        bench_pipeline.stock_pipeline(data_dir, run_dir, train_steps=37))
    trainer = next(node.pipeline_node for node in fewer.nodes
                   if node.pipeline_node.node_info.id == "Trainer")
    assert {name: json.loads(trainer.parameters.parameters[name].field_value.string_value)
            for name in ("train_args", "eval_args")} == {
        "train_args": {"num_steps": 37},
        "eval_args": {"num_steps": bench_pipeline.STOCK_EVAL_STEPS}}


@pytest.mark.pipeline
def test_our_side_through_the_command_at_a_small_size(tmp_path):
    """`python -m bench pipeline --sides ours` on 2,000 rows: each component's seconds read from
    the run's metadata fill the stages, the rest of the process is outside them, the rows
    StatisticsGen counted are the CSV's, the Evaluator's example count is the eval split's,
    and the table and chart show it."""
    chart = str(tmp_path / "stages.png")
    result = json.loads(bench("pipeline", "--rows", "2000", "--sides", "ours",
                             "--train-steps", "30", "--work-dir", str(tmp_path / "work"),
                             "--json", "--plot", chart).stdout)
    run = result["runs"]["ours"]["2000"]
    (sample,) = run["samples"]
    assert sample["rows"] == sum(sample["split_rows"].values()) == 2000
    assert 0 < sample["split_rows"]["eval"] < 2000
    assert sample["stage_rows"]["Transform"] == 2000
    assert sample["stage_rows"]["Evaluator"] == sample["split_rows"]["eval"] == \
        sample["quality"]["example_count"]
    assert 0 < sample["quality"]["binary_accuracy"] <= 1
    assert 0 <= sample["quality"]["auc"] <= 1
    assert isinstance(sample["blessed"], bool)

    assert {bench_pipeline.STAGE_OF[c] for c in sample["components"]} == \
        set(sample["stage_seconds"])
    for stage in [*bench_pipeline.ROW_BASIS, "Trainer"]:
        assert sample["stage_seconds"][stage] > 0, stage
    assert sum(sample["stage_seconds"].values()) == pytest.approx(
        sample["components_seconds"])
    assert 0 < sample["components_seconds"] < sample["process_seconds"]
    assert sample["before_first_seconds"] > 0 and sample["after_last_seconds"] >= 0
    # Outside the components: before the first, between them, after the last.
    assert sample["before_first_seconds"] + sample["after_last_seconds"] <= \
        sample["outside_seconds"] + 0.01
    assert run["median_process_seconds"] == sample["process_seconds"]
    assert result["train_steps"] == 30 and result["marginal"] == {}
    assert "stock_over_ours" not in result

    shown = bench_pipeline.table(result)
    lines = display.format_table(shown)
    assert [c[0] for c in shown.columns] == ["ours 2k s"]
    assert shown.rows[bench_pipeline.WHOLE]["ours@2000"] == f"{sample['process_seconds']:.1f}"
    for stage in [*sample["stage_seconds"], bench_pipeline.OUTSIDE, bench_pipeline.WHOLE]:
        assert any(line.strip().startswith(stage) for line in lines), stage
    assert f"binary_accuracy {sample['quality']['binary_accuracy']:.4f}" in lines[-1]
    # Every stage's peak memory, within the whole tree's; TensorFlow alone takes 300 MB.
    peaks = sample["stage_peak_bytes"]
    assert set(peaks) == set(sample["stage_seconds"])
    assert all(0 < peak <= sample["process_peak_bytes"] for peak in peaks.values()), peaks
    assert peaks["Trainer"] > 300 * 2**20
    assert "\nPeak RSS (MiB) at 2k rows, ours: ExampleGen" in lines[-1]
    with open(chart, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not os.path.exists(tmp_path / "work" / "pipeline-runs" / "ours")


def test_sides_are_checked():
    result = bench("pipeline", "--sides", "stock,tfx", check=False)
    assert result.returncode == 2
    assert "--sides" in result.stderr and "stock, ours" in result.stderr


def test_the_memory_sampler_catches_a_peak_between_two_samples():
    """A child holds 400 MB for a tenth of a second, between samples half a second apart,
    then frees it: a snapshot of its resident size would miss it; the high-water mark does
    not, and the samples after it fall back."""
    import subprocess
    import sys
    import time

    from bench import memory

    script = ("import time; time.sleep(0.6); x = bytearray(400 << 20); time.sleep(0.1); "
              "del x; time.sleep(1.2)")
    with subprocess.Popen([sys.executable, "-c", script]) as child, \
            memory.PeakSampler(child.pid, interval=0.5) as sampler:
        child.wait()
    assert len(sampler.samples) >= 3
    assert sampler.peak() >= 400 << 20
    assert sampler.samples[-1][1] < 100 << 20
    before = sampler.samples[0][0]
    assert sampler.peak(end=before) < 100 << 20
