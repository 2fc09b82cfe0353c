"""Two runs at once on one output root, and pushes that meet in one second: a second `tfrp
run` refuses while the first holds the pipeline's lock (a killed holder's lock is taken
over); each push gets a version folder of its own, and a push killed part-way, on a disk or a
bucket, leaves nothing TF Serving's version scan or our finder would take for a model."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REACHABLE, taxi_run_args, tfrp
from tfrecord_shards import fileio
from components.production_model.find import latest_pushed
from components.pusher import push

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the lock ------------------------------------------------------------------------------

def _config(tmp_path, **settings):
    from pipeline.configs import PipelineConfig
    from pipeline import local_runner

    config = local_runner.local_config(PipelineConfig(
        pipeline_name="locked", output_root=str(tmp_path), **settings))
    fileio.makedirs(fileio.dirname(config.metadata_path))
    return config


def test_a_held_lock_refuses_naming_its_run_and_a_killed_holders_is_taken_over(tmp_path):
    """A process holding the run lock makes the next run refuse in one line naming its run,
    pid and host; once it is SIGKILLed (no cleanup), the lock is free at once."""
    from pipeline import local_runner

    config = _config(tmp_path)
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the holder: takes the lock, says so, and waits to be killed
        try:
            with local_runner.run_lock(config, "2030-01-01T00:00:00.000001"):
                os.write(ready_write, b"1")
                time.sleep(120)
        finally:
            os._exit(0)
    try:
        assert os.read(ready_read, 1) == b"1"
        with pytest.raises(local_runner.AlreadyRunning) as refused:
            with local_runner.run_lock(config, "second"):
                pytest.fail("two holders of one lock")
        message = str(refused.value)
        assert "\n" not in message
        assert "run 2030-01-01T00:00:00.000001" in message and f"pid {pid} on " in message
        assert config.pipeline_root in message
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready_read)
        os.close(ready_write)
    with local_runner.run_lock(config, "third"):  # the dead holder's lock, taken over
        holder = json.loads(open(local_runner.lock_path(config)).read())
        assert holder["run_id"] == "third" and holder["pid"] == os.getpid()


@pytest.mark.pipeline
def test_a_second_run_on_one_output_root_refuses_and_the_first_reports_its_own(
        taxi_slice_dir, tmp_path):
    """Two `tfrp run` on one output root, the second (another model: more steps) started
    while the first runs: the second refuses in one line naming the first's run and changes
    nothing; the first completes, and its summary and push are its own."""
    from pipeline.configs import PipelineConfig
    from pipeline import local_runner, run_summary

    first = PipelineConfig(pipeline_name="overlap", data_root=taxi_slice_dir,
                           output_root=str(tmp_path / "out"), train_steps=100, eval_steps=5,
                           batch_size=64, **REACHABLE)
    second = first.replace(train_steps=150)
    lock = local_runner.lock_path(local_runner.local_config(first))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    started = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run",
                                *taxi_run_args(first)], cwd=ROOT, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        holder = {}
        deadline = time.monotonic() + 120
        while holder.get("pid") != started.pid and time.monotonic() < deadline:
            assert started.poll() is None, started.communicate()
            time.sleep(0.2)
            text = open(lock).read() if os.path.exists(lock) else ""
            holder = json.loads(text) if text.strip() else {}
        assert holder.get("pid") == started.pid, "the first run never took the lock"
        refused = tfrp("run", *taxi_run_args(second), check=False)
        out, err = started.communicate(timeout=600)
    finally:
        if started.poll() is None:
            started.kill()
    assert refused.returncode != 0
    error = [line for line in refused.stderr.splitlines() if line.startswith("Error")]
    assert len(error) == 1 and "already running" in error[0], refused.stderr[-2000:]
    assert f"run {holder['run_id']} (pid {started.pid} on " in error[0]
    assert "Running overlap" in refused.stdout and "ShardedExampleGen" not in refused.stdout
    assert started.returncode == 0, err[-3000:]

    # The second changed nothing: the store holds one run, the serving folder one push.
    metadata = local_runner.local_config(first).metadata_path
    store = run_summary.open_store(metadata)
    runs = store.get_contexts_by_type("pipeline_run")
    assert [r.name for r in runs] == [holder["run_id"]]
    serving = local_runner.local_config(first).resolved_serving_dir
    [(version, folder)] = push.pushed_versions(serving)
    assert not [n for n in os.listdir(serving) if n != str(version)]

    # The first's summary is its own: every component ran once, the push is its model.
    summary = run_summary.summarize(metadata, first.pipeline_name, holder["run_id"])
    assert "Reused from cache: 0 of" in out
    assert f"Pushed model: {folder}" in out
    assert summary.pushed_model == folder and summary.blessed
    [model] = summary.artifacts["Model"]
    assert push.read_marker(folder)["source"].startswith(model.uri)
    [trainer] = [e for e in store.get_executions_by_context(runs[0].id)
                 if run_summary.node_name(store, e) == "Trainer"]
    train_args = trainer.custom_properties["train_args"].string_value
    assert json.loads(train_args) == {"num_steps": 100}  # the first's model, not the second's
    assert len([line for line in out.splitlines()
                if line.strip().startswith("Trainer ")]) == 1


# -- pushes --------------------------------------------------------------------------------

def _saved_model(folder, value: float) -> str:
    """A real SavedModel that returns `value`: two values, two fingerprints."""
    import tensorflow as tf

    class Constant(tf.Module):
        def __init__(self):
            super().__init__()
            self.value = tf.Variable(value)

        @tf.function(input_signature=[])
        def __call__(self):
            return self.value

    module = Constant()
    tf.saved_model.save(module, str(folder))
    return str(folder)


def _fingerprint(folder: str) -> int:
    import tensorflow as tf

    return tf.saved_model.experimental.read_fingerprint(folder).saved_model_checksum


def _push_with_the_pipelines_pusher(model_uri: str, serving: str, pushed_uri: str):
    """One push through the executor of the Pusher `create_pipeline` builds, as TFX calls it:
    a blessed Model artifact in, a PushedModel out."""
    from tfx.proto import pusher_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    from components.pusher.component import Pusher

    model, blessing, pushed = (standard_artifacts.Model(), standard_artifacts.ModelBlessing(),
                               standard_artifacts.PushedModel())
    model.uri, blessing.uri, pushed.uri = model_uri, model_uri + "-blessing", pushed_uri
    blessing.set_int_custom_property("blessed", 1)
    destination = pusher_pb2.PushDestination(filesystem=pusher_pb2.PushDestination.Filesystem(
        base_directory=serving))
    Pusher.EXECUTOR_SPEC.executor_class().Do(
        {"model": [model], "model_blessing": [blessing]}, {"pushed_model": [pushed]},
        {"push_destination": proto_utils.proto_to_json(destination)})
    return pushed


def test_two_pushes_in_one_second_get_folders_of_their_own(tmp_path):
    """Two different models pushed back to back (the same second, where stock's Pusher gave
    both one folder and dropped the second): two versions, each folder complete and holding
    its own model, and the PushedModel properties stock's readers take."""
    from pipeline.pipeline import Pusher as PipelinesPusher
    from components.pusher.component import Pusher

    assert PipelinesPusher is Pusher
    serving = str(tmp_path / "serving")
    models = [_saved_model(tmp_path / f"model-{i}" / "Format-Serving", float(i))
              for i in (1, 2)]
    assert _fingerprint(models[0]) != _fingerprint(models[1])
    for attempt in range(3):  # the two pushes must fall in one second; they take milliseconds
        pushed = [_push_with_the_pipelines_pusher(os.path.dirname(m), serving,
                                                  str(tmp_path / f"pushed-{attempt}-{i}"))
                  for i, m in enumerate(models)]
        versions = [int(p.get_string_custom_property("pushed_version")) for p in pushed]
        if versions[0] // 10 ** 6 == versions[1] // 10 ** 6:
            break
    assert versions[0] // 10 ** 6 == versions[1] // 10 ** 6 and versions[0] < versions[1]
    for p, model, version in zip(pushed, models, versions):
        destination = p.get_string_custom_property("pushed_destination")
        assert p.get_int_custom_property("pushed") == 1
        assert destination == os.path.join(serving, str(version))
        assert push.is_complete(destination, version)
        assert _fingerprint(destination) == _fingerprint(model)
        assert _fingerprint(p.uri) == _fingerprint(model)  # stock's archive copy
    assert latest_pushed(serving) == pushed[1].get_string_custom_property("pushed_destination")
    assert not [n for n in os.listdir(serving) if not n.isdigit()]  # no staging left


