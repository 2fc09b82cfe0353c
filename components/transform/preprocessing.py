"""The preprocessing_fn a Transform runs: the user's (a module file or a dotted name, taking
`(inputs)` or TFX's `(inputs, custom_config)`), or the schema-derived default; with
image_storage=raw, its image outputs become raw pixels inside the graph."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect as pyinspect
import sys
from typing import Callable

import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2

from shard_readers import images
from tfrecord_shards.codec import parser
from components.transform.defaults import default_preprocessing_fn, dense_scalar
from components.transform.options import TransformOptions


def load_preprocessing_fn(options: TransformOptions, raw_schema: schema_pb2.Schema
                          ) -> Callable[[dict], dict]:
    """The user's preprocessing_fn, or the schema-derived default. A user function may take
    `(inputs, custom_config)`, as in TFX; custom_config carries the raw schema."""
    if options.module_file:
        fn = _module_from_file(options.module_file).preprocessing_fn
    elif options.preprocessing_fn:
        module_name, _, name = options.preprocessing_fn.rpartition(".")
        fn = getattr(importlib.import_module(module_name), name)
    else:
        return with_image_storage(default_preprocessing_fn(raw_schema, options.label_key,
                                                           options.task),
                                  raw_schema, options)
    if len(pyinspect.signature(fn).parameters) >= 2:
        user_fn = fn
        fn = lambda inputs: user_fn(inputs, {"raw_schema": raw_schema})  # noqa: E731
    return with_image_storage(fn, raw_schema, options)


def raw_image_names(raw_schema: schema_pb2.Schema, options: TransformOptions) -> list[str]:
    """The image features Transform stores as raw pixels: with image_storage=raw, every
    feature the raw schema marks as an encoded image."""
    if options.image_storage != "raw":
        return []
    return [f.name for f in raw_schema.feature if f.HasField("image_domain")]


def with_image_storage(preprocessing_fn: Callable[[dict], dict], raw_schema: schema_pb2.Schema,
                       options: TransformOptions) -> Callable[[dict], dict]:
    """`preprocessing_fn`, then, with image_storage=raw, each image feature it outputs under
    its own name as bytes (a pass-through, the default's way) decoded and resized to
    image_shape, as raw pixels."""
    names = raw_image_names(raw_schema, options)
    if not names:
        return preprocessing_fn
    spec = images.ImageSpec(*options.image_shape)
    features = parser.feature_by_name(raw_schema)

    def preprocessing_fn_with_raw_images(inputs: dict) -> dict:
        outputs = dict(preprocessing_fn(inputs))
        for name in names:
            if name in outputs and outputs[name].dtype == tf.string:
                outputs[name] = images.raw_pixels(
                    dense_scalar(outputs[name], features[name]), spec)
        return outputs

    return preprocessing_fn_with_raw_images


def _module_from_file(path: str):
    """The user's module file as a module registered under a name of its own, as TFX loads
    one: a function of it pickled for Beam's steps (tf.Transform's analysis traces in them)
    finds its module, and its module's globals, again by that name."""
    name = "tfrp_user_module_" + hashlib.sha256(path.encode()).hexdigest()[:12]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
