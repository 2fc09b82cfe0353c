"""Runs killed with SIGKILL at random moments leave nothing that looks complete, and say what
to delete when rerun into the same folder."""
from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tfrecord_shards import shards, tfrecord_io
from tfrecord_shards.codec import schema_file

pytestmark = pytest.mark.slow

SEED = 15
KILLS = 3


def looks_complete(folder: str) -> bool:
    """What a reader would take for a finished output: shards with a schema and a manifest."""
    return bool(glob.glob(os.path.join(folder, "Split-*", "*"))) and all(
        os.path.exists(os.path.join(folder, name))
        for name in (schema_file.SCHEMA_FILE, shards.MANIFEST_FILE))


def timed_run(command: list[str]) -> float:
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env=child_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return time.monotonic() - start


def child_env() -> dict:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}


def kill_after(command: list[str], seconds: float) -> bool:
    """Starts `command`, SIGKILLs it after `seconds` (as the OOM killer or a preempted VM
    would: no handler runs), then kills any Beam worker it left behind. False when the run
    finished first (this run was quicker than the one timed), with exit status 0."""
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=child_env(), start_new_session=True)
    killed = False
    try:
        assert child.wait(timeout=seconds) == 0, "the run failed before it was killed"
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGKILL)
        child.wait()
        killed = True
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return killed


def is_whole(folder: str, rows: int) -> bool:
    """Complete in fact: the manifest accounts for all `rows`, and every shard it lists is
    there at its full size and reads to its end (records framed whole, CRCs checked)."""
    manifest = shards.read_manifest(folder)
    listed = [shard for split in manifest["splits"].values() for shard in split["shards"]]
    paths = [os.path.join(folder, shard["path"]) for shard in listed]
    return (manifest["rows_in"] == rows
            and manifest["rows_written"] + manifest["rows_quarantined"] == rows
            and all(os.path.getsize(path) == shard["bytes"]
                    for path, shard in zip(paths, listed))
            and all(tfrecord_io.count_records(path) > 0 for path in paths))


def check_killed_runs(make_command, tmp_path, full_seconds: float, rows: int) -> None:
    """Kills the run at seeded random moments across its length; each folder left behind
    must not look complete unless it is (a kill after the commit, while the process exits),
    and a rerun into it must refuse: naming what to delete, or that the output is finished."""
    moments = random.Random(SEED).sample(range(5, 95), KILLS)
    landed = 0
    for moment in moments:
        out = str(tmp_path / f"killed_at_{moment}")
        if not kill_after(make_command(out), full_seconds * moment / 100):
            # Finished before the kill: then its output is complete, as it should be.
            assert looks_complete(out) and is_whole(out, rows), \
                f"a finished run left {os.listdir(out)}"
            continue
        landed += 1
        complete = looks_complete(out)
        if complete:
            assert is_whole(out, rows), f"killed at {moment}% of the run: {os.listdir(out)}"
        if os.path.isdir(out) and os.listdir(out):
            rerun = subprocess.run(make_command(out), capture_output=True, text=True,
                                   env=child_env())
            assert rerun.returncode != 0
            if complete:  # killed after the commit: a finished output is kept, not deleted
                assert "already holds a finished output" in rerun.stderr, rerun.stderr[-2000:]
            else:
                assert f"rm -r {out}" in rerun.stderr and "is not empty" in rerun.stderr, \
                    rerun.stderr[-2000:]
    assert landed >= KILLS - 1, f"only {landed} of {KILLS} kills came before the run ended"


@pytest.fixture(scope="module")
def big_csv(tmp_path_factory) -> str:
    from testsupport.data import write_taxi_csv

    return write_taxi_csv(200_000, str(tmp_path_factory.mktemp("kill") / "csv"))


def test_examplegen_killed_at_random_moments(big_csv, tmp_path):
    def command(out: str) -> list[str]:
        return [sys.executable, "-m", "pipeline.cli", "examplegen", big_csv, out,
                "--num-shards", "4"]

    full = timed_run(command(str(tmp_path / "whole")))
    check_killed_runs(command, tmp_path, full, 200_000)
    assert looks_complete(str(tmp_path / "whole"))
    fresh = str(tmp_path / "fresh")
    timed_run(command(fresh))
    manifest = shards.read_manifest(fresh)
    assert manifest["rows_in"] == manifest["rows_written"] == 200_000


