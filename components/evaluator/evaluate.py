"""The fast Evaluator's engine: TFMA's evaluation of one or two exported models on the raw
eval examples, without Beam and without TFX, written as TFMA writes it.

The examples are read with our framing reader (`tfrecord_io.iter_record_blocks`, ~16 MB of
records a block). Each model scores them through its own serving signature in one
`tf.function` call per batch: the batch's records are cut out of the block's bytes inside
TensorFlow (`tf.strings.substr` of one string tensor, no Python object a record), and the
model's preprocessing signatures (`transform_features`, when the eval config names them) run
in the same call for the label and any sliced feature they output. Features the model does not
output (a raw label, slicing columns) are decoded with `parser.decode_record_block`. Metrics
are then computed per slice on whole arrays (metrics.py); TFMA's own code gives the metric keys,
checks the thresholds (`metrics_validator`, `CombineValidations`) and makes the protos that
`tfma.load_eval_result`, `load_metrics` and `load_validation_result` read.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from tfrecord_shards import fileio, rows_done, tfrecord_io
from components.evaluator import metrics as metric_values
from components.evaluator.metrics import Scores, UnsupportedSetting
from components.evaluator.options import EvaluatorOptions

# TFMA's output files (writers/metrics_plots_and_validations_writer.py with the default
# tfrecord format: one shard of each sliced output, one unsharded validation result).
METRICS_FILE = "metrics-00000-of-00001.tfrecord"
PLOTS_FILE = "plots-00000-of-00001.tfrecord"
ATTRIBUTIONS_FILE = "attributions-00000-of-00001.tfrecord"
VALIDATIONS_FILE = "validations.tfrecord"
EVAL_CONFIG_FILE = "eval_config.json"
# Where TFMA looks for a prediction in a signature's outputs when no prediction_key names it
# (metric_util.prepare_labels_and_predictions).
PREDICTION_OUTPUTS = ("scores", "outputs", "predictions", "logistic", "probabilities", "logits")
_PREDICTION, _LABEL = "__prediction__", "__label__"
_KERAS_TYPES = ("tf_keras", "tf2")


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """What an evaluation found: the validation result TFMA would write, and counts."""

    validation: Any  # validation_result_pb2.ValidationResult
    rows: int
    slices: int
    seconds: float


def evaluate(eval_config: Any, data_files: Sequence[str], model_paths: dict[str, str],
             output_uri: str, schema: Any = None,
             options: EvaluatorOptions = EvaluatorOptions()) -> EvalResult:
    """Evaluates the models of `eval_config` (a tfma.EvalConfig with TFMA's defaults applied,
    as `update_eval_config_with_defaults` leaves it), found at `model_paths` by model spec
    name, on the tf.Examples in `data_files` (TFRecord, gzip or plain), and writes TFMA's
    ModelEvaluation files to `output_uri`. `schema` types the features decoded here (a raw
    label, slicing columns); without it, the schema.pbtxt beside our ExampleGen's shards, or
    the first records' own types."""
    started = time.perf_counter()
    check_config(eval_config)
    keys, instances = metric_keys(eval_config)
    scorers = [ModelScorer.load(spec, model_paths[spec.name], eval_config)
               for spec in eval_config.model_specs]
    columns = slicing_columns(eval_config)
    raw_names = sorted({s.spec.label_key for s in scorers if not s.label_transformed} |
                       {c for c in columns if not any(c in s.transformed_outputs
                                                      for s in scorers)})
    scored = score_files(scorers, data_files, raw_names, schema, options)
    if not scored.rows:
        raise ValueError(f"no examples to evaluate in {', '.join(data_files) or 'no files'}")
    slices = slice_rows(eval_config, scored)
    runners = {name: metric_values.KerasRunner.of_metric(instance)
               for name, instance in instances.items() if metric_values.is_keras(instance)}
    sliced_metrics = [(slice_key, slice_metrics(rows, scorers, scored, keys, instances,
                                                runners, eval_config))
                      for slice_key, rows in slices.items()]
    validation = validate(sliced_metrics, eval_config)
    write_evaluation(output_uri, eval_config, sliced_metrics, validation,
                     {s.spec.name: s.path for s in scorers}, data_files)
    seconds = time.perf_counter() - started
    logging.info("Evaluator: %d rows, %d slices, %d model(s) in %.1f s", scored.rows,
                 len(slices), len(scorers), seconds)
    return EvalResult(validation, scored.rows, len(slices), seconds)


