"""The compiled pipeline (the file Kubeflow Pipelines and Vertex take) run task by task as
open-source Kubeflow Pipelines 2.5 runs it (`tests/kfp_launch.py` in its `kfp-oss` mode):
each task gets the executor input its driver builds (typed runtime and task output
parameters, its producers' artifacts rebuilt from ML Metadata without a type, output URIs
under the run's root, and the `executor-logs` output the default install adds to every
task), its inputs copied to the pod and its outputs back, and the retries its spec asks for.
Nothing of LocalDagRunner is involved. The store is moto's S3 server on this machine's
loopback, reached under minio:// (the open-source default's root) and s3://.

Every run is submitted with `enable_caching=True`, as kfp's Client and Vertex's PipelineJob
take it, which turns every task's cache on whatever the spec says. The spec, compiled once,
runs over one data folder and one serving folder:

1. as compiled: it trains on the folder's rows and pushes;
2. after the folder's file was replaced at the same URI, with `train_steps=1` set at run
   time: it reads the new rows (a cached ExampleGen would train on the old ones), trains one
   step, is compared with the first push, and is refused;
3. with nothing changed: ExampleGen, Transform and the Trainer come from the cache, and the
   run settings and the model in production do not. This run stops at the Trainer and the
   model in production (`run_spec(through=...)`): the Evaluator and the Pusher would judge
   and refuse the same model as the second run;
4. with another `data_root` set at run time: it reads that folder. This run stops after
   ExampleGen.

A fifth run, on an s3:// root with its own serving folder, has Transform killed part-way
through its commit: the retry its retry policy allows, with the same executor input and
URIs, succeeds, and the model is pushed.

The commands run on this machine's interpreter here, each in a child forked from one process
that has imported what they import (`tests/forked.py`); `tests/test_image.py` runs the spec in
the image, each task its own process, on gs://.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

import forked
import kfp_launch
from conftest import tfrp
from testsupport import faults as fault_env

pytestmark = [pytest.mark.pipeline, pytest.mark.object_store]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = {"run-settings", "ImportSchemaGen", "ShardedExampleGen", "StatisticsGen",
         "ExampleValidator", "ShardedTransform", "production_model", "Trainer", "Evaluator",
         "Pusher"}
BUCKET = "kfp"
# What a task's environment must not hold of its own, so that the spec's env and secret
# references are what reach the store.
STORE_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
             "AWS_SECRET_ACCESS_KEY", "S3_ENDPOINT")


def write_trips(taxi_csv: str, path: str, first: int, count: int) -> None:
    """Trips first..first+count of the taxi sample, with its header, into `path`."""
    with open(taxi_csv, encoding="utf-8", newline="") as src:
        rows = list(csv.reader(src))
    with open(path, "w", encoding="utf-8", newline="") as dst:
        csv.writer(dst).writerows([rows[0], *rows[1 + first:1 + first + count]])


@pytest.fixture(scope="module")
def stores(file_layer_stores):
    """The loopback stores, with os.environ naming them for this module's tests (the
    launcher's copies, `tfrp compile` and the checks read the store with it), and as it was
    afterwards."""
    saved = dict(os.environ)
    os.environ.update(file_layer_stores.env)
    yield file_layer_stores
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def kfp_runs(tmp_path_factory, taxi_csv, stores):
    from tfrecord_shards import fileio

    folder = tmp_path_factory.mktemp("kfp")
    stores.make_bucket("s3", BUCKET)
    local = folder / "trips.csv"
    env = {**os.environ, **stores.env, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": fault_env.python_path(),
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
    # The tasks reach the store only as a pod on a minio:// root does: its endpoint from the
    # spec's env, its keys from KFP's secret through the spec's platform part.
    task_base_env = {name: value for name, value in env.items() if name not in STORE_ENV}
    cluster_secrets = {"mlpipeline-minio-artifact": {
        "accesskey": stores.env["AWS_ACCESS_KEY_ID"],
        "secretkey": stores.env["AWS_SECRET_ACCESS_KEY"]}}
    data, other = f"s3://{BUCKET}/data", f"s3://{BUCKET}/other"
    serving = f"s3://{BUCKET}/serving"
    spec = str(folder / "pipeline.yaml")

    # Each task in a child of one process that has imported what the tasks import
    # (tests/forked.py: 33 CPU-s for these runs, against 107 with a process a task).
    tasks = forked.ForkServer("pipeline.task_entrypoint", [
        "pipeline.task_entrypoint",
        "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"], env)
    faults: dict[str, str] = {}  # a text of a task's command -> the fault of its next run
    finished: list[tuple[list[str], subprocess.CompletedProcess]] = []

    def execute(command: list[str], image: str, pod_env: dict) -> subprocess.CompletedProcess:
        assert command[:3] == ["python", "-m", "pipeline.task_entrypoint"], command[:3]
        task_env = {**task_base_env, **pod_env}
        for marker in list(faults):
            if any(marker in arg for arg in command):
                task_env[fault_env.ENVIRONMENT] = faults.pop(marker)
        result = tasks.run(command[3:], task_env, cwd=str(folder))
        if result.returncode and fault_env.ENVIRONMENT not in task_env:
            print(result.stderr[-5000:])
        finished.append((command, result))
        return result

    def run(root: str, through=None, **parameters) -> tuple[kfp_launch.Run, list[str]]:
        done = kfp_launch.run_spec(spec, root, execute, str(folder / "outputs"),
                                   mode=kfp_launch.KFP_OSS, parameters=parameters,
                                   cache_dir=str(folder / "kfp-cache"), enable_caching=True,
                                   through=through, secrets=cluster_secrets)
        return done, sorted(fileio.listdir(serving)) if fileio.exists(serving) else []

    try:
        write_trips(taxi_csv, str(local), 0, 1500)
        fileio.copy_file(str(local), f"{data}/trips.csv")
        write_trips(taxi_csv, str(local), 6000, 900)
        fileio.copy_file(str(local), f"{other}/trips.csv")
        tfrp("compile", "--output", spec, "--pipeline-root", f"minio://{BUCKET}/root",
             "--data-root", data, "--set", f"serving_dir={serving}",
             "--set", f"image_workdir={ROOT}",
             "--set", f"task_env=AWS_ENDPOINT_URL={stores.env['AWS_ENDPOINT_URL']}")
        minio = f"minio://{BUCKET}/root"
        runs = [run(minio)]
        write_trips(taxi_csv, str(local), 3000, 2400)  # replaced, same URI
        fileio.copy_file(str(local), f"{data}/trips.csv")
        runs.append(run(minio, train_steps=1))
        runs.append(run(minio, through={"StatisticsGen", "Trainer", "production_model"},
                        train_steps=1))
        runs.append(run(minio, through={"ShardedExampleGen"}, data_root=other,
                        train_steps=1))
        # Killed after the second object of Transform's commit moved, then retried.
        faults["components.transform.executor"] = "kill-in-commit=2"
        retried = kfp_launch.run_spec(
            spec, f"s3://{BUCKET}/retried", execute, str(folder / "outputs"),
            mode=kfp_launch.KFP_OSS, parameters={"serving_dir": f"{serving}-retried"},
            secrets=cluster_secrets)
        retried_pushes = sorted(fileio.listdir(f"{serving}-retried"))
        pusher_log = fileio.read_text(
            f"{runs[0][0]['Pusher']}/{kfp_launch.LOGS_OUTPUT}")
    finally:
        tasks.close()
    with open(spec, encoding="utf-8") as f:
        compiled = f.read()
    return {"runs": runs, "retried": (retried, retried_pushes), "serving": serving,
            "faults_left": dict(faults), "pusher_log": pusher_log, "finished": finished,
            "env": stores.env, "compiled": compiled, "spec": spec,
            "outputs": str(folder / "outputs"), "secrets": cluster_secrets}


def rows_written(run: kfp_launch.Run, task: str, key: str) -> int:
    (artifact,) = kfp_launch.executor_output(run, task)["artifacts"][key]["artifacts"]
    return int(artifact["metadata"]["rows_written"])


def test_the_compiled_pipeline_runs_every_task_and_pushes_on_a_minio_root(kfp_runs):
    from tfrecord_shards import fileio

    [(run, pushed), *_] = kfp_runs["runs"]
    assert set(run) == TASKS and not run.cached, run
    # The driver's layout: <root>/<pipeline>/<run id>/<task>/<uuid>/<output>.
    for task, folder in run.folders.items():
        assert folder.startswith(f"minio://{BUCKET}/root/tfrp-taxi/{run.run_id}/{task}/")
    assert rows_written(run, "ShardedExampleGen", "examples") == 1500
    written = kfp_launch.executor_output(run, "Evaluator")
    (blessing,) = written["artifacts"]["blessing"]["artifacts"]
    assert blessing["metadata"]["blessed"] == 1
    (version,) = pushed
    assert fileio.exists(f"{kfp_runs['serving']}/{version}/saved_model.pb")
    (pushed_model,) = kfp_launch.executor_output(run, "Pusher")[
        "artifacts"]["pushed_model"]["artifacts"]
    assert pushed_model["metadata"]["pushed_destination"] == f"{kfp_runs['serving']}/{version}"


def test_every_task_was_handed_the_executor_logs_output_and_its_log_was_written(kfp_runs):
    """The default install's PUBLISH_LOGS adds `executor-logs` (system.Artifact) to every
    task's outputs; TFX's entrypoint would stop at it (ImportError: Could not import
    system.Artifact). Our entrypoint hands TFX only the declared outputs, and the launcher
    writes the task's output there."""
    finished = kfp_runs["finished"]
    assert len(finished) > 30
    for command, _ in finished:
        assert any('"executor-logs"' in arg and "system.Artifact" in arg
                   for arg in command), command[3:5]
    pusher = [result for command, result in finished
              if any("pusher.executor" in arg for arg in command)][0]
    assert kfp_runs["pusher_log"] == pusher.stdout + pusher.stderr


