"""The models' scores on the eval examples: a model spec's model loaded once, with the one
`tf.function` that scores a batch of records through its serving signature and its
preprocessing signatures (`ModelScorer`), run over every record of the data files block by
block, the raw features the models do not output decoded beside (`score_files`)."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from typing import Any, Iterator, Sequence, Union

import numpy as np
import pyarrow as pa
import tensorflow as tf

from tfrecord_shards import rows_done, tfrecord_io
from tfrecord_shards.codec import parser
from components.evaluator import keras_metrics
from components.evaluator.config import KERAS_TYPES, slicing_columns
from components.evaluator.options import EvaluatorOptions, UnsupportedSetting
from components.evaluator.raw_features import (as_rows, check_labels, raw_feature_schema,
                                               raw_values)
from components.evaluator.scores import Scores

# Where TFMA looks for a prediction in a signature's outputs when no prediction_key names it
# (metric_util.prepare_labels_and_predictions).
PREDICTION_OUTPUTS = ("scores", "outputs", "predictions", "logistic", "probabilities", "logits")
_PREDICTION, _LABEL = "__prediction__", "__label__"


class ModelScorer:
    """One model spec's model, loaded once, and the one `tf.function` that scores a batch of
    records with it: the prediction its serving signature outputs, and the label and sliced
    features its preprocessing signatures output."""

    def __init__(self, spec: Any, path: str, model: Any, is_keras: bool,
                 include_default_metrics: bool, slicing: Sequence[str]):
        self.spec, self.path, self.model = spec, path, model
        self.default_metrics = is_keras and include_default_metrics
        signature_name = spec.signature_name or (
            "predict" if "predict" in model.signatures else "serving_default")
        signature = self._signature(signature_name)
        serving_input = self._records_input(signature, signature_name)
        self.prediction_output = self._prediction_output(signature, signature_name)
        preprocessors = []
        self.transformed_outputs: set[str] = set()
        for name in spec.preprocessing_function_names:
            function = self._signature(name)
            preprocessors.append((function, self._records_input(function, name)))
            self.transformed_outputs |= set(function.structured_outputs)
        self.label_transformed = spec.label_key in self.transformed_outputs
        if not spec.label_key:
            raise ValueError(f"model spec {spec.name!r} names no label_key")
        wanted = ({spec.label_key} if self.label_transformed else set()) | \
            (set(slicing) & self.transformed_outputs)
        prediction_output = self.prediction_output

        @tf.function(input_signature=[tf.TensorSpec([], tf.string),
                                      tf.TensorSpec([None], tf.int64),
                                      tf.TensorSpec([None], tf.int64)])
        def score(data, starts, lengths):
            records = tf.strings.substr(data, starts, lengths)
            found = {_PREDICTION: signature(**{serving_input: records})[prediction_output]}
            for function, input_name in preprocessors:
                outputs = function(**{input_name: records})
                for name in wanted & set(outputs):
                    found[_LABEL if name == spec.label_key else name] = outputs[name]
                    if name == spec.label_key and name in slicing:
                        found[name] = outputs[name]
            return found

        self.score = score
        if self.default_metrics:
            self.compiled_keys = keras_metrics.compiled_metric_keys(model, spec.name)
            self.compiled = keras_metrics.KerasRunner.of_compiled(model)

    @classmethod
    def load(cls, spec: Any, path: str, eval_config: Any) -> "ModelScorer":
        """Loads the SavedModel once. As TFMA decides (`model_util.get_model_type`), a model
        Keras loads is a Keras model, whose compiled metrics TFMA adds by default."""
        options = eval_config.options
        include_default = not options.HasField("include_default_metrics") or \
            options.include_default_metrics.value
        model, is_keras = None, False
        if spec.model_type in KERAS_TYPES or (not spec.model_type and include_default):
            try:
                model = tf.keras.models.load_model(path)
                is_keras = isinstance(model, tf.keras.models.Model)
            except Exception as e:  # noqa: BLE001 - TFMA's test: not loadable as Keras
                if spec.model_type in KERAS_TYPES:
                    raise ValueError(f"{path}: not a Keras model: {e}") from e
                logging.info("Evaluator: %s is not a Keras model (%s)", path, e)
        if model is None or not hasattr(model, "signatures"):
            model = tf.saved_model.load(path)
        return cls(spec, path, model, is_keras, include_default,
                   slicing_columns(eval_config))

    def _signature(self, name: str) -> Any:
        if name not in self.model.signatures:
            raise ValueError(f"{self.path}: no signature {name!r} (it has "
                             f"{', '.join(sorted(self.model.signatures)) or 'none'})")
        return self.model.signatures[name]

    def _records_input(self, signature: Any, name: str) -> str:
        """The signature's one input, which must take serialized tf.Examples."""
        inputs = signature.structured_input_signature[1]
        if len(inputs) != 1 or next(iter(inputs.values())).dtype != tf.string or \
                next(iter(inputs.values())).shape.rank != 1:
            raise UnsupportedSetting(
                f"{self.path}: signature {name!r} does not take a batch of serialized "
                f"tf.Examples (its inputs: {dict(inputs)})")
        return next(iter(inputs))

    def _prediction_output(self, signature: Any, name: str) -> str:
        outputs = list(signature.structured_outputs)
        key = self.spec.prediction_key
        if key:
            if key not in outputs:
                raise ValueError(f"{self.path}: signature {name!r} has no output {key!r} "
                                 f"(prediction_key); it has {', '.join(outputs)}")
            return key
        if len(outputs) == 1:
            return outputs[0]
        for key in PREDICTION_OUTPUTS:
            if key in outputs:
                return key
        raise ValueError(f"{self.path}: signature {name!r} has outputs {', '.join(outputs)}; "
                         f"name the prediction with the model spec's prediction_key")


