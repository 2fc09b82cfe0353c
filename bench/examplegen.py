"""`tfrp bench examplegen`: ours vs stock CsvExampleGen, each as a one-component LocalDagRunner
pipeline with the same Beam settings, on the same seeded taxi-like CSV.

Each measurement runs in a fresh subprocess so its peak RSS is its own and no import or cache
from an earlier run helps it. Timing covers `LocalDagRunner.run`, not interpreter start-up.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

IMPLEMENTATIONS = ("stock", "ours")


def _one_run(impl: str, data_dir: str, work_dir: str, beam_args: list[str]) -> dict:
    from tfx import v1 as tfx

    if impl == "stock":
        component = tfx.components.CsvExampleGen(input_base=data_dir)
    else:
        from components.example_gen.component import ShardedExampleGen

        component = ShardedExampleGen(source=data_dir, format="csv")
    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    pipeline = tfx.dsl.Pipeline(
        pipeline_name=f"bench-{impl}", pipeline_root=os.path.join(work_dir, "root"),
        components=[component], enable_cache=False, beam_pipeline_args=beam_args,
        metadata_connection_config=tfx.orchestration.metadata
        .sqlite_metadata_connection_config(os.path.join(work_dir, "metadata.db")))
    start = time.perf_counter()
    tfx.orchestration.LocalDagRunner().run(pipeline)
    seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    shutil.rmtree(work_dir, ignore_errors=True)
    return {"impl": impl, "seconds": seconds, "peak_rss_mb": peak_kb / 1024}


def measure(impl: str, data_dir: str, work_dir: str, beam_args: list[str]) -> dict:
    """Runs one measurement in a child interpreter and returns its JSON line."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "bench.examplegen", impl, data_dir, work_dir,
         json.dumps(beam_args)],
        capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{impl} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_benchmark(rows: int, work_root: str, repeats: int = 3,
                  beam_args: list[str] | None = None, impls=IMPLEMENTATIONS) -> dict:
    from bench import data

    data_dir = os.path.join(work_root, f"taxi-{rows}")
    data.write_taxi_csv(rows, data_dir)
    beam_args = beam_args or []
    runs = {impl: [] for impl in impls}
    for _ in range(repeats):
        for impl in impls:  # interleaved so drift in the machine hits both alike
            runs[impl].append(measure(impl, data_dir, os.path.join(work_root, "work"),
                                      beam_args))
    result = {"rows": rows, "repeats": repeats, "beam_args": beam_args}
    for impl, items in runs.items():
        seconds = statistics.median(r["seconds"] for r in items)
        result[impl] = {"median_seconds": seconds, "rows_per_second": rows / seconds,
                        "median_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in items),
                        "seconds": [r["seconds"] for r in items]}
    if "stock" in result and "ours" in result:
        result["speedup"] = result["stock"]["median_seconds"] / result["ours"]["median_seconds"]
    return result


if __name__ == "__main__":
    impl, data_dir, work_dir, beam_args = sys.argv[1:5]
    print(json.dumps(_one_run(impl, data_dir, work_dir, json.loads(beam_args))))
