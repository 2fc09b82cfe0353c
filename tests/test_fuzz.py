"""The fuzzer: a fixed-seed set of mutated inputs ends in clear errors or balanced runs, and
its balance check catches the losses it exists to catch."""
from __future__ import annotations

import json
import os

import pytest

from tfrecord_shards import shards, tfrecord_io
from components.example_gen import beam_job
from testsupport import fuzz
from components.example_gen.options import ExampleGenOptions
from tfrecord_shards.shards import ShardingOptions
from conftest import bench

CI_SEED, CI_CASES = 0, 42


@pytest.mark.slow
def test_fixed_seed_set_ends_in_clear_errors_or_balanced_runs():
    result = bench("fuzz", "--cases", str(CI_CASES), "--seed", str(CI_SEED), "--json",
                  check=False)
    summary = json.loads(result.stdout)
    assert summary["failed_cases"] == [] and result.returncode == 0, summary["failed_cases"]
    assert summary["cases"] == CI_CASES
    assert summary["clear_errors"] + summary["balanced_runs"] == CI_CASES
    assert summary["clear_errors"] > 0 and summary["balanced_runs"] > 0
    assert all(counts["cases"] > 0 for counts in summary["by_format"].values()), \
        summary["by_format"]


@pytest.mark.slow
def test_the_printed_figure_names_every_count():
    result = bench("fuzz", "--cases", "2", "--seed", "7", "--jobs", "1")
    assert result.stdout.startswith("seed 7: 2 cases tried, ")
    assert " clear errors, " in result.stdout and " balanced runs, 0 failures" in result.stdout


def _written(taxi_slice_dir, tmp_path) -> str:
    out = str(tmp_path / "out")
    beam_job.run(ExampleGenOptions(source=os.path.join(taxi_slice_dir, "data.csv"),
                                   splits="all:1",
                                   sharding=ShardingOptions(num_shards=1, compression="none")),
                 out)
    return out


def test_balance_check_catches_a_record_missing_from_the_shards(taxi_slice_dir, tmp_path):
    out = _written(taxi_slice_dir, tmp_path)
    assert fuzz.check_balance(out) is None
    [shard] = shards.read_manifest(out)["splits"]["all"]["shards"]
    path = os.path.join(out, shard["path"])
    *_, (last_offset, _) = tfrecord_io.iter_records(path)
    os.truncate(path, last_offset)
    assert fuzz.check_balance(out) == \
        f"the manifest says {shard['rows']} rows written, the shards hold {shard['rows'] - 1}"


def test_balance_check_catches_counts_that_do_not_add_up(taxi_slice_dir, tmp_path):
    out = _written(taxi_slice_dir, tmp_path)
    manifest = shards.read_manifest(out)
    assert fuzz.check_balance(out, true_rows=manifest["rows_in"]) is None
    assert fuzz.check_balance(out, true_rows=manifest["rows_in"] + 5) == (
        f"silent loss: the input holds {manifest['rows_in'] + 5} rows, the run accounted "
        f"for {manifest['rows_in']}")
    manifest["rows_in"] += 1
    with open(os.path.join(out, shards.MANIFEST_FILE), "w") as f:
        json.dump(manifest, f)
    assert fuzz.check_balance(out).startswith(f"unbalanced: {manifest['rows_in']} in, ")
