"""Resuming mid-epoch: a Trainer SIGKILLed after step 25, with checkpoints every 10 steps,
goes on from step 20 and finishes the epoch; with a row id in every row, the rows of steps
1-20 of the first run and every row of the second are the epoch's rows, each once. With the
buffer shuffle the checkpoint holds tf.data's iterator; with the global order, the row stream's
position alone (a few bytes)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import packing
from tfrecord_shards.packing.write import pack_batch
from tfrecord_shards.codec import schema_file

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS, BATCH, EVERY, KILL_AFTER = 2000, 32, 10, 25
STEPS = -(-ROWS // BATCH)  # one epoch

# One training process: the input function and the training loop of run_fn, with every
# batch's row ids logged as it is fetched. With a kill step, the process SIGKILLs itself
# when it fetches the batch after that step.
TRAIN = textwrap.dedent("""
    import json, os, signal, sys
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    from tfrecord_shards.codec import schema_file
    from components.trainer import fit, models, module
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    from components.trainer import distribute
    from components.trainer.options import TrainerOptions

    examples, out, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    steps, every, shuffle = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    schema = schema_file.load_schema(examples)
    files = os.path.join(examples, "Split-train", "*")
    options, checkpointing = module.checkpointing_for(TrainerOptions(
        checkpoint_every=every, input=InputConfig(batch_size=32, num_epochs=1, seed=7,
                                                  shuffle_buffer=500, shuffle=shuffle)),
        distribute.worker_folders(tf.distribute.get_strategy(), out,
                                  os.path.join(out, "checkpoints")))
    data = build_dataset(files, schema, "label", feature_keys=["x", "row_id"],
                         config=options.input)
    sample = build_dataset(files, schema, "label", feature_keys=["x"],
                           config=InputConfig(batch_size=32, training=False)).take(2)
    model = models.build_tabular_model(schema, ["x"], models.DataStatistics.of(sample, ["x"]),
                                       models.Head("binary"))
    log = open(os.path.join(out, "steps.jsonl"), "a")

    def on_batch(step, batch):
        if step == kill_after + 1:
            os.kill(os.getpid(), signal.SIGKILL)
        rows = batch[0]["row_id"].numpy().ravel().tolist()
        log.write(json.dumps({"pid": os.getpid(), "step": step, "rows": rows}) + "\\n")
        log.flush()

    result = fit.train(model, tf.distribute.get_strategy(), data, steps=steps,
                       steps_per_epoch=steps, log_dir=os.path.join(out, "logs"),
                       global_batch_size=32, checkpointing=checkpointing, on_batch=on_batch)
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"resumed_from_step": result.resumed_from_step,
                   "checkpoints": result.checkpoints}, f)
""")


def row_schema(packed_rows: int = 0) -> schema_pb2.Schema:
    schema = schema_pb2.Schema()
    for name, kind in (("row_id", schema_pb2.INT), ("x", schema_pb2.FLOAT),
                       ("label", schema_pb2.INT)):
        feature = schema.feature.add(name=name, type=kind)
        feature.presence.min_fraction = 1.0
        feature.shape.dim.add(size=1)
    return packing.annotate(schema, packed_rows) if packed_rows else schema


def write_examples(folder, packed_rows: int) -> str:
    """ROWS rows with a row id, per row or packed, in 4 gzip shards and a schema.pbtxt."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=ROWS).astype(np.float32)
    table = pa.table({"row_id": np.arange(ROWS), "x": x, "label": (x > 0).astype(np.int64)})
    os.makedirs(folder / "Split-train")
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    for shard in range(4):
        part = table.slice(shard * ROWS // 4, ROWS // 4)
        if packed_rows:
            records = pack_batch(part, packing.PackedLayout.from_schema(
                row_schema(packed_rows)))
        else:
            records = [tf.train.Example(features=tf.train.Features(feature={
                "row_id": tf.train.Feature(int64_list=tf.train.Int64List(value=[row["row_id"]])),
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[row["x"]])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[row["label"]])),
            })).SerializeToString() for row in part.to_pylist()]
        with tf.io.TFRecordWriter(str(folder / "Split-train" / f"data_tfrecord-{shard:05d}-of-"
                                      f"00004.gz"), options) as writer:
            for record in records:
                writer.write(record)
    schema_file.write_schema(row_schema(packed_rows), str(folder / "schema.pbtxt"))
    return str(folder)


def train(examples: str, out: str, kill_after: int, shuffle: str
          ) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", TRAIN, examples, out, str(kill_after),
         str(STEPS), str(EVERY), shuffle], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO})