@dataclasses.dataclass
class Scored:
    """Every model's scores on every row, and the features sliced on, in row order."""

    rows: int
    scores: dict[str, Scores]  # by model spec name
    transformed: dict[str, dict[str, np.ndarray]]  # model name -> output -> [rows, ...]
    raw: Any  # pyarrow Table of the raw features decoded here (label, slicing columns)


def score_files(scorers: Sequence[ModelScorer],
                data_files: Sequence[Union[str, tfrecord_io.RecordRange]],
                raw_names: Sequence[str], schema: Any, options: EvaluatorOptions) -> Scored:
    """Runs every model over every record of `data_files` (files, or ranges of them),
    block by block, and decodes the raw features `raw_names` the models do not output."""
    outputs: dict[str, dict[str, list]] = {s.spec.name: {} for s in scorers}
    raw_batches, raw_schema, rows = [], None, 0
    # Batches are scored by `threads` workers while this thread reads on; results are taken
    # in the order they were asked for, so rows keep the files' order.
    pool = concurrent.futures.ThreadPoolExecutor(options.threads)
    pending: list = []

    def collect(scorer: ModelScorer, future: concurrent.futures.Future,
                block: tfrecord_io.RecordBlock, window: slice) -> None:
        try:
            found = future.result()
        except tf.errors.InvalidArgumentError as e:
            raise ValueError(unscorable_record(scorer, block, window, e)) from None
        for name, value in found.items():
            outputs[scorer.spec.name].setdefault(name, []).append(value.numpy())

    try:
        for block in iter_blocks(data_files):
            if raw_names:
                if raw_schema is None:
                    raw_schema = raw_feature_schema(raw_names, schema, block)
                for part in block.parts(parser.records_per_decode(raw_schema)):
                    batch = parser.decode_record_block(part, raw_schema)
                    check_labels(batch, part, [s.spec.label_key for s in scorers
                                               if not s.label_transformed])
                    raw_batches.append(batch)
            data = tf.constant(block.buffer.tobytes())
            lengths = block.ends - block.starts
            for first in range(0, len(block.starts), options.batch_rows):
                window = slice(first, first + options.batch_rows)
                starts = tf.constant(block.starts[window].astype(np.int64))
                sizes = tf.constant(lengths[window].astype(np.int64))
                for scorer in scorers:
                    pending.append((scorer, pool.submit(scorer.score, data, starts, sizes),
                                    block, window))
                while len(pending) > 2 * options.threads * len(scorers):
                    collect(*pending.pop(0))
            rows += len(block.starts)
            rows_done.add(len(block.starts))
        while pending:
            collect(*pending.pop(0))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    raw = pa.Table.from_batches(raw_batches) if raw_batches else None
    scores, transformed = {}, {}
    for scorer in scorers:
        mine = {name: np.concatenate(values) for name, values in
                outputs[scorer.spec.name].items()} if rows else {}
        transformed[scorer.spec.name] = {k: v for k, v in mine.items()
                                         if k not in (_PREDICTION, _LABEL)}
        if not rows:
            continue
        if scorer.label_transformed:
            labels = mine[_LABEL]
        else:
            labels = raw_values(raw.column(scorer.spec.label_key), scorer.spec.label_key)
        scores[scorer.spec.name] = Scores(as_rows(labels), as_rows(mine[_PREDICTION]))
    return Scored(rows, scores, transformed, raw)


def iter_blocks(data_files: Sequence[Union[str, tfrecord_io.RecordRange]]
                ) -> Iterator[tfrecord_io.RecordBlock]:
    for file in data_files:
        yield from tfrecord_io.iter_record_blocks(file)


def unscorable_record(scorer: ModelScorer, block: tfrecord_io.RecordBlock, window: slice,
                      error: Exception) -> str:
    """One line naming the first record of a batch the model's signatures refuse (not a
    tf.Example, a feature of another type or missing): its file, offset and TensorFlow's
    reason. The batch's records are tried one at a time, only once a batch has failed."""
    data = tf.constant(block.buffer.tobytes())
    first, last = window.indices(len(block.starts))[:2]
    for index in range(first, last):
        try:
            scorer.score(data, tf.constant([int(block.starts[index])], tf.int64),
                         tf.constant([int(block.ends[index] - block.starts[index])], tf.int64))
        except tf.errors.InvalidArgumentError as e:
            error, first, last = e, index, index + 1
            break
    reason = str(getattr(error, "message", error)).strip().splitlines()[0]
    where = f"record at byte offset {block.record_offset(first)}" if last == first + 1 else \
        f"records at byte offsets {block.record_offset(first)}..{block.record_offset(last - 1)}"
    return f"{block.path}: {where}: the model at {scorer.path} cannot score it: {reason}"
