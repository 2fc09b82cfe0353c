"""Scoring Transform's eval split instead of the raw one: each model's layers after the
Transform graph (its `score_transformed` signature) on the rows Transform already wrote,
dense, read by the numpy reader. Parsing every raw tf.Example and running the Transform graph
again is most of what scoring through serving_default costs (on the taxi model, 1.2 of 1.3
CPU-s per 200k rows).

The blessing must still cover the signature that serves. So each run also scores the first
`serving_check_rows` raw eval records through serving_default (and the preprocessing
signatures, for the label), and compares them with the same rows of the transformed split.
Where a prediction or a label differs by more than `SERVING_TOLERANCE`, the model is not
blessed, and one line says why.

The rows pair up only when the transformed split lists them in the raw split's order. That
holds when Transform's manifest says `row_order: input` (its columnar path writes each
input file's rows in order) and its only input is the Examples the Evaluator reads; and the
model must embed the graph that made them (the digests in Transform's manifest and beside
the model agree: a Trainer reused from cache may hold an older graph). Otherwise,
or when a model lacks the signature, or when a label or sliced feature exists only in the raw
rows, the Evaluator scores the raw records as before and logs why (`unusable`).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import tensorflow as tf

from shard_readers import numpy_reader
from tfrecord_shards import fileio, packing, rows_done, shards
from tfrecord_shards.codec import schema_file
from tfrecord_shards.manifest import ROW_ORDER_INPUT
from components.evaluator.options import EvaluatorOptions
from components.evaluator.raw_features import as_rows
from components.evaluator.scores import Scores
from components.evaluator.scoring import (_LABEL, _PREDICTION, ModelScorer, Scored, iter_blocks)
from components.trainer.options import (MODEL_INPUTS_FILE, TRANSFORMED_SIGNATURE,
                                        signature_input_name)

# The most a prediction or label of a raw record, scored through serving_default, may differ
# from the same row's on the transformed split: float32 rounding of a graph run on other
# batch shapes stays near 1e-7.
SERVING_TOLERANCE = 1e-5


@dataclasses.dataclass(frozen=True)
class TransformedSplit:
    """Transform's files of the evaluated splits, in the raw files' row order."""

    files: list[str]
    schema: Any  # schema_pb2.Schema stored beside them
    rows: int
    graph_digest: Optional[str] = None  # of the TransformGraph that made them
    file_records: tuple[int, ...] = ()  # each file's records (packed blocks), as listed
    # A piece's [first, end) of its one file (`pieces`); it keeps the split's `rows`, which
    # decide how it is scored.
    records: Optional[tuple[int, int]] = None

    @property
    def whole(self) -> bool:
        """Whether this is the whole split, which must then hold `rows` rows."""
        return self.records is None

    def pieces(self, rows: int) -> list["TransformedSplit"]:
        """The split cut, in order, into pieces of about `rows` rows, whole records of one
        file each: a Beam job's units of work, whose rows the job adds up and checks against
        `rows`."""
        per_record = packing.packed_rows(self.schema) or 1
        step = max(1, rows // per_record)
        return [dataclasses.replace(self, files=[path], records=(first, min(first + step, count)))
                for path, count in zip(self.files, self.file_records, strict=True)
                for first in range(0, count, step)]


@dataclasses.dataclass(frozen=True)
class ServingCheck:
    """The first rows scored both ways, and the largest difference found."""

    rows: int
    largest_difference: float
    refusal: Optional[str]  # the one line, when the difference is over the tolerance
    tolerance: float = SERVING_TOLERANCE


def transformed_split(transformed_dir: Optional[str], examples_dir: str,
                      splits: Sequence[str]) -> tuple[Optional[TransformedSplit], str]:
    """Transform's output for `splits` of `examples_dir` when its rows pair with the raw
    rows one to one, else None; and why not."""
    if not transformed_dir:
        return None, "no transformed examples given"
    manifest = shards.read_manifest(transformed_dir)
    raw = shards.read_manifest(examples_dir)
    if manifest is None or raw is None:
        return None, "the transformed or the raw examples have no manifest"
    if manifest.get("row_order") != ROW_ORDER_INPUT:
        return None, "the transformed examples do not keep the raw rows' order"
    inputs = [fileio.absolute(uri) for uri in manifest.get("inputs", [])]
    if inputs != [fileio.absolute(examples_dir)]:
        return None, "the transformed examples were made from other examples"
    files: list[str] = []
    records: list[int] = []
    rows = 0
    for split in splits:
        mine, theirs = manifest["splits"].get(split), raw["splits"].get(split)
        if mine is None or theirs is None or mine["rows"] != theirs["rows"]:
            return None, f"split {split!r} has other rows after Transform"
        files += [fileio.join(transformed_dir, s["path"]) for s in mine["shards"]]
        records += [s["rows"] for s in mine["shards"]]  # a shard's "rows" are its records
        rows += mine["rows"]
    return TransformedSplit(files, schema_file.load_schema(transformed_dir), rows,
                            manifest.get("transform_graph_digest"), tuple(records)), ""


def unusable(scorers: Sequence[ModelScorer], raw_names: Sequence[str],
             slicing: Sequence[str], split: Optional[TransformedSplit]) -> str:
    """Why the models cannot be scored on the transformed split; "" when they can."""
    if split is None:
        return "no transformed split pairs with the raw rows"
    if raw_names:
        return f"{', '.join(raw_names)} exist only in the raw rows"
    if slicing:
        return f"slices of {', '.join(slicing)} are made from the raw rows"
    for scorer in scorers:
        if TRANSFORMED_SIGNATURE not in scorer.model.signatures:
            return f"the model at {scorer.path} has no {TRANSFORMED_SIGNATURE} signature"
        named = {signature_input_name(f.name) for f in split.schema.feature}
        unnamed = sorted(set(scorer.model.signatures[TRANSFORMED_SIGNATURE]
                             .structured_input_signature[1]) - named)
        if unnamed:
            return f"{', '.join(unnamed)} of {TRANSFORMED_SIGNATURE} name no transformed feature"
        inputs_file = fileio.join(scorer.path, MODEL_INPUTS_FILE)
        embedded = (fileio.read_json(inputs_file) or {}).get("transform_graph_digest") \
            if fileio.exists(inputs_file) else None
        if split.graph_digest is None or embedded != split.graph_digest:
            return (f"the model at {scorer.path} embeds another Transform graph than the one "
                    f"that made the transformed split")
        if not scorer.label_transformed:
            return f"the label of {scorer.spec.name!r} is not a transformed feature"
    return ""


def score_transformed(scorers: Sequence[ModelScorer], split: TransformedSplit,
                      options: EvaluatorOptions, made: Optional[dict] = None
                      ) -> Iterator[Scored]:
    """Every model's predictions on every row of the transformed split, with its label, in
    parts of at least `options.part_rows` rows (the last may be short), so that the caller
    holds one part at a time. Batches are scored by `threads` workers while this thread
    reads on, and taken in the order they were read. `made` keeps the scoring functions
    between calls (a Beam worker's pieces of a split), so each is compiled once."""
    signatures = [scorer.model.signatures[TRANSFORMED_SIGNATURE] for scorer in scorers]
    feature_of = {signature_input_name(f.name): f.name for f in split.schema.feature}
    inputs = [{name: feature_of[name] for name in s.structured_input_signature[1]}
              for s in signatures]
    labels = sorted({scorer.spec.label_key for scorer in scorers})
    wanted = sorted(set().union(*(i.values() for i in inputs)) | set(labels))
    part_rows = max(options.part_rows, options.serving_check_rows)
    found: dict[str, dict[str, list]] = {s.spec.name: {_PREDICTION: [], _LABEL: []}
                                         for s in scorers}
    pool = concurrent.futures.ThreadPoolExecutor(options.threads)
    pending: list = []  # a batch's futures, a model each, and its labels

    def collect() -> int:
        futures, batch = pending.pop(0)
        for scorer, future in zip(scorers, futures):
            found[scorer.spec.name][_PREDICTION].append(
                future.result()[scorer.prediction_output].numpy())
            found[scorer.spec.name][_LABEL].append(batch[scorer.spec.label_key])
        return len(batch[labels[0]])

    def part() -> Scored:
        scores = {name: Scores(as_rows(np.concatenate(parts.pop(_LABEL))),
                               as_rows(np.concatenate(parts.pop(_PREDICTION))))
                  for name, parts in found.items()}
        for parts in found.values():
            parts.update({_PREDICTION: [], _LABEL: []})
        return Scored(len(next(iter(scores.values()))), scores,
                      {s.spec.name: {} for s in scorers}, None)

    compile_ = bool(options.jit_compile_rows) and split.rows >= options.jit_compile_rows
    functions: list = []
    rows = collected = 0
    try:
        for batch in numpy_reader.iter_batches(split.files, split.schema,
                                               options.transformed_batch_rows, features=wanted,
                                               records=split.records):
            tensors = [{name: tf.constant(batch[feature]) for name, feature in names.items()}
                       for names in inputs]
            if not functions:
                made = {} if made is None else made
                for signature, given, scorer in zip(signatures, tensors, scorers):
                    if (scorer.path, compile_) not in made:
                        made[scorer.path, compile_] = scoring_function(signature, given,
                                                                       compile_, scorer.path)
                functions = [made[scorer.path, compile_] for scorer in scorers]
            pending.append(([pool.submit(function, given)
                             for function, given in zip(functions, tensors)],
                            {name: batch[name] for name in labels}))
            rows += len(batch[wanted[0]])
            rows_done.add(len(batch[wanted[0]]))
            while len(pending) > options.threads:
                collected += collect()
                if collected >= part_rows:
                    yield part()
                    collected = 0
        while pending:
            collected += collect()
        if collected:
            yield part()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if split.whole:
        check_rows(rows, split)


def check_rows(rows: int, split: TransformedSplit) -> None:
    """Raises unless `rows` (those scored) are the rows the split's manifest lists."""
    if rows != split.rows:
        raise ValueError(f"{len(split.files)} transformed shards held {rows:,} rows; their "
                         f"manifest says {split.rows:,}")


def scoring_function(signature, inputs: dict, compile_: bool, path: str
                     ) -> Callable[[dict], dict]:
    """`signature` as a function of a dict of input tensors; with `compile_`, compiled by
    XLA when XLA compiles it on `inputs` (the first batch), else as it is, which is logged
    (string ops, such as a Hashing layer's, have no XLA kernel)."""
    def plain(given: dict) -> dict:
        return signature(**given)

    if not compile_:
        return plain
    compiled = tf.function(plain, jit_compile=True)
    try:
        compiled(inputs)
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
        logging.info("Evaluator: %s of the model at %s is scored without XLA, which cannot "
                     "compile it: %s", TRANSFORMED_SIGNATURE, path,
                     str(error).strip().splitlines()[0])
        return plain
    logging.info("Evaluator: %s of the model at %s is scored compiled by XLA",
                 TRANSFORMED_SIGNATURE, path)
    return compiled


def check_serving_first_rows(scorers: Sequence[ModelScorer], split: TransformedSplit,
                             data_files: Sequence[str], options: EvaluatorOptions
                             ) -> ServingCheck:
    """`check_serving` for a caller that does not hold the split's first rows scored (the
    Beam job, whose workers score the split a file each): the first
    `options.serving_check_rows` rows of `split` (or all) scored here, then checked."""
    parts = score_transformed(scorers, split, dataclasses.replace(options, part_rows=1))
    try:
        first = next(parts, None)
    finally:
        parts.close()
    if first is None:
        return ServingCheck(0, 0.0, None)
    return check_serving(scorers, data_files, first, options)


def check_serving(scorers: Sequence[ModelScorer], data_files: Sequence[str], scored: Scored,
                  options: EvaluatorOptions) -> ServingCheck:
    """Scores the first `options.serving_check_rows` raw records (all, when fewer) through
    each model's serving and preprocessing signatures, and compares them with the same rows
    of `scored`."""
    wanted = min(options.serving_check_rows, scored.rows)
    served: dict[str, dict[str, list]] = {s.spec.name: {_PREDICTION: [], _LABEL: []}
                                          for s in scorers}
    taken = 0
    for block in iter_blocks(data_files):
        count = min(wanted - taken, len(block.starts))
        data = tf.constant(block.buffer.tobytes())
        starts = tf.constant(block.starts[:count].astype(np.int64))
        lengths = tf.constant((block.ends[:count] - block.starts[:count]).astype(np.int64))
        for scorer in scorers:
            outputs = scorer.score(data, starts, lengths)
            for key in (_PREDICTION, _LABEL):
                served[scorer.spec.name][key].append(outputs[key].numpy())
        taken += count
        if taken >= wanted:
            break
    largest, worst = 0.0, ""
    for scorer in scorers:
        mine = scored.scores[scorer.spec.name]
        for what, theirs, ours in (
                ("prediction", served[scorer.spec.name][_PREDICTION], mine.predictions),
                ("label", served[scorer.spec.name][_LABEL], mine.labels)):
            theirs = as_rows(np.concatenate(theirs)).astype(np.float64)
            ours = ours[:taken].astype(np.float64)
            if theirs.shape != ours.shape:
                largest, worst = float("inf"), f"{scorer.spec.name}'s {what}s"
                break
            difference = float(np.max(np.abs(theirs - ours))) if taken else 0.0
            if difference > largest:
                largest, worst = difference, f"{scorer.spec.name}'s {what}s"
    refusal = None
    if largest > SERVING_TOLERANCE:
        refusal = (f"not blessed: on the first {taken:,} eval rows, {worst} through "
                   f"serving_default differ from the transformed split's by {largest:.3g} "
                   f"(more than {SERVING_TOLERANCE:g})")
    logging.info("Evaluator: serving_default on the first %d raw rows against the transformed "
                 "split: largest difference %.3g", taken, largest)
    return ServingCheck(taken, largest, refusal)
