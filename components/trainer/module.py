"""TFX Trainer module: `run_fn(fn_args)` trains a Keras (tf-keras) model from our input function.

Passed to the stock Trainer as `run_fn="components.trainer.module.run_fn"`, so the installed
package is the module and nothing is rebuilt into a wheel per run.

What to train is read from `custom_config`, all keys optional:
  label_key       the label feature, or a derived label ("big_tipper": tips > 20 % of fare)
  exclude         features the model must not see
  images          {"image": [height, width, channels]}: decode these and train a small CNN
  num_classes     classes of an image label (default: the label's int_domain, else 10)
  image_dtype     "uint8" (normalised on the device, default) or "float32"
  batch_size, epochs (reporting windows of train_steps), cache, skip_corrupt
  seed            seeds weight initialisation and input shuffling (default 42)
With a Transform graph the model trains on transformed examples and the serving signature
applies the graph to raw examples.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping, Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: E402

from components import codec, packing  # noqa: E402
from components.inspect import find_schema  # noqa: E402
from components.trainer import distribute, fit  # noqa: E402
from components.trainer.input import (  # noqa: E402
    ImageSpec, InputConfig, build_dataset, corrupt_files_named, decode_images, example_parser,
    resolve_files)

keras = tf.keras

TAXI_LABEL = "big_tipper"
TAXI_EXCLUDED = ("tips", "trip_start_timestamp", "pickup_census_tract", "dropoff_census_tract")
IMAGE_METADATA = ("height", "width", "channels", "format")
HASH_BINS = 64
EMBEDDING_DIM = 4
NORMALIZATION_BATCHES = 20
DEFAULT_SEED = 42
# Raw Examples -> transformed features incl. the label; the Evaluator's preprocessing function.
TRANSFORM_SIGNATURE = "transform_features"


def taxi_label(features: Mapping[str, tf.Tensor]) -> tf.Tensor:
    tips = tf.cast(features["tips"], tf.float32)
    fare = tf.cast(features["fare"], tf.float32)
    return tf.cast(tips > 0.2 * fare, tf.float32)


# Labels computed from other features when the data does not carry them (raw taxi rows).
DERIVED_LABELS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    TAXI_LABEL: (taxi_label, ("tips", "fare")),
}


def preprocessing_fn(inputs: dict, custom_config: dict) -> dict:
    """The taxi Transform: the default transforms for every model feature, plus the label
    computed from the raw tip and fare before they are scaled."""
    from components.transform.defaults import dense_scalar, transform_features

    schema = custom_config["raw_schema"]
    features = codec.feature_by_name(schema)
    outputs = transform_features(inputs, schema, exclude=TAXI_EXCLUDED)
    tips = dense_scalar(inputs["tips"], features["tips"])
    fare = dense_scalar(inputs["fare"], features["fare"])
    outputs[TAXI_LABEL] = tf.cast(tips > 0.2 * fare, tf.int64)
    return outputs


def model_feature_keys(schema: schema_pb2.Schema, label_key: str, excluded,
                       images: Mapping[str, ImageSpec]) -> list[str]:
    """Images plus every scalar feature that is neither the label nor excluded."""
    if images:
        return sorted(images)
    label_sources = DERIVED_LABELS.get(label_key, (None, ()))[1]
    return [f.name for f in schema.feature if codec.is_scalar(f)
            and f.name not in set(excluded) | {label_key} | set(label_sources)]


def _categorical_size(feature: schema_pb2.Feature) -> Optional[int]:
    """Vocabulary-encoded ints (Transform's output) carry their range in int_domain."""
    if feature.type == schema_pb2.INT and feature.HasField("int_domain") and \
            feature.int_domain.is_categorical and feature.int_domain.max > 0:
        return int(feature.int_domain.max) + 1
    return None


def build_tabular_model(schema: schema_pb2.Schema, feature_keys: list[str],
                        sample: tf.data.Dataset) -> keras.Model:
    """Numbers are standardised with statistics from `sample`; strings are hashed and embedded,
    vocabulary ids embedded directly."""
    features = codec.feature_by_name(schema)
    sample_batches = [({k: v.numpy() for k, v in f.items() if not isinstance(v, tf.RaggedTensor)},
                       label) for f, label in sample]
    inputs, encoded = {}, []
    for name in feature_keys:
        feature = features[name]
        categories = _categorical_size(feature)
        if feature.type == schema_pb2.BYTES:
            inputs[name] = keras.Input(shape=(1,), name=name, dtype=tf.string)
            ids = keras.layers.Hashing(num_bins=HASH_BINS)(inputs[name])
            size = HASH_BINS
        elif categories:
            inputs[name] = keras.Input(shape=(1,), name=name, dtype=tf.int64)
            ids = keras.layers.Lambda(lambda x: tf.maximum(x, 0))(inputs[name])
            size = categories
        else:
            inputs[name] = keras.Input(shape=(1,), name=name,
                                       dtype=tf.int64 if feature.type == schema_pb2.INT
                                       else tf.float32)
            values = np.concatenate([np.asarray(f[name], np.float64).ravel()
                                     for f, _ in sample_batches])
            norm = keras.layers.Normalization(axis=None, mean=values.mean(),
                                              variance=max(values.var(), 1e-12),
                                              name=f"{name}_norm")
            encoded.append(norm(tf.cast(inputs[name], tf.float32)))
            continue
        embedded = keras.layers.Embedding(size, EMBEDDING_DIM)(ids)
        encoded.append(keras.layers.Reshape((EMBEDDING_DIM,))(embedded))
    x = keras.layers.Concatenate()(encoded)
    for units in (64, 32):
        x = keras.layers.Dense(units, activation="relu")(x)
    output = keras.layers.Dense(1, activation="sigmoid", name="probability")(x)
    model = keras.Model(inputs=inputs, outputs=output)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.BinaryCrossentropy(),
                  metrics=[keras.metrics.BinaryAccuracy(name="accuracy"),
                           keras.metrics.AUC(name="auc")])
    return model


