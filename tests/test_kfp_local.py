"""The compiled pipeline (the JSON Kubeflow Pipelines and Vertex take) run task by task as
Kubeflow Pipelines' launcher runs it (`tests/kfp_launch.py`, on `kfp.local`'s pieces): each
task gets the executor input KFP builds (plain constants, its producers' artifacts, its output
URIs) and runs its container command; nothing of LocalDagRunner or ML Metadata is involved.
This proves that the spec has nothing open-source KFP v2 cannot execute (schema 2.1
constants, no `resolver` task), that the production model needs no ML Metadata query, and
that each executor creates what it writes. The commands run on this machine's interpreter
here; `tests/test_image.py` runs them in the image.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import kfp_launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = {"ImportSchemaGen", "ShardedExampleGen", "StatisticsGen", "ExampleValidator",
         "ShardedTransform", "production_model", "Trainer", "Evaluator", "Pusher"}


def run_on_this_machine(folder: str) -> list[tuple[dict[str, str], list[str]]]:
    """The two runs of `kfp_launch.run_twice`, every task's command run here with the
    environment the image sets, the schemas read from this checkout."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="1",
               PYTHONPATH=ROOT, PATH=os.pathsep.join(
                   [os.path.dirname(sys.executable), os.environ["PATH"]]))

    def execute(command: list[str], image: str) -> int:
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=folder)
        if result.returncode:
            print(result.stderr[-5000:])
        return result.returncode

    return kfp_launch.run_twice(folder, execute, "--set", f"image_workdir={ROOT}")


@pytest.fixture(scope="module")
def kfp_runs(tmp_path_factory):
    """Twice, into the same serving folder: the compiled default pipeline (it pushes), then
    the same pipeline trained for one step (the Evaluator compares it with the first push)."""
    folder = tmp_path_factory.mktemp("kfp")
    return folder, run_on_this_machine(str(folder))


def test_every_task_of_the_compiled_pipeline_runs_and_the_model_is_pushed(kfp_runs):
    folder, [(outputs, pushed), _] = kfp_runs
    assert set(outputs) == TASKS, outputs
    assert os.listdir(os.path.join(outputs["Evaluator"], "blessing")) == ["BLESSED"]
    # The first run: nothing in production yet, so the model was judged by the bounds alone.
    assert os.listdir(os.path.join(outputs["production_model"], "model")) == []
    (version,) = pushed
    assert os.path.exists(os.path.join(folder, "serving", version, "saved_model.pb"))
    written = kfp_launch.executor_output(outputs, "Pusher")
    (pushed_model,) = written["artifacts"]["pushed_model"]["artifacts"]
    assert pushed_model["metadata"]["pushed_destination"] == os.path.join(
        folder, "serving", version)
    # Executors made the folders they write into (only LocalDagRunner makes them first).
    assert os.path.exists(os.path.join(outputs["ShardedTransform"], "post_transform_schema",
                                       "schema.pbtxt"))


def test_a_second_run_compares_with_the_first_push_and_refuses_a_worse_model(kfp_runs):
    folder, [(_, first_pushed), (outputs, pushed)] = kfp_runs
    production = os.path.join(outputs["production_model"], "model", "Format-Serving")
    assert os.path.exists(os.path.join(production, "saved_model.pb"))
    written = kfp_launch.executor_output(outputs, "production_model")
    (model,) = written["artifacts"]["model"]["artifacts"]
    assert model["metadata"]["pushed_model"] == os.path.join(folder, "serving",
                                                             first_pushed[0])
    assert os.listdir(os.path.join(outputs["Evaluator"], "blessing")) == ["NOT_BLESSED"]
    assert pushed == first_pushed  # nothing new in the serving folder
