"""The compiled pipeline (the JSON Kubeflow Pipelines and Vertex take) run task by task as
open-source Kubeflow Pipelines runs it (`tests/kfp_launch.py` in its `kfp-oss` mode, on
`kfp.local`'s pieces): each task gets the executor input KFP builds (its runtime and task
output parameters, its producers' artifacts rebuilt from ML Metadata without a type, its
output URIs) and runs its container command; KFP's cache is on, keyed as the backend keys
it; nothing of LocalDagRunner is involved. The same spec, compiled once, runs four times
over one data folder and one serving folder:

1. as compiled: it trains on the folder's rows and pushes;
2. after the folder's file was replaced at the same path, with `train_steps=1` set at run
   time: it reads the new rows (a cached ExampleGen would train on the old ones), trains one
   step, is compared with the first push, and is refused;
3. with nothing changed: ExampleGen, Transform and the Trainer come from the cache. This run
   stops at the Trainer and the model in production (`run_spec(through=...)`): the
   Evaluator and the Pusher would judge and refuse the same model as the second run;
4. with another `data_root` set at run time: it reads that folder. This run stops after
   ExampleGen: what follows it is the second run's work on other rows, and nothing of it
   is asserted.

The commands run on this machine's interpreter here, each in a child forked from one process
that has imported what they import (`tests/forked.py`); `tests/test_image.py` runs the spec in
the image, each task its own process, on gs://.
"""
from __future__ import annotations

import csv
import os
import sys

import pytest

import forked
import kfp_launch
from conftest import tfrp

pytestmark = pytest.mark.pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = {"run-settings", "ImportSchemaGen", "ShardedExampleGen", "StatisticsGen",
         "ExampleValidator", "ShardedTransform", "production_model", "Trainer", "Evaluator",
         "Pusher"}


def write_trips(taxi_csv: str, path: str, first: int, count: int) -> None:
    """Trips first..first+count of the taxi sample, with its header, into `path`."""
    with open(taxi_csv, encoding="utf-8", newline="") as src:
        rows = list(csv.reader(src))
    with open(path, "w", encoding="utf-8", newline="") as dst:
        csv.writer(dst).writerows([rows[0], *rows[1 + first:1 + first + count]])


@pytest.fixture(scope="module")
def kfp_runs(tmp_path_factory, taxi_csv):
    folder = tmp_path_factory.mktemp("kfp")
    data, other = folder / "data", folder / "other"
    data.mkdir()
    other.mkdir()
    write_trips(taxi_csv, str(data / "trips.csv"), 0, 1500)
    write_trips(taxi_csv, str(other / "trips.csv"), 6000, 900)
    spec = str(folder / "pipeline.json")
    tfrp("compile", "--output", spec, "--pipeline-root", str(folder / "root"),
         "--data-root", str(data), "--set", f"serving_dir={folder / 'serving'}",
         "--set", f"image_workdir={ROOT}")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="1",
               PYTHONPATH=ROOT, PATH=os.pathsep.join(
                   [os.path.dirname(sys.executable), os.environ["PATH"]]))

    # Each task in a child of one process that has imported what the tasks import
    # (tests/forked.py: 33 CPU-s for these runs, against 107 with a process a task).
    tasks = forked.ForkServer("pipeline.task_entrypoint", [
        "pipeline.task_entrypoint",
        "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"], env)

    def execute(command: list[str], image: str) -> int:
        assert command[:3] == ["python", "-m", "pipeline.task_entrypoint"], command[:3]
        result = tasks.run(command[3:], env, cwd=str(folder))
        if result.returncode:
            print(result.stderr[-5000:])
        return result.returncode

    def run(through=None, **parameters) -> tuple[kfp_launch.Run, list[str]]:
        done = kfp_launch.run_spec(spec, str(folder / "root"), execute,
                                   mode=kfp_launch.KFP_OSS, parameters=parameters,
                                   cache_dir=str(folder / "kfp-cache"), through=through)
        serving = folder / "serving"
        return done, sorted(os.listdir(serving)) if serving.exists() else []

    try:
        runs = [run()]
        write_trips(taxi_csv, str(data / "trips.csv"), 3000, 2400)  # replaced, same path
        runs.append(run(train_steps=1))
        runs.append(run(through={"StatisticsGen", "Trainer", "production_model"},
                        train_steps=1))
        runs.append(run(through={"ShardedExampleGen"}, data_root=str(other), train_steps=1))
    finally:
        tasks.close()
    return folder, runs


