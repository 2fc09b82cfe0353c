"""Keras layers of the tabular model."""
from __future__ import annotations

import math
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402

keras = tf.keras


class PeriodicEmbedding(keras.layers.Layer):
    """Each of F scaled numbers as `width` learned features of sines and cosines of it.

    For a number x, cos(2π c x) and sin(2π c x) at `frequencies` trained frequencies c (drawn
    from N(0, sigma) at the start), then a ReLU layer of its own per feature: "periodic
    embeddings, PLR" in Gorishniy, Rubachev and Babenko, "On Embeddings for Numerical
    Features in Tabular Deep Learning" (NeurIPS 2022). A plain MLP bends slowly on one
    number (a price step, a latitude band); sines of several frequencies give it thresholds
    and bands to combine from the first layer on.

    Input [batch, F], output [batch, F * width]."""

    def __init__(self, frequencies: int = 16, width: int = 16, sigma: float = 1.0,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.frequencies, self.width, self.sigma = frequencies, width, sigma

    def build(self, input_shape) -> None:
        features = int(input_shape[-1])
        self.coefficients = self.add_weight(
            name="coefficients", shape=(features, self.frequencies),
            initializer=keras.initializers.RandomNormal(stddev=self.sigma))
        self.kernel = self.add_weight(
            name="kernel", shape=(features, 2 * self.frequencies, self.width),
            initializer="glorot_uniform")
        self.bias = self.add_weight(name="bias", shape=(features, self.width),
                                    initializer="zeros")
        super().build(input_shape)

    def call(self, x: tf.Tensor) -> tf.Tensor:
        angles = 2 * math.pi * self.coefficients[None] * x[..., None]
        periodic = tf.concat([tf.cos(angles), tf.sin(angles)], axis=-1)
        out = tf.nn.relu(tf.einsum("bfk,fkd->bfd", periodic, self.kernel) + self.bias)
        return tf.reshape(out, [-1, out.shape[1] * self.width])

    def get_config(self) -> dict:
        return dict(super().get_config(), frequencies=self.frequencies, width=self.width,
                    sigma=self.sigma)
