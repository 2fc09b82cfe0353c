"""The dataset statistics our preprocessing takes (a mean, a variance, quantile boundaries, a
vocabulary, a maximum), behind one interface with three implementations:

- `TftAnalyzers`, the default: tf.Transform's analyzers (`tft.mean`, ...), which
  tf.Transform's Beam analysis computes: the general path, any preprocessing_fn;
- `CollectAnalyzers`: while the columnar path traces the preprocessing_fn, each call records
  what it needs the statistic of (a tensor computed from the raw inputs) and hands back a
  stand-in; the traced function then yields every analyzer's input for a batch of rows,
  which `statistics.Analysis` reduces in numpy (components/transform/columnar_job.py);
- `ConstantAnalyzers`: with the statistics known, each call is its value, a constant (a
  vocabulary: a lookup of its file, an asset of the SavedModel), so the traced function is
  the finished transform graph.

`defaults.transform_features` calls them through `current()`, so one body of code defines
both paths: they differ only in how a statistic is computed. A preprocessing_fn that calls
tf.Transform's analyzers itself keeps the general path (`uses_tft_analyzers`).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Optional

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
from tensorflow_transform import analyzer_nodes

from tfrecord_shards import fileio
from components.transform.statistics import (
    MAX, MEAN, QUANTILES, VAR, VOCABULARY, AnalyzerSpec)

class TftAnalyzers:
    """tf.Transform's own analyzers."""

    def mean(self, x: tf.Tensor) -> tf.Tensor:
        return tft.mean(x)

    def var(self, x: tf.Tensor) -> tf.Tensor:
        return tft.var(x)

    def max(self, x: tf.Tensor) -> tf.Tensor:
        return tft.max(x)

    def quantiles(self, x: tf.Tensor, num_buckets: int, epsilon: float) -> tf.Tensor:
        return tft.quantiles(x, num_buckets, epsilon=epsilon)

    def vocabulary_ids(self, x: tf.Tensor, *, top_k: Optional[int] = None,
                       frequency_threshold: Optional[int] = None, num_oov_buckets: int = 0,
                       vocab_filename: Optional[str] = None) -> tf.Tensor:
        return tft.compute_and_apply_vocabulary(
            x, top_k=top_k, frequency_threshold=frequency_threshold,
            num_oov_buckets=num_oov_buckets, vocab_filename=vocab_filename)


class CollectAnalyzers(TftAnalyzers):
    """Records each statistic asked for and what a batch contributes to it (`inputs`, by key:
    the batch's count, mean and squared deviations, its largest value, its distinct values
    and their counts, or for quantiles its values), reduced in the graph so that little
    leaves it; hands back a stand-in of the statistic's shape and type, which nothing reads."""

    def __init__(self) -> None:
        self.specs: list[AnalyzerSpec] = []
        self.inputs: dict[str, dict[str, tf.Tensor]] = {}
        # A mean and a variance of the same tensor take the same batch moments.
        self._moments: dict[Any, dict[str, tf.Tensor]] = {}

    def _record(self, kind: str, x: tf.Tensor, **params: Any) -> None:
        asked = x
        if isinstance(x, (tf.SparseTensor, tf.RaggedTensor)):
            x = x.values
        x = tf.reshape(x, [-1])
        key = f"{len(self.specs):03d}_{kind}"
        self.specs.append(AnalyzerSpec(key, kind, x.dtype.name, **params))
        if kind in (MEAN, VAR):
            if isinstance(asked, tf.Tensor) and asked.ref() in self._moments:
                self.inputs[key] = self._moments[asked.ref()]
                return
            # tf.Transform's mean and variance leave out non-finite values.
            values = tf.cast(x, tf.float64)
            values = kept_values(values, tf.math.is_finite(values))
            count = tf.size(values, tf.int64)
            mean = tf.math.divide_no_nan(tf.reduce_sum(values), tf.cast(count, tf.float64))
            self.inputs[key] = {"count": count, "mean": mean,
                                "m2": tf.reduce_sum(tf.square(values - mean))}
            if isinstance(asked, tf.Tensor):
                self._moments[asked.ref()] = self.inputs[key]
        elif kind == MAX:
            self.inputs[key] = {"count": tf.size(x, tf.int64), "max": tf.reduce_max(x)}
        elif kind == VOCABULARY:
            values, _, counts = tf.unique_with_counts(x, out_idx=tf.int64)
            self.inputs[key] = {"values": values, "counts": counts}
        else:
            self.inputs[key] = {"values": x}

    def mean(self, x):
        self._record(MEAN, x)
        return tf.zeros([], tf.float32)

    def var(self, x):
        self._record(VAR, x)
        return tf.ones([], tf.float32)

    def max(self, x):
        self._record(MAX, x)
        return tf.zeros([], x.dtype)

    def quantiles(self, x, num_buckets, epsilon):
        self._record(QUANTILES, x, num_buckets=num_buckets, epsilon=epsilon)
        return tf.constant(np.linspace(0.0, 1.0, num_buckets - 1, dtype=np.float32)[None])

    def vocabulary_ids(self, x, *, top_k=None, frequency_threshold=None, num_oov_buckets=0,
                       vocab_filename=None):
        self._record(VOCABULARY, x, top_k=top_k, frequency_threshold=frequency_threshold or 0,
                     num_oov_buckets=num_oov_buckets, vocab_filename=vocab_filename)
        return tf.zeros_like(x, tf.int64)


