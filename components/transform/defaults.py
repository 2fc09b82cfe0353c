"""The preprocessing_fn used when the user gives none, derived from the raw schema, with every
statistic from tf.Transform analyzers over the training split, so serving does the same:

- a number (int or float, not a 0/1 flag): a missing value is imputed with the mean, and a
  `<name>__missing` 0/1 feature says it was missing (when the schema says values can be
  missing); the value is z-scored (`<name>`) and also cut into NUM_BUCKETS quantile buckets
  (`<name>__bucket`, categorical), which lets the model bend on heavy tails and steps;
- a date or time (tag `tfrp.time=epoch_seconds`): the same, plus its calendar parts as
  categories (`<name>__month`, `<name>__weekday`, `<name>__hour`) and `<name>__year`;
- a number whose column is named as an identifier (`id`, `user_id`, `movieId`, `Item ID`:
  ID_NAME): the same, plus `<name>__id`, ids of a vocabulary of its values seen at least
  twice in training. A user or item number is a key, not a quantity: its effect is the
  key's own, which an embedding learns and no scaling or quantile bucket of the number can;
- a string: ids of a vocabulary (its most frequent MAX_VOCABULARY values, one OOV bucket);
- a 0/1 flag (a bool column) and encoded images (bytes with an image_domain) pass through:
  decoding images is the input function's parallel work, not the transform graph's.
Scalar features come out dense ([batch]), so the transformed examples carry exactly one value
per feature; list features pass through. The label: see `transform_features`.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, Optional

import tensorflow as tf
from tensorflow_transform import schema_inference
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import names
from tfrecord_shards.codec import parser
from tfrecord_shards.codec.serializer import TIME_TAG
from components.transform import analyzers
from components.trainer.tasks import MULTICLASS, REGRESSION

OOV_BUCKETS = 1
NUM_BUCKETS = 16
MAX_VOCABULARY = 10_000
# A column name that ends in "id" as a word of its own: `id`, `user_id`, `Item ID`, `userId`,
# `movieID`; not `paid` or `valid`.
ID_NAME = re.compile(r"(?:^|[^A-Za-z])(?:id|Id|ID)$|[a-z0-9](?:Id|ID)$")
# A key seen once in training teaches its embedding that one row, and every eval row it
# appears in is a key the model knows nothing of: such keys share the OOV id instead.
ID_MIN_COUNT = 2


def vocabulary_name(feature: str) -> str:
    """The vocabulary file of a feature (`TFTransformOutput.vocabulary_by_name`): a file
    name, whatever the feature is called."""
    return names.op_name(feature)


def dense_scalar(value, feature: schema_pb2.Feature) -> tf.Tensor:
    """A parsed scalar feature (sparse when it can be missing) as a dense [batch] tensor."""
    return tf.reshape(parser.densify(value, feature), [-1])


def transform_features(inputs: dict, schema: schema_pb2.Schema,
                       exclude: Iterable[str] = (), label_key: Optional[str] = None,
                       task: Optional[str] = None) -> dict:
    """The default transforms for every input feature not in `exclude`. The label is kept in
    its own units (a regression target is not z-scored, an int one becomes a float; int class
    ids keep their values, and the schema records the largest over all the training rows, so
    the number of classes is never taken from a sample), except a string label, which becomes
    ids of a vocabulary with no OOV bucket: its size is the number of classes, and an eval
    label never seen in training maps to -1."""
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
            outputs[name] = _label(dense, feature, task, name)
        elif feature.HasField("image_domain") or _is_flag(feature):
            outputs[name] = dense
        elif feature.type == schema_pb2.BYTES:
            outputs[name] = analyzers.current().vocabulary_ids(
                dense, top_k=MAX_VOCABULARY, num_oov_buckets=OOV_BUCKETS,
                vocab_filename=vocabulary_name(name))
        else:
            outputs.update(_number(name, dense, _present(value), feature))
            if ID_NAME.search(name):
                outputs[f"{name}__id"] = analyzers.current().vocabulary_ids(
                    tf.strings.as_string(dense), top_k=MAX_VOCABULARY,
                    frequency_threshold=ID_MIN_COUNT, num_oov_buckets=OOV_BUCKETS,
                    vocab_filename=vocabulary_name(f"{name}__id"))
    return outputs


def _is_flag(feature: schema_pb2.Feature) -> bool:
    return feature.type == schema_pb2.INT and feature.HasField("int_domain") and \
        feature.int_domain.is_categorical and feature.int_domain.max <= 1


def _number(name: str, raw: tf.Tensor, present: tf.Tensor, feature: schema_pb2.Feature
            ) -> dict:
    """A number's features: imputed, z-scored, quantile buckets, a missing flag; for a time,
    its calendar parts too.

    Every analyzer reads the raw present values, none an analyzer's output, so the analysis
    is one phase: tf.Transform's analyzer cache then spares an input seen before (a span of
    a rolling window) from being read again. A missing value is imputed with the mean, so it
    z-scores to 0 and falls in the mean's bucket."""
    statistics = analyzers.current()
    numbers = tf.cast(raw, tf.float32)
    kept = analyzers.kept_values(numbers, present)
    mean = tf.cast(statistics.mean(kept), tf.float32)
    filled = tf.where(present, numbers, mean)
    # The derived names are `names.DERIVED_SUFFIXES`: the Trainer leaves out what is derived
    # from a feature it is told to leave out.
    boundaries = statistics.quantiles(kept, NUM_BUCKETS, epsilon=min(1.0 / NUM_BUCKETS, 0.01))
    out = {name: _z_score(filled, mean, statistics.var(kept)),
           f"{name}__bucket": apply_buckets(filled, boundaries)}
    if not (feature.HasField("presence") and feature.presence.min_fraction >= 1.0):
        out[f"{name}__missing"] = tf.cast(tf.logical_not(present), tf.float32)
    if TIME_TAG in feature.annotation.tag:
        seconds = tf.where(present, tf.cast(raw, tf.int64),
                           tf.cast(tf.round(mean), tf.int64))
        year, month, weekday, hour = _calendar(seconds)
        years = tf.cast(year, tf.float32)
        present_years = analyzers.kept_values(years, present)
        year_mean = tf.cast(statistics.mean(present_years), tf.float32)
        out[f"{name}__year"] = _z_score(tf.where(present, years, year_mean), year_mean,
                                        statistics.var(present_years))
        for part, values, count in (("month", month - 1, 12), ("weekday", weekday, 7),
                                    ("hour", hour, 24)):
            out[f"{name}__{part}"] = apply_buckets(
                tf.cast(values, tf.float32),
                tf.constant([[i + 0.5 for i in range(count - 1)]], tf.float32))
    return out