# --- what the config asks --------------------------------------------------------------------
def check_config(eval_config: Any) -> None:
    """Refuses, in one line each, the TFMA settings this evaluator does not implement."""
    def refuse(what: str) -> None:
        raise UnsupportedSetting(f"the fast Evaluator does not support {what}; use "
                                f"StockEvaluator (TFMA on Beam) for it")

    if len(eval_config.model_specs) > 2:
        refuse("more than two models")
    for spec in eval_config.model_specs:
        if spec.model_type and spec.model_type not in (*_KERAS_TYPES, "tf_generic"):
            refuse(f"model_type {spec.model_type!r}")
        if spec.example_weight_key or spec.example_weight_keys:
            refuse("example weights")
        if spec.label_keys or spec.prediction_keys:
            refuse("multi-output models (label_keys, prediction_keys)")
    for spec in eval_config.metrics_specs:
        if spec.query_key:
            refuse("query_key")
        if spec.HasField("aggregate"):
            refuse("aggregate (micro and macro averages)")
        if spec.output_names and list(spec.output_names) != [""]:
            refuse("output_names")
        if spec.HasField("binarize") and (spec.binarize.k_list.values or
                                          spec.binarize.top_k_list.values):
            refuse("binarize by k or top k")
        if spec.example_weights.weighted:
            refuse("example-weighted metrics")
        for metric in spec.metrics:
            if metric.per_slice_thresholds or metric.cross_slice_thresholds:
                refuse("per-slice and cross-slice thresholds")
        if spec.per_slice_thresholds or spec.cross_slice_thresholds:
            refuse("per-slice and cross-slice thresholds")
    if eval_config.cross_slicing_specs:
        refuse("cross_slicing_specs")
    for spec in eval_config.slicing_specs:
        if spec.slice_keys_sql:
            refuse("slice_keys_sql")
    options = eval_config.options
    if options.compute_confidence_intervals.value:
        refuse("confidence intervals")
    if options.min_slice_size.value:
        refuse("min_slice_size")


def metric_keys(eval_config: Any) -> tuple[list, dict]:
    """The metric keys TFMA outputs for the config's metrics specs (its own
    `to_computations`, private keys left out) and each key name's metric instance."""
    from tensorflow_model_analysis.metrics import metric_specs, metric_types

    computations = metric_specs.to_computations(eval_config.metrics_specs,
                                                eval_config=eval_config)
    keys = []
    for computation in computations:
        for key in computation.keys:
            if isinstance(key, metric_types.PlotKey):
                if key.name.startswith("_"):
                    continue
                raise UnsupportedSetting(f"plots ({key.name}); the fast Evaluator computes "
                                        f"metrics only, StockEvaluator plots too")
            if not key.name.startswith("_") and key not in keys:
                keys.append(key)
    instances = {}
    for _, _, instance in metric_specs.keys_and_metrics_from_specs(
            eval_config, eval_config.metrics_specs):
        instances[instance.name] = instance
    for key in keys:
        if key.name not in instances:
            raise UnsupportedSetting(f"the metric key {key.name!r}, which no configured metric "
                                    f"names")
        metric_values.check_supported(instances[key.name])
    return keys, instances


def slicing_columns(eval_config: Any) -> list[str]:
    names = []
    for spec in eval_config.slicing_specs:
        for name in list(spec.feature_keys) + list(spec.feature_values):
            if name not in names:
                names.append(name)
    return names


