"""StatisticsGen's engine: the statistics of each split of an Examples artifact, written as
stock StatisticsGen writes them (`Split-<name>/FeatureStats.pb`, one
DatasetFeatureStatisticsList), so that SchemaGen, ExampleValidator and TFDV's visualisation
take them unchanged. It imports no TFX, TensorFlow, Beam or TFDV.

Each split's shards are read a block at a time (`tfrecord_io.iter_record_blocks`), decoded to
Arrow by the compiled decoder and summarised by threads; the main thread folds the block
summaries in file order, so the output does not depend on which thread finished first.
The parts: `plan.py` (which features, read how), `kernels.py` (the compiled loops),
`accumulators.py` (a block's summary, a split's statistics folded or merged) and `proto.py`
(the protos, as TFDV 1.16 builds them).

Why not TFDV's own generators in-process: importing any part of TFDV imports TensorFlow and
Beam (15 to 20 s on the 2-core development machine, before any work), and its
BasicStatsGenerator alone takes about 8 us a row of taxi-like data (127k rows/s on one
core), half of it feeding every value to the quantiles sketch, where reading and decoding a
row take about 2.5 us. Here a block's numbers come from compiled loops, and the sketch
(tfx_bsl's, the one TFDV uses) is fed a block's values sorted and thinned
(`accumulators._thin`).
"""
from __future__ import annotations

import argparse
import collections
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Optional, Sequence, Union

from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from tfrecord_shards import fileio, rows_done, tfrecord_io
from tfrecord_shards.packing.arrow import RowDecoder
from tfrecord_shards.memory import release_free_memory
from components.statistics_gen.accumulators import SplitStats, block_part
from components.statistics_gen.options import StatisticsGenOptions
from components.statistics_gen.plan import Plan, plan_for, split_files, unsupported_schema

STATS_FILE = "FeatureStats.pb"  # stock StatisticsGen's file name in each Split-<name>/


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def scan(inputs: Iterable[tuple[str, Sequence[Union[str, tfrecord_io.RecordRange]], Plan]],
         options: StatisticsGenOptions, count_rows: bool = True) -> dict[str, SplitStats]:
    """{split: its statistics} of (split, record files or ranges of them, plan) inputs. The
    main thread reads the files (inflating and unframing release the GIL) and folds the
    block summaries in order; `options.threads` threads decode and summarise the blocks.
    With `count_rows`, the rows summarised are this process's rows done (`rows_done`, the
    live line's count); a component scanning rows it counts another way (Transform's
    statistics of the rows it transforms) says False."""
    threads = options.threads or _cpus()
    results: dict[str, SplitStats] = {}
    in_flight: collections.deque = collections.deque()
    with ThreadPoolExecutor(threads, thread_name_prefix="statistics") as pool:
        try:
            for split, files, plan in inputs:
                stats = results[split] = SplitStats(plan, options)
                decoder = RowDecoder(plan.schema)
                for file in files:
                    for block in tfrecord_io.iter_record_blocks(file):
                        for part in block.parts(decoder.records_per_decode):
                            in_flight.append((stats, pool.submit(
                                block_part, part, decoder, plan)))
                            while len(in_flight) > threads + 2:
                                _fold(in_flight.popleft(), count_rows)
                    # The threads' freed blocks, back to the kernel a file at a time.
                    release_free_memory()
            while in_flight:
                _fold(in_flight.popleft(), count_rows)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return results


def _fold(entry: tuple, count_rows: bool) -> None:
    owner, future = entry
    part = future.result()
    owner.add(part)
    if count_rows:
        rows_done.add(part.rows)


def split_statistics(examples_uri: str, splits: list[str],
                     options: Optional[StatisticsGenOptions] = None,
                     stats_schema: Optional[schema_pb2.Schema] = None
                     ) -> dict[str, statistics_pb2.DatasetFeatureStatisticsList]:
    """{split: DatasetFeatureStatisticsList} for the splits of the Examples at
    `examples_uri`, as stock StatisticsGen computes them (with `stats_schema` as its schema
    input)."""
    options = options or StatisticsGenOptions()
    inputs = split_inputs(examples_uri, splits, stats_schema)
    return {split: stats.statistics() for split, stats in scan(inputs, options).items()}


def split_inputs(examples_uri: str, splits: list[str],
                 stats_schema: Optional[schema_pb2.Schema] = None
                 ) -> list[tuple[str, list[str], Plan]]:
    """(split, its record files, its plan) for each split: what `scan` and the Beam job
    read."""
    reason = unsupported_schema(stats_schema)
    if reason:
        raise ValueError(f"the statistics schema has {reason}, which needs stock "
                         f"StatisticsGen")
    inputs = []
    for split in splits:
        files = split_files(examples_uri, split)
        inputs.append((split, files, plan_for(fileio.join(examples_uri, f"Split-{split}"),
                                              files, stats_schema)))
    return inputs


def write_statistics(output_uri: str, split: str,
                     stats: statistics_pb2.DatasetFeatureStatisticsList) -> int:
    """Writes `output_uri`/Split-<split>/FeatureStats.pb; returns the split's example
    count."""
    folder = fileio.join(output_uri, f"Split-{split}")
    fileio.makedirs(folder)
    fileio.write_bytes(fileio.join(folder, STATS_FILE), stats.SerializeToString())
    return stats.datasets[0].num_examples


def run(examples_uri: str, output_uri: str, splits: list[str],
        options: Optional[StatisticsGenOptions] = None,
        stats_schema: Optional[schema_pb2.Schema] = None) -> dict[str, int]:
    """Writes `output_uri`/Split-<name>/FeatureStats.pb for each split; returns each split's
    example count. (`engine.run` picks this or the Beam job.)"""
    return {split: write_statistics(output_uri, split, stats) for split, stats in
            split_statistics(examples_uri, splits, options, stats_schema).items()}


def artifact_splits(examples_uri: str) -> list[str]:
    """The split names of an Examples artifact folder, from its Split-<name>/ folders."""
    return sorted(name[len("Split-"):] for name in fileio.listdir(examples_uri)
                  if name.startswith("Split-") and fileio.isdir(fileio.join(examples_uri, name)))



# --- Command line (timing the engine as a whole process) ---------------------------------

def main(argv: Optional[list[str]] = None) -> None:
    arguments = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arguments.add_argument("examples", help="an Examples artifact folder (Split-*/ inside)")
    arguments.add_argument("output", help="the ExampleStatistics folder to write")
    arguments.add_argument("--splits", help="comma-separated (default: every Split-*/)")
    arguments.add_argument("--threads", type=int)
    given = arguments.parse_args(argv)
    started = time.perf_counter()
    splits = given.splits.split(",") if given.splits else artifact_splits(given.examples)
    written = run(given.examples, given.output, splits,
                  StatisticsGenOptions(threads=given.threads))
    rows = sum(written.values())
    seconds = time.perf_counter() - started
    print(f"{rows:,} rows in {seconds:.2f} s ({rows / seconds:,.0f} rows/s): "
          + ", ".join(f"{split} {count:,}" for split, count in written.items()))


if __name__ == "__main__":
    main()
