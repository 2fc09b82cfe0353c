"""The training loop, instrumented to say how long each step waited for its input.

Keras's `fit` fetches the next batch inside its compiled train function, so from outside it the
fetch and the step are one number. Here the fetch (`next(iterator)`) happens on the host, timed,
and the step runs as `strategy.run(model.train_step)` in a `tf.function` -- the same step `fit`
runs -- timed until its loss is back on the host. The difference is the measurement, not the
maths: optimizer, losses and metrics are the compiled Keras model's own.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Callable, Optional

import tensorflow as tf

from tfrecord_shards import fileio
from components.trainer.options import REPORT_FILE, InputNotCheckpointable

# The thresholds the TensorFlow profiler's input-pipeline analyser uses.
NOT_INPUT_BOUND = "not input-bound"
MODERATELY_INPUT_BOUND = "moderately input-bound"
HIGHLY_INPUT_BOUND = "highly input-bound"


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
    evaluation: dict  # the kept weights' scores on the validation rows (not the eval split)
    warmup_seconds: float
    devices: list[str]
    global_batch_size: int
    resumed_from_step: int = 0
    checkpoints: list = dataclasses.field(default_factory=list)  # step, seconds, bytes
    # With early stopping: the validation loss after each epoch (the report keeps the key
    # eval_losses), the step whose weights were kept, and the step training stopped at.
    eval_losses: list = dataclasses.field(default_factory=list)
    best_step: Optional[int] = None
    stopped_at_step: Optional[int] = None
    # The second fit on every train row, when there was one (module.RefitPlan).
    refit: Optional[dict] = None

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
            "resumed_from_step": self.resumed_from_step,
            "checkpoints": self.checkpoints,
            "early_stopping": {"eval_losses": self.eval_losses, "best_step": self.best_step,
                               "stopped_at_step": self.stopped_at_step},
            "refit": self.refit,
        }


def _first_replica(strategy: tf.distribute.Strategy, values: dict) -> dict:
    return {k: strategy.experimental_local_results(v)[0] for k, v in values.items()}


def _as_floats(logs: dict) -> dict:
    return {k: float(v) for k, v in logs.items()}


@dataclasses.dataclass(frozen=True)
class EarlyStopping:
    """After each epoch, score `validation_steps` batches of the validation rows (held out of
    training; never the eval split); stop when the loss has not improved for `patience`
    epochs in a row, and keep the weights of the best epoch."""

    patience: int
    validation_steps: int


class _BestWeights:
    def __init__(self, stopping: Optional[EarlyStopping], model, validation_data, test_step):
        self._stopping, self._model, self._test_step = stopping, model, test_step
        self._iterator = iter(validation_data) \
            if stopping and validation_data is not None else None
        self.losses: list[float] = []
        self.best_step: Optional[int] = None
        self.best_logs: Optional[dict] = None
        self._best_loss, self._weights, self._since_best = float("inf"), None, 0

    def should_stop(self, step: int) -> bool:
        if self._iterator is None:
            return False
        self._model.reset_metrics()
        for _ in range(self._stopping.validation_steps):
            logs = self._test_step(next(self._iterator))
        loss = float(logs["loss"])
        self.losses.append(loss)
        if loss < self._best_loss:
            self._best_loss, self.best_step, self._since_best = loss, step, 0
            self._weights = self._model.get_weights()
            self.best_logs = _as_floats(logs)
            return False
        self._since_best += 1
        return self._since_best >= self._stopping.patience

    def restore(self) -> None:
        if self._weights is not None:
            self._model.set_weights(self._weights)


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """Save the model, the optimizer, the step and the input's position every `every_steps`
    steps into `directory`; a run that finds a checkpoint there goes on from it, mid-epoch,
    with no row seen twice or skipped (beyond the steps after the last save, which are
    trained again).

    The input's position is tf.data's iterator state (its shuffle buffers included), or, for
    a global order (`global_order`), the position in its row stream: the seed and one
    number, saved beside the checkpoint as `<checkpoint>.input.json`. A global order resumes
    from that number on any number of workers (`saved_stream_position`)."""

    directory: str
    every_steps: int
    keep: int = 2
    global_order: bool = False
    # Where to restore from, if not `directory`: the chief's folder, for a global order.
    restore_from: Optional[str] = None
    stream_seed: Optional[int] = None
    # Where the row stream stood at step 0: the input's start_epoch and start_position.
    stream_epoch: int = 0
    stream_start: int = 0


INPUT_POSITION_SUFFIX = ".input.json"
INPUT_POSITION_FORMAT = "tfrp.input_position/1"


def input_position_text(seed: Optional[int], step: int, start_epoch: int,
                        start_position: int) -> str:
    """The `<checkpoint>.input.json` of a global order: where its row stream stands."""
    return json.dumps({"format": INPUT_POSITION_FORMAT, "seed": seed, "step": step,
                       "start_epoch": start_epoch, "start_position": start_position})


def saved_stream_position(directory: str, seed: Optional[int]
                          ) -> Optional[tuple[int, int]]:
    """(start_epoch, start_position) of the row stream at the latest checkpoint in
    `directory`, or None when there is none. A position saved for another seed is refused:
    its rows are another order."""
    latest = tf.train.latest_checkpoint(directory)
    if latest is None:
        return None
    saved = fileio.read_json(latest + INPUT_POSITION_SUFFIX)
    if saved is None or saved.get("format") != INPUT_POSITION_FORMAT:
        raise InputNotCheckpointable(f"{latest} holds no global-order position "
                                     f"({latest + INPUT_POSITION_SUFFIX}); it was saved with "
                                     "another shuffle, so it cannot resume this one")
    if saved["seed"] != seed:
        raise InputNotCheckpointable(f"{latest} was saved for seed {saved['seed']}, not "
                                     f"{seed}: its position is in another order")
    return int(saved["start_epoch"]), int(saved["start_position"])


def train(model: tf.keras.Model, strategy: tf.distribute.Strategy, train_data, *,
          steps: int, steps_per_epoch: int, log_dir: str, global_batch_size: int,
          validation_data=None, validation_steps: int = 0,
          checkpointing: Optional[Checkpointing] = None,
          early_stopping: Optional[EarlyStopping] = None,
          validation_rows_repeat: bool = False,
          on_batch: Optional[Callable[[int, object], None]] = None) -> TrainingResult:
    """Trains `steps` steps in epochs of `steps_per_epoch`, timing input waits per epoch;
    with `early_stopping`, stops when the validation loss stops improving and keeps the best
    epoch's weights.

    `train_data`/`validation_data` are distributed datasets (or plain ones on one device)
    that repeat at least as long as needed; the validation rows are held out of training and
    are never the eval split, which the Evaluator blesses on. TensorBoard scalars go to
    `log_dir`/train and /validation. `on_batch(step, batch)` sees each batch as it is fetched
    (step counts from 1). `validation_rows_repeat`: `validation_data` gives the same rows
    each time round, so the final score of the kept weights is the early-stop check that
    chose them, and is not run again.
    """
    train_step, test_step = _compiled_steps(model, strategy)
    # The optimizer's slots made now, not by the first step: a tf.function that creates
    # variables is traced twice, and a trace of this step takes seconds.
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    train_writer = tf.summary.create_file_writer(fileio.join(log_dir, "train"))
    validation_writer = tf.summary.create_file_writer(fileio.join(log_dir, "validation"))
    iterator = iter(train_data)
    epochs: list[EpochTiming] = []
    warmup = 0.0
    saves = _Saves(checkpointing, model, iterator, global_batch_size)
    done = saves.restore()
    first = done
    best = _BestWeights(early_stopping, model, validation_data, test_step)
    stopped_at = None
    while done < steps:
        epoch_steps = min(steps_per_epoch, steps - done)
        epoch, loss, first_step = _train_epoch(model, train_step, iterator, saves, on_batch,
                                               done, epoch_steps, steps_per_epoch, first)
        done += epoch_steps
        warmup = warmup if first_step is None else first_step
        epochs.append(epoch)
        _report_epoch(train_writer, done, epoch, loss)
        if best.should_stop(done):
            stopped_at = done
            logging.info("early stop after %d steps: the validation loss last improved at "
                         "step %d", done, best.best_step)
            break
    best.restore()
    evaluation = _final_evaluation(model, test_step, best, validation_data, validation_steps,
                                   early_stopping, validation_rows_repeat)
    if evaluation:
        _write_scalars(validation_writer, done, evaluation)
        logging.info("validation rows after %d steps: %s", done, evaluation)
    train_writer.flush()
    validation_writer.flush()
    devices = _devices(strategy)
    return TrainingResult(epochs, evaluation, warmup, devices, global_batch_size,
                          resumed_from_step=first, checkpoints=saves.timings,
                          eval_losses=best.losses, best_step=best.best_step,
                          stopped_at_step=stopped_at)


def _compiled_steps(model: tf.keras.Model, strategy: tf.distribute.Strategy
                    ) -> tuple[Callable, Callable]:
    """The model's train and test steps on every replica, as tf.functions that give the
    first replica's logs."""
    # No AutoGraph: these two only call Keras's own steps, and converting Keras's code
    # function by function took 19 of the first step's 20 seconds (measured on taxi rows).
    @tf.function(autograph=False)
    def train_step(batch):
        return _first_replica(strategy, strategy.run(model.train_step, args=(batch,)))

    @tf.function(autograph=False)
    def test_step(batch):
        return _first_replica(strategy, strategy.run(model.test_step, args=(batch,)))

    return train_step, test_step


