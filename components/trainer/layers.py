"""The tabular model's periodic embedding of numbers, built of Keras's own layers, so a saved
model loads as Keras without this module (TFMA's Evaluator loads it so, for the compiled
metrics; a layer class of ours would need importing there first)."""
from __future__ import annotations

import math
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402

keras = tf.keras

# The layer holding each number's frequencies, by name (tests and readers find it so).
FREQUENCIES_LAYER = "periodic_frequencies"


def periodic_embedding(numbers: tf.Tensor, frequencies: int, width: int,
                       sigma: float) -> tf.Tensor:
    """Each of F scaled numbers as `width` learned features of sines and cosines of it.

    For a number x, cos(2π c x) and sin(2π c x) at `frequencies` trained frequencies c (drawn
    from N(0, sigma) at the start), then a ReLU layer of its own per number: "periodic
    embeddings, PLR" in Gorishniy, Rubachev and Babenko, "On Embeddings for Numerical
    Features in Tabular Deep Learning" (NeurIPS 2022). A plain MLP bends slowly on one
    number (a price step, a latitude band); sines of several frequencies give it thresholds
    and bands to combine from the first layer on.

    `numbers` is [batch, F]; the result [batch, F * width]."""
    features = int(numbers.shape[-1])
    coefficients = keras.layers.EinsumDense(
        "bf,fk->bfk", output_shape=(features, frequencies),
        kernel_initializer=keras.initializers.RandomNormal(stddev=sigma),
        name=FREQUENCIES_LAYER)(numbers)
    angles = keras.layers.Rescaling(2 * math.pi)(coefficients)
    # Python lambdas, not tf.cos itself: Keras saves a Lambda's function as code, and
    # cannot save an op's signature.
    periodic = keras.layers.Concatenate()([keras.layers.Lambda(lambda t: tf.cos(t))(angles),
                                           keras.layers.Lambda(lambda t: tf.sin(t))(angles)])
    embedded = keras.layers.EinsumDense("bfk,fkd->bfd", output_shape=(features, width),
                                        bias_axes="fd", activation="relu")(periodic)
    return keras.layers.Reshape((features * width,))(embedded)