# --- the models ------------------------------------------------------------------------------
class ModelScorer:
    """One model spec's model, loaded once, and the one `tf.function` that scores a batch of
    records with it: the prediction its serving signature outputs, and the label and sliced
    features its preprocessing signatures output."""

    def __init__(self, spec: Any, path: str, model: Any, is_keras: bool,
                 include_default_metrics: bool, slicing: Sequence[str]):
        import tensorflow as tf

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
            self.compiled_keys = metric_values.compiled_metric_keys(model, spec.name)
            self.compiled = metric_values.KerasRunner.of_compiled(model)

    @classmethod
    def load(cls, spec: Any, path: str, eval_config: Any) -> "ModelScorer":
        """Loads the SavedModel once. As TFMA decides (`model_util.get_model_type`), a model
        Keras loads is a Keras model, whose compiled metrics TFMA adds by default."""
        import tensorflow as tf

        options = eval_config.options
        include_default = not options.HasField("include_default_metrics") or \
            options.include_default_metrics.value
        model, is_keras = None, False
        if spec.model_type in _KERAS_TYPES or (not spec.model_type and include_default):
            try:
                model = tf.keras.models.load_model(path)
                is_keras = isinstance(model, tf.keras.models.Model)
            except Exception as e:  # noqa: BLE001 - TFMA's test: not loadable as Keras
                if spec.model_type in _KERAS_TYPES:
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
        import tensorflow as tf

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


# --- reading and scoring ---------------------------------------------------------------------
@dataclasses.dataclass
class Scored:
    """Every model's scores on every row, and the features sliced on, in row order."""

    rows: int
    scores: dict[str, Scores]  # by model spec name
    transformed: dict[str, dict[str, np.ndarray]]  # model name -> output -> [rows, ...]
    raw: Any  # pyarrow Table of the raw features decoded here (label, slicing columns)


def score_files(scorers: Sequence[ModelScorer], data_files: Sequence[str],
                raw_names: Sequence[str], schema: Any, options: EvaluatorOptions) -> Scored:
    """Runs every model over every record of `data_files`, block by block, and decodes the
    raw features `raw_names` the models do not output."""
    import pyarrow as pa
    import tensorflow as tf

    from tfrecord_shards.codec import parser

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


def iter_blocks(data_files: Sequence[str]) -> Iterator[tfrecord_io.RecordBlock]:
    for path in data_files:
        yield from tfrecord_io.iter_record_blocks(path)


def unscorable_record(scorer: ModelScorer, block: tfrecord_io.RecordBlock, window: slice,
                      error: Exception) -> str:
    """One line naming the first record of a batch the model's signatures refuse (not a
    tf.Example, a feature of another type or missing): its file, offset and TensorFlow's
    reason. The batch's records are tried one at a time, only once a batch has failed."""
    import tensorflow as tf

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


def as_rows(values: np.ndarray) -> np.ndarray:
    """A [rows] or [rows, ...] array as [rows, values]."""
    values = np.asarray(values)
    return values.reshape(len(values), -1)


def raw_feature_schema(names: Sequence[str], schema: Any, block: tfrecord_io.RecordBlock):
    """The features decoded here, typed by the given schema, else by the schema.pbtxt our
    ExampleGen writes beside its shards, else by the first records themselves."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    from tfrecord_shards.codec import parser, schema_file

    if schema is None:
        schema = schema_file.find_schema(block.path)
    found = parser.feature_by_name(schema) if schema is not None else {}
    if schema is not None and any(tag.startswith("tfrp.packed_rows")
                                  for tag in schema.annotation.tag):
        raise ValueError(f"{block.path}: packed records (several rows a tf.Example); the "
                         f"Evaluator scores ExampleGen's rows, one a tf.Example")
    subset = schema_pb2.Schema()
    missing = [name for name in names if name not in found]
    typed = record_types(missing, block) if missing else {}
    for name in names:
        feature = subset.feature.add()
        if name in found:
            feature.CopyFrom(found[name])
        else:
            feature.name, feature.type = name, typed[name]
    return subset


def record_types(names: Sequence[str], block: tfrecord_io.RecordBlock,
                 sample: int = 1000) -> dict[str, int]:
    """The schema type of each named feature, from the kind of list the first records hold
    it in; a feature none of them holds is named in one line."""
    from tensorflow_metadata.proto.v0 import schema_pb2
    import tensorflow as tf

    kinds = {"float_list": schema_pb2.FLOAT, "int64_list": schema_pb2.INT,
             "bytes_list": schema_pb2.BYTES}
    found: dict[str, int] = {}
    for i in range(min(sample, len(block.starts))):
        example = tf.train.Example.FromString(
            block.buffer[block.starts[i]:block.ends[i]].tobytes())
        for name in names:
            if name not in found and name in example.features.feature:
                kind = example.features.feature[name].WhichOneof("kind")
                if kind:
                    found[name] = kinds[kind]
        if len(found) == len(names):
            return found
    missing = [name for name in names if name not in found]
    raise ValueError(f"{block.path}: no feature {', '.join(map(repr, missing))} in the first "
                     f"{min(sample, len(block.starts))} records (a label_key or slicing "
                     f"column the model does not output either)")


def check_labels(batch: Any, block: tfrecord_io.RecordBlock, label_keys: Sequence[str]) -> None:
    """Every record has a label: a missing one is named by file and offset."""
    import pyarrow.compute as pc

    for key in set(label_keys):
        column = batch.column(batch.schema.get_field_index(key))
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        if (lengths == 0).any():
            row = int(np.flatnonzero(lengths == 0)[0])
            raise ValueError(f"{block.path}: record at byte offset {block.record_offset(row)} "
                             f"has no value for the label {key!r}")


def raw_values(column: Any, name: str) -> np.ndarray:
    """A raw feature's values as [rows, values] (every row holds as many)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_binary(column.type.value_type) or \
            pa.types.is_large_binary(column.type.value_type):
        raise ValueError(f"the label {name!r} holds bytes; a preprocessing function (the "
                         f"model spec's preprocessing_function_names) must map it to numbers")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if len(set(lengths.tolist())) > 1:
        raise ValueError(f"the label {name!r} holds {lengths.min()} to {lengths.max()} values "
                         f"a row; every row needs as many")
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    return values.reshape(len(column), int(lengths[0]) if len(lengths) else 1)


