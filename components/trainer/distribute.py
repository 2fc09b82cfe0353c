"""Distribution strategy and device-side input, written for a multi-GPU box, correct on CPU."""
from __future__ import annotations

import logging
from typing import Callable

import tensorflow as tf


def make_strategy() -> tf.distribute.Strategy:
    """MirroredStrategy over every visible GPU; TF's default (single-device) strategy otherwise."""
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        strategy = tf.distribute.MirroredStrategy([g.name for g in gpus])
    else:
        strategy = tf.distribute.get_strategy()
    logging.info("Training with %s on %d replica(s)", type(strategy).__name__,
                 strategy.num_replicas_in_sync)
    return strategy


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
