"""StatisticsGen's engine as a Beam job, for runners that spread work over workers (Dataflow,
Flink, Spark, the DirectRunner's `multi_processing` mode): `engine.run` takes it when
`engine.runs_on_beam` says so. It imports no TFX, TensorFlow or TFDV.

  (split, piece of a shard) -> summarise it (`stats_job.scan`) -> SplitStats
  SplitStats per split -> merged, in any order (`MergeSplitStats`) -> statistics proto
  -> `output`/Split-<name>/FeatureStats.pb, written by a worker

A piece is about `piece_records` records of one shard, whole gzip members as our manifest
lists them (or records of a plain file with a .idx), so even one large shard spreads over the
workers; a shard without an index is one piece.

The accumulators are `accumulators.SplitStats`, merged by their own `merge`: counts, extremes,
length and value-count tables are summed exactly, moments by the parallel (Chan) update and
the quantile sketches by tfx_bsl's Merge, so the statistics are those `scan` writes, the
moments to rounding and the quantiles to the sketch's rank error (epsilon).
"""
from __future__ import annotations

import dataclasses
import logging
import pickle
from typing import Callable, Optional, Sequence

import apache_beam as beam
from tensorflow_metadata.proto.v0 import statistics_pb2

from tfrecord_shards import fileio, record_index
from components.statistics_gen import stats_job
from components.statistics_gen.accumulators import SplitStats
from components.statistics_gen.options import StatisticsGenOptions
from components.statistics_gen.plan import Plan

_log = logging.getLogger(__name__)


class SplitStatsCoder(beam.coders.Coder):
    """A SplitStats between workers: pickled (tfx_bsl's quantile sketch pickles its whole
    state through __getstate__), after `compact` has merged its value tables and compacted
    its sketches."""

    def encode(self, value: SplitStats) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> SplitStats:
        return pickle.loads(encoded)

    def is_deterministic(self) -> bool:
        return False


class _SummarisePiece(beam.DoFn):
    """(split, a shard file or a range of one) -> (split, its SplitStats); a split with no
    shards (None) -> (split, an empty SplitStats), so that its statistics are still
    written."""

    def __init__(self, plans: dict[str, Plan], options: StatisticsGenOptions):
        self._plans = plans
        # One decoding thread beside the reading one: the runner runs a worker per core.
        self._options = dataclasses.replace(options, threads=options.threads or 1)

    def process(self, element):
        split, piece = element
        plan = self._plans[split]
        if piece is None:
            yield split, SplitStats(plan, self._options)
            return
        stats = stats_job.scan([(split, [piece], plan)], self._options)[split]
        yield split, stats.compact()


class MergeSplitStats(beam.CombineFn):
    """SplitStats of one split's shards -> one SplitStats, in any order and grouping. The
    inputs are left as they were: the first is merged into an empty accumulator, not
    mutated."""

    def create_accumulator(self) -> Optional[SplitStats]:
        return None

    def add_input(self, accumulator, stats: SplitStats):
        if accumulator is None:
            accumulator = SplitStats(stats.plan, stats.options)
        return accumulator.merge(stats)

    def merge_accumulators(self, accumulators):
        merged = None
        for accumulator in accumulators:
            if accumulator is None:
                continue
            if merged is None:
                merged = accumulator  # Beam lets a merge reuse its first accumulator
            else:
                merged.merge(accumulator)
        return merged

    def compact(self, accumulator):
        return accumulator.compact() if accumulator is not None else None

    def extract_output(self, accumulator) -> SplitStats:
        return accumulator

    def get_accumulator_coder(self):
        return SplitStatsCoder()


def _write(element: tuple[str, SplitStats], output_uri: str) -> tuple[str, int]:
    split, stats = element
    return split, stats_job.write_statistics(output_uri, split, stats.statistics())


def build_pipeline(pipeline: beam.Pipeline,
                   inputs: Sequence[tuple[str, list[str], Plan]],
                   options: StatisticsGenOptions, output_uri: str):
    """Adds the statistics of `inputs` ((split, shard files, plan), as `stats_job.split_inputs`
    makes them) to `pipeline`, written under `output_uri`; returns the PCollection of
    (split, example count)."""
    plans = {split: plan for split, _, plan in inputs}
    pieces = [(split, piece) for split, files, _ in inputs
              for piece in record_index.pieces(files, options.piece_records)] + \
        [(split, None) for split, files, _ in inputs if not files]
    _log.info("StatisticsGen: summarising %d shards in %d pieces of about %d records",
              sum(len(files) for _, files, _ in inputs), len(pieces), options.piece_records)
    return (
        pipeline
        | "Pieces" >> beam.Create(pieces)
        | "Spread" >> beam.Reshuffle()  # one piece per bundle, over every worker
        | "Summarise" >> beam.ParDo(_SummarisePiece(plans, options))
        .with_output_types(beam.typehints.Tuple[str, SplitStats])
        | "Merge" >> beam.CombinePerKey(MergeSplitStats())
        | "Write" >> beam.Map(_write, output_uri)
    )


def run(inputs: Sequence[tuple[str, list[str], Plan]], output_uri: str,
        options: Optional[StatisticsGenOptions] = None,
        beam_pipeline_args: Optional[list[str]] = None,
        make_pipeline: Optional[Callable] = None) -> dict[str, int]:
    """Runs the job (on `make_pipeline()`'s pipeline, else one made from
    `beam_pipeline_args`) and returns each split's example count, read back from what the
    workers wrote."""
    options = options or StatisticsGenOptions()
    pipeline = make_pipeline() if make_pipeline else beam.Pipeline(
        argv=list(beam_pipeline_args or []))
    with pipeline:
        build_pipeline(pipeline, inputs, options, output_uri)
    return {split: _written_examples(output_uri, split) for split, _, _ in inputs}


def _written_examples(output_uri: str, split: str) -> int:
    stats = statistics_pb2.DatasetFeatureStatisticsList.FromString(fileio.read_bytes(
        fileio.join(output_uri, f"Split-{split}", stats_job.STATS_FILE)))
    return stats.datasets[0].num_examples


beam.coders.registry.register_coder(SplitStats, SplitStatsCoder)