# --- slices ----------------------------------------------------------------------------------
def slice_rows(eval_config: Any, scored: Scored) -> dict[tuple, Optional[np.ndarray]]:
    """Each slice's key (TFMA's SliceKeyType: sorted (column, value) pairs) and its rows (None:
    all of them), slicing spec by slicing spec as TFMA's `SingleSliceSpec.generate_slices`
    slices: a row is in the slice of each combination of its distinct values of the columns,
    if it holds every feature value the spec names; bytes values as text."""
    from tensorflow_model_analysis.slicer import slicer_lib

    specs = list(eval_config.slicing_specs) or [None]
    slices: dict[tuple, Optional[np.ndarray]] = {}
    for proto in specs:
        spec = slicer_lib.SingleSliceSpec(spec=proto) if proto is not None else \
            slicer_lib.SingleSliceSpec()
        if spec.is_overall():
            slices.setdefault((), None)
            continue
        matches = sorted(spec._features)  # noqa: SLF001 - TFMA's parsed (column, value) pairs
        keep = np.ones(scored.rows, bool)
        for column, value in matches:
            keep &= rows_holding(row_values(scored, column), value)
        columns = sorted(spec._columns)  # noqa: SLF001
        pairs = [row_values(scored, column) for column in columns]
        for key, rows in column_slices(columns, pairs, keep, matches).items():
            slices.setdefault(key, rows)
    return slices


@dataclasses.dataclass(frozen=True)
class RowValues:
    """A column's distinct values in each row: pair i is (rows[i], values[codes[i]])."""

    rows: np.ndarray
    codes: np.ndarray
    values: list  # Python values as TFMA's slice accessor gives them (bytes, int, float)
    size: int  # rows in all


def row_values(scored: Scored, column: str) -> RowValues:
    """Where TFMA's slice accessor looks: the models' transformed features first (every model
    that outputs the column), the raw features otherwise."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays = [outputs[column] for outputs in scored.transformed.values() if column in outputs]
    if arrays:
        rows_list, values_list = [], []
        for array in arrays:
            flat = as_rows(array)
            rows_list.append(np.repeat(np.arange(scored.rows), flat.shape[1]))
            values_list.append(flat.ravel())
        rows, values = np.concatenate(rows_list), np.concatenate(values_list)
    else:
        array = scored.raw.column(column)
        array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        rows = np.repeat(np.arange(scored.rows), lengths)
        flat = pc.list_flatten(array)
        values = flat.to_numpy(zero_copy_only=False) if not (
            pa.types.is_binary(flat.type) or pa.types.is_large_binary(flat.type)) else \
            np.array(flat.to_pylist(), dtype=object)
    distinct, codes = np.unique(values, return_inverse=True)
    # One pair a (row, value): TFMA takes a row's values through np.unique.
    pair = np.unique(rows.astype(np.int64) * len(distinct) + codes)
    return RowValues(pair // max(1, len(distinct)), pair % max(1, len(distinct)),
                     distinct.tolist(), scored.rows)


def rows_holding(column: RowValues, value: Any) -> np.ndarray:
    """Rows holding `value` as TFMA compares a spec's feature value with a row's values: equal,
    or a str equal to a bytes value's encoding, or a number whose str equals a value."""
    def match(candidate: Any) -> bool:
        if candidate == value:
            return True
        if isinstance(value, str):
            return value.encode() == candidate
        return str(value) == candidate

    hits = np.array([match(v) for v in column.values], bool)
    keep = np.zeros(column.size, bool)
    keep[column.rows[hits[column.codes]]] = True
    return keep


