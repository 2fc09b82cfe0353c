"""Distribution strategy and device-side input, written for a multi-GPU box, correct on CPU."""
from __future__ import annotations

import dataclasses
import json
import logging
import os

from tfrecord_shards import fileio
from typing import Callable, Optional

import tensorflow as tf


def cluster_workers(tf_config: Optional[str] = None) -> int:
    """How many training processes TF_CONFIG names (chief and workers), 1 without one."""
    raw = os.environ.get("TF_CONFIG", "") if tf_config is None else tf_config
    cluster = json.loads(raw).get("cluster", {}) if raw.strip() else {}
    return max(1, len(cluster.get("chief", [])) + len(cluster.get("worker", [])))


def make_strategy() -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy when TF_CONFIG names more than one worker (each worker runs
    run_fn; the strategy all-reduces over the network, NCCL on GPUs); else MirroredStrategy
    over every visible GPU, or over several logical CPU devices when they were configured
    (tests); else TF's default, single-device strategy."""
    if cluster_workers() > 1:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        devices = tf.config.list_logical_devices("GPU") or \
            tf.config.list_logical_devices("CPU")
        strategy = tf.distribute.MirroredStrategy([d.name for d in devices]) \
            if len(devices) > 1 or tf.config.list_logical_devices("GPU") else \
            tf.distribute.get_strategy()
    logging.info("Training with %s on %d replica(s)", strategy_name(strategy),
                 strategy.num_replicas_in_sync)
    return strategy


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    """The public name: TF's MultiWorkerMirroredStrategy is a class named
    CollectiveAllReduceStrategy."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "MultiWorkerMirroredStrategy"
    return type(strategy).__name__


def worker_index(strategy: tf.distribute.Strategy) -> Optional[int]:
    """None on the process that writes the outputs (one process, or the multi-worker chief);
    else this worker's index, whose outputs go to a folder of its own."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or cluster_workers() == 1:
        return None
    if resolver.task_type == "chief" or (
            resolver.task_type == "worker" and resolver.task_id == 0 and
            "chief" not in resolver.cluster_spec().as_dict()):
        return None
    return int(resolver.task_id)


def input_options(prefetch_to_device: bool = True,
                  per_replica_buffer_size: int = 2) -> tf.distribute.InputOptions:
    # Fetching to device overlaps host->device copies with the step; the buffer of two batches
    # per replica is what hides one copy behind one step.
    return tf.distribute.InputOptions(
        experimental_fetch_to_device=prefetch_to_device,
        experimental_per_replica_buffer_size=per_replica_buffer_size,
    )


def distribute(strategy: tf.distribute.Strategy,
               dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
               prefetch_to_device: bool = True):
    """One input pipeline per worker, each batching per replica, prefetched onto the devices.

    `dataset_fn` receives the `InputContext`; it must shard files by `input_pipeline_id` and
    batch with `get_per_replica_batch_size(global_batch)`.
    """
    return strategy.distribute_datasets_from_function(
        dataset_fn, options=input_options(prefetch_to_device))


@dataclasses.dataclass(frozen=True)
class WorkerFolders:
    """Where one training process writes. The chief (or the only process) writes the run's
    outputs into `model_run_dir`; another worker writes its report (and the copy of the model
    that saving under MultiWorkerMirroredStrategy needs) in a `worker-<i>/` folder of its
    own, and saves its input position beside the chief's. `shared_checkpoint_dir` is the
    chief's checkpoint folder, on storage every worker reaches: where a restarted job, of any
    number of workers, takes a global order's checkpoint from."""

    worker: Optional[int]  # None: this process writes the run's outputs
    run_dir: str
    checkpoint_dir: str
    shared_checkpoint_dir: str

    @property
    def writes_outputs(self) -> bool:
        return self.worker is None


def worker_folders(strategy: tf.distribute.Strategy, model_run_dir: str,
                   checkpoint_dir: Optional[str] = None) -> WorkerFolders:
    """This process's folders; checkpoints default to `<model_run_dir>/checkpoints`."""
    worker = worker_index(strategy)
    checkpoints = checkpoint_dir or fileio.join(model_run_dir, "checkpoints")
    if worker is None:
        return WorkerFolders(None, model_run_dir, checkpoints, checkpoints)
    own = f"worker-{worker}"
    return WorkerFolders(worker, fileio.join(model_run_dir, own),
                         fileio.join(checkpoints, own), checkpoints)
