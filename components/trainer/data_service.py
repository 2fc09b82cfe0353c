"""tf.data service: its servers (a dispatcher, and workers that run the Trainer's input chain),
and the input chain's stage that hands the chain to them and counts what each epoch brought.

A trainer whose host CPUs cannot parse fast enough sets `data_service` to the dispatcher's
address; the reading and parsing then run on the workers, and more CPU machines means more
input throughput. `tfrp data-service dispatcher|worker` starts them; on a cluster, run one
dispatcher and a worker per CPU machine, each worker told the dispatcher's address.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from components.trainer.options import DATA_SERVICE_PORT


def start_dispatcher(port: int = DATA_SERVICE_PORT, work_dir: Optional[str] = None
                     ) -> tf.data.experimental.service.DispatchServer:
    """A dispatcher on `port`. With `work_dir` (a shared path) it journals its state there,
    so a restarted dispatcher resumes its jobs."""
    return tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(
            port=port, work_dir=work_dir, fault_tolerant_mode=bool(work_dir)))


def start_worker(dispatcher: str, port: int = 0, host: str = "localhost"
                 ) -> tf.data.experimental.service.WorkerServer:
    """A worker on `port` (0: any free port) that registers with `dispatcher` (host:port) and
    tells it to reach this worker at `host`."""
    return tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(
            dispatcher_address=dispatcher.replace("grpc://", ""), port=port,
            worker_address=f"{host}:%port%"))



class ServedEpochs:
    """Counts the rows each epoch through a tf.data service brings, against the rows the split
    holds. The service's distributed epoch is at most once: when a worker dies mid-epoch, the
    rows it had taken (its files in progress) never arrive, and the epoch ends without them.
    This says how many, once each epoch ends: a warning when rows were missed."""

    def __init__(self, expected_rows: int,
                 on_epoch: Optional[Callable[[dict], None]] = None):
        self.expected = expected_rows
        self.on_epoch = on_epoch
        self._epoch = self._rows = 0

    def add(self, rows: np.ndarray, ends_epoch: np.ndarray) -> np.ndarray:
        if not ends_epoch:
            self._rows += int(rows)
            return rows
        epoch = {"epoch": self._epoch, "rows": self._rows, "expected_rows": self.expected,
                 "missed_rows": self.expected - self._rows}
        self._epoch, self._rows = self._epoch + 1, 0
        if epoch["missed_rows"]:
            logging.warning(
                "tf.data service: epoch %d brought %d of %d rows; %d missed (a worker was lost "
                "mid-epoch: the service's epoch is at most once, so the rows it held are not "
                "read again)", epoch["epoch"], epoch["rows"], self.expected,
                epoch["missed_rows"])
        else:
            logging.info("tf.data service: epoch %d brought all %d rows", epoch["epoch"],
                         self.expected)
        if self.on_epoch is not None:
            self.on_epoch(epoch)
        return rows


def _empty_like(spec):
    """An element of `spec` with no rows where the batch size is not fixed."""
    if isinstance(spec, tf.RaggedTensorSpec):
        values = tf.zeros([0] + [d or 0 for d in spec.shape[spec.ragged_rank + 1:]],
                          spec.dtype)
        return tf.RaggedTensor.from_nested_row_lengths(
            values, [tf.zeros([0], spec.row_splits_dtype)] * spec.ragged_rank)
    return tf.zeros([d or 0 for d in spec.shape], spec.dtype)


def _rows_in(batch) -> tf.Tensor:
    first = tf.nest.flatten(batch, expand_composites=False)[0]
    return tf.cast(first.nrows() if isinstance(first, tf.RaggedTensor)
                   else tf.shape(first)[0], tf.int64)


def on_data_service(service: Optional[str], counter: Optional[ServedEpochs] = None):
    """Everything above this point (reading, shuffling, parsing, batching) runs on the tf.data
    service's workers. Dynamic sharding hands each file to one worker at a time, so each row
    arrives once per epoch however many workers there are, unless a worker dies: with
    `counter`, a flagged marker after each epoch's last batch lets the trainer count what the
    epoch brought (`ServedEpochs`)."""
    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if not service:
            return dataset
        served = dataset.apply(tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
            service=service))
        if counter is None:
            return served
        marker = tf.nest.map_structure(_empty_like, served.element_spec)
        flagged = served.map(lambda *batch: (batch, False)).concatenate(
            tf.data.Dataset.from_tensors((tuple(marker) if isinstance(marker, tuple)
                                          else (marker,), True)))

        def count(batch, ends_epoch):
            counted = tf.numpy_function(counter.add, [_rows_in(batch), ends_epoch], tf.int64)
            with tf.control_dependencies([counted]):
                return batch, tf.identity(ends_epoch)

        return (flagged
                .map(count)
                .filter(lambda batch, ends_epoch: tf.logical_not(ends_epoch))
                .map(lambda batch, _: batch if len(batch) > 1 else batch[0]))
    return apply