def column_slices(columns: Sequence[str], pairs: Sequence[RowValues], keep: np.ndarray,
                  matches: Sequence[tuple]) -> dict[tuple, np.ndarray]:
    """The slices of a spec's columns: each row's combinations of its values (a cartesian
    product per row), rows outside `keep` left out."""
    rows = np.flatnonzero(keep)
    combos = np.zeros((len(rows), 0), np.int64)
    for column in pairs:
        inside = keep[column.rows]
        column_rows, column_codes = column.rows[inside], column.codes[inside]
        order = np.argsort(column_rows, kind="stable")
        column_rows, column_codes = column_rows[order], column_codes[order]
        counts = np.bincount(column_rows, minlength=len(keep))
        firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        # Each existing combination repeated once per value its row holds in this column.
        repeat = counts[rows]
        expanded_rows = np.repeat(rows, repeat)
        expanded = np.repeat(combos, repeat, axis=0)
        offsets = np.arange(len(expanded_rows)) - np.repeat(np.cumsum(repeat) - repeat, repeat)
        new_codes = column_codes[firsts[expanded_rows] + offsets]
        rows, combos = expanded_rows, np.column_stack([expanded, new_codes])
    if not len(rows):
        return {}
    distinct, inverse = np.unique(combos, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(distinct) + 1))
    found = {}
    for i, codes in enumerate(distinct):
        parts = [(column, slice_value(pairs[j].values[code], column))
                 for j, (column, code) in enumerate(zip(columns, codes))]
        key = tuple(sorted(list(matches) + parts))
        found[key] = rows[order[bounds[i]:bounds[i + 1]]]
    return found


def slice_value(value: Any, column: str) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"Found non-UTF8 feature value {value!r} in column "
                             f"{column!r}") from e
    return value


# --- metrics, diffs, validation --------------------------------------------------------------
def slice_metrics(rows: Optional[np.ndarray], scorers: Sequence[ModelScorer], scored: Scored,
                  keys: Sequence[Any], instances: dict, runners: dict, eval_config: Any) -> dict:
    """Every metric of every model on a slice's rows (None: all), then the candidate-minus-
    baseline diffs TFMA adds (`add_diff_metrics`). `runners`: the Keras metrics' by name."""
    found: dict = {}
    for scorer in scorers:
        scores = scored.scores[scorer.spec.name].take(rows)
        if scorer.default_metrics:
            found.update(zip(scorer.compiled_keys, scorer.compiled(scores)))
        for key in keys:
            if key.model_name == scorer.spec.name:
                found[key] = metric_values.metric_value(instances[key.name], key, scores,
                                                        runners.get(key.name))
    return with_diffs(found, eval_config)


def slice_statistics(rows: Optional[np.ndarray], scorers: Sequence[ModelScorer],
                     scored: Scored, keys: Sequence[Any], instances: dict,
                     runners: dict) -> dict:
    """What `slice_metrics` computes its metrics from, as sums over the rows
    (`metrics.metric_statistics`; a model's compiled metrics under ("compiled", model)): the
    statistics of parts of a slice's rows add up to those of the whole slice
    (`metrics.merge_statistics`)."""
    found: dict = {}
    for scorer in scorers:
        scores = scored.scores[scorer.spec.name].take(rows)
        if scorer.default_metrics:
            found[("compiled", scorer.spec.name)] = scorer.compiled.state(scores)
        for key in keys:
            if key.model_name == scorer.spec.name and metric_values.statistic_id(
                    instances[key.name], key) not in found:
                found.update(metric_values.metric_statistics(
                    instances[key.name], key, scores, runners.get(key.name)))
    return found


