"""StatisticsGen's one entry: `run` picks where the statistics are computed, by the pipeline's
Beam args (`runs_on_beam`): in this process (`stats_job.run`: one reading thread, decoding
threads) on the local DirectRunner, `make run`'s default, which spares Beam's start-up;
else as the Beam job (`beam_job`, a piece of a shard per element) on the runner the args
name. The TFX executor and the command line (`python -m components.statistics_gen.engine`)
call it. It imports no TFX, and Beam only when the Beam job runs.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, Iterable, Optional

from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import beam_runners
from components.statistics_gen import stats_job
from components.statistics_gen.options import StatisticsGenOptions

def runs_on_beam(beam_pipeline_args: Optional[Iterable[str]]) -> bool:
    """Whether the statistics of a run with these Beam args are the Beam job's: any runner
    but the DirectRunner, or the DirectRunner in worker processes
    (`--direct_running_mode=multi_processing`, as `direct_num_workers` in a pipeline config
    sets it). The DirectRunner in this process (no args, `in_memory`, `multi_threading`)
    keeps `stats_job.scan`, its threads doing what a Beam job would add its start-up and
    per-element costs to."""
    return not beam_runners.args_in_this_process(beam_pipeline_args)


def run(examples_uri: str, output_uri: str, splits: list[str],
        options: Optional[StatisticsGenOptions] = None,
        stats_schema: Optional[schema_pb2.Schema] = None,
        beam_pipeline_args: Optional[list[str]] = None,
        make_pipeline: Optional[Callable] = None) -> dict[str, int]:
    """Writes `output_uri`/Split-<name>/FeatureStats.pb for each split and returns each
    split's example count, on the path `runs_on_beam(beam_pipeline_args)` picks
    (`make_pipeline`, the TFX executor's, makes the Beam job's pipeline when given). Both
    paths write the same statistics, the moments to rounding and the quantiles to the
    sketch's rank error."""
    options = options or StatisticsGenOptions()
    if not runs_on_beam(beam_pipeline_args):
        return stats_job.run(examples_uri, output_uri, splits, options, stats_schema)
    # apache_beam: 3.0 s to import; the in-process path (stats_job) runs without it.
    from components.statistics_gen import beam_job

    return beam_job.run(stats_job.split_inputs(examples_uri, splits, stats_schema),
                        output_uri, options, beam_pipeline_args=beam_pipeline_args,
                        make_pipeline=make_pipeline)


def main(argv: Optional[list[str]] = None) -> None:
    arguments = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Further arguments are Beam's, as a pipeline's beam_args: "
               "--direct_running_mode=multi_processing --direct_num_workers=2, or another "
               "runner, runs the Beam job.")
    arguments.add_argument("examples", help="an Examples artifact folder (Split-*/ inside)")
    arguments.add_argument("output", help="the ExampleStatistics folder to write")
    arguments.add_argument("--splits", help="comma-separated (default: every Split-*/)")
    arguments.add_argument("--piece-records", type=int, help="records a Beam element "
                           "summarises (default: StatisticsGenOptions.piece_records)")
    given, beam_args = arguments.parse_known_args(argv)
    started = time.perf_counter()
    splits = given.splits.split(",") if given.splits else \
        stats_job.artifact_splits(given.examples)
    options = StatisticsGenOptions() if given.piece_records is None else \
        StatisticsGenOptions(piece_records=given.piece_records)
    written = run(given.examples, given.output, splits, options, beam_pipeline_args=beam_args)
    rows = sum(written.values())
    seconds = time.perf_counter() - started
    path = "Beam job" if runs_on_beam(beam_args) else "in process"
    print(f"{rows:,} rows in {seconds:.2f} s ({path}): "
          + ", ".join(f"{split} {count:,}" for split, count in written.items()))


if __name__ == "__main__":
    main()