def build_image_model(name: str, image: ImageSpec, num_classes: int) -> keras.Model:
    """A small CNN. Pixels may arrive as uint8: scaling to [0, 1] is the first layer, so on a
    GPU it runs on the device after a 4x cheaper host->device copy."""
    inputs = keras.Input(shape=(image.height, image.width, image.channels), name=name,
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
    output = keras.layers.Dense(num_classes, activation="softmax", name="probabilities")(x)
    model = keras.Model(inputs={name: inputs}, outputs=output)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    return model


def _serving_signature(model: keras.Model, schema: schema_pb2.Schema, feature_keys: list[str],
                       images: Mapping[str, ImageSpec], transform_output=None):
    """Scores serialized raw tf.Examples: parse with the raw schema, fill gaps, apply the
    Transform graph when there is one, decode images, then the model."""
    output_name = model.output_names[0]
    if transform_output is None:
        parse = example_parser(schema, feature_keys, images)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve_tf_examples(serialized):
            return {output_name: model(parse(serialized))}

        return serve_tf_examples

    transform = _raw_to_transformed(model, transform_output)
    transformed = codec.feature_by_name(transform_output.transformed_metadata.schema)

    @tf.autograph.experimental.do_not_convert  # plain Python branching on names only
    def model_input(name: str, features: dict) -> tf.Tensor:
        value = codec.densify(features[name], transformed[name])
        return decode_images(value, images[name]) if name in images else value

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve_transformed(serialized):
        features = transform(serialized)
        return {output_name: model({k: model_input(k, features) for k in feature_keys})}

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
    label = codec.feature_by_name(transform_output.transformed_metadata.schema)[label_key]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def transform_features(serialized):
        return {label_key: codec.densify(transform(serialized)[label_key], label)}

    return transform_features


def run_fn(fn_args: Any) -> None:
    """Trains on `fn_args.train_files`, evaluates, writes input_report.json and TensorBoard
    logs into `model_run_dir`, and exports a tf.Example serving model."""
    custom = dict(fn_args.custom_config or {})
    transform_output = None
    if getattr(fn_args, "transform_graph_path", None):
        import tensorflow_transform as tft

        transform_output = tft.TFTransformOutput(fn_args.transform_graph_path)
        schema = transform_output.transformed_metadata.schema
    else:
        schema = codec.load_schema(fn_args.schema_path)
    raw_schema = codec.load_schema(fn_args.schema_path) if fn_args.schema_path else schema
    # Packed examples carry their packing in the schema stored beside them.
    train_files = resolve_files(fn_args.train_files)
    stored = find_schema(train_files[0])
    data_schema = stored if stored is not None and packing.packed_rows(stored) else schema

    images = {name: ImageSpec(*shape, dtype=custom.get("image_dtype", "uint8"))
              for name, shape in (custom.get("images") or {}).items()}
    label_key = custom.get("label_key", "label" if images else TAXI_LABEL)
    excluded = custom.get("exclude", IMAGE_METADATA if images else TAXI_EXCLUDED)
    feature_keys = model_feature_keys(schema, label_key, excluded, images)
    label_fn, label_inputs = (None, ())
    if label_key not in codec.feature_by_name(schema) and label_key in DERIVED_LABELS:
        label_fn, label_inputs = DERIVED_LABELS[label_key]
    batch_size = int(custom.get("batch_size", 64 if images else 256))
    seed = int(custom.get("seed", DEFAULT_SEED))
    keras.utils.set_random_seed(seed)
    strategy = distribute.make_strategy()
    global_batch = batch_size * strategy.num_replicas_in_sync

    def dataset_fn(files, training: bool):
        def make(context: tf.distribute.InputContext) -> tf.data.Dataset:
            config = InputConfig(
                batch_size=context.get_per_replica_batch_size(global_batch),
                training=training, cache=custom.get("cache", "none"), seed=seed,
                skip_corrupt=bool(custom.get("skip_corrupt", False)), images=images)
            return build_dataset(files, data_schema, None if label_fn else label_key,
                                 feature_keys=feature_keys, label_fn=label_fn,
                                 label_inputs=label_inputs, config=config,
                                 input_context=context)
        return make

    with corrupt_files_named(train_files + resolve_files(fn_args.eval_files)):
        with strategy.scope():
            if images:
                name, image = next(iter(images.items()))
                model = build_image_model(name, image, _num_classes(schema, label_key, custom))
            else:
                sample = dataset_fn(fn_args.train_files, False)(tf.distribute.InputContext())
                model = build_tabular_model(schema, feature_keys,
                                            sample.take(NORMALIZATION_BATCHES))
        train = distribute.distribute(strategy, dataset_fn(fn_args.train_files, True))
        evaluation = distribute.distribute(strategy, dataset_fn(fn_args.eval_files, False))
        epochs = max(1, int(custom.get("epochs", 10)))
        result = fit.train(model, strategy, train, steps=fn_args.train_steps,
                           steps_per_epoch=max(1, -(-fn_args.train_steps // epochs)),
                           log_dir=fn_args.model_run_dir, global_batch_size=global_batch,
                           eval_data=evaluation, eval_steps=fn_args.eval_steps or 0)
    report = result.report()
    report_path = fit.write_report(report, fn_args.model_run_dir)
    logging.info("Input report: %s (overall input wait %.1f%%, %s)", report_path,
                 100 * report["overall"]["input_wait_share"], report["overall"]["label"])

    signatures = {"serving_default": _serving_signature(
        model, raw_schema if transform_output is None else schema, feature_keys, images,
        transform_output)}
    if transform_output is not None and label_key in codec.feature_by_name(schema):
        signatures[TRANSFORM_SIGNATURE] = _transform_features_signature(
            model, transform_output, label_key)
    model.save(fn_args.serving_model_dir, save_format="tf", signatures=signatures)
    logging.info("Exported serving model to %s", fn_args.serving_model_dir)


def _num_classes(schema: schema_pb2.Schema, label_key: str, custom: Mapping) -> int:
    if "num_classes" in custom:
        return int(custom["num_classes"])
    label = codec.find_feature(schema, label_key)
    if label is not None and label.HasField("int_domain") and label.int_domain.max > 0:
        return int(label.int_domain.max) + 1
    return 10
