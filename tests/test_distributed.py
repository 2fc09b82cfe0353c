"""Training beyond one replica, on CPU as CI has it: MirroredStrategy over two logical CPU
devices in one process, and MultiWorkerMirroredStrategy over two worker processes on
127.0.0.1, each running run_fn as the Trainer does on every replica of a cluster."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from testsupport.trainer_faults import data_service_run, start_data_service, stop, write_row_ids
from components.transform import taxi
from components.example_gen import beam_job
from components.example_gen.options import ExampleGenOptions
from local_cluster.listening import free_ports
from tfrecord_shards.shards import ShardingOptions
from components.trainer.input import build_dataset
from components.trainer.options import InputConfig

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What each training process runs: run_fn with real FnArgs, as TFX's Trainer calls it.
RUN_FN = textwrap.dedent("""
    import json, os, sys
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    if os.environ.get("LOGICAL_CPUS"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * int(os.environ["LOGICAL_CPUS"]))
    from tfx.components.trainer.fn_args_utils import FnArgs
    from components.trainer import module
    examples, out, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    module.run_fn(FnArgs(
        train_files=[os.path.join(examples, "Split-train", "*")],
        eval_files=[os.path.join(examples, "Split-eval", "*")],
        schema_path=os.path.join(examples, "schema.pbtxt"),
        model_run_dir=os.path.join(out, "model_run"),
        serving_model_dir=os.path.join(out, "serving"),
        train_steps=60, eval_steps=2, custom_config=settings))
