"""TFX Trainer module: `run_fn(fn_args)` trains a Keras (tf-keras) model from our input function.

Passed to the stock Trainer as `run_fn="components.trainer.module.run_fn"`, so the installed
package is the module and nothing is rebuilt into a wheel per run.

What to train is the `custom_config`: the fields of `TrainerOptions`
(components/trainer/options.py), all optional. The schema input says what the examples hold;
ShardedTransform's post-transform schema also says whether they are packed. With a Transform
graph the model trains on transformed examples and the serving signature applies the graph to
raw examples.

This module is the run's outline and its input: the schemas, the validation rows, the budget,
the refit and the input report. The networks are in models.py, the serving signatures, the
export and the warm start in export.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import time
from typing import Any, Callable, Mapping, Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
import tensorflow_transform as tft  # noqa: E402
from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: E402

from tfrecord_shards import fileio, names, packing, tf_filesystems  # noqa: E402
from tfrecord_shards.codec import parser, schema_file  # noqa: E402
from shard_readers.images import ImageSpec, with_storage_from  # noqa: E402
from components.trainer import distribute, fit  # noqa: E402
from components.trainer.corruption import corrupt_files_named  # noqa: E402
from components.trainer.export import export_model, serving_signatures, warm_start  # noqa: E402
from components.trainer.input import (  # noqa: E402
    Holdout, build_dataset, input_share, resolve_files, split_rows)
from components.trainer.models import (  # noqa: E402
    DataStatistics, Head, Periodic, build_model, make_head, numeric_keys)
from components.trainer.options import GLOBAL_SHUFFLE, TrainerOptions  # noqa: E402
from components.trainer.sampling import RecordSample  # noqa: E402

keras = tf.keras


def model_feature_keys(schema: schema_pb2.Schema, label_key: str, excluded,
                       images: Mapping[str, ImageSpec], label_inputs=()) -> list[str]:
    """Images, or every scalar feature that is not the label, what it is computed from, or
    excluded, nor made from one of those by the default preprocessing (`x__bucket`)."""
    if images:
        return sorted(images)
    left_out = set(excluded) | {label_key} | set(label_inputs)
    return [f.name for f in schema.feature if parser.is_scalar(f)
            and not any(names.derived(f.name, source) for source in left_out)]


def _import_function(dotted: str) -> Callable:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


@dataclasses.dataclass(frozen=True)
class Schemas:
    """The schemas of one training run, each by the role it plays."""

    stored: schema_pb2.Schema  # the schema input as given: its packing and raw-pixel tags
    read: schema_pb2.Schema  # what the input function parses the examples with
    model: schema_pb2.Schema  # the features the model sees (after Transform, with a graph)
    transform_output: Any = None  # tft.TFTransformOutput, when there is a Transform graph
    graph_dir: Optional[str] = None  # that graph's folder


def resolve_schemas(fn_args: Any) -> Schemas:
    """With a Transform graph the examples are its output: ShardedTransform's post-transform
    schema says whether they are packed, and is read as it is; any other schema input (stock
    wiring passes the raw one) means one transformed row each, read with the graph's
    transformed schema."""
    stored = schema_file.load_schema(fn_args.schema_path)
    if not getattr(fn_args, "transform_graph_path", None):
        return Schemas(stored, stored, stored)
    transform_output = tft.TFTransformOutput(fn_args.transform_graph_path)
    transformed = transform_output.transformed_metadata.schema
    read = stored if packing.packed_rows(stored) else transformed
    return Schemas(stored, read, transformed, transform_output, fn_args.transform_graph_path)


@dataclasses.dataclass(frozen=True)
class Validation:
    """Where the rows that choose the weights and stop training come from: a split of their
    own (`files`, no holdout), or a fraction of the train split held out by hash
    (`holdout`, the training rows then the rest); no files: none. Never the eval split."""

    files: tuple[str, ...] = ()
    holdout: Optional[Holdout] = None  # the validation side; the training side is the rest
    split: Optional[str] = None  # the named split, when they are one

    @property
    def training_holdout(self) -> Optional[Holdout]:
        return dataclasses.replace(self.holdout, validation=False) if self.holdout else None


def split_of(pattern: str) -> Optional[str]:
    """The split an `<examples>/Split-<name>/*` pattern reads, or None."""
    folder = fileio.basename(pattern.rstrip("*/").rstrip("/"))
    return folder[len("Split-"):] if folder.startswith("Split-") else None


def resolve_validation(fn_args: Any, options: TrainerOptions) -> Validation:
    """The Examples' `validation_split` when every train pattern has it beside it, else
    `validation_fraction` of the train split held out by hash, else nothing."""
    name = options.validation_split
    evaluated = {split_of(p) for p in fn_args.eval_files or ()}
    if name and name in evaluated:
        raise ValueError(f"validation_split={name!r} is the split the Evaluator blesses on; "
                         "name another split, or set validation_split='' to hold rows out "
                         "of the train split")
    train = list(fn_args.train_files)
    if name and all(split_of(p) for p in train):
        named = [fileio.join(fileio.dirname(p.rstrip("*/").rstrip("/")), f"Split-{name}", "*")
                 for p in train]
        if all(tf.io.gfile.glob(p) for p in named):
            return Validation(tuple(named), split=name)
    if options.validation_fraction > 0:
        return Validation(tuple(train), Holdout(options.validation_fraction, validation=True))
    return Validation()


# The scaling pass's batches: few enough that Python's per-batch sums cost nothing beside the
# reading (at 30M taxi rows, 65,536 rows a batch took 2 CPU-s less than 4,096), small enough
# to hold (about 8 MB a batch for 15 numbers).
STATISTICS_BATCH_ROWS = 65_536


@dataclasses.dataclass
class TrainingInput:
    """The input functions of one run: every replica's reader of the training or validation
    rows, all parsing with the same schema, features and label; the files the training
    readers took are recorded for the report."""

    options: TrainerOptions
    schema: schema_pb2.Schema
    feature_keys: list[str]
    label_fn: Optional[Callable]
    images: Mapping[str, ImageSpec]
    train_files: list[str]
    read_files: list[str] = dataclasses.field(default_factory=list)
    # Through a tf.data service: each training epoch's rows against the split's.
    served_epochs: list[dict] = dataclasses.field(default_factory=list)
    # The rows that choose the weights; the training readers leave them out.
    validation: Validation = Validation()

    def files(self) -> list[str]:
        """Every file the run reads: the train split's, and a validation split's."""
        return sorted(set(self.train_files) | set(
            resolve_files(list(self.validation.files)) if self.validation.files else ()))

    @property
    def validation_rows_repeat(self) -> bool:
        """Whether a validation reader with `fixed_steps` gives the same rows each time round
        (tabular rows are kept; images are read anew, and read on through the split)."""
        return not self.images

    def dataset_fn(self, files, training: bool, batches_per_step: int = 1,
                   fixed_steps: int = 0, holdout: Optional[Holdout] = None
                   ) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
        """Each replica's reader of `files` (only `holdout`'s side of them, with one), in
        batches of `batches_per_step` training batches (a validation step's cost is mostly
        the call's, not the rows'). With `fixed_steps`, the first that many batches over and
        over, parsed once: every early stop check then scores the same rows, so their losses
        compare the model and not the rows, and later checks skip the reading. Images are
        read anew each time: their pixels would not fit in memory."""
        options = self.options

        def make(context: tf.distribute.InputContext) -> tf.data.Dataset:
            config = options.input_config(
                context.get_per_replica_batch_size(options.input.batch_size *
                                                   batches_per_step), training, self.images)
            if training:
                self.read_files.extend(input_share(self.train_files, context)[0])
            dataset = self._dataset(files, self.feature_keys, config, context,
                                    self.served_epochs.append if training else None, holdout)
            if fixed_steps and self.validation_rows_repeat:
                dataset = dataset.take(fixed_steps).cache().repeat()
            return dataset
        return make

    def statistics(self, files, holdout: Optional[Holdout] = None) -> DataStatistics:
        """One pass over the training rows (`holdout`'s side of `files`), reading only the
        numbers the model scales and the label: cheaper than an epoch (no strings, no images,
        no gradients), and it sees every part of the split, which the first batches do not:
        every row, or of a large split an evenly spread sample (scaling_sample_rows)."""
        keys = [] if self.images else numeric_keys(self.schema, self.feature_keys)
        config = dataclasses.replace(self.options.input_config(
            max(self.options.input.batch_size, STATISTICS_BATCH_ROWS), False, {}), num_epochs=1)
        total = split_rows(files)
        sample = RecordSample.of(resolve_files(files), total, self.options.scaling_sample_rows) \
            if total and not config.data_service and not config.skip_corrupt else None
        statistics = DataStatistics.of(self._dataset(files, keys, config, holdout=holdout,
                                                     sample=sample), keys)
        if sample is None:
            return statistics
        logging.info("Scaling statistics from %s rows: every %d-th piece of the split's "
                     "%s rows", f"{statistics.rows:,}", sample.every, f"{total:,}")
        return dataclasses.replace(
            statistics, sampled_rows=statistics.rows, rows_estimated=holdout is not None,
            rows=total if holdout is None else round(statistics.rows / sample.share()))

    def rows_read(self, files, holdout: Optional[Holdout], batches: int,
                  batch_size: int) -> int:
        """The rows in the first `batches` batches of `batch_size` of a validation reader:
        the rows its early stop checks score."""
        config = dataclasses.replace(self.options.input_config(batch_size, False, {}),
                                     num_epochs=1)
        labels = self._dataset(files, [], config, holdout=holdout).take(batches)
        return sum(len(label) for _, label in labels.as_numpy_iterator())

    def _dataset(self, files, feature_keys: list[str], config,
                 context: Optional[tf.distribute.InputContext] = None,
                 on_served_epoch: Optional[Callable[[dict], None]] = None,
                 holdout: Optional[Holdout] = None,
                 sample: Optional[RecordSample] = None) -> tf.data.Dataset:
        """`feature_keys` and the label (read, or computed by label_fn) of `files`."""
        return build_dataset(files, self.schema,
                             None if self.label_fn else self.options.label_key,
                             feature_keys=feature_keys, label_fn=self.label_fn,
                             label_inputs=self.options.label_inputs if self.label_fn else (),
                             config=config, input_context=context,
                             on_served_epoch=on_served_epoch, holdout=holdout, sample=sample)


def run_fn(fn_args: Any) -> None:
    """Trains on `fn_args.train_files` less the validation rows, which choose the weights
    (`resolve_validation`; the eval split is never read), writes input_report.json and
    TensorBoard logs into `model_run_dir`, and exports a tf.Example serving model."""
    # Each worker of a multi-worker cluster runs this in a process of its own.
    tf_filesystems.register_for(fn_args.serving_model_dir, fn_args.model_run_dir,
                                fn_args.transform_graph_path, *(fn_args.train_files or ()))
    phases = Phases()
    options = TrainerOptions.from_custom_config(fn_args.custom_config).for_train_rows(
        split_rows(fn_args.train_files))
    schemas = resolve_schemas(fn_args)
    # ShardedTransform's stored schema says which image features it wrote as raw pixels.
    images = with_storage_from(options.image_specs(), schemas.stored)
    feature_keys = model_feature_keys(schemas.model, options.label_key, options.excluded(),
                                      images, options.label_inputs)
    keras.utils.set_random_seed(options.seed)
    strategy = distribute.make_strategy()
    options.check_replicas(strategy.num_replicas_in_sync)
    folders = distribute.worker_folders(strategy, fn_args.model_run_dir, options.checkpoint_dir)
    options, checkpointing = checkpointing_for(options, folders)
    inputs = TrainingInput(options, schemas.read, feature_keys, _label_fn(options, schemas.model),
                           images, resolve_files(fn_args.train_files),
                           validation=resolve_validation(fn_args, options))

    with corrupt_files_named(inputs.files()):
        with phases("statistics"):
            statistics = inputs.statistics(fn_args.train_files,
                                           inputs.validation.training_holdout)
        head = make_head(options, schemas.model, options.label_key, images, statistics.label,
                         schemas.transform_output)
        with phases("build"), strategy.scope():
            model = build_model(schemas.model, feature_keys, images, statistics, head,
                                Periodic.of(options))
            if options.warm_start:
                warm_start(model, fn_args.base_model, feature_keys)
        with phases("train"):
            result = _train(model, strategy, inputs, fn_args, options, folders, checkpointing)
        model, plan = _refit_if_small(model, result, statistics, inputs, strategy, fn_args,
                                      folders, schemas, head, phases)
    with phases("export"):
        export_model(model, fn_args.serving_model_dir, folders, serving_signatures(
            model, schemas.model, feature_keys, images, head, options.label_key,
            schemas.transform_output), schemas.graph_dir)
    _write_input_report(result, head, strategy, inputs, folders.run_dir, phases,
                        _validation_report(inputs, statistics, fn_args, plan))


class Phases:
    """Seconds spent in each phase of a training run, for its report: `with phases(name):`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - started


def _train(model: keras.Model, strategy: tf.distribute.Strategy, inputs: "TrainingInput",
           fn_args: Any, options: TrainerOptions, folders: distribute.WorkerFolders,
           checkpointing: Optional[fit.Checkpointing]) -> fit.TrainingResult:
    """The training loop over this run's budget, on the training rows, its weights chosen on
    the validation rows."""
    budget = training_budget(fn_args, options)
    validation = inputs.validation
    return fit.train(
        model, strategy,
        distribute.distribute(strategy, inputs.dataset_fn(
            fn_args.train_files, True, holdout=validation.training_holdout)),
        steps=budget.steps, steps_per_epoch=budget.steps_per_epoch,
        log_dir=folders.run_dir, global_batch_size=options.input.batch_size,
        validation_data=distribute.distribute(strategy, inputs.dataset_fn(
            list(validation.files), False, budget.validation_batches_per_step,
            budget.validation_steps, validation.holdout)) if validation.files else None,
        validation_steps=budget.validation_steps, checkpointing=checkpointing,
        early_stopping=fit.EarlyStopping(budget.patience, budget.validation_steps)
        if budget.patience and budget.validation_steps else None,
        validation_rows_repeat=inputs.validation_rows_repeat)


@dataclasses.dataclass(frozen=True)
class RefitPlan:
    """The second fit of a small train split (TrainerOptions.refit_below_rows): every train
    row, the held-out ones too, for the passes the validation rows chose."""

    rows: int  # every train row
    steps: int
    chosen_step: int  # the first fit's best check, on `chosen_rows` training rows
    chosen_rows: int

    def report(self) -> dict:
        return {"rows": self.rows, "steps": self.steps, "chosen_step": self.chosen_step,
                "chosen_rows": self.chosen_rows}


def refit_plan(inputs: "TrainingInput", fn_args: Any, statistics: DataStatistics,
               result: fit.TrainingResult) -> Optional[RefitPlan]:
    """The refit, when the validation rows were held out of a train split of fewer than
    refit_below_rows rows and chose a step; else None. The chosen step in passes over the
    training rows is the refit's in passes over every train row (a pass of a few steps is
    whole batches, so 60 steps of 4-batch passes over 700 rows are 15 passes, and over the
    780 rows with the held-out ones, 15 passes of 4 batches still)."""
    options, validation = inputs.options, inputs.validation
    if not options.refit_below_rows or validation.holdout is None or \
            result.best_step is None or not statistics.rows:
        return None
    rows = split_rows(fn_args.train_files)
    if rows is None:  # not our shards: count them
        rows = inputs.statistics(fn_args.train_files).rows
    if rows >= options.refit_below_rows:
        return None
    batch = options.input.batch_size
    one_pass, all_pass = -(-statistics.rows // batch), -(-rows // batch)
    steps = max(1, round(result.best_step * all_pass / one_pass))
    return RefitPlan(rows, steps, result.best_step, statistics.rows)


def _refit_if_small(model: keras.Model, result: fit.TrainingResult,
                    statistics: DataStatistics, inputs: "TrainingInput",
                    strategy: tf.distribute.Strategy, fn_args: Any,
                    folders: distribute.WorkerFolders, schemas: "Schemas", head: "Head",
                    phases: "Phases") -> tuple[keras.Model, Optional[RefitPlan]]:
    """The model to export and the refit's plan: a small train split's refit on every train
    row (`refit_plan`; its training is recorded in `result.refit`), else `model` as the first
    fit left it and no plan."""
    plan = refit_plan(inputs, fn_args, statistics, result)
    if plan is None:
        return model, None
    with phases("refit"):
        model, refitted = _refit(plan, inputs, strategy, fn_args, folders, schemas,
                                 inputs.feature_keys, head)
    result.refit = dict(plan.report(), training=refitted.report())
    return model, plan


def _refit(plan: RefitPlan, inputs: "TrainingInput", strategy: tf.distribute.Strategy,
           fn_args: Any, folders: distribute.WorkerFolders, schemas: "Schemas",
           feature_keys: list[str], head: "Head"
           ) -> tuple[keras.Model, fit.TrainingResult]:
    """A new model from the first fit's start (the same seed; scaling from every train row),
    trained on every train row for the plan's steps, with no validation rows and no early
    stop: nothing is chosen here. The eval split is not read. Not checkpointed: a restarted
    Trainer fits it again (a small table's, seconds)."""
    options = inputs.options
    statistics = inputs.statistics(fn_args.train_files)
    keras.utils.set_random_seed(options.seed)
    with strategy.scope():
        model = build_model(schemas.model, feature_keys, inputs.images, statistics, head,
                            Periodic.of(options))
        if options.warm_start:
            warm_start(model, fn_args.base_model, feature_keys)
    window = min(plan.steps, training_budget(fn_args, options).steps_per_epoch)
    result = fit.train(
        model, strategy,
        distribute.distribute(strategy, inputs.dataset_fn(fn_args.train_files, True)),
        steps=plan.steps, steps_per_epoch=max(1, window),
        log_dir=fileio.join(folders.run_dir, "refit"),
        global_batch_size=options.input.batch_size)
    logging.info("refit: %d steps on all %d train rows (the validation rows chose step %d "
                 "of %d rows' training)", plan.steps, plan.rows, plan.chosen_step,
                 plan.chosen_rows)
    return model, result


def checkpointing_for(options: TrainerOptions, folders: distribute.WorkerFolders
                      ) -> tuple[TrainerOptions, Optional[fit.Checkpointing]]:
    """The checkpoints to save, and the options to read the input with. With the buffer
    shuffle each worker saves and restores its own input iterator. A global order restarted
    from a checkpoint starts its row stream where the chief's latest checkpoint left it, on
    every worker of a job of any size (model, optimizer and step come from there too): the
    position is one number for the whole job, not a worker's state."""
    if not options.checkpoint_every:
        return options, None
    directory = folders.checkpoint_dir
    if options.input.shuffle != GLOBAL_SHUFFLE:
        return options, fit.Checkpointing(directory, options.checkpoint_every)
    shared = folders.shared_checkpoint_dir
    saved = fit.saved_stream_position(shared, options.input.seed)
    if saved is not None:
        options = dataclasses.replace(options, input=dataclasses.replace(
            options.input, start_epoch=saved[0], start_position=saved[1]))
    return options, fit.Checkpointing(directory, options.checkpoint_every, global_order=True,
                                      restore_from=shared,
                                      stream_seed=options.input.seed,
                                      stream_epoch=options.input.start_epoch,
                                      stream_start=options.input.start_position)


@dataclasses.dataclass(frozen=True)
class Budget:
    steps: int
    steps_per_epoch: int
    # Validation calls, each of `validation_batches_per_step` training batches of rows.
    validation_steps: int
    patience: int = 0  # epochs without improvement before an early stop (0: never stop)
    validation_batches_per_step: int = 1


# At most this many training batches of validation rows are scored in one call: a call's
# cost is mostly per call, and the early stop scores eval_steps batches after every epoch.
VALIDATION_BATCHES_PER_STEP = 16


def training_budget(fn_args: Any, options: TrainerOptions) -> Budget:
    """train_steps at most, and at most max_epochs passes over the training rows; an epoch is
    one pass when the row count is known and a pass is shorter than a reporting window
    (train_steps / epochs), else the window. The validation loss is checked on `eval_steps`
    batches (the Trainer's EvalArgs), at most one pass over the validation rows. Rows held
    out by hash are counted as their share of the split's."""
    batch = options.input.batch_size
    validation = resolve_validation(fn_args, options)
    train_rows = split_rows(fn_args.train_files)
    validation_rows = split_rows(list(validation.files)) if validation.files else 0
    if validation.holdout and train_rows:
        validation_rows = max(1, round(train_rows * validation.holdout.fraction))
        train_rows -= validation_rows
    window = max(1, -(-fn_args.train_steps // max(1, options.epochs)))
    steps = fn_args.train_steps
    if train_rows:
        one_pass = max(1, -(-train_rows // batch))
        steps = min(steps, options.max_epochs * one_pass)
        window = min(window, one_pass)
    validation_steps = (fn_args.eval_steps or 0) if validation.files else 0
    if validation_rows:
        validation_steps = min(validation_steps, max(1, -(-validation_rows // batch)))
    # The same rows (validation_steps batches) in fewer, larger calls.
    calls = -(-validation_steps // VALIDATION_BATCHES_PER_STEP)
    per_call = -(-validation_steps // calls) if calls else 1
    patience = options.early_stopping_patience
    if patience:
        patience = max(patience, -(-options.early_stopping_min_steps // window))
    return Budget(max(1, steps), window, calls, patience, per_call)


def _label_fn(options: TrainerOptions, schema: schema_pb2.Schema) -> Optional[Callable]:
    """The function computing the label, when the examples lack it and one is set."""
    if options.label_key in parser.feature_by_name(schema) or not options.label_fn:
        return None
    return _import_function(options.label_fn)


def _validation_report(inputs: TrainingInput, statistics: DataStatistics,
                       fn_args: Any, refit: Optional[RefitPlan] = None) -> dict:
    """How many rows trained, how many chose the weights and where they came from, and the
    refit's rows and steps when there was one; the eval split is not among them (the run
    summary says so from this)."""
    validation, budget = inputs.validation, training_budget(fn_args, inputs.options)
    chose = inputs.rows_read(
        list(validation.files), validation.holdout, budget.validation_steps,
        inputs.options.input.batch_size * budget.validation_batches_per_step) \
        if validation.files and budget.validation_steps else 0
    holdout = validation.holdout
    return {"rows_trained": statistics.rows, "rows_trained_estimated": statistics.rows_estimated,
            "scaling_rows": statistics.sampled_rows or statistics.rows,
            "rows_choosing_weights": chose,
            "split": validation.split, "fraction": holdout.fraction if holdout else None,
            "refit_rows": refit.rows if refit else None,
            "refit_steps": refit.steps if refit else None,
            "hashed": None if not holdout else "packed row (its block and place in it)"
            if packing.packed_rows(inputs.schema) else "record",
            # The files this run read, checked against the eval split's.
            "eval_split_read": bool(fn_args.eval_files) and bool(
                set(inputs.files()) & set(resolve_files(fn_args.eval_files)))}


def _write_input_report(result, head: Head, strategy: tf.distribute.Strategy,
                        inputs: TrainingInput, run_dir: str, phases: Phases,
                        validation: dict) -> None:
    report = result.report()
    report.update(task=head.task, strategy=distribute.strategy_name(strategy),
                  validation=validation,
                  phase_seconds=phases.seconds,
                  replicas=strategy.num_replicas_in_sync,
                  workers=distribute.cluster_workers(),
                  input_files=sorted(set(inputs.read_files)),
                  served_epochs=inputs.served_epochs)
    report_path = fit.write_report(report, run_dir)
    logging.info("Input report: %s (overall input wait %.1f%%, %s)", report_path,
                 100 * report["overall"]["input_wait_share"], report["overall"]["label"])