def _fake_model(folder) -> str:
    """A SavedModel's layout (names only): enough for the copy's order and the markers."""
    os.makedirs(os.path.join(folder, "variables"))
    os.makedirs(os.path.join(folder, "assets"))
    for name in ("variables/variables.index", "variables/variables.data-00000-of-00001",
                 "assets/vocabulary.txt", "fingerprint.pb", "saved_model.pb"):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(os.urandom(2048))
    return str(folder)


def test_a_clash_takes_the_next_number_and_never_writes_into_a_folder(tmp_path):
    """Two pushes in one microsecond, and a folder already at the number the clock gives: each
    push takes the next free number; the folder that was there is left as it was."""
    model = _fake_model(tmp_path / "model")
    serving = tmp_path / "serving"
    taken = serving / "1700000000000000"
    taken.mkdir(parents=True)
    (taken / "other.txt").write_text("not ours")
    clock = lambda: 1_700_000_000_000_000_000  # noqa: E731 - always the same nanosecond
    # Newest there + 1 is above the clock: the new versions are above every folder.
    first = push.push(model, str(serving), clock=clock)
    second = push.push(model, str(serving), clock=clock)
    assert (first.version, second.version) == (1700000000000001, 1700000000000002)
    assert os.listdir(taken) == ["other.txt"]
    for pushed in (first, second):
        assert sorted(os.listdir(pushed.destination)) == sorted(
            os.listdir(model) + [push.MARKER_FILE])
    # The clock alone: a number taken between the look and the move goes to the next.
    (serving / "1700000000000003").mkdir()
    (serving / "1700000000000003" / "x").write_text("")
    third = push.push(model, str(serving), clock=clock)
    assert third.version == 1700000000000004