""")
SETTINGS = {**taxi.TRAINER_SETTINGS, "batch_size": 64, "epochs": 3}


@pytest.fixture(scope="module")
def four_shard_examples(taxi_slice_dir, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("four_shards") / "examples")
    beam_job.run(ExampleGenOptions(source=os.path.join(taxi_slice_dir, "data.csv"),
                                   sharding=ShardingOptions(num_shards=4)), out)
    return out


def start(examples: str, out: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", RUN_FN, examples, out, json.dumps(SETTINGS)],
        cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO, **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, timeout: float = 300) -> None:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output[-4000:]


def losses(report: dict) -> list[float]:
    return [epoch["metrics"]["loss"] for epoch in report["epochs"]]


@pytest.fixture(scope="module")
def training_runs(four_shard_examples, tmp_path_factory) -> dict:
    """One process with MirroredStrategy over two logical CPUs; then the two worker processes
    of one MultiWorkerMirroredStrategy cluster on 127.0.0.1 (all three at once would be
    three trainers on this machine's two cores)."""
    mirrored, cluster = (tmp_path_factory.mktemp(n) for n in ("mirrored", "workers"))
    finish(start(four_shard_examples, str(mirrored), {"LOGICAL_CPUS": "2"}))
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes = [start(four_shard_examples, str(cluster), {"TF_CONFIG": json.dumps({
        "cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})})
        for index in range(2)]
    for process in processes:
        finish(process)
    return {"mirrored": mirrored, "workers": cluster}


def test_mirrored_strategy_over_two_logical_cpus_reduces_loss(training_runs):
    out = training_runs["mirrored"]
    with open(out / "model_run" / "input_report.json") as f:
        report = json.load(f)
    assert (report["strategy"], report["replicas"]) == ("MirroredStrategy", 2)
    assert report["global_batch_size"] == 64  # global: 32 per replica
    assert losses(report)[-1] < losses(report)[0], losses(report)
    assert os.path.exists(out / "serving" / "saved_model.pb")


def test_two_workers_train_on_different_files_and_reduce_loss(training_runs):
    out = training_runs["workers"]
    reports = []
    for folder in ("model_run", os.path.join("model_run", "worker-1")):
        with open(out / folder / "input_report.json") as f:
            reports.append(json.load(f))
    for report in reports:
        assert (report["strategy"], report["workers"]) == ("MultiWorkerMirroredStrategy", 2)
        assert losses(report)[-1] < losses(report)[0], losses(report)
    chief_files, other_files = (set(r["input_files"]) for r in reports)
    assert len(chief_files) == len(other_files) == 2 and not chief_files & other_files
    # Only the chief exports the model.
    assert os.path.exists(out / "serving" / "saved_model.pb")
    assert not os.path.exists(out / "model_run" / "worker-1" / "model_copy")


def eval_rows(examples: str, context=None) -> list[tuple[float, float]]:
    """(trip_seconds, fare) of every eval row one input pipeline yields."""
    from tfrecord_shards.codec import schema_file

    dataset = build_dataset(os.path.join(examples, "Split-eval", "*"),
                            schema_file.load_schema(examples), None,
                            feature_keys=["trip_seconds", "fare"],
                            config=InputConfig(batch_size=50, training=False, num_epochs=1),
                            input_context=context)
    return [(float(s), float(f)) for batch in dataset
            for s, f in zip(batch["trip_seconds"].numpy().ravel(),
                            batch["fare"].numpy().ravel())]


def test_fewer_files_than_pipelines_shards_by_record(taxi_examples):
    """One file, two input pipelines: each keeps every other record, none is read twice."""
    assert len(os.listdir(os.path.join(taxi_examples, "Split-eval"))) == 1
    first, second = (eval_rows(taxi_examples, tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=pipeline)) for pipeline in (0, 1))
    everything = eval_rows(taxi_examples)
    assert abs(len(first) - len(second)) <= 1
    assert sorted(first + second) == sorted(everything)


# --- tf.data service ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data_service():
    """A dispatcher and two workers on loopback ports; yields the dispatcher's address."""
    address, servers, _ = start_data_service()
    yield address
    stop(servers)


def test_the_dispatcher_says_where_it_really_listens_and_warns_of_an_open_port():
    """TensorFlow binds tf.data service servers to every interface and has no setting to
    choose one: the start-up lines print the binding the kernel reports and, when it is not
    loopback alone, the warning with the network rule it needs."""
    from local_cluster import listening

    (port,) = free_ports(1)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    server = subprocess.Popen([sys.executable, "-W", "ignore", "-m", "pipeline.cli",
                               "data-service", "dispatcher", "--port", str(port)],
                              cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        first, second = server.stderr.readline(), server.stderr.readline()
        bound, where = listening.listening_addresses(port), listening.describe(port)
    finally:
        server.kill()
        server.wait()
    assert bound, first
    assert f"listening on {where}" in first, first
    assert f"reach it at grpc://{socket.getfqdn()}:{port}" in first, first
    if bound - {"127.0.0.1", "::1"}:
        assert "every interface" in first and "no one for credentials" in second, second
        assert f"--dport {port}" in second, second


@pytest.fixture(scope="module")
def row_id_examples(tmp_path_factory) -> str:
    """3,000 rows with a row_id, in 4 shards per split."""
    return write_row_ids(str(tmp_path_factory.mktemp("row_ids")), 3000, 4)


def epoch_row_ids(examples: str, service=None, on_served_epoch=None) -> list[int]:
    from tfrecord_shards.codec import schema_file

    dataset = build_dataset(os.path.join(examples, "Split-train", "*"),
                            schema_file.load_schema(examples), None, feature_keys=["row_id"],
                            config=InputConfig(batch_size=64, num_epochs=1, data_service=service),
                            on_served_epoch=on_served_epoch)
    return [int(v) for batch in dataset for v in batch["row_id"].numpy().ravel()]


def test_the_data_service_yields_every_row_of_an_epoch_once(row_id_examples, data_service):
    direct = epoch_row_ids(row_id_examples)
    epochs: list = []
    served = epoch_row_ids(row_id_examples, data_service, epochs.append)
    assert len(direct) > 1000 and len(set(direct)) == len(direct)
    assert sorted(served) == sorted(direct)
    # The epoch's rows are counted against the split's, which our manifest gives.
    assert epochs == [{"epoch": 0, "rows": len(direct), "expected_rows": len(direct),
                       "missed_rows": 0}]


def test_training_through_the_data_service_reduces_loss(row_id_examples, data_service,
                                                       tmp_path):
    from tfrecord_shards.codec import schema_file
    from components.trainer import fit, models

    schema = schema_file.load_schema(row_id_examples)
    files = os.path.join(row_id_examples, "Split-train", "*")
    data = build_dataset(files, schema, "label", feature_keys=["x"],
                         config=InputConfig(batch_size=64, data_service=data_service))
    sample = build_dataset(files, schema, "label", feature_keys=["x"],
                           config=InputConfig(batch_size=64, training=False)).take(2)
    model = models.build_tabular_model(schema, ["x"], models.DataStatistics.of(sample, ["x"]),
                                       models.Head("binary"))
    result = fit.train(model, tf.distribute.get_strategy(), data, steps=60, steps_per_epoch=20,
                       log_dir=str(tmp_path), global_batch_size=64)
    report = result.report()
    assert losses(report)[-1] < losses(report)[0], losses(report)
    # The input-wait report still times each step's wait for its batch.
    assert all(epoch["wait_seconds"] > 0 for epoch in report["epochs"])


def test_a_data_service_worker_killed_mid_epoch_training_goes_on_and_says_what_was_missed(
        tmp_path, caplog):
    """Two tf.data service workers feed a training loop, each handed one of the split's two
    files (12,000 rows in all); one is SIGKILLed 2 steps in, its file mostly unread, and,
    as a supervisor would, a new one is started at its address (TensorFlow 2.16's client waits
    for that address: with no worker back there it never ended, tried here for minutes).
    Training goes on and finishes. The epoch the worker died in brings each row at most once,
    and the input counts what it brought against the split: rows brought + rows missed = the
    split's rows, and a warning names the missed rows (the service's epoch is at most once:
    rows a dead worker held are not read again; how many depends on what it held, from none
    to most of the epoch in tries here). The next epoch brings every row, once."""
    examples = write_row_ids(str(tmp_path), 12_000, 2)
    run = data_service_run(examples, 32, str(tmp_path / "logs"), kill_at_step=2)
    assert run["worker_killed"] and run["worker_restarted"]
    assert run["trained_steps"] == run["steps"]  # training went on to the end
    split_rows, epochs, seen = run["split_rows"], run["served_epochs"], run["rows"]
    first, second = epochs[0], epochs[1]
    assert first["expected_rows"] == second["expected_rows"] == split_rows
    assert 0 <= first["missed_rows"] < split_rows
    assert first["rows"] + first["missed_rows"] == split_rows
    warned = [r.getMessage() for r in caplog.records if "missed" in r.getMessage()]
    assert warned == ([f"tf.data service: epoch 0 brought {first['rows']} of {split_rows} "
                       f"rows; {first['missed_rows']} missed (a worker was lost mid-epoch: "
                       "the service's epoch is at most once, so the rows it held are not "
                       "read again)"] if first["missed_rows"] else [])
    assert second == {"epoch": 1, "rows": split_rows, "expected_rows": split_rows,
                      "missed_rows": 0}
    in_first = seen[:first["rows"]]
    assert len(set(in_first)) == len(in_first)  # fewer rows, none twice
    assert len(set(seen[first["rows"]:first["rows"] + split_rows])) == split_rows

