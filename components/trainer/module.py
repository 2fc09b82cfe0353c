"""TFX Trainer module: `run_fn(fn_args)` trains a Keras (tf-keras) model from our input function.

Passed to the stock Trainer as `run_fn="components.trainer.module.run_fn"`, so the installed
package is the module and nothing is rebuilt into a wheel per run.

What to train is the `custom_config`: the fields of `TrainerOptions`
(components/trainer/options.py), all optional. The schema input says what the examples hold;
ShardedTransform's post-transform schema also says whether they are packed. With a Transform
graph the model trains on transformed examples and the serving signature applies the graph to
raw examples.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable, Mapping, Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: E402

from tfrecord_shards import fileio, names, packing, tf_filesystems  # noqa: E402
from tfrecord_shards.codec import parser, schema_file  # noqa: E402
from shard_readers.images import ImageSpec, decode_images, with_storage_from  # noqa: E402
from components.trainer import distribute, fit, layers, tasks  # noqa: E402
from components.trainer.input import (  # noqa: E402
    Holdout, build_dataset, corrupt_files_named, example_parser, input_share, resolve_files,
    split_rows)
from components.trainer.options import (  # noqa: E402
    GLOBAL_SHUFFLE, TRANSFORM_SIGNATURE, TrainerOptions)

keras = tf.keras

HASH_BINS = 64
HIDDEN_UNITS = (128, 64)
# Features each number's periodic embedding gives the first hidden layer.
PERIODIC_WIDTH = 16


def embedding_width(categories: int) -> int:
    """Wider for more categories, 2 to 16 (the rule of thumb 1.6 * n^0.56)."""
    return int(min(16, max(2, round(1.6 * categories ** 0.56))))


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
    import importlib

    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _categorical_size(feature: schema_pb2.Feature) -> Optional[int]:
    """Vocabulary-encoded ints (Transform's output) carry their range in int_domain."""
    if feature.type == schema_pb2.INT and feature.HasField("int_domain") and \
            feature.int_domain.is_categorical and feature.int_domain.max > 0:
        return int(feature.int_domain.max) + 1
    return None


@dataclasses.dataclass(frozen=True)
class Head:
    """The model's last layer, loss, metrics and serving outputs, by task (tasks.py)."""

    task: str
    num_classes: int = 2
    class_names: tuple[str, ...] = ()  # multiclass: the label's value of each class id

    def output_layer(self, x: tf.Tensor, label: "Moments") -> tf.Tensor:
        if self.task == tasks.MULTICLASS:
            return keras.layers.Dense(self.num_classes, activation="softmax",
                                      name=tasks.PROBABILITIES)(x)
        if self.task == tasks.REGRESSION:
            # Starts at the label's mean and scale, so the first steps are not spent
            # walking the output from 0 to the target's units.
            x = keras.layers.Dense(1)(x)
            return keras.layers.Rescaling(label.std or 1.0, offset=label.mean,
                                          name=tasks.PREDICTION)(x)
        return keras.layers.Dense(1, activation="sigmoid", name=tasks.PROBABILITY)(x)

    def compile(self, model: keras.Model) -> keras.Model:
        if self.task == tasks.MULTICLASS:
            loss, metrics = keras.losses.SparseCategoricalCrossentropy(), [
                keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        elif self.task == tasks.REGRESSION:
            loss, metrics = keras.losses.MeanSquaredError(), [
                keras.metrics.MeanSquaredError(name="mse")]
        else:
            loss, metrics = keras.losses.BinaryCrossentropy(), [
                keras.metrics.BinaryAccuracy(name="accuracy"), keras.metrics.AUC(name="auc")]
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss, metrics=metrics)
        return model

    def serving_outputs(self, output: tf.Tensor) -> dict:
        if self.task != tasks.MULTICLASS:
            return {self.output_name: output}
        class_ids = tf.argmax(output, axis=-1)
        class_names = tf.constant(list(self.class_names) or
                                  [str(i) for i in range(self.num_classes)])
        return {tasks.PROBABILITIES: output, tasks.CLASS_IDS: class_ids,
                tasks.CLASSES: tf.gather(class_names, class_ids)}

    @property
    def output_name(self) -> str:
        return {tasks.MULTICLASS: tasks.PROBABILITIES,
                tasks.REGRESSION: tasks.PREDICTION}.get(self.task, tasks.PROBABILITY)


@dataclasses.dataclass
class Moments:
    """Count, mean, variance and largest value of a stream of numbers, summed in float64
    about the first batch's mean so that large values (epoch seconds) keep their precision."""

    count: int = 0
    shift: float = 0.0
    total: float = 0.0
    squares: float = 0.0
    largest: float = float("-inf")

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, np.float64).ravel()
        values = values[np.isfinite(values)]
        if not values.size:
            return
        if not self.count:
            self.shift = float(values.mean())
        centred = values - self.shift
        self.count += values.size
        self.total += float(centred.sum())
        self.squares += float(np.square(centred).sum())
        self.largest = max(self.largest, float(values.max()))

    @property
    def mean(self) -> float:
        return self.shift + self.total / self.count if self.count else 0.0

    @property
    def variance(self) -> float:
        if not self.count:
            return 0.0
        return max(0.0, self.squares / self.count - (self.total / self.count) ** 2)

    @property
    def std(self) -> float:
        return float(np.sqrt(self.variance))