def rows_written(run: kfp_launch.Run, task: str, key: str) -> int:
    (artifact,) = kfp_launch.executor_output(run, task)["artifacts"][key]["artifacts"]
    return int(artifact["metadata"]["rows_written"])


def test_the_compiled_pipeline_runs_every_task_and_pushes(kfp_runs):
    folder, [(run, pushed), *_] = kfp_runs
    assert set(run) == TASKS and not run.cached, run
    assert rows_written(run, "ShardedExampleGen", "examples") == 1500
    assert os.listdir(os.path.join(run["Evaluator"], "blessing")) == ["BLESSED"]
    # The first run: nothing in production yet, so the model was judged by the bounds alone.
    assert os.listdir(os.path.join(run["production_model"], "model")) == []
    (version,) = pushed
    assert os.path.exists(os.path.join(folder, "serving", version, "saved_model.pb"))
    written = kfp_launch.executor_output(run, "Pusher")
    (pushed_model,) = written["artifacts"]["pushed_model"]["artifacts"]
    assert pushed_model["metadata"]["pushed_destination"] == os.path.join(
        folder, "serving", version)
    # Executors made the folders they write into (only LocalDagRunner makes them first).
    assert os.path.exists(os.path.join(run["ShardedTransform"], "post_transform_schema",
                                       "schema.pbtxt"))


def test_data_replaced_at_the_same_path_is_read_by_the_next_run(kfp_runs):
    """KFP's cache is keyed by a task's inputs and spec; ExampleGen's options carry the
    fingerprint the run-settings task took of the files, so the replaced file misses."""
    _, [(first, _), (second, _), *_] = kfp_runs
    assert "ShardedExampleGen" not in second.cached
    assert {"ShardedExampleGen", "ShardedTransform", "Trainer"}.isdisjoint(second.cached)
    assert rows_written(second, "ShardedExampleGen", "examples") == 2400
    assert rows_written(second, "ShardedTransform", "transformed_examples") == 2400
    assert rows_written(first, "ShardedTransform", "transformed_examples") == 1500


def test_train_steps_set_at_run_time_trains_a_worse_model_that_is_refused(kfp_runs):
    folder, [(_, first_pushed), (second, pushed), *_] = kfp_runs
    report = os.path.join(second["Trainer"], "model_run")
    assert os.path.exists(report)
    production = os.path.join(second["production_model"], "model", "Format-Serving")
    assert os.path.exists(os.path.join(production, "saved_model.pb"))
    written = kfp_launch.executor_output(second, "production_model")
    (model,) = written["artifacts"]["model"]["artifacts"]
    assert model["metadata"]["pushed_model"] == os.path.join(folder, "serving",
                                                             first_pushed[0])
    assert os.listdir(os.path.join(second["Evaluator"], "blessing")) == ["NOT_BLESSED"]
    assert pushed == first_pushed  # nothing new in the serving folder


def test_a_run_with_nothing_changed_reuses_examplegen_transform_and_the_trainer(kfp_runs):
    _, [_, (second, _), (third, _), _] = kfp_runs
    assert {"ShardedExampleGen", "StatisticsGen", "ShardedTransform",
            "Trainer"} <= third.cached, third.cached
    assert third["ShardedExampleGen"] == second["ShardedExampleGen"]
    # Never from the cache: what the run reads, and the model in production.
    assert {"run-settings", "production_model"}.isdisjoint(third.cached)


def test_a_run_given_another_data_root_reads_it(kfp_runs):
    _, [*_, (fourth, _)] = kfp_runs
    assert set(fourth) == {"run-settings", "ShardedExampleGen"}, fourth
    assert "ShardedExampleGen" not in fourth.cached
    assert rows_written(fourth, "ShardedExampleGen", "examples") == 900