@pytest.mark.parametrize("shuffle", ["buffer", "global"])
@pytest.mark.parametrize("packed_rows", [0, 64], ids=["per-row", "packed"])
def test_a_killed_trainer_resumes_mid_epoch_without_losing_a_row(tmp_path, packed_rows,
                                                                 shuffle):
    examples = write_examples(tmp_path / "examples", packed_rows)
    out = tmp_path / "run"
    out.mkdir()
    killed = train(examples, str(out), KILL_AFTER, shuffle)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (out / "result.json").exists()
    resumed = train(examples, str(out), 0, shuffle)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with open(out / "result.json") as f:
        result = json.load(f)
    assert result["resumed_from_step"] == 20  # the last checkpoint before the kill

    with open(out / "steps.jsonl") as f:
        logged = [json.loads(line) for line in f]
    first_pid = logged[0]["pid"]
    first = {e["step"]: e["rows"] for e in logged if e["pid"] == first_pid}
    second = {e["step"]: e["rows"] for e in logged if e["pid"] != first_pid}
    assert sorted(first) == list(range(1, KILL_AFTER + 1))
    assert sorted(second) == list(range(21, STEPS + 1))
    # Steps 21-25 are trained again. A global order is a function of its position, so they
    # hold the very same rows; the buffer shuffle's parallel reads may hand the restored
    # iterator's rows over in another order (seen on a loaded machine), so there only every
    # row of the epoch once is promised, below.
    if shuffle == "global":
        assert all(first[step] == second[step] for step in range(21, KILL_AFTER + 1))
    seen = [row for step in range(1, 21) for row in first[step]] + \
        [row for rows in second.values() for row in rows]
    assert sorted(seen) == list(range(ROWS))  # every row of the epoch, each once
    # The saves after the restart are timed and sized.
    assert [c["step"] for c in result["checkpoints"]] == list(range(30, STEPS + 1, EVERY))
    assert all(c["bytes"] > 0 and c["seconds"] > 0 for c in result["checkpoints"])
    if shuffle == "global":  # the input's state is its row stream's position, nothing more
        assert all(0 < c["input_bytes"] < 1024 for c in result["checkpoints"])
        positions = sorted((out / "checkpoints").glob("*.input.json"))
        assert len(positions) == 2  # one per checkpoint kept
        assert json.loads(positions[-1].read_text())["start_position"] == \
            result["checkpoints"][-1]["step"] * BATCH
    else:
        assert all(c["input_bytes"] is None for c in result["checkpoints"])


def test_checkpointing_with_a_stage_that_cannot_be_saved_says_so(taxi_examples, tmp_path):
    from tfx.components.trainer.fn_args_utils import FnArgs

    from components.transform import taxi
    from components.trainer import fit, module

    args = FnArgs(train_files=[os.path.join(taxi_examples, "Split-train", "*")],
                  eval_files=[os.path.join(taxi_examples, "Split-eval", "*")],
                  schema_path=os.path.join(taxi_examples, "schema.pbtxt"),
                  model_run_dir=str(tmp_path / "model_run"),
                  serving_model_dir=str(tmp_path / "serving"), train_steps=4, eval_steps=1,
                  custom_config={**taxi.TRAINER_SETTINGS, "checkpoint_every": 2,
                                 "skip_corrupt": True})
    with pytest.raises(fit.InputNotCheckpointable, match="skip_corrupt .* begin the epoch"):
        module.run_fn(args)

    # A stage found only when saving (a Python generator) stops the run the same way.
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(1,))])
    model.compile(optimizer="adam", loss="mse")
    data = tf.data.Dataset.from_generator(
        lambda: ((np.ones((4, 1), np.float32), np.ones((4, 1), np.float32)) for _ in range(9)),
        output_signature=(tf.TensorSpec([4, 1]), tf.TensorSpec([4, 1])))
    with pytest.raises(fit.InputNotCheckpointable, match="begin the epoch again"):
        fit.train(model, tf.distribute.get_strategy(), data, steps=4, steps_per_epoch=4,
                  log_dir=str(tmp_path / "logs"), global_batch_size=4,
                  checkpointing=fit.Checkpointing(str(tmp_path / "ckpt"), 2))


# The job that loses its worker: its settings, and the job itself, run once for the three
# restarts below (each restarts from a copy of its folder).
LOST_WORKER_JOB = dict(steps=42, batch_size=48, checkpoint_every=10, kill_after=25)


@pytest.fixture(scope="module")
def job_that_lost_a_worker(tmp_path_factory) -> tuple[str, str]:
    """(examples, the folder of the job that lost worker 1)."""
    from testsupport.trainer_faults import killed_job

    folder = tmp_path_factory.mktemp("lost-worker")
    examples = write_examples(folder / "examples", 0)
    killed_job(examples, str(folder / "job"), **LOST_WORKER_JOB)
    return examples, str(folder / "job")


@pytest.mark.parametrize("restart_workers", [1, 2, 3])
def test_a_job_that_lost_a_worker_resumes_from_its_checkpoint_and_reads_each_row_once(
        job_that_lost_a_worker, tmp_path, restart_workers):
    """Two MultiWorkerMirroredStrategy workers train a global order with saves every 10
    steps; worker 1 is SIGKILLed at step 26. Worker 0 fails on its own (its all-reduce with
    the dead worker errs), so an orchestrator sees the job fail rather than hang. As one
    would, the test starts the job again (in a copy of its folder; the first job runs once
    for all three), on one worker, on two and on three: each restores
    the chief's step-20 checkpoint and builds its input at the saved position. Steps 1-20 of the
    first job and every step of the second together read exactly the rows one process reads
    in the stream's first 42 batches of 48: each row of the epoch once, and the first rows of
    the next."""
    from testsupport.trainer_faults import cluster_run, stream_rows

    examples, killed_in = job_that_lost_a_worker
    steps = LOST_WORKER_JOB["steps"]  # 2016 rows: the epoch's 2000 and 16 of the next
    run = cluster_run(examples, str(tmp_path / "job"), **LOST_WORKER_JOB,
                      restart_workers=restart_workers, killed_in=killed_in)
    assert run["survivor"]["exit"] not in (0, None), run["survivor"]
    assert run["results"] == [{"resumed_from_step": 20, "workers": restart_workers}
                              ] * restart_workers
    by_step = run["rows_by_step"]
    assert sorted(by_step) == list(range(1, steps + 1))
    assert all(len(rows) == 48 for rows in by_step.values())
    seen = sorted(row for rows in by_step.values() for row in rows)
    assert seen == sorted(stream_rows(examples, steps, 48))
    assert sorted(set(seen)) == list(range(ROWS)) and len(seen) - ROWS == 16
