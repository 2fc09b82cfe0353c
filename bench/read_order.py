"""Times `read_examples` and Spark's Parquet read in a given order in one SparkSession, to
see what a read costs after another action (the session's first read, a worker that
imported TensorFlow) rather than on its own.

    python -m bench.read_order FOLDER STEP [STEP ...]

FOLDER holds `ours/`, `ours-plain/` and `parquet/` as `python -m bench spark` leaves them
(`tfrp_runs/bench/spark-<rows>-out`). A step is one of `python -m bench spark`'s reads (`ours`,
`ours-plain`, `parquet`, `python-floor`) or `tf` (one task per core that imports
TensorFlow, as the per-row recipe's workers do).
"""
from __future__ import annotations

import importlib
import os
import sys
import time


def _import_tensorflow(batches):
    importlib.import_module("tensorflow")
    yield from batches


def run(folder: str, steps: list[str], master: str = "local[2]") -> list[tuple[str, float]]:
    from bench.spark import read_actions
    from spark_shards.session import get_session

    spark = get_session(master)
    actions = read_actions(spark, {name: os.path.join(folder, name)
                                   for name in ("ours", "ours-plain", "parquet")})
    actions["tf"] = lambda: spark.range(spark.sparkContext.defaultParallelism).mapInArrow(
        _import_tensorflow, "id long").write.format("noop").mode("overwrite").save()
    timings = []
    for step in steps:
        start = time.perf_counter()
        actions[step]()
        timings.append((step, time.perf_counter() - start))
        print(f"{step} {timings[-1][1]:.2f} s", flush=True)
    spark.stop()
    return timings


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2:])
