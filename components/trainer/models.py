"""The Trainer's Keras models: the task's head, the numbers' scaling statistics, and the
tabular and image networks built from them.

`build_model` gives an image CNN when the examples hold images, else the tabular network:
numbers standardised with moments over every training row (`DataStatistics`) and embedded
through sines of them, strings hashed and embedded, vocabulary ids embedded directly.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Mapping, Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: E402

from tfrecord_shards import names  # noqa: E402
from tfrecord_shards.codec import parser  # noqa: E402
from shard_readers.images import ImageSpec  # noqa: E402
from components.trainer import layers, tasks  # noqa: E402
from components.trainer.options import TrainerOptions  # noqa: E402

keras = tf.keras



HASH_BINS = 64


HIDDEN_UNITS = (128, 64)


# Features each number's periodic embedding gives the first hidden layer.
PERIODIC_WIDTH = 16


def embedding_width(categories: int) -> int:
    """Wider for more categories, 2 to 16 (the rule of thumb 1.6 * n^0.56)."""
    return int(min(16, max(2, round(1.6 * categories ** 0.56))))


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
    """Moments of the numeric features and the label over every row of a dataset, or of a
    sample spread evenly over all of it (sampling.py). The model's scaling and the head's
    starting point come from every part of the training rows, not from the first batches:
    tables are often sorted (by date, by id), and the first rows' spread is not the data's."""

    features: dict[str, Moments]
    label: Moments
    rows: int = 0  # every row read, a missing label or not
    # Read from a sample (sampling.py): the rows it held. `rows` is then the dataset's: from
    # our manifest when no rows are held out, else estimated from the sample's share.
    sampled_rows: Optional[int] = None
    rows_estimated: bool = False

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


def build_model(schema: schema_pb2.Schema, feature_keys: list[str],
                images: Mapping[str, ImageSpec], statistics: DataStatistics,
                head: Head, periodic: Periodic = Periodic()) -> keras.Model:
    if images:
        name, image = next(iter(images.items()))
        return build_image_model(name, image, head)
    return build_tabular_model(schema, feature_keys, statistics, head, periodic)


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
