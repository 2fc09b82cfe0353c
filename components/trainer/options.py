"""The Trainer's settings, with no TensorFlow import: the input chain's knobs (`InputConfig`)
and `TrainerOptions`, which the pipeline passes to the stock Trainer as its `custom_config`
and `run_fn` reads back. How an image feature is read is `shard_readers.images.ImageSpec`."""
from __future__ import annotations

import dataclasses
import keyword
import re
from typing import Any, Mapping, Optional

from shard_readers.images import ImageSpec
from tfrecord_shards.options import JsonOptions, SettingError, from_flat, setting
from components.trainer import tasks

DEFAULT_SEED = 42
# The serving model's signature from raw Examples to the transformed features, label included:
# the Evaluator's preprocessing function.
TRANSFORM_SIGNATURE = "transform_features"
# The serving model's signature from the transformed features (dense numbers, a tensor per
# feature, as the Transform graph outputs them) to the task's outputs: what the Evaluator
# scores Transform's eval split through, instead of parsing and transforming each raw row.
TRANSFORMED_SIGNATURE = "score_transformed"
# Beside the SavedModel: the features it was trained on (for a later warm start) and the
# digest of the Transform graph it embeds (for the Evaluator to pair it with Transform's rows).
MODEL_INPUTS_FILE = "assets.extra/tfrp_model_inputs.json"