class ConstantAnalyzers(TftAnalyzers):
    """Each statistic as the constant `values` holds for it (by key, in the order asked),
    a vocabulary as a lookup of its file in `vocabulary_dir`, which the transform graph
    keeps as an asset, as tf.Transform's vocabularies are kept."""

    def __init__(self, specs: list[AnalyzerSpec], values: dict[str, Any],
                 vocabulary_dir: str) -> None:
        self._specs, self._values, self._vocabulary_dir = specs, values, vocabulary_dir
        self._asked = 0

    def _next(self, kind: str) -> tuple[AnalyzerSpec, Any]:
        if self._asked >= len(self._specs) or self._specs[self._asked].kind != kind:
            raise RuntimeError(f"the preprocessing_fn asked for its statistics in another "
                               f"order than when it was analysed (a {kind} at "
                               f"{self._asked}); it must ask in the same order each time")
        spec = self._specs[self._asked]
        self._asked += 1
        return spec, self._values[spec.key]

    def mean(self, x):
        return tf.constant(self._next(MEAN)[1], tf.float32)

    def var(self, x):
        return tf.constant(self._next(VAR)[1], tf.float32)

    def max(self, x):
        return tf.constant(self._next(MAX)[1], x.dtype)

    def quantiles(self, x, num_buckets, epsilon):
        return tf.constant(np.asarray(self._next(QUANTILES)[1], np.float32).reshape(
            [1, num_buckets - 1]))

    def vocabulary_ids(self, x, *, top_k=None, frequency_threshold=None, num_oov_buckets=0,
                       vocab_filename=None):
        spec, vocabulary = self._next(VOCABULARY)
        path = write_vocabulary(self._vocabulary_dir, spec.vocab_filename or spec.key,
                                vocabulary)
        # The path is an asset of the SavedModel, as tf.Transform's vocabularies are: the
        # file is copied into it, and the graph reads the copy wherever it is loaded. As in
        # tf.Transform, the path is an eager constant, which the table's initializer can
        # hold as an asset.
        with tf.init_scope():
            filename = tf.constant(path)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.ASSET_FILEPATHS, filename)
        return tft.apply_vocabulary(x, filename, num_oov_buckets=num_oov_buckets)

    def check_all_asked(self) -> None:
        if self._asked != len(self._specs):
            raise RuntimeError(f"the preprocessing_fn asked for {self._asked} statistics, "
                               f"{len(self._specs)} when it was analysed")


def write_vocabulary(folder: str, name: str, vocabulary: list[bytes]) -> str:
    """A vocabulary file as tf.Transform writes one (text: a value a line, most frequent
    first); the graph's lookup reads it at load time."""
    path = fileio.join(folder, name)
    fileio.write_bytes(path, b"".join(value + b"\n" for value in vocabulary))
    return path


def kept_values(values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """`tf.boolean_mask` of a 1-D tensor by a 1-D mask, in 5 ops where it makes 29: the
    default preprocessing_fn is traced three times a run (for its statistics, then twice by
    tf.Transform's writer), and each op takes about half a millisecond to build."""
    return tf.gather(values, tf.reshape(tf.where(mask), [-1]))


_current: contextvars.ContextVar = contextvars.ContextVar("analyzers", default=TftAnalyzers())


def current() -> TftAnalyzers:
    """The analyzers the preprocessing being traced now takes its statistics from."""
    return _current.get()


@contextlib.contextmanager
def using(analyzers: TftAnalyzers) -> Iterator[TftAnalyzers]:
    token = _current.set(analyzers)
    try:
        yield analyzers
    finally:
        _current.reset(token)


def uses_tft_analyzers(graph: tf.Graph) -> bool:
    """Whether a traced preprocessing_fn called tf.Transform's analyzers itself."""
    return bool(graph.get_collection(analyzer_nodes.TENSOR_REPLACEMENTS))