@dataclasses.dataclass
class DataStatistics:
    """Moments of the numeric features and the label over every row of a dataset. The model's
    scaling and the head's starting point come from all the training rows, not from the first
    batches: tables are often sorted (by date, by id), and the first rows' spread is not the
    data's."""

    features: dict[str, Moments]
    label: Moments
    rows: int = 0  # every row read, a missing label or not

    @classmethod
    def of(cls, data: tf.data.Dataset, keys: list[str]) -> "DataStatistics":
        features = {key: Moments() for key in keys}
        label = Moments()
        rows = 0
        for batch, labels in data.as_numpy_iterator():
            for key, moments in features.items():
                moments.add(batch[key])
            label.add(labels)
            rows += len(labels)
        return cls(features, label, rows)


def scaling_variance(moments: Moments) -> float:
    """The variance a number is scaled by: its training rows' own, or 1 when it is constant
    there (a missing-value flag whose column had no gap in training, a column of one value).
    Scaled by a variance of about 0, a value that differs at serving time (the flag set for
    the first gap) would enter the model millions strong and swamp every other feature."""
    if moments.variance <= 1e-12 * max(1.0, moments.mean ** 2):
        return 1.0
    return moments.variance


def numeric_keys(schema: schema_pb2.Schema, feature_keys: list[str]) -> list[str]:
    """The features the tabular model scales: numbers that are not category ids."""
    features = parser.feature_by_name(schema)
    return [k for k in feature_keys if features[k].type != schema_pb2.BYTES
            and not _categorical_size(features[k])]


@dataclasses.dataclass(frozen=True)
class Periodic:
    """The numbers' periodic embedding (TrainerOptions.periodic_*); 0 frequencies: none."""

    frequencies: int = TrainerOptions.periodic_frequencies
    sigma: float = TrainerOptions.periodic_sigma

    @classmethod
    def of(cls, options: TrainerOptions) -> "Periodic":
        return cls(options.periodic_frequencies, options.periodic_sigma)


