"""The Trainer's two faults, as the tests and `python -m bench faults` run them.

- A tf.data service worker SIGKILLed mid-epoch. As a supervisor would, a new worker is
  started at its address: TensorFlow 2.16's client waits for a lost worker's address and
  never ends otherwise (tried here for minutes, with and without the dispatcher's
  fault-tolerant mode).
- One of two MultiWorkerMirroredStrategy workers SIGKILLed mid-epoch. The survivor's next
  all-reduce fails (UnavailableError) and it exits non-zero; as an orchestrator would, the
  job is then started again, on the same or another number of workers, and every worker
  restores the chief's last checkpoint and input position.

Every batch's row ids are logged as it is fetched, so what was read is counted from the rows
themselves, not assumed. Run as `python -m testsupport.trainer_faults ARGS`, this module is one
worker of such a job (TF_CONFIG from the environment).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 7
WORKER_TIMEOUT = 300
SURVIVOR_TIMEOUT = 120


def process_env(**extra: str) -> dict:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO, **extra}


def write_row_ids(folder: str, rows: int, shards: int) -> str:
    """`rows` rows of (row_id, x, label) through our ExampleGen, `shards` shards per split."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from components.example_gen import beam_job
    from components.example_gen.options import ExampleGenOptions
    from tfrecord_shards.shards import ShardingOptions

    rng = np.random.default_rng(0)
    x = rng.normal(size=rows)
    source = os.path.join(folder, "rows.parquet")
    pq.write_table(pa.table({"row_id": np.arange(rows), "x": x, "label": (x > 0).astype(int)}),
                   source)
    out = os.path.join(folder, "examples")
    beam_job.run(ExampleGenOptions(source=source, sharding=ShardingOptions(num_shards=shards)),
                 out)
    return out


# tf.data service: each server a `tfrp data-service` process on a loopback port.

def start_server(*arguments: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-W", "ignore", "-m", "pipeline.cli", "data-service", *arguments],
        cwd=REPO, env=process_env(), stderr=subprocess.PIPE, text=True)


def start_worker(dispatcher_port: int, port: int) -> subprocess.Popen:
    """A `tfrp data-service worker`, once it says it started (on stderr)."""
    worker = start_server("worker", "--dispatcher", f"localhost:{dispatcher_port}",
                          "--port", str(port))
    line = worker.stderr.readline()
    if "tf.data service" not in line:
        raise RuntimeError(f"the tf.data service worker did not start: {line}")
    return worker


def start_data_service(workers: int = 2) -> tuple[str, list[subprocess.Popen], list[int]]:
    """A dispatcher and `workers` workers: the dispatcher's grpc:// address, the processes
    (dispatcher first) and their ports."""
    from local_cluster.listening import free_ports

    ports = free_ports(1 + workers)
    dispatcher = start_server("dispatcher", "--port", str(ports[0]))
    time.sleep(3)  # the workers register with a dispatcher that is up
    servers = [dispatcher] + [start_worker(ports[0], port) for port in ports[1:]]
    line = dispatcher.stderr.readline()
    if "tf.data service" not in line:
        raise RuntimeError(f"the tf.data service dispatcher did not start: {line}")
    return f"grpc://localhost:{ports[0]}", servers, ports


def stop(servers: list[subprocess.Popen]) -> None:
    for server in servers:
        server.kill()
        server.wait()