# Runs a push whose process SIGKILLs itself after the N-th file it writes; then the same push
# again, unkilled, when asked. argv: model, serving folder, N.
KILLED_PUSH = """
import os, signal, sys
from components.pusher import push
model, serving, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
push.push(model, serving)  # one complete push first: the model in production
written = []
def hook(path):
    written.append(path)
    if len(written) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
push.push(model, serving, on_copied=hook)
"""

# What TF Serving's version scan and our finder see in a serving folder, as JSON.
SCAN = """
import json, sys
from tfrecord_shards import fileio
from components.production_model.find import latest_pushed
from components.pusher import push
serving = sys.argv[1]
numeric = {n: sorted(fileio.relpath(fileio.join(r, f), fileio.join(serving, n))
                     for r, _, fs in fileio.walk(fileio.join(serving, n)) for f in fs)
           for n in fileio.listdir(serving) if n.isdigit()}
print(json.dumps({"numeric": numeric, "latest": latest_pushed(serving),
                  "complete": [f for _, f in push.pushed_versions(serving)],
                  "names": fileio.listdir(serving)}))
"""


def _check_scan(scan: dict, model_files: list[str]) -> None:
    """The killed push left no numeric folder TF Serving would load (each has the marker and
    the whole model, or no saved_model.pb), and the finder takes the earlier push."""
    [complete] = scan["complete"]
    assert scan["latest"] == complete
    for name, files in scan["numeric"].items():
        if push.MARKER_FILE in files:
            assert sorted(files) == sorted(model_files + [push.MARKER_FILE]), (name, files)
        else:
            assert push.SAVED_MODEL_FILE not in files, (name, files)


def _model_files(model: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(r, f), model)
                  for r, _, fs in os.walk(model) for f in fs)


@pytest.mark.parametrize("kill_at", [1, 5])
def test_a_push_killed_part_way_on_a_disk_leaves_no_version(tmp_path, kill_at):
    """Killed after its first file, or after all but saved_model.pb: only the hidden staging
    folder is left (TF Serving skips non-numeric names), and the finder keeps the earlier push;
    the next push completes."""
    model = _fake_model(tmp_path / "model")
    serving = str(tmp_path / "serving")
    killed = subprocess.run([sys.executable, "-c", KILLED_PUSH, model, serving, str(kill_at)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    scan = json.loads(subprocess.run([sys.executable, "-c", SCAN, serving], cwd=ROOT,
                                     capture_output=True, text=True, check=True).stdout)
    _check_scan(scan, _model_files(model))
    assert len(scan["numeric"]) == 1
    assert [n for n in scan["names"] if n.startswith(push.STAGING_PREFIX)]
    after = push.push(model, serving)
    assert latest_pushed(serving) == after.destination


@pytest.mark.object_store
def test_a_push_killed_part_way_on_a_bucket_is_not_a_version(object_stores, tmp_path):
    """On gs://, where the move into the numeric folder is a copy per object, a push killed
    part-way through that copy leaves a numeric folder without the marker or saved_model.pb
    (TF Serving fails to load it and keeps serving the model it has), which the finder
    skips."""
    serving = f"{object_stores.make_bucket('gs', 'tfrp-pushes')}/serving"
    model = _fake_model(tmp_path / "model")
    files = _model_files(model)
    # The staging copy writes every file, then the move copies 2 of them, then the kill.
    killed = object_stores.run([sys.executable, "-c", KILLED_PUSH, model, serving,
                                str(len(files) + 2)], cwd=ROOT, timeout=300,
                               env={"PYTHONWARNINGS": "ignore"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    scanned = object_stores.run([sys.executable, "-c", SCAN, serving], cwd=ROOT, timeout=300,
                                env={"PYTHONWARNINGS": "ignore"})
    assert scanned.returncode == 0, scanned.stderr[-3000:]
    scan = json.loads(scanned.stdout)
    _check_scan(scan, files)
    [partial] = [files_there for files_there in scan["numeric"].values()
                 if push.MARKER_FILE not in files_there]
    assert len(partial) == 2