def apply_buckets(x: tf.Tensor, boundaries: tf.Tensor) -> tf.Tensor:
    """`tft.apply_buckets` of a 1-D tensor by [1, n] boundaries (the bucket of x: how many
    boundaries are <= x; the schema's int domain [0, n]), in 8 ops where it makes 38: the
    default preprocessing_fn is traced three times a run and buckets every number, and each
    op takes about half a millisecond to build. tests/test_transform.py holds it to
    tf.Transform's on the same values."""
    buckets = tf.reshape(tf.raw_ops.UpperBound(sorted_inputs=boundaries,
                                               values=tf.reshape(x, [1, -1]),
                                               out_type=tf.int64), [-1])
    schema_inference.set_tensor_schema_override(
        buckets, tf.constant(0, tf.int64),
        tf.constant(boundaries.shape[1], tf.int64) if boundaries.shape[1] is not None
        else tf.shape(boundaries, out_type=tf.int64)[1])
    return buckets


def _z_score(x: tf.Tensor, mean: tf.Tensor, variance: tf.Tensor) -> tf.Tensor:
    """(x - mean) / std, as tft.scale_to_z_score computes it (x - mean when the variance is
    0), from a mean and variance taken elsewhere."""
    variance = tf.cast(variance, tf.float32)
    centred = x - mean
    return tf.where(variance > 0, centred / tf.sqrt(tf.maximum(variance, 1e-30)), centred)


def _present(value) -> tf.Tensor:
    """[batch] bool: whether each row of a scalar feature has a value (a dense input always
    has). Built in few ops: the default preprocessing_fn is traced three times a run, and
    each op takes about half a millisecond to build."""
    if not isinstance(value, tf.SparseTensor):
        return tf.ones([tf.shape(value)[0]], tf.bool)
    has_value = tf.SparseTensor(value.indices, tf.ones_like(value.values, tf.bool),
                                value.dense_shape)
    return tf.reduce_any(tf.sparse.to_dense(has_value, default_value=False), axis=1)


def _calendar(seconds: tf.Tensor) -> tuple:
    """(year, month 1-12, weekday Monday=0, hour) of epoch seconds, UTC (the civil-from-days
    algorithm, in integer ops)."""
    days = tf.math.floordiv(seconds, 86_400)
    hour = tf.math.floordiv(seconds - days * 86_400, 3_600)
    weekday = tf.math.floormod(days + 3, 7)  # 1970-01-01 was a Thursday
    z = days + 719_468
    era = tf.math.floordiv(z, 146_097)
    day_of_era = z - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1_460 + day_of_era // 36_524
                   - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    month = tf.where(shifted_month < 10, shifted_month + 3, shifted_month - 9)
    year = year_of_era + era * 400 + tf.cast(month <= 2, tf.int64)
    return year, month, weekday, hour


def _label(dense: tf.Tensor, feature: schema_pb2.Feature, task: Optional[str],
           name: str) -> tf.Tensor:
    if feature.type == schema_pb2.BYTES:
        return analyzers.current().vocabulary_ids(dense, num_oov_buckets=0,
                                                  vocab_filename=vocabulary_name(name))
    if task == REGRESSION and feature.type == schema_pb2.INT:
        return tf.cast(dense, tf.float32)
    if task == MULTICLASS and feature.type == schema_pb2.INT:
        # Class ids 0..K-1 stay themselves; the schema's int domain takes K - 1 from the
        # largest id in all the training rows, which is where the Trainer counts classes.
        labels = tf.identity(tf.cast(dense, tf.int64))
        schema_inference.set_tensor_schema_override(
            labels, tf.constant(0, tf.int64), tf.cast(analyzers.current().max(labels),
                                                      tf.int64))
        return labels
    return dense


def default_preprocessing_fn(schema: schema_pb2.Schema, label_key: Optional[str] = None,
                             task: Optional[str] = None) -> Callable[[dict], dict]:
    def preprocessing_fn(inputs: dict) -> dict:
        return transform_features(inputs, schema, label_key=label_key, task=task)
    return preprocessing_fn