def test_data_replaced_at_the_same_uri_is_read_with_every_cache_forced_on(kfp_runs):
    """Every task's cache is on (enable_caching=True at submit). The run settings' and the
    production model's keys hold the run's id, so they run again; ExampleGen's options carry
    the fingerprint the run settings took of the files, so the replaced file misses."""
    [(first, _), (second, _), *_] = kfp_runs["runs"]
    assert {"run-settings", "production_model", "ShardedExampleGen", "ShardedTransform",
            "Trainer"}.isdisjoint(second.cached)
    assert rows_written(second, "ShardedExampleGen", "examples") == 2400
    assert rows_written(second, "ShardedTransform", "transformed_examples") == 2400
    assert rows_written(first, "ShardedTransform", "transformed_examples") == 1500


def test_train_steps_set_at_run_time_trains_a_worse_model_that_is_refused(kfp_runs):
    [(_, first_pushed), (second, pushed), *_] = kfp_runs["runs"]
    written = kfp_launch.executor_output(second, "production_model")
    (model,) = written["artifacts"]["model"]["artifacts"]
    assert model["metadata"]["pushed_model"] == f"{kfp_runs['serving']}/{first_pushed[0]}"
    (blessing,) = kfp_launch.executor_output(second, "Evaluator")[
        "artifacts"]["blessing"]["artifacts"]
    assert blessing["metadata"]["blessed"] == 0
    assert pushed == first_pushed  # nothing new in the serving folder