def metrics_from_statistics(statistics: dict, scorers: Sequence[ModelScorer],
                            keys: Sequence[Any], instances: dict, runners: dict,
                            eval_config: Any) -> dict:
    """`slice_metrics` from a slice's statistics (`slice_statistics`, merged)."""
    found: dict = {}
    for scorer in scorers:
        if scorer.default_metrics:
            found.update(zip(scorer.compiled_keys, scorer.compiled.results(
                statistics[("compiled", scorer.spec.name)])))
        for key in keys:
            if key.model_name == scorer.spec.name:
                found[key] = metric_values.statistics_value(instances[key.name], key,
                                                            statistics, runners.get(key.name))
    return with_diffs(found, eval_config)


def with_diffs(found: dict, eval_config: Any) -> dict:
    """`found` and the candidate-minus-baseline diffs TFMA adds (`add_diff_metrics`)."""
    from tensorflow_model_analysis.utils import model_util

    baseline = model_util.get_baseline_model_spec(eval_config)
    if baseline is not None:
        diffs = {}
        for key, value in found.items():
            if key.is_diff or key.model_name == baseline.name:
                continue
            base = key.make_baseline_key(baseline.name)
            if base in found and metric_values.is_diffable(value):
                diffs[key.make_diff_key()] = value - found[base]
        found.update(diffs)
    return found


def validate(sliced_metrics: Sequence[tuple], eval_config: Any) -> Any:
    """TFMA's validation result: `metrics_validator.validate_metrics` on each slice, merged by
    the writer's `CombineValidations` (no rubber stamp, as TFX's executor runs it)."""
    from tensorflow_model_analysis.evaluators import metrics_validator
    from tensorflow_model_analysis.writers import metrics_plots_and_validations_writer as writer

    combine = writer.CombineValidations(eval_config, rubber_stamp=False)
    merged = combine.create_accumulator()
    for sliced in sliced_metrics:
        merged = combine.add_input(merged, metrics_validator.validate_metrics(sliced,
                                                                               eval_config))
    return combine.extract_output(merged)


# --- output ----------------------------------------------------------------------------------
def write_evaluation(output_uri: str, eval_config: Any, sliced_metrics: Sequence[tuple],
                     validation: Any, model_locations: dict[str, str],
                     data_files: Sequence[str]) -> None:
    """The files TFMA's writers leave in a ModelEvaluation folder: eval_config.json, one
    MetricsForSlice a slice, an empty PlotsForSlice and AttributionsForSlice a slice (what
    stock writes when no plot is configured) and the ValidationResult."""
    from tensorflow_model_analysis.proto import metrics_for_slice_pb2
    from tensorflow_model_analysis.slicer import slicer_lib
    from tensorflow_model_analysis.writers import eval_config_writer
    from tensorflow_model_analysis.writers import metrics_plots_and_validations_writer as writer

    fileio.makedirs(output_uri)
    metrics, plots, attributions = [], [], []
    for slice_key, values in sliced_metrics:
        metrics.append(writer.convert_slice_metrics_to_proto(
            (slice_key, values), add_metrics_callbacks=None).SerializeToString())
        key = slicer_lib.serialize_slice_key(slice_key)
        plots.append(metrics_for_slice_pb2.PlotsForSlice(slice_key=key).SerializeToString())
        attributions.append(metrics_for_slice_pb2.AttributionsForSlice(
            slice_key=key).SerializeToString())
    for name, records in ((METRICS_FILE, metrics), (PLOTS_FILE, plots),
                          (ATTRIBUTIONS_FILE, attributions),
                          (VALIDATIONS_FILE, [validation.SerializeToString()])):
        fileio.write_bytes(fileio.join(output_uri, name),
                           tfrecord_io.frame_records(records)[0].tobytes())
    folders = sorted({fileio.dirname(path) for path in data_files})
    fileio.write_text(fileio.join(output_uri, EVAL_CONFIG_FILE),
                      eval_config_writer._serialize_eval_run(  # noqa: SLF001 - TFMA's format
                          eval_config, ",".join(folders), "tfrecords", model_locations))