TRANSFORM = """
import sys
from tfrecord_shards.codec import schema_file
from tfrecord_shards.shards import ShardingOptions
from components.transform import beam_job
from components.transform.options import TransformOptions
examples, out = sys.argv[1], sys.argv[2]
beam_job.run(TransformOptions(sharding=ShardingOptions(num_shards=3)), examples,
             schema_file.load_schema(examples), out + "_graph", out)
"""


def test_transform_killed_at_random_moments(taxi_examples, tmp_path):
    def command(out: str) -> list[str]:
        return [sys.executable, "-c", TRANSFORM, taxi_examples, out]

    # Transform keeps no state outside its output folder, so the run timed before the kills
    # stands for a clean one (ExampleGen's test also reruns after its kills).
    whole = str(tmp_path / "whole")
    full = timed_run(command(whole))
    assert looks_complete(whole) and shards.read_manifest(whole)["rows_written"] == 2000
    check_killed_runs(command, tmp_path, full, 2000)


SPARK_WRITE = """
import sys
from spark_shards.session import get_session
from components.example_gen.spark_write import write_examples
source, out = sys.argv[1], sys.argv[2]
spark = get_session("local[2]")
write_examples(spark.read.csv(source, header=True, inferSchema=True), out, num_shards=4)
"""


@pytest.mark.spark
def test_spark_writer_killed_at_random_moments(tmp_path_factory, tmp_path):
    """SIGKILL takes the driver and, with its process group, Spark's JVM and Python workers:
    a preempted driver machine."""
    from testsupport.data import write_taxi_csv

    source = write_taxi_csv(60_000, str(tmp_path_factory.mktemp("kill_spark") / "csv"))

    def command(out: str) -> list[str]:
        return [sys.executable, "-c", SPARK_WRITE, source, out]

    fresh = str(tmp_path / "fresh")
    full = timed_run(command(fresh))
    manifest = shards.read_manifest(fresh)
    assert manifest["rows_in"] == manifest["rows_written"] == 60_000
    check_killed_runs(command, tmp_path, full, 60_000)


EXECUTOR_ATTEMPT = """
import sys
from tfx.types import standard_artifacts
from components.example_gen.executor import Executor
from components.example_gen.options import ExampleGenOptions
from tfrecord_shards.options import OPTIONS_KEY
from tfrecord_shards.shards import ShardingOptions

examples = standard_artifacts.Examples()
examples.uri = sys.argv[2]
options = ExampleGenOptions(source=sys.argv[1], sharding=ShardingOptions(num_shards=3))
Executor().Do({}, {"examples": [examples]}, {OPTIONS_KEY: options.to_json()})
"""


def test_a_retried_task_writes_whole_into_the_folder_its_killed_attempt_left(
        taxi_slice_dir, tmp_path):
    """An orchestrator retries a task into the URIs it gave the first attempt: the retry of
    an ExampleGen task SIGKILLed in the middle of its commit (after its second move) writes
    a whole output there, and nothing of the first attempt is left beside it."""
    from testsupport import faults

    output = tmp_path / "task" / "examples"
    output.mkdir(parents=True)  # as LocalDagRunner and KFP's launcher give it
    attempt = [sys.executable, "-c", EXECUTOR_ATTEMPT, taxi_slice_dir, str(output)]
    killed = subprocess.run(attempt, capture_output=True, text=True, env=faults.child_env(
        f"{faults.KILL_IN_COMMIT}=2", child_env()))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert os.path.exists(output / shards.COMMITTING_FILE) and not looks_complete(str(output))
    retried = subprocess.run(attempt, capture_output=True, text=True, env=child_env())
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert is_whole(str(output), 2000)
    assert sorted(os.listdir(tmp_path / "task")) == ["examples"]  # no staging folder left
