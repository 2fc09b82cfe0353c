"""The Chicago taxi sample's specifics: its label, the features its model leaves out, and its
Transform. `pipeline/configs.py` points the taxi dataset here; nothing generic imports it."""
from __future__ import annotations

from typing import Any, Mapping

TAXI_LABEL = "big_tipper"
# The tip is the label's source, and these three are identifiers or timestamps.
TAXI_EXCLUDED = ("tips", "trip_start_timestamp", "pickup_census_tract", "dropoff_census_tract")
LABEL_INPUTS = ("tips", "fare")
PREPROCESSING_FN = "components.transform.taxi.preprocessing_fn"

# The Trainer settings (components/trainer/options.py) that train on taxi rows.
TRAINER_SETTINGS: dict[str, Any] = {
    "label_key": TAXI_LABEL, "label_fn": "components.transform.taxi.taxi_label", "task": "binary",
    "label_inputs": LABEL_INPUTS, "exclude": TAXI_EXCLUDED}


def taxi_label(features: Mapping[str, Any]):
    """A big tipper tipped more than 20 % of the fare."""
    # tensorflow: 2.2 s to import; traced by name, and configs imports taxi for its names.
    import tensorflow as tf

    tips = tf.cast(features["tips"], tf.float32)
    fare = tf.cast(features["fare"], tf.float32)
    return tf.cast(tips > 0.2 * fare, tf.float32)


def preprocessing_fn(inputs: dict, custom_config: dict) -> dict:
    """The taxi Transform: the default transforms for every model feature, plus the label
    computed from the raw tip and fare before they are scaled."""
    # tensorflow, defaults: 2.3 s to import; traced by name; configs imports taxi for its names.
    import tensorflow as tf

    from tfrecord_shards.codec import parser
    from components.transform.defaults import dense_scalar, transform_features

    schema = custom_config["raw_schema"]
    features = parser.feature_by_name(schema)
    outputs = transform_features(inputs, schema, exclude=TAXI_EXCLUDED)
    raw = {name: dense_scalar(inputs[name], features[name]) for name in LABEL_INPUTS}
    outputs[TAXI_LABEL] = tf.cast(taxi_label(raw), tf.int64)
    return outputs
