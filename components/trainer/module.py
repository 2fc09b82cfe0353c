"""TFX Trainer module: `run_fn(fn_args)` trains a Keras (tf-keras) model from our input function.

Passed to the stock Trainer as `run_fn="components.trainer.module.run_fn"`, so the installed
package is the module and nothing is rebuilt into a wheel per run.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: E402

from components import codec  # noqa: E402
from components.trainer import distribute  # noqa: E402
from components.trainer.input import InputConfig, build_dataset  # noqa: E402

keras = tf.keras

# The taxi task: will the tip exceed 20 % of the fare? `tips` only defines the label.
TAXI_LABEL_SOURCE = ("tips", "fare")
TAXI_EXCLUDED = ("tips", "trip_start_timestamp", "pickup_census_tract", "dropoff_census_tract")
HASH_BINS = 64
EMBEDDING_DIM = 4
NORMALIZATION_BATCHES = 20


def taxi_label(features: Mapping[str, tf.Tensor]) -> tf.Tensor:
    tips = tf.cast(features["tips"], tf.float32)
    fare = tf.cast(features["fare"], tf.float32)
    return tf.cast(tips > 0.2 * fare, tf.float32)


def tabular_feature_keys(schema: schema_pb2.Schema, excluded: tuple[str, ...]) -> list[str]:
    return [f.name for f in schema.feature if codec.is_scalar(f) and f.name not in excluded]


def build_tabular_model(schema: schema_pb2.Schema, feature_keys: list[str],
                        sample: tf.data.Dataset) -> keras.Model:
    """Numbers are standardised with statistics from `sample`; strings are hashed and embedded."""
    features = codec.feature_by_name(schema)
    inputs, encoded = {}, []
    for name in feature_keys:
        kind = features[name].type
        dtype = tf.string if kind == schema_pb2.BYTES else tf.float32
        inputs[name] = keras.Input(shape=(1,), name=name, dtype=dtype)
        if kind == schema_pb2.BYTES:
            hashed = keras.layers.Hashing(num_bins=HASH_BINS)(inputs[name])
            embedded = keras.layers.Embedding(HASH_BINS, EMBEDDING_DIM)(hashed)
            encoded.append(keras.layers.Reshape((EMBEDDING_DIM,))(embedded))
        else:
            norm = keras.layers.Normalization(axis=None, name=f"{name}_norm")
            norm.adapt(sample.map(lambda f, _, n=name: tf.cast(f[n], tf.float32)))
            encoded.append(norm(inputs[name]))
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


def _serving_signature(model: keras.Model, schema: schema_pb2.Schema,
                       feature_keys: list[str]):
    """Parses serialized tf.Examples with the raw schema, fills gaps, and scores them."""
    spec = {k: v for k, v in codec.feature_spec_from_schema(schema).items() if k in feature_keys}
    features = codec.feature_by_name(schema)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve_tf_examples(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        dense = {k: codec.densify(v, features[k]) for k, v in parsed.items()}
        return {"probability": model(dense)}

    return serve_tf_examples


def run_fn(fn_args: Any) -> None:
    """Trains on `fn_args.train_files`, evaluates, and exports a tf.Example serving model."""
    custom = fn_args.custom_config or {}
    schema = codec.load_schema(fn_args.schema_path)
    feature_keys = tabular_feature_keys(schema, TAXI_EXCLUDED)
    batch_size = int(custom.get("batch_size", 256))
    strategy = distribute.make_strategy()

    def dataset_fn(files, training):
        def make(context: tf.distribute.InputContext) -> tf.data.Dataset:
            config = InputConfig(
                batch_size=context.get_per_replica_batch_size(batch_size),
                training=training, cache=custom.get("cache", "none"))
            return build_dataset(files, schema, None, feature_keys=feature_keys,
                                 label_fn=taxi_label, label_inputs=TAXI_LABEL_SOURCE,
                                 config=config, input_context=context)
        return make

    with strategy.scope():
        sample = dataset_fn(fn_args.train_files, False)(tf.distribute.InputContext()) \
            .take(NORMALIZATION_BATCHES)
        model = build_tabular_model(schema, feature_keys, sample)

    train = distribute.distribute(strategy, dataset_fn(fn_args.train_files, True))
    evaluation = distribute.distribute(strategy, dataset_fn(fn_args.eval_files, False))
    tensorboard = keras.callbacks.TensorBoard(log_dir=fn_args.model_run_dir, update_freq="epoch")
    steps_per_epoch = max(1, fn_args.train_steps // int(custom.get("epochs", 1)))
    model.fit(train, steps_per_epoch=steps_per_epoch,
              epochs=max(1, fn_args.train_steps // steps_per_epoch),
              validation_data=evaluation, validation_steps=fn_args.eval_steps,
              callbacks=[tensorboard], verbose=2)
    signatures = {"serving_default": _serving_signature(model, schema, feature_keys)}
    model.save(fn_args.serving_model_dir, save_format="tf", signatures=signatures)
    logging.info("Exported serving model to %s", fn_args.serving_model_dir)