def test_a_run_with_nothing_changed_reuses_examplegen_transform_and_the_trainer(kfp_runs):
    [_, (second, _), (third, _), _] = kfp_runs["runs"]
    assert {"ShardedExampleGen", "StatisticsGen", "ShardedTransform",
            "Trainer"} <= third.cached, third.cached
    assert third["ShardedExampleGen"] == second["ShardedExampleGen"]
    # Never from the cache, even forced on: what the run reads, and the model in production.
    assert {"run-settings", "production_model"}.isdisjoint(third.cached)


def test_a_run_given_another_data_root_reads_it(kfp_runs):
    [*_, (fourth, _)] = kfp_runs["runs"]
    assert set(fourth) == {"run-settings", "ShardedExampleGen"}, fourth
    assert "ShardedExampleGen" not in fourth.cached
    assert rows_written(fourth, "ShardedExampleGen", "examples") == 900


def test_a_task_killed_mid_commit_is_retried_into_the_same_uris_and_succeeds(kfp_runs):
    from tfrecord_shards import fileio

    retried, pushed = kfp_runs["retried"]
    assert not kfp_runs["faults_left"]  # the fault was used
    assert retried.attempts["ShardedTransform"] == 2
    assert all(n == 1 for task, n in retried.attempts.items() if task != "ShardedTransform")
    assert set(retried) == TASKS
    for task in retried:
        assert retried[task].startswith(f"s3://{BUCKET}/retried/tfrp-taxi/{retried.run_id}/")
    # The data folder holds the 2,400 rows the second run read.
    assert rows_written(retried, "ShardedTransform", "transformed_examples") == 2400
    cache = f"{retried['ShardedTransform']}/updated_analyzer_cache"
    assert fileio.exists(cache)
    (version,) = pushed
    assert fileio.exists(f"{kfp_runs['serving']}-retried/{version}/saved_model.pb")


def test_the_tasks_reached_the_store_through_the_specs_env_and_secret_references(kfp_runs):
    """No task had the store's endpoint or keys of its own (`STORE_ENV`): every one came
    from the spec, the keys by KFP's secret's name. The spec was compiled with the keys in
    the environment and holds none of them."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert kfp_runs["env"][name] not in kfp_runs["compiled"]
    assert "mlpipeline-minio-artifact" in kfp_runs["compiled"]
    assert kfp_runs["env"]["AWS_ENDPOINT_URL"] in kfp_runs["compiled"]


def test_the_run_is_refused_or_its_parameters_typed_as_the_backend_does(kfp_runs):
    """A string for a NUMBER_INTEGER root parameter and a root on a local disk are refused
    before any task runs; a name the root does not declare is ignored."""
    def execute(command, image, env):
        raise AssertionError(f"no task should run: {command[3:5]}")

    spec, outputs = kfp_runs["spec"], kfp_runs["outputs"]
    with pytest.raises(kfp_launch.RunRefused, match="train_steps requires type double or "
                                                    "integer"):
        kfp_launch.run_spec(spec, f"minio://{BUCKET}/refused", execute, outputs,
                            parameters={"train_steps": "5"})
    with pytest.raises(kfp_launch.RunRefused, match="takes only gs://, s3://, minio://, oci://"):
        kfp_launch.run_spec(spec, outputs, execute, outputs)
    with pytest.raises(AssertionError, match="no task should run"):  # it started
        kfp_launch.run_spec(spec, f"minio://{BUCKET}/refused", execute, outputs,
                            parameters={"no_such_setting": 5}, secrets=kfp_runs["secrets"])