def _train_epoch(model: tf.keras.Model, train_step: Callable, iterator, saves: "_Saves",
                 on_batch: Optional[Callable[[int, object], None]], done: int,
                 epoch_steps: int, steps_per_epoch: int, first: int
                 ) -> tuple[EpochTiming, float, Optional[float]]:
    """`epoch_steps` steps from step `done`, each timed as its wait for the batch and its
    compute: the epoch's timing, its last loss, and the run's first step (step `first`, the
    one that traces) timed whole when it is among them, else None."""
    model.reset_metrics()
    wait = compute = 0.0
    warmup = None
    logs: dict = {}
    for _ in range(epoch_steps):
        started = time.perf_counter()
        batch = next(iterator)
        fetched = time.perf_counter()
        if on_batch is not None:
            on_batch(done + 1, batch)
        logs = train_step(batch)
        loss = float(logs["loss"])  # blocks until the device finished the step
        finished = time.perf_counter()
        if done == first:
            warmup = finished - started
        else:
            wait += fetched - started
            compute += finished - fetched
        done += 1
        saves.after_step(done)
    epoch = EpochTiming(done // steps_per_epoch + (done % steps_per_epoch > 0),
                        epoch_steps, wait, compute, _as_floats(logs))
    return epoch, loss, warmup


