"""Image features, both ways: encoded (JPEG/PNG/... as ExampleGen stores them) and raw
(uint8 pixels at the training size, as Transform stores them with `image_storage="raw"`).

Raw storage moves the decode and resize out of every epoch into Transform, which runs once:
the input function then turns each value into pixels with `decode_raw` and a reshape. Both
sides use `decode_image` here, so a raw image equals the encoded one decoded and resized by
the input function, pixel for pixel.

A raw feature is a bytes feature of height * width * channels bytes per row (row-major,
channels last), marked in the stored schema by the feature annotation tag
`tfrp.raw_pixels=<h>x<w>x<c>`; `raw_shape(feature)` reads it back.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from tensorflow_metadata.proto.v0 import schema_pb2

if TYPE_CHECKING:  # annotations only; the functions import TensorFlow when they run
    import tensorflow as tf

RAW_TAG_PREFIX = "tfrp.raw_pixels="
STORAGES = ("encoded", "raw")


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """How an image feature becomes a [batch, height, width, channels] tensor.

    `dtype="uint8"` ships the pixels to the accelerator as bytes (4x less host->device traffic)
    and leaves normalisation to the model's first layer, which runs on the device.
    `storage` says what the records hold: encoded images, or raw pixels already at this size
    (`with_storage_from` reads it from the stored schema).
    """

    height: int
    width: int
    channels: int = 3
    dtype: str = "uint8"  # or "float32": scaled to [0, 1] on the host
    storage: str = "encoded"

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)


def raw_shape(feature: schema_pb2.Feature) -> Optional[tuple[int, int, int]]:
    """(height, width, channels) when `feature` holds raw pixels, else None."""
    for tag in feature.annotation.tag:
        if tag.startswith(RAW_TAG_PREFIX):
            height, width, channels = (int(n) for n in tag[len(RAW_TAG_PREFIX):].split("x"))
            return height, width, channels
    return None


def mark_raw(schema: schema_pb2.Schema, names: Sequence[str], spec: ImageSpec
             ) -> schema_pb2.Schema:
    """A copy of `schema` with `names` marked as raw pixels of `spec`'s shape."""
    marked = schema_pb2.Schema()
    marked.CopyFrom(schema)
    tag = RAW_TAG_PREFIX + "x".join(str(n) for n in spec.shape)
    for feature in marked.feature:
        if feature.name in names:
            kept = [t for t in feature.annotation.tag if not t.startswith(RAW_TAG_PREFIX)]
            del feature.annotation.tag[:]
            feature.annotation.tag.extend(kept + [tag])
            feature.annotation.comment.append(
                f"uint8 pixels, {spec.height}x{spec.width}x{spec.channels}, row-major, channels "
                "last (decoded and resized by Transform)")
    return marked


def with_storage_from(images: Mapping[str, ImageSpec], schema: schema_pb2.Schema
                      ) -> dict[str, ImageSpec]:
    """`images`, with `storage="raw"` for each feature `schema` marks as raw pixels (others
    are left as they are). Raw pixels cannot be resized at read time, so a spec whose size
    differs from the stored pixels is an error."""
    features = {f.name: f for f in schema.feature}
    resolved = dict(images)
    for name, spec in images.items():
        stored = raw_shape(features[name]) if name in features else None
        if stored is None:
            continue
        if stored != spec.shape:
            raise ValueError(
                f"image feature {name!r} holds raw pixels of {stored[0]}x{stored[1]}x"
                f"{stored[2]} (Transform's image_shape), but the Trainer asks for "
                f"{spec.height}x{spec.width}x{spec.channels}; set the same image_shape for both")
        resolved[name] = dataclasses.replace(spec, storage="raw")
    return resolved


def decode_image(data: "tf.Tensor", spec: ImageSpec) -> "tf.Tensor":
    """One encoded image (JPEG/PNG/GIF/BMP) -> [h, w, c] uint8 at the spec's size. Images
    already at that size skip the resize, which otherwise costs more than the decode."""
    # tensorflow: 4 s to import; shard_readers promise no TensorFlow (tests/test_device_feed.py)
    import tensorflow as tf

    image = tf.io.decode_image(data, channels=spec.channels, expand_animations=False)
    image.set_shape([None, None, spec.channels])

    def resized():
        scaled = tf.image.resize(image, [spec.height, spec.width], antialias=True)
        return tf.cast(tf.clip_by_value(tf.round(scaled), 0, 255), tf.uint8)

    same_size = tf.logical_and(tf.shape(image)[0] == spec.height,
                               tf.shape(image)[1] == spec.width)
    image = tf.cond(same_size, lambda: image, resized)
    return tf.ensure_shape(image, [spec.height, spec.width, spec.channels])


def raw_pixels(encoded: "tf.Tensor", spec: ImageSpec) -> "tf.Tensor":
    """A batch of encoded images, [batch] or [batch, 1] -> [batch] strings of raw pixels.

    TensorFlow has no op that turns a tensor into its raw bytes, but `serialize_tensor` of a
    numeric tensor ends with them: the TensorProto's `tensor_content`, its last field."""
    # tensorflow: 4 s to import; shard_readers promise no TensorFlow (tests/test_device_feed.py)
    import tensorflow as tf

    size = spec.height * spec.width * spec.channels

    def one(data):
        return tf.strings.substr(tf.io.serialize_tensor(decode_image(data, spec)), -size, size)

    return tf.map_fn(one, tf.reshape(encoded, [-1]),
                     fn_output_signature=tf.TensorSpec([], tf.string))


def decode_images(values: "tf.Tensor", spec: ImageSpec) -> "tf.Tensor":
    """A batch of image values, [batch] or [batch, 1] -> [batch, h, w, c] uint8, or float32
    scaled to [0, 1] when the spec asks for host-side normalisation. Raw pixels are a
    reinterpretation of the bytes; encoded images are decoded one by one."""
    # tensorflow: 4 s to import; shard_readers promise no TensorFlow (tests/test_device_feed.py)
    import tensorflow as tf

    values = tf.reshape(values, [-1])
    if spec.storage == "raw":
        images = tf.reshape(tf.io.decode_raw(values, tf.uint8), [-1, *spec.shape])
    else:
        images = tf.map_fn(lambda data: decode_image(data, spec), values,
                           fn_output_signature=tf.TensorSpec(spec.shape, tf.uint8))
    if spec.dtype == "float32":
        return tf.cast(images, tf.float32) / 255.0
    return images