def build_tabular_model(schema: schema_pb2.Schema, feature_keys: list[str],
                        statistics: DataStatistics, head: Head,
                        periodic: Periodic = Periodic()) -> keras.Model:
    """Numbers are standardised with `statistics`, and also embedded through sines of them
    (`periodic`); strings are hashed and embedded, vocabulary ids embedded directly."""
    features = parser.feature_by_name(schema)
    inputs, encoded, scaled = {}, [], []
    # Layers take names TensorFlow accepts; the inputs stay keyed by the features' own.
    safe = names.op_names(feature_keys)
    for name in feature_keys:
        feature = features[name]
        categories = _categorical_size(feature)
        if feature.type == schema_pb2.BYTES:
            inputs[name] = keras.Input(shape=(1,), name=safe[name], dtype=tf.string)
            ids = keras.layers.Hashing(num_bins=HASH_BINS)(inputs[name])
            size = HASH_BINS
        elif categories:
            inputs[name] = keras.Input(shape=(1,), name=safe[name], dtype=tf.int64)
            ids = keras.layers.Lambda(lambda x: tf.maximum(x, 0))(inputs[name])
            size = categories
        else:
            inputs[name] = keras.Input(shape=(1,), name=safe[name],
                                       dtype=tf.int64 if feature.type == schema_pb2.INT
                                       else tf.float32)
            moments = statistics.features[name]
            norm = keras.layers.Normalization(axis=None, mean=moments.mean,
                                              variance=scaling_variance(moments),
                                              name=f"{safe[name]}_norm")
            scaled.append(norm(tf.cast(inputs[name], tf.float32)))
            continue
        width = embedding_width(size)
        embedded = keras.layers.Embedding(size, width)(ids)
        encoded.append(keras.layers.Reshape((width,))(embedded))
    if scaled:
        numbers = scaled[0] if len(scaled) == 1 else keras.layers.Concatenate()(scaled)
        encoded.append(numbers)
        if periodic.frequencies:
            encoded.append(layers.periodic_embedding(numbers, periodic.frequencies,
                                                     PERIODIC_WIDTH, periodic.sigma))
    x = encoded[0] if len(encoded) == 1 else keras.layers.Concatenate()(encoded)
    for units in HIDDEN_UNITS:
        x = keras.layers.Dense(units, activation="relu")(x)
    model = keras.Model(inputs=inputs, outputs=head.output_layer(x, statistics.label))
    return head.compile(model)


def build_image_model(name: str, image: ImageSpec, head: Head) -> keras.Model:
    """A small CNN. Pixels may arrive as uint8: scaling to [0, 1] is the first layer, so on a
    GPU it runs on the device after a 4x cheaper host->device copy."""
    inputs = keras.Input(shape=(image.height, image.width, image.channels),
                         name=names.op_name(name),
                         dtype=tf.uint8 if image.dtype == "uint8" else tf.float32)
    x = keras.layers.Lambda(lambda t: tf.cast(t, tf.float32))(inputs)
    if image.dtype == "uint8":
        x = keras.layers.Rescaling(1.0 / 255)(x)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D(2)(x)
    if min(image.height, image.width) >= 16:
        x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    model = keras.Model(inputs={name: inputs}, outputs=head.output_layer(x, Moments()))
    return head.compile(model)


def _serving_signature(model: keras.Model, schema: schema_pb2.Schema, feature_keys: list[str],
                       images: Mapping[str, ImageSpec], head: Head, transform_output=None):
    """Scores serialized raw tf.Examples: parse with the raw schema, fill gaps, apply the
    Transform graph when there is one, decode images, then the model; the outputs are the
    task's (Head.serving_outputs)."""
    if transform_output is None:
        parse = example_parser(schema, feature_keys, images)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")],
                 autograph=False)
        def serve_tf_examples(serialized):
            return head.serving_outputs(model(parse(serialized)))

        return serve_tf_examples

    transform = _raw_to_transformed(model, transform_output)
    transformed = parser.feature_by_name(transform_output.transformed_metadata.schema)

    @tf.autograph.experimental.do_not_convert  # plain Python branching on names only
    def model_input(name: str, features: dict) -> tf.Tensor:
        value = parser.densify(features[name], transformed[name])
        return decode_images(value, images[name]) if name in images else value

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")],
                 autograph=False)
    def serve_transformed(serialized):
        features = transform(serialized)
        return head.serving_outputs(
            model({k: model_input(k, features) for k in feature_keys}))

    return serve_transformed


def _raw_to_transformed(model: keras.Model, transform_output) -> Callable:
    # The layer is tracked on the model so the saved model carries the transform graph, once.
    if not hasattr(model, "tft_layer"):
        model.tft_layer = transform_output.transform_features_layer()
    raw_spec = transform_output.raw_feature_spec()

    def transform(serialized: tf.Tensor) -> dict:
        return model.tft_layer(tf.io.parse_example(serialized, raw_spec))

    return transform


def _transform_features_signature(model: keras.Model, transform_output, label_key: str):
    """Raw Examples -> the transformed label: TFMA's preprocessing function, so the Evaluator
    scores raw eval examples even when the label only exists after Transform."""
    transform = _raw_to_transformed(model, transform_output)
    label = parser.feature_by_name(transform_output.transformed_metadata.schema)[label_key]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")],
                 autograph=False)
    def transform_features(serialized):
        return {label_key: parser.densify(transform(serialized)[label_key], label)}

    return transform_features


