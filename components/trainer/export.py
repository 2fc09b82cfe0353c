"""The Trainer's exported model: its serving signatures, the SavedModel the chief writes,
and the warm start that loads a production model's weights back into a new one.

serving_default scores serialized raw tf.Examples with the same parser the input function
uses (`example_parser`), so training and serving cannot drift apart; with a Transform graph
it applies the graph first, and the Evaluator's transform_features signature gives the
transformed label.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Mapping, Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: E402

from tfrecord_shards import fileio  # noqa: E402
from tfrecord_shards.codec import parser  # noqa: E402
from shard_readers.images import ImageSpec, decode_images  # noqa: E402
from components.trainer import distribute  # noqa: E402
from components.trainer.input import example_parser  # noqa: E402
from components.trainer.models import Head  # noqa: E402
from components.trainer.options import (  # noqa: E402
    MODEL_INPUTS_FILE, TRANSFORM_SIGNATURE, TRANSFORMED_SIGNATURE, signature_input_name)
from components.transform.graph_digest import graph_digest  # noqa: E402

keras = tf.keras


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


_NUMBER_TYPES = {schema_pb2.FLOAT: tf.float32, schema_pb2.INT: tf.int64}


def _transformed_signature(model: keras.Model, schema: schema_pb2.Schema,
                           feature_keys: list[str], head: Head) -> Optional[Callable]:
    """The model on transformed features, a dense tensor each ([rows] for a scalar, [rows,
    n] for a fixed list): the layers after the Transform graph. None when a feature is not
    dense numbers (text, images, variable-length lists), which only serving_default takes."""
    features = parser.feature_by_name(schema)
    specs = {}
    for name in feature_keys:
        feature = features[name]
        if feature.type not in _NUMBER_TYPES or not parser.is_fixed(feature):
            return None
        shape = [d.size for d in feature.shape.dim]
        specs[name] = tf.TensorSpec([None] + ([] if shape in ([], [1]) else shape),
                                    _NUMBER_TYPES[feature.type],
                                    name=signature_input_name(name))
    if len({spec.name for spec in specs.values()}) < len(specs):
        return None  # two features' names differ only where TensorFlow's names cannot

    @tf.function(input_signature=[specs], autograph=False)
    def score_transformed(transformed):
        return head.serving_outputs(model({name: parser.densify(transformed[name],
                                                                features[name])
                                           for name in feature_keys}))

    return score_transformed


def serving_signatures(model: keras.Model, schema: schema_pb2.Schema, feature_keys: list[str],
                       images: Mapping[str, ImageSpec], head: Head, label_key: str,
                       transform_output: Any = None) -> dict:
    """serving_default (raw Examples in, the task's outputs out) and, with a Transform graph,
    the Evaluator's transform_features (when the graph makes the label) and
    score_transformed (when every feature it makes is dense numbers). `schema` holds the
    features the model sees (the graph's output, with one)."""
    signatures = {"serving_default": _serving_signature(
        model, schema, feature_keys, images, head, transform_output)}
    if transform_output is not None and label_key in parser.feature_by_name(schema):
        signatures[TRANSFORM_SIGNATURE] = _transform_features_signature(
            model, transform_output, label_key)
    scorer = _transformed_signature(model, schema, feature_keys, head) \
        if transform_output is not None else None
    if scorer is not None:
        signatures[TRANSFORMED_SIGNATURE] = scorer
    return signatures


def export_model(model: keras.Model, serving_model_dir: str,
                 folders: distribute.WorkerFolders, signatures: dict,
                 transform_graph: Optional[str] = None) -> None:
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
        f.write(json.dumps({"features": sorted(model.input), **(
            {"transform_graph_digest": graph_digest(transform_graph)} if transform_graph
            else {})}))
    if folders.writes_outputs:
        logging.info("Exported serving model to %s", serving_model_dir)
    else:
        tf.io.gfile.rmtree(target)

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