def _final_evaluation(model: tf.keras.Model, test_step: Callable, best: _BestWeights,
                      validation_data, validation_steps: int,
                      early_stopping: Optional[EarlyStopping],
                      validation_rows_repeat: bool) -> dict:
    """The kept weights' score on `validation_steps` batches of the validation rows: the
    early-stop check that chose them when it scored the same rows, else a pass of its own;
    {} without validation rows."""
    if validation_rows_repeat and best.best_logs is not None and \
            early_stopping is not None and early_stopping.validation_steps == validation_steps:
        return best.best_logs  # the kept weights, scored on these rows already
    if validation_data is None or validation_steps <= 0:
        return {}
    model.reset_metrics()
    evaluation: dict = {}
    validation_iterator = iter(validation_data)
    for _ in range(validation_steps):
        evaluation = test_step(next(validation_iterator))
    return _as_floats(evaluation)


def _report_epoch(writer, done: int, epoch: EpochTiming, loss: float) -> None:
    """The epoch's metrics and input wait, to TensorBoard at step `done` and to the log."""
    _write_scalars(writer, done, dict(epoch.metrics, input_wait_share=epoch.input_wait_share))
    logging.info("epoch %d: %d steps, loss %.4f, input wait %.1f%% (%s)", epoch.epoch,
                 epoch.steps, loss, 100 * epoch.input_wait_share,
                 input_bound_label(epoch.input_wait_share))


