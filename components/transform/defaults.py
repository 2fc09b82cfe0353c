"""The preprocessing_fn used when the user gives none, derived from the raw schema.

Floats are z-scored, strings become vocabulary ids (with one OOV bucket), ints are kept, and
encoded images (bytes with an image_domain) pass through: decoding them is the input
function's parallel work, not the transform graph's.
Scalar features come out dense ([batch]), gaps filled with the schema default, so the
transformed examples carry exactly one value per feature; list features pass through.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

import tensorflow as tf
import tensorflow_transform as tft
from tensorflow_metadata.proto.v0 import schema_pb2

from components.codec import parser

OOV_BUCKETS = 1


def dense_scalar(value, feature: schema_pb2.Feature) -> tf.Tensor:
    """A parsed scalar feature (sparse when it can be missing) as a dense [batch] tensor."""
    return tf.reshape(parser.densify(value, feature), [-1])


def transform_features(inputs: dict, schema: schema_pb2.Schema,
                       exclude: Iterable[str] = (), label_key: Optional[str] = None) -> dict:
    """The default transforms for every input feature not in `exclude`. The label is kept in
    its own units (a regression target is not z-scored; an int label keeps its ids), except a
    string label, which becomes ids of a vocabulary with no OOV bucket: its size is the
    number of classes, and an eval label never seen in training maps to -1."""
    features = parser.feature_by_name(schema)
    outputs = {}
    for name, value in inputs.items():
        if name in set(exclude) or name not in features:
            continue
        feature = features[name]
        if not parser.is_scalar(feature):
            outputs[name] = value
            continue
        dense = dense_scalar(value, feature)
        if name == label_key:
            outputs[name] = tft.compute_and_apply_vocabulary(
                dense, num_oov_buckets=0, vocab_filename=name) \
                if feature.type == schema_pb2.BYTES else dense
        elif feature.type == schema_pb2.FLOAT:
            outputs[name] = tft.scale_to_z_score(dense)
        elif feature.HasField("image_domain"):
            outputs[name] = dense
        elif feature.type == schema_pb2.BYTES:
            outputs[name] = tft.compute_and_apply_vocabulary(
                dense, num_oov_buckets=OOV_BUCKETS, vocab_filename=name)
        else:
            outputs[name] = dense
    return outputs


def default_preprocessing_fn(schema: schema_pb2.Schema, label_key: Optional[str] = None
                             ) -> Callable[[dict], dict]:
    def preprocessing_fn(inputs: dict) -> dict:
        return transform_features(inputs, schema, label_key=label_key)
    return preprocessing_fn