def data_service_run(examples: str, batch_size: int, log_dir: str,
                     kill_at_step: Optional[int] = None) -> dict:
    """Trains through a dispatcher and two workers on the train split for two epochs and 5
    steps (each worker handed one of the split's files when it has two). With
    `kill_at_step`, worker 1 is SIGKILLed when that step's batch is fetched and a new worker
    is started at its port. Returns the training's seconds (servers up already), the served
    epochs' counts, every trained row id in order, the split's rows and what became of the
    worker."""
    import tensorflow as tf

    from tfrecord_shards.codec import schema_file
    from components.trainer import fit, models
    from components.trainer.input import build_dataset, split_rows
    from components.trainer.options import InputConfig

    address, servers, ports = start_data_service()
    try:
        started = time.monotonic()
        schema = schema_file.load_schema(examples)
        files = os.path.join(examples, "Split-train", "*")
        epochs: list = []
        data = build_dataset(files, schema, "label", feature_keys=["x", "row_id"],
                             config=InputConfig(batch_size=batch_size, data_service=address),
                             on_served_epoch=epochs.append)
        sample = build_dataset(files, schema, "label", feature_keys=["x"],
                               config=InputConfig(batch_size=64, training=False)).take(2)
        model = models.build_tabular_model(schema, ["x"],
                                           models.DataStatistics.of(sample, ["x"]),
                                           models.Head("binary"))
        rows: list = []

        def on_batch(step: int, batch) -> None:
            if step == kill_at_step:
                servers[2].send_signal(signal.SIGKILL)
                servers[2].wait()
                servers.append(start_worker(ports[0], ports[2]))
            rows.extend(int(v) for v in batch[0]["row_id"].numpy().ravel())

        split = split_rows(files)
        steps = 2 * -(-split // batch_size) + 5  # through the second epoch's end
        result = fit.train(model, tf.distribute.get_strategy(), data, steps=steps,
                           steps_per_epoch=steps, log_dir=log_dir,
                           global_batch_size=batch_size, on_batch=on_batch)
        seconds = time.monotonic() - started
    finally:
        stop(servers)
    return {"seconds": seconds, "served_epochs": epochs, "rows": rows, "split_rows": split,
            "steps": steps, "trained_steps": result.epochs[0].steps,
            "worker_killed": servers[2].returncode == -signal.SIGKILL,
            "worker_restarted": len(servers) == 4}


# MultiWorkerMirroredStrategy: each worker a process running `main` below.

def start_cluster(examples: str, out: str, workers: int, *, steps: int, batch_size: int,
                  checkpoint_every: int, kill_after: int = 0, kill_worker: int = -1
                  ) -> list[subprocess.Popen]:
    """A job of `workers` worker processes on 127.0.0.1 (see `main`)."""
    from local_cluster.listening import free_ports

    addresses = [f"127.0.0.1:{port}" for port in free_ports(workers)]
    return [subprocess.Popen(
        [sys.executable, "-W", "ignore", "-m", "testsupport.trainer_faults", examples, out,
         str(steps), str(batch_size), str(checkpoint_every), str(kill_after), str(kill_worker)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=process_env(TF_CONFIG=json.dumps({"cluster": {"worker": addresses},
                                              "task": {"type": "worker", "index": index}})))
        for index in range(workers)]


def _finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=WORKER_TIMEOUT)
    if process.returncode != 0:
        raise RuntimeError(f"a worker failed ({process.returncode}):\n{output[-3000:]}")
    return output


def cluster_run(examples: str, out: str, *, steps: int, batch_size: int,
                checkpoint_every: int, kill_after: Optional[int] = None,
                restart_workers: int = 2, killed_in: Optional[str] = None) -> dict:
    """A job of two workers training `steps` steps of a global order. With `kill_after`,
    worker 1 SIGKILLs itself when it fetches the batch after that step; worker 0's next
    all-reduce fails and it exits on its own (given `SURVIVOR_TIMEOUT` seconds, then stopped,
    as an orchestrator's deadline would), and the job is started again on `restart_workers`
    workers. `killed_in`: a folder where `killed_job` already ran that first job with the
    same settings; it is copied to `out`, and only the second start runs.

    Returns the seconds from the first start (with `killed_in`, the second) to the last
    exit; how the survivor ended (its exit code, None if it had to be stopped) and after how
    long; each worker's result; and, by step, the rows the model kept: the first job's steps
    up to the checkpoint the second restored, then every step of the second.
    """
    os.makedirs(out, exist_ok=True)
    settings = dict(steps=steps, batch_size=batch_size, checkpoint_every=checkpoint_every)
    started = time.monotonic()
    if kill_after is None:
        for worker in start_cluster(examples, out, 2, **settings):
            _finish(worker)
        first_logs: set = set()
        workers, survivor = 2, None
    else:
        if killed_in is None:
            survivor = killed_job(examples, out, kill_after=kill_after, **settings)
        else:
            shutil.copytree(killed_in, out, dirs_exist_ok=True)
            with open(os.path.join(out, SURVIVOR_FILE)) as f:
                survivor = json.load(f)
        first_logs = {name for name in os.listdir(out) if name.startswith("steps-")}
        for worker in start_cluster(examples, out, restart_workers, **settings):
            _finish(worker)
        workers = restart_workers
    seconds = time.monotonic() - started
    results = []
    for index in range(workers):
        with open(os.path.join(out, f"result-{index}.json")) as f:
            results.append(json.load(f))
    resumed = results[0]["resumed_from_step"]
    rows_by_step: dict[int, list[int]] = {}
    for name in os.listdir(out):
        if not name.startswith("steps-"):
            continue
        with open(os.path.join(out, name)) as f:
            for line in f:
                entry = json.loads(line)
                if (name in first_logs) == (entry["step"] <= resumed):
                    rows_by_step.setdefault(entry["step"], []).extend(entry["rows"])
    return {"seconds": seconds, "survivor": survivor, "results": results,
            "rows_by_step": rows_by_step}


SURVIVOR_FILE = "survivor.json"


def killed_job(examples: str, out: str, *, steps: int, batch_size: int,
               checkpoint_every: int, kill_after: int) -> dict:
    """`cluster_run`'s first job with `kill_after`, into `out`: worker 1 killed, worker 0
    left to fail. Returns how the survivor ended, also kept in `out`/SURVIVOR_FILE."""
    os.makedirs(out, exist_ok=True)
    first = start_cluster(examples, out, 2, steps=steps, batch_size=batch_size,
                          checkpoint_every=checkpoint_every, kill_after=kill_after,
                          kill_worker=1)
    output, _ = first[1].communicate(timeout=WORKER_TIMEOUT)
    if first[1].returncode != -signal.SIGKILL:
        raise RuntimeError(f"worker 1 was to be killed; it ended {first[1].returncode}:\n"
                           f"{output[-3000:]}")
    lost_at = time.monotonic()
    try:
        first[0].communicate(timeout=SURVIVOR_TIMEOUT)
        survivor = {"exit": first[0].returncode}
    except subprocess.TimeoutExpired:
        first[0].kill()
        first[0].communicate(timeout=60)
        survivor = {"exit": None}
    survivor["seconds"] = time.monotonic() - lost_at
    with open(os.path.join(out, SURVIVOR_FILE), "w") as f:
        json.dump(survivor, f)
    return survivor


def stream_rows(examples: str, steps: int, batch_size: int) -> list[int]:
    """The row ids one process reads in the global order's first `steps` batches."""
    from tfrecord_shards.codec import schema_file
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    alone = build_dataset(os.path.join(examples, "Split-train", "*"),
                          schema_file.load_schema(examples), "label", feature_keys=["row_id"],
                          config=InputConfig(batch_size=batch_size, seed=SEED, shuffle="global")
                          ).take(steps)
    return [int(v) for features, _ in alone for v in features["row_id"].numpy().ravel()]


def main(argv: list[str]) -> None:
    """One worker: the Trainer's strategy, folders, checkpoints and input function, with
    every batch's row ids logged by step to `out`/steps-PID.jsonl."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    from tfrecord_shards.codec import schema_file
    from components.trainer import distribute, fit, models, module
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig, TrainerOptions

    examples, out = argv[0], argv[1]
    steps, batch_size, every, kill_after, kill_worker = (int(a) for a in argv[2:7])
    strategy = distribute.make_strategy()
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
    options = TrainerOptions(checkpoint_every=every, input=InputConfig(
        batch_size=batch_size, seed=SEED, shuffle="global"))
    options.check_replicas(strategy.num_replicas_in_sync)
    folders = distribute.worker_folders(strategy, os.path.join(out, "model_run"),
                                        os.path.join(out, "checkpoints"))
    options, checkpointing = module.checkpointing_for(options, folders)
    schema = schema_file.load_schema(examples)
    files = os.path.join(examples, "Split-train", "*")

    def dataset_fn(context):
        config = options.input_config(context.get_per_replica_batch_size(batch_size), True, {})
        return build_dataset(files, schema, "label", feature_keys=["x", "row_id"],
                             config=config, input_context=context)

    sample = build_dataset(files, schema, "label", feature_keys=["x"],
                           config=InputConfig(batch_size=32, training=False)).take(2)
    with strategy.scope():
        model = models.build_tabular_model(
            schema, ["x"], models.DataStatistics.of(sample, ["x"]), models.Head("binary"))
    log = open(os.path.join(out, f"steps-{os.getpid()}.jsonl"), "a")

    def on_batch(step: int, batch) -> None:
        if step == kill_after + 1 and task == kill_worker:
            os.kill(os.getpid(), signal.SIGKILL)
        rows = [int(v) for part in strategy.experimental_local_results(batch[0]["row_id"])
                for v in part.numpy().ravel()]
        log.write(json.dumps({"step": step, "rows": rows}) + "\n")
        log.flush()

    result = fit.train(model, strategy, distribute.distribute(strategy, dataset_fn),
                       steps=steps, steps_per_epoch=steps, log_dir=folders.run_dir,
                       global_batch_size=batch_size, checkpointing=checkpointing,
                       on_batch=on_batch)
    with open(os.path.join(out, f"result-{task}.json"), "w") as f:
        json.dump({"resumed_from_step": result.resumed_from_step,
                   "workers": strategy.num_replicas_in_sync}, f)


def split_ids(examples: str) -> list[int]:
    """Every row id of the train split, read back from its shards."""
    from shard_readers import numpy_reader
    from tfrecord_shards import shards

    manifest = shards.read_manifest(examples)
    files = [os.path.join(examples, shard["path"])
             for shard in manifest["splits"]["train"]["shards"]]
    return [int(v) for batch in numpy_reader.iter_batches(files, features=["row_id"])
            for v in batch["row_id"].ravel()]


def run_benchmark(rows: int, work_dir: str, log: Callable[[str], None] = print,
                  service_repeats: int = 3) -> dict:
    """Both faults on `rows` rows with row ids (the train split in two files), each against
    a clean run of the same work; rows lost and doubled are counted from the ids trained.
    The data-service fault runs `service_repeats` times: what it costs depends on what the
    killed worker held when it died."""
    import numpy as np

    os.makedirs(work_dir, exist_ok=True)
    examples = write_row_ids(work_dir, rows, 2)
    split = split_ids(examples)
    batch_size = 96  # whole per-replica batches on two workers and on three
    runs: dict[str, dict] = {}

    def record(name: str, engine: str, seconds: float, expected: list[int], seen: list[int],
               clean: Optional[str], **extra) -> None:
        expected_counts = np.bincount(expected, minlength=rows)
        seen_counts = np.bincount(seen, minlength=rows)
        runs[name] = {"engine": engine, "seconds": seconds, "rows_in": len(expected),
                      "rows_out": len(seen),
                      "rows_lost": int(np.maximum(expected_counts - seen_counts, 0).sum()),
                      "duplicates": int(np.maximum(seen_counts - expected_counts, 0).sum()),
                      "vs_clean": seconds / runs[clean]["seconds"] if clean else 1.0, **extra}
        log(f"{name}: {seconds:.1f} s, {runs[name]['rows_out']:,} rows out, "
            f"{runs[name]['rows_lost']} lost, {runs[name]['duplicates']} doubled")

    steps_per_epoch = -(-len(split) // batch_size)
    for repeat in range(service_repeats + 1):
        name = ("tf.data service: clean" if repeat == 0 else
                f"tf.data service: worker SIGKILL, restarted ({repeat})")
        run = data_service_run(examples, batch_size, os.path.join(work_dir, "service-logs"),
                               steps_per_epoch // 3 if repeat else None)
        # Two epochs, cut where the service said the first ended.
        brought = run["served_epochs"][0]["rows"] + run["served_epochs"][1]["rows"]
        record(name, "tf.data service", run["seconds"], split + split, run["rows"][:brought],
               None if repeat == 0 else "tf.data service: clean",
               reported_missed=sum(e["missed_rows"] for e in run["served_epochs"][:2]))

    steps = len(split) // batch_size
    expected = stream_rows(examples, steps, batch_size)
    for name, kill_after, restart in (
            ("MWMS: clean", None, 2),
            ("MWMS: worker SIGKILL, job restarted on 2", steps * 3 // 5, 2),
            ("MWMS: worker SIGKILL, job restarted on 3", steps * 3 // 5, 3)):
        out = os.path.join(work_dir, name.split(":")[1].strip().replace(" ", "-"))
        run = cluster_run(examples, out, steps=steps, batch_size=batch_size,
                          checkpoint_every=max(steps // 6, 1), kill_after=kill_after,
                          restart_workers=restart)
        record(name, "MultiWorkerMirrored", run["seconds"], expected,
               [row for rows_of_step in run["rows_by_step"].values() for row in rows_of_step],
               None if kill_after is None else "MWMS: clean",
               resumed_from_step=run["results"][0]["resumed_from_step"],
               survivor=run["survivor"])
        if run["survivor"]:
            log(f"  the survivor ended with {run['survivor']['exit']} "
                f"{run['survivor']['seconds']:.1f} s after the kill; resumed from step "
                f"{run['results'][0]['resumed_from_step']}")
    return {"rows": rows, "split_rows": len(split), "runs": runs}


if __name__ == "__main__":
    main(sys.argv[1:])