def _write_scalars(writer, step: int, values: dict) -> None:
    with writer.as_default(step=step):
        for name, value in values.items():
            tf.summary.scalar(name, value)


class _Saves:
    """The checkpoint of a training loop: restored once, saved every N steps, timed."""

    def __init__(self, checkpointing: Optional[Checkpointing], model, iterator,
                 global_batch_size: int):
        self._every = checkpointing.every_steps if checkpointing else 0
        self.timings: list[dict] = []
        if not self._every:
            return
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._stream = checkpointing if checkpointing.global_order else None
        self._global_batch = global_batch_size
        state = {} if self._stream else {"iterator": iterator}
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer,
                                               step=self._step, **state)
        self._manager = tf.train.CheckpointManager(self._checkpoint, checkpointing.directory,
                                                   max_to_keep=checkpointing.keep)
        self._prefix = fileio.join(checkpointing.directory, "ckpt")  # the manager's names
        self._restore_from = checkpointing.restore_from or checkpointing.directory

    def restore(self) -> int:
        """The step to go on from: the latest checkpoint's, or 0."""
        latest = tf.train.latest_checkpoint(self._restore_from) if self._every else None
        if not latest:
            return 0
        self._checkpoint.restore(latest)
        logging.info("Resuming from %s at step %d", latest, int(self._step))
        if self._stream:  # the input was built at the saved position; steps count from it
            self._stream = dataclasses.replace(
                self._stream, stream_start=self._stream.stream_start
                - int(self._step) * self._global_batch)
        return int(self._step)

    def after_step(self, done: int) -> None:
        if not self._every or done % self._every:
            return
        self._step.assign(done)
        started = time.perf_counter()
        input_bytes = None
        if self._stream:
            # Written before the checkpoint that names it becomes the latest, so a kill
            # between the two never leaves a latest checkpoint without its position.
            text = input_position_text(self._stream.stream_seed, done,
                                       self._stream.stream_epoch,
                                       self._stream.stream_start + done * self._global_batch)
            fileio.makedirs(fileio.dirname(self._prefix))
            fileio.write_text(f"{self._prefix}-{done}{INPUT_POSITION_SUFFIX}", text)
            input_bytes = len(text)
        try:
            path = self._manager.save(checkpoint_number=done)
        except (tf.errors.FailedPreconditionError, tf.errors.UnimplementedError) as error:
            raise InputNotCheckpointable(
                "the input pipeline's position cannot be saved, so a restarted Trainer would "
                f"begin the epoch again: {error.message.splitlines()[0]}; set "
                "checkpoint_every=0, or drop the stage named") from None
        self.timings.append({"step": done, "seconds": time.perf_counter() - started,
                             "bytes": _checkpoint_bytes(path), "input_bytes": input_bytes})
        if self._stream:  # the positions of checkpoints the manager let go
            kept = {p + INPUT_POSITION_SUFFIX for p in self._manager.checkpoints}
            for stale in tf.io.gfile.glob(f"{self._prefix}-*{INPUT_POSITION_SUFFIX}"):
                if stale not in kept:
                    fileio.remove(stale)


def _checkpoint_bytes(prefix: str) -> int:
    return sum(tf.io.gfile.stat(f).length for f in tf.io.gfile.glob(prefix + ".*"))


def _devices(strategy: tf.distribute.Strategy) -> list[str]:
    try:
        return list(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy places everything on the default device
        gpus = tf.config.list_logical_devices("GPU")
        return [(gpus or tf.config.list_logical_devices("CPU"))[0].name]


def write_report(report: dict, folder: str) -> str:
    path = fileio.join(folder, REPORT_FILE)
    tf.io.gfile.makedirs(folder)
    fileio.write_json(path, report)
    return path


def load_report(folder: str) -> Optional[dict]:
    return fileio.read_json(fileio.join(folder, REPORT_FILE))
