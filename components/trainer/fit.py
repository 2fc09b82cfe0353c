"""The training loop, instrumented to say how long each step waited for its input.

Keras's `fit` fetches the next batch inside its compiled train function, so from outside it the
fetch and the step are one number. Here the fetch (`next(iterator)`) happens on the host, timed,
and the step runs as `strategy.run(model.train_step)` in a `tf.function` -- the same step `fit`
runs -- timed until its loss is back on the host. The difference is the measurement, not the
maths: optimizer, losses and metrics are the compiled Keras model's own.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Optional

import tensorflow as tf

from components import fileio

# The thresholds the TensorFlow profiler's input-pipeline analyser uses.
NOT_INPUT_BOUND = "not input-bound"
MODERATELY_INPUT_BOUND = "moderately input-bound"
HIGHLY_INPUT_BOUND = "highly input-bound"
REPORT_FILE = "input_report.json"


def input_bound_label(wait_share: float) -> str:
    if wait_share < 0.05:
        return NOT_INPUT_BOUND
    if wait_share < 0.20:
        return MODERATELY_INPUT_BOUND
    return HIGHLY_INPUT_BOUND


@dataclasses.dataclass
class EpochTiming:
    epoch: int
    steps: int
    wait_seconds: float
    compute_seconds: float
    metrics: dict

    @property
    def input_wait_share(self) -> float:
        total = self.wait_seconds + self.compute_seconds
        return self.wait_seconds / total if total > 0 else 0.0

    def as_dict(self) -> dict:
        return {"epoch": self.epoch, "steps": self.steps,
                "wait_seconds": self.wait_seconds, "compute_seconds": self.compute_seconds,
                "input_wait_share": self.input_wait_share,
                "label": input_bound_label(self.input_wait_share), "metrics": self.metrics}


@dataclasses.dataclass
class TrainingResult:
    epochs: list[EpochTiming]
    evaluation: dict
    warmup_seconds: float
    devices: list[str]
    global_batch_size: int

    def report(self) -> dict:
        wait = sum(e.wait_seconds for e in self.epochs)
        compute = sum(e.compute_seconds for e in self.epochs)
        share = wait / (wait + compute) if wait + compute > 0 else 0.0
        return {
            "epochs": [e.as_dict() for e in self.epochs],
            "overall": {"wait_seconds": wait, "compute_seconds": compute,
                        "input_wait_share": share, "label": input_bound_label(share)},
            "thresholds": {NOT_INPUT_BOUND: "< 0.05", MODERATELY_INPUT_BOUND: "0.05 - 0.20",
                           HIGHLY_INPUT_BOUND: ">= 0.20"},
            # The first step traces and compiles the step function; it is neither input nor
            # steady-state compute, so it is reported apart.
            "warmup_seconds": self.warmup_seconds,
            "devices": self.devices,
            "global_batch_size": self.global_batch_size,
            "evaluation": self.evaluation,
        }


def _first_replica(strategy: tf.distribute.Strategy, values: dict) -> dict:
    return {k: strategy.experimental_local_results(v)[0] for k, v in values.items()}


def _as_floats(logs: dict) -> dict:
    return {k: float(v) for k, v in logs.items()}


def train(model: tf.keras.Model, strategy: tf.distribute.Strategy, train_data, *,
          steps: int, steps_per_epoch: int, log_dir: str, global_batch_size: int,
          eval_data=None, eval_steps: int = 0) -> TrainingResult:
    """Trains `steps` steps in epochs of `steps_per_epoch`, timing input waits per epoch.

    `train_data`/`eval_data` are distributed datasets (or plain ones on one device) that
    repeat at least as long as needed. TensorBoard scalars go to `log_dir`/train and /eval.
    """
    @tf.function
    def train_step(batch):
        return _first_replica(strategy, strategy.run(model.train_step, args=(batch,)))

    @tf.function
    def test_step(batch):
        return _first_replica(strategy, strategy.run(model.test_step, args=(batch,)))

    train_writer = tf.summary.create_file_writer(os.path.join(log_dir, "train"))
    eval_writer = tf.summary.create_file_writer(os.path.join(log_dir, "eval"))
    iterator = iter(train_data)
    epochs: list[EpochTiming] = []
    warmup = 0.0
    done = 0
    while done < steps:
        model.reset_metrics()
        wait = compute = 0.0
        epoch_steps = min(steps_per_epoch, steps - done)
        logs: dict = {}
        for _ in range(epoch_steps):
            started = time.perf_counter()
            batch = next(iterator)
            fetched = time.perf_counter()
            logs = train_step(batch)
            loss = float(logs["loss"])  # blocks until the device finished the step
            finished = time.perf_counter()
            if done == 0:
                warmup = finished - started
            else:
                wait += fetched - started
                compute += finished - fetched
            done += 1
        epoch = EpochTiming(len(epochs) + 1, epoch_steps, wait, compute, _as_floats(logs))
        epochs.append(epoch)
        with train_writer.as_default(step=done):
            for name, value in epoch.metrics.items():
                tf.summary.scalar(name, value)
            tf.summary.scalar("input_wait_share", epoch.input_wait_share)
        logging.info("epoch %d: %d steps, loss %.4f, input wait %.1f%% (%s)", epoch.epoch,
                     epoch_steps, loss, 100 * epoch.input_wait_share,
                     input_bound_label(epoch.input_wait_share))
    evaluation: dict = {}
    if eval_data is not None and eval_steps > 0:
        model.reset_metrics()
        eval_iterator = iter(eval_data)
        for _ in range(eval_steps):
            evaluation = test_step(next(eval_iterator))
        evaluation = _as_floats(evaluation)
        with eval_writer.as_default(step=done):
            for name, value in evaluation.items():
                tf.summary.scalar(name, value)
        logging.info("evaluation after %d steps: %s", done, evaluation)
    train_writer.flush()
    eval_writer.flush()
    devices = _devices(strategy)
    return TrainingResult(epochs, evaluation, warmup, devices, global_batch_size)


def _devices(strategy: tf.distribute.Strategy) -> list[str]:
    try:
        return list(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy places everything on the default device
        gpus = tf.config.list_logical_devices("GPU")
        return [(gpus or tf.config.list_logical_devices("CPU"))[0].name]


def write_report(report: dict, folder: str) -> str:
    path = os.path.join(folder, REPORT_FILE)
    tf.io.gfile.makedirs(folder)
    fileio.write_json(path, report)
    return path


def load_report(folder: str) -> Optional[dict]:
    return fileio.read_json(os.path.join(folder, REPORT_FILE))