@dataclasses.dataclass(frozen=True)
class Schemas:
    """The schemas of one training run, each by the role it plays."""

    stored: schema_pb2.Schema  # the schema input as given: its packing and raw-pixel tags
    read: schema_pb2.Schema  # what the input function parses the examples with
    model: schema_pb2.Schema  # the features the model sees (after Transform, with a graph)
    transform_output: Any = None  # tft.TFTransformOutput, when there is a Transform graph


def resolve_schemas(fn_args: Any) -> Schemas:
    """With a Transform graph the examples are its output: ShardedTransform's post-transform
    schema says whether they are packed, and is read as it is; any other schema input (stock
    wiring passes the raw one) means one transformed row each, read with the graph's
    transformed schema."""
    stored = schema_file.load_schema(fn_args.schema_path)
    if not getattr(fn_args, "transform_graph_path", None):
        return Schemas(stored, stored, stored)
    import tensorflow_transform as tft

    transform_output = tft.TFTransformOutput(fn_args.transform_graph_path)
    transformed = transform_output.transformed_metadata.schema
    read = stored if packing.packed_rows(stored) else transformed
    return Schemas(stored, read, transformed, transform_output)


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
        no gradients), and it sees every row, which a sample of the first batches does not."""
        keys = [] if self.images else numeric_keys(self.schema, self.feature_keys)
        config = dataclasses.replace(self.options.input_config(
            max(self.options.input.batch_size, 4096), False, {}), num_epochs=1)
        return DataStatistics.of(self._dataset(files, keys, config, holdout=holdout), keys)

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
                 holdout: Optional[Holdout] = None) -> tf.data.Dataset:
        """`feature_keys` and the label (read, or computed by label_fn) of `files`."""
        return build_dataset(files, self.schema,
                             None if self.label_fn else self.options.label_key,
                             feature_keys=feature_keys, label_fn=self.label_fn,
                             label_inputs=self.options.label_inputs if self.label_fn else (),
                             config=config, input_context=context,
                             on_served_epoch=on_served_epoch, holdout=holdout)


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
    train_files = resolve_files(fn_args.train_files)
    inputs = TrainingInput(options, schemas.read, feature_keys,
                           _label_fn(options, schemas.model), images, train_files,
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
            model, schemas, feature_keys, images, head, options.label_key))
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


def build_model(schema: schema_pb2.Schema, feature_keys: list[str],
                images: Mapping[str, ImageSpec], statistics: DataStatistics,
                head: Head, periodic: Periodic = Periodic()) -> keras.Model:
    if images:
        name, image = next(iter(images.items()))
        return build_image_model(name, image, head)
    return build_tabular_model(schema, feature_keys, statistics, head, periodic)


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
    return {"rows_trained": statistics.rows, "rows_choosing_weights": chose,
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


def serving_signatures(model: keras.Model, schemas: Schemas, feature_keys: list[str],
                       images: Mapping[str, ImageSpec], head: Head, label_key: str) -> dict:
    """serving_default (raw Examples in, the task's outputs out) and, with a Transform graph
    that makes the label, the Evaluator's transform_features."""
    signatures = {"serving_default": _serving_signature(
        model, schemas.model, feature_keys, images, head, schemas.transform_output)}
    if schemas.transform_output is not None and \
            label_key in parser.feature_by_name(schemas.model):
        signatures[TRANSFORM_SIGNATURE] = _transform_features_signature(
            model, schemas.transform_output, label_key)
    return signatures


def export_model(model: keras.Model, serving_model_dir: str,
                 folders: distribute.WorkerFolders, signatures: dict) -> None:
    """The chief exports the serving model. Every other worker must save too (saving under
    MultiWorkerMirroredStrategy is collective), into a scratch copy it then deletes."""
    # Without save_traces Keras does not trace every layer's call for the SavedModel; the
    # signatures are what serving and the Evaluator use, and the export takes 0.6 s instead
    # of 10 (taxi model, measured).
    target = serving_model_dir if folders.writes_outputs else \
        fileio.join(folders.run_dir, "model_copy")
    model.save(target, save_format="tf", signatures=signatures, save_traces=False)
    # What a later warm start checks its features against (serving ignores assets.extra).
    tf.io.gfile.makedirs(fileio.dirname(fileio.join(target, MODEL_INPUTS_FILE)))
    with tf.io.gfile.GFile(fileio.join(target, MODEL_INPUTS_FILE), "w") as f:
        f.write(json.dumps({"features": sorted(model.input)}))
    if folders.writes_outputs:
        logging.info("Exported serving model to %s", serving_model_dir)
    else:
        tf.io.gfile.rmtree(target)


MODEL_INPUTS_FILE = fileio.join("assets.extra", "tfrp_model_inputs.json")


def warm_start(model: keras.Model, base_model: Optional[str], feature_keys: list[str]) -> None:
    """Loads the production model's weights into `model` (same features, same layers). Its
    scaling comes with them. No production model yet (a first run): a cold start, logged."""
    if not base_model or not fileio.exists(base_model):
        logging.info("warm_start: no model in production yet; training from random weights")
        return
    inputs_file = fileio.join(base_model, MODEL_INPUTS_FILE)
    if not tf.io.gfile.exists(inputs_file):
        raise ValueError(f"warm_start: {base_model} was not exported by this Trainer (no "
                         f"{MODEL_INPUTS_FILE}); train once with warm_start=false")
    with tf.io.gfile.GFile(inputs_file) as f:
        before = json.load(f)["features"]
    if sorted(before) != sorted(feature_keys):
        gone = sorted(set(before) - set(feature_keys))
        new = sorted(set(feature_keys) - set(before))
        raise ValueError(f"warm_start: the production model {base_model} was trained on other "
                         f"features than the new transform graph gives (gone: {gone}; new: "
                         f"{new}); train once with warm_start=false")
    try:
        status = model.load_weights(fileio.join(base_model, "variables", "variables"))
        status.assert_existing_objects_matched()  # every layer of the new model found its own
    except (AssertionError, ValueError) as mismatch:
        # A layer missing fails the assertion; a layer of another shape fails the restore
        # itself (a ValueError naming the variable). Either way the architectures differ.
        detail = str(mismatch).strip().splitlines()[0][:200] if str(mismatch).strip() else ""
        raise ValueError(f"warm_start: the production model {base_model} has other layers than "
                         "this Trainer builds (trained before the numbers' periodic embedding, "
                         "or with other periodic_frequencies); train once with "
                         f"warm_start=false ({detail})") from None
    logging.info("warm_start: weights from %s", base_model)


def make_head(options: TrainerOptions, schema: schema_pb2.Schema, label_key: str,
              images: Mapping[str, ImageSpec], label_moments: Moments,
              transform_output=None) -> Head:
    """The task as set (the pipeline settles it from the data), else what the transformed
    label's schema says, else binary; a multiclass label's classes from `num_classes`, the
    label's domain (a vocabulary's size), or the largest training label plus one."""
    label = parser.find_feature(schema, label_key)
    task = options.task if options.task != tasks.AUTO else (
        tasks.MULTICLASS if images else tasks.task_from_schema(label) or tasks.BINARY)
    if task != tasks.MULTICLASS:
        logging.info("Task: %s", task)
        return Head(task)
    num_classes = options.num_classes or tasks.classes_from_schema(label)
    if not num_classes:
        num_classes = int(label_moments.largest) + 1 if label_moments.count else 0
    if num_classes < 2:
        raise ValueError(f"{label_key}: a multiclass label needs at least 2 classes; set "
                         f"num_classes")
    class_names: tuple[str, ...] = ()
    if transform_output is not None:
        try:  # the default preprocessing_fn names a string label's vocabulary after it
            vocabulary = transform_output.vocabulary_by_name(names.op_name(label_key))
            class_names = tuple(v.decode("utf-8", "replace") if isinstance(v, bytes)
                                else str(v) for v in vocabulary)
        except (ValueError, KeyError, tf.errors.NotFoundError):
            class_names = ()
    if class_names and len(class_names) != num_classes:
        class_names = ()
    logging.info("Task: %s (%d classes)", task, num_classes)
    return Head(task, int(num_classes), class_names)