def signature_input_name(feature: str) -> str:
    """`score_transformed`'s input name for a feature: letters, digits and underscores, as a
    SavedModel signature keeps them ("Body Mass (g)" -> "Body_Mass__g_"; TensorFlow turns
    the "/" of "Delta 15 N (o/oo)" into "_" itself)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", feature)
    # A SavedModel's signature is a Python function of these names: a keyword ("class", a
    # common label) or a leading digit is no parameter name, and the export fails.
    if keyword.iskeyword(name) or name[:1].isdigit():
        return "f_" + name
    return name if re.match(r"[A-Za-z]", name) else "f" + name
# Image datasets carry these beside the pixels; a model must not learn from them.
IMAGE_METADATA = ("height", "width", "channels", "format")
# Where `tfrp data-service dispatcher` listens unless told otherwise.
DATA_SERVICE_PORT = 5050
BUFFER_SHUFFLE, GLOBAL_SHUFFLE = "buffer", "global"
# What run_fn writes into model_run_dir: input waits, early stopping, the rows it trained on
# and the rows that chose the weights (the run summary reads it back).
REPORT_FILE = "input_report.json"


class InputNotCheckpointable(RuntimeError):
    """An input stage whose position cannot be saved: resuming would restart the epoch."""


@dataclasses.dataclass
class InputConfig(JsonOptions):
    """Every knob of the input chain. The defaults are the fast path. In `TrainerOptions.input`
    the batch size is the global one, which the Trainer splits across replicas."""

    batch_size: int = 256
    training: bool = True
    # "buffer": files shuffled, records through a buffer of shuffle_buffer (packed: blocks
    # through block_shuffle_buffer, rows within each group). "global": each epoch a seeded
    # permutation of every record (packed: every block, rows shuffled within blocks), read by
    # the records' index; an epoch resumes from (start_epoch, start_position) alone.
    shuffle: str = setting(BUFFER_SHUFFLE, choices=(BUFFER_SHUFFLE, GLOBAL_SHUFFLE))
    start_epoch: int = 0
    start_position: int = 0
    shuffle_buffer: int = 10_000
    seed: Optional[int] = DEFAULT_SEED
    # "none", "memory" or a file path prefix; placed after parsing so later epochs skip it.
    cache: str = "none"
    # None repeats forever (Keras counts steps); an int gives that many epochs.
    num_epochs: Optional[int] = None
    # "auto" sniffs the gzip magic of the first file; else "gzip" or "none".
    compression: str = "auto"
    cycle_length: Optional[int] = None  # None lets AUTOTUNE choose the reader parallelism.
    # Records taken from one file before the interleave moves on. With 1, a parallel
    # interleave hands every record across threads and reads ~10x slower (measured).
    block_length: int = 64
    reader_buffer_bytes: int = 8 << 20
    # Opt-in: scan the files first and read damaged ones past their bad records.
    skip_corrupt: bool = False
    drop_remainder: bool = False
    # Packed data (see tfrecord_shards/packing/) is shuffled as whole blocks in a buffer of this
    # many blocks, then row by row within each group of `shuffle_buffer` rows parsed together.
    block_shuffle_buffer: int = 16
    # 0 keeps TF's global pool; a private pool isolates input work from the model's ops.
    private_threadpool_size: int = 0
    # tf.data's autotuner re-plans parallelism and buffer sizes while it runs, which costs CPU
    # and, early on, can run the parse one call at a time. Off, every AUTOTUNE parallelism is
    # the core count from the first element and prefetch buffers still grow as needed. None:
    # on for per-row records, off for packed ones read directly, each the faster there
    # (bench/RESULTS.md); on through a tf.data service, whose client needs it.
    autotune: Optional[bool] = None
    # Only with autotune: the memory its buffers may use.
    ram_budget_bytes: Optional[int] = None
    # A prefetch at the end of the chain. Packed records read directly arrive from the parallel
    # map as whole parsed groups (about `shuffle_buffer` rows, 40 batches at the defaults)
    # that the map keeps buffered ahead, so a prefetch there only adds a hand-over between
    # threads per batch, which cost more than the batch's slicing on 2 cores
    # (bench/RESULTS.md). None: on, except for packed records read directly.
    prefetch: Optional[bool] = None
    # Threads one op inside the chain may use (tf.data's max_intra_op_parallelism; 0 is TF's
    # default). None: 1 for packed records, whose parallel map over whole groups already
    # keeps every core busy, so an op that splits its work across the pool only adds
    # wake-ups; TF's default for per-row records.
    intra_op_threads: Optional[int] = None
    # "grpc://host:port" of a tf.data service dispatcher (`tfrp data-service`): reading and
    # parsing then run on the service's workers, so CPU machines can feed one trainer.
    data_service: Optional[str] = None
    # How each image feature is read (the Trainer makes them from TrainerOptions.images).
    image_specs: Mapping[str, ImageSpec] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TrainerOptions(JsonOptions):
    """What to train and how to read it. Every field is optional in a custom_config."""

    label_key: str = "label"
    # "module.function" computing the label from parsed features, for data that lacks it
    # (raw taxi rows: "tips > 20 % of fare"), and the features it reads. Those features are
    # never model inputs: the label is made of them.
    label_fn: Optional[str] = None
    label_inputs: tuple[str, ...] = ()
    # Features the model must not see; None leaves out IMAGE_METADATA for images, else nothing.
    exclude: Optional[tuple[str, ...]] = None
    # {"image": [height, width, channels]}: decode these features and train a small CNN.
    images: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    image_dtype: str = ImageSpec.dtype
    # binary | multiclass | regression (components/trainer/tasks.py); auto: from the
    # transformed label's schema (a float is regression, a vocabulary's ids are classes).
    task: str = "auto"
    # Why `task` is what it is, when the pipeline inferred it from the label's values (the
    # run summary prints it beside the task).
    task_reason: str = ""
    # Classes of a multiclass label; None takes the label's int_domain (a vocabulary's size),
    # else the largest label in the first batches plus one.
    num_classes: Optional[int] = None
    epochs: int = 10  # reporting windows of train_steps, when an epoch is longer than that
    # The budget: train_steps at most, and at most this many passes over the training rows
    # (when their count is known: our shards' manifest says it), so a small table or image
    # set does not train for minutes after it stopped improving.
    max_epochs: int = 100
    # The rows that choose the weights and stop training early: the Examples' split of this
    # name when they have one (never the eval split, which the Evaluator blesses on), else
    # this fraction of the train split, held out of training by a stable hash of each record
    # (of each row's packed block and place in it, for packed records). 0 with no such split:
    # nothing held out, no early stop, the last step's weights. validation_split "": always
    # the fraction.
    validation_split: str = "validation"
    validation_fraction: float = setting(0.1, minimum=0.0, maximum=0.5)
    # Stop when the validation rows' loss has not improved for this many epochs (checked
    # after each pass, or each reporting window), keeping the best epoch's weights; 0: never.
    early_stopping_patience: int = 5
    # ... and not before this many steps without improvement: a small table's pass is a few
    # steps, and five passes of three noisy steps each are no plateau (Sacramento's 600
    # training rows stopped after 27 steps, R² 0.43; with 100 steps' patience, 0.61).
    early_stopping_min_steps: int = 100
    # A train split of fewer rows than this, its tenth held out by hash: once the validation
    # rows have chosen how long to train (the best check's passes over the training rows),
    # train a new model from the same seed on every train row, the held-out tenth too, for
    # that many passes, and export it. A small table then learns from all of its train rows,
    # and its training length is still chosen on rows held out of that choice; the eval split
    # is read by neither fit. On the small tables of `python -m bench tables` (at most 621
    # train rows; three seeds each) it raised diabetes' R² 0.484 -> 0.524 and Housing's
    # 0.600 -> 0.607, cost breast cancer 0.963 -> 0.958; on diamonds' 32k train rows it
    # did not help (0.9803 -> 0.9783, 0.9760 -> 0.9757) and on the taxi sample's 10,076 it
    # doubled the training for accuracy 0.8912 -> 0.8900 (bench/RESULTS.md, 2026-12-01).
    # 0: never; a validation split of the Examples' own: never (every train row trained).
    refit_below_rows: int = setting(10_000, minimum=0)
    # A table of fewer train rows than small_table_rows trains in batches of at most
    # small_table_batch_size rows: at 256, a 300-row table's pass is one or two batches,
    # so max_epochs allows a hundred or two steps of nearly full-batch descent, and each
    # early-stop check follows a pass that moved the model once. With the refit, at 64
    # Housing's R² went 0.607 -> 0.629, Sacramento's 0.535 -> 0.590, titanic's accuracy
    # 0.767 -> 0.789; breast cancer's 0.958 -> 0.954 (three seeds each, same entry).
    # Images keep their batch. 0: never.
    small_table_rows: int = setting(2_000, minimum=0)
    small_table_batch_size: int = setting(64, minimum=1)
    # The scaling pass (the numbers' mean and variance, the label's, before training) reads
    # every training row of a split of fewer than twice this many; a larger split of our
    # shards, an evenly spread sample of at least this many (sampling.py), so that its cost
    # stays flat: over every row it took 6.1 s at 30M taxi rows against 0.9 s at 3M. 0: every
    # row, always.
    scaling_sample_rows: int = setting(2_000_000, minimum=0)
    # Each scaled number also enters the tabular model as a ReLU layer over sines and cosines
    # of it at this many trained frequencies (components/trainer/layers.py; 0: the number
    # alone), the frequencies drawn from N(0, periodic_sigma) at the start. A small sigma
    # starts them smooth, so a few hundred rows are not fitted row by row (sigma 1.0 cost
    # the 546-row Ecdat Housing 0.05 of R², 0.1 cost it 0.02) while diamonds' cut grades and
    # the flights' delays still gained (bench/RESULTS.md, 2026-11-26).
    periodic_frequencies: int = 16
    periodic_sigma: float = 0.1
    # How the examples are read: batch size (global), shuffling, seed (also the weights'),
    # cache, damaged files, a tf.data service. Set by their own names in a custom_config.
    input: InputConfig = dataclasses.field(default_factory=InputConfig)
    # Save model, optimizer, step and the input iterator's position every N steps (0: never);
    # a Trainer restarted with the same checkpoint_dir goes on from the last save, mid-epoch.
    checkpoint_every: int = 0
    # Default: <model_run_dir>/checkpoints (worker i of a cluster: its worker-i/ there). TFX
    # gives each execution a new model_run_dir, so set a stable path for a restarted
    # pipeline run to find the checkpoints.
    checkpoint_dir: Optional[str] = None
    # Start from the weights of the model in production (the Trainer's `base_model`, the
    # latest blessed model) instead of from random ones; it must have been trained on the same
    # features.
    warm_start: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        tasks.check_task(self.task)
        if self.checkpoint_every and (self.input.data_service or self.input.skip_corrupt):
            raise InputNotCheckpointable(
                f"checkpoint_every={self.checkpoint_every} cannot resume mid-epoch with "
                + ("data_service (the service's position is not saved)"
                   if self.input.data_service else
                   "skip_corrupt (damaged files are read by a Python generator whose "
                   "position is not saved)")
                + "; a restarted Trainer would begin the epoch again. Drop one of the two.")

    def for_train_rows(self, rows: Optional[int]) -> "TrainerOptions":
        """These options for a train split of `rows` rows (None: not known): a small table's
        smaller batch (small_table_rows)."""
        if rows is None or self.images or rows >= self.small_table_rows or \
                self.input.batch_size <= self.small_table_batch_size:
            return self
        return dataclasses.replace(self, input=dataclasses.replace(
            self.input, batch_size=self.small_table_batch_size))

    def check_replicas(self, replicas: int) -> None:
        """The global batch must split evenly over the replicas training it."""
        if self.input.batch_size % replicas:
            raise SettingError(["batch_size"], f"{{0}} {self.input.batch_size} does not split "
                                               f"evenly over {replicas} replicas")

    @classmethod
    def from_custom_config(cls, custom: Optional[Mapping[str, Any]]) -> "TrainerOptions":
        """From a custom_config: this class's fields, and the input's by their own names
        (`batch_size`) or whole under `input`."""
        values = dict(custom or {})
        for name in ("label_inputs", "exclude"):  # JSON turns tuples into lists
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        return from_flat(cls, values)

    def as_custom_config(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def image_specs(self) -> dict[str, ImageSpec]:
        return {name: ImageSpec(*shape, dtype=self.image_dtype)
                for name, shape in self.images.items()}

    def excluded(self) -> tuple[str, ...]:
        if self.exclude is not None:
            return self.exclude
        return IMAGE_METADATA if self.images else ()

    @property
    def seed(self) -> int:
        return DEFAULT_SEED if self.input.seed is None else self.input.seed

    def input_config(self, per_replica_batch_size: int, training: bool,
                     image_specs: Optional[Mapping[str, ImageSpec]] = None) -> InputConfig:
        """The input settings for one replica's reader of the training or eval files."""
        return dataclasses.replace(
            self.input, batch_size=per_replica_batch_size, training=training,
            image_specs=self.image_specs() if image_specs is None else image_specs)
