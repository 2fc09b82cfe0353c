"""`python -m bench examplegen`: ours vs stock CsvExampleGen on the same seeded taxi-like CSV, each
run as a user runs it, in a whole fresh process (imports included) with the same Beam settings.

- `stock`: CsvExampleGen in a one-component LocalDagRunner pipeline (gzip at zlib's level 6,
  which Beam's TFRecord sink uses).
- `ours`: what `tfrp examplegen SOURCE OUT` runs (`engine.run`, gzip level 1, our
  default), without the command line's argument parsing.
- `ours-gzip6`: the same at stock's gzip level.
- `ours-tfx`: ShardedExampleGen in a one-component LocalDagRunner pipeline, like stock.

Each child reports its in-run time (the run call alone), its output's bytes on disk, its peak
RSS and its RSS right after its imports (so memory can be compared without ~1 GB of imports);
the parent adds the whole process's wall time, the figure the headline ratio uses.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import sys
import time
from typing import Callable

from bench import processes
from bench.display import Table

IMPLEMENTATIONS = ("stock", "ours", "ours-gzip6", "ours-tfx")  # the first is the baseline


def _data_bytes(folder: str) -> int:
    """Bytes of the Split-* data files below `folder` (schema and manifest left out)."""
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(folder) if "Split-" in root for name in names)


def _tfx_pipeline(impl: str, data_dir: str, work_dir: str, beam_args: list[str]):
    from tfx import v1 as tfx

    if impl == "stock":
        component = tfx.components.CsvExampleGen(input_base=data_dir)
    else:
        from components.example_gen.component import ShardedExampleGen

        component = ShardedExampleGen(source=data_dir, format="csv")
    return tfx.dsl.Pipeline(
        pipeline_name=f"bench-{impl}", pipeline_root=os.path.join(work_dir, "root"),
        components=[component], enable_cache=False, beam_pipeline_args=beam_args,
        metadata_connection_config=tfx.orchestration.metadata
        .sqlite_metadata_connection_config(os.path.join(work_dir, "metadata.db")))


def _child(impl: str, data_dir: str, work_dir: str, beam_args: list[str]) -> dict:
    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    if impl in ("stock", "ours-tfx"):
        from tfx import v1 as tfx

        # The executor's imports happen inside the run; done here, they count as imports.
        if impl == "stock":
            from tfx.components.example_gen.csv_example_gen import executor
        else:
            from components.example_gen import executor
        assert executor
        pipeline = _tfx_pipeline(impl, data_dir, work_dir, beam_args)
        rss_after_imports = processes.resident_bytes() / 2**20
        start = time.perf_counter()
        tfx.orchestration.LocalDagRunner().run(pipeline)
        output = os.path.join(work_dir, "root")
    else:
        # What `tfrp examplegen` runs, without its argument parsing.
        from components.example_gen import engine
        from components.example_gen import beam_job
        from components.example_gen.options import ExampleGenOptions
        from tfrecord_shards.options import from_flat

        assert beam_job
        output = os.path.join(work_dir, "out")
        level = {"compression_level": 6} if impl == "ours-gzip6" else {}
        options = from_flat(ExampleGenOptions, {"source": data_dir, **level})
        rss_after_imports = processes.resident_bytes() / 2**20
        start = time.perf_counter()
        engine.run(options, output, beam_pipeline_args=beam_args, progress=True)
    seconds = time.perf_counter() - start
    result = {"impl": impl, "seconds": seconds, "data_bytes": _data_bytes(output),
              "rss_after_imports_mb": rss_after_imports,
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    shutil.rmtree(work_dir, ignore_errors=True)
    return result


def run_benchmark(rows: int, work_root: str, repeats: int = 3,
                  beam_args: list[str] | None = None, impls=IMPLEMENTATIONS,
                  log: Callable[[str], None] = print) -> dict:
    from testsupport import data

    data_dir = os.path.join(work_root, f"taxi-{rows}")
    data.write_taxi_csv(rows, data_dir)
    beam_args = beam_args or []
    samples: dict[str, list[dict]] = {impl: [] for impl in impls}

    def measure(impl: str) -> dict:
        sample = processes.run_child("bench.examplegen", [
            impl, data_dir, os.path.join(work_root, "work"), json.dumps(beam_args)])
        samples[impl].append(sample)
        return dict(sample, rows=rows)

    result = processes.interleaved(impls, repeats, rows, measure, log, by="process_seconds")
    for impl, entry in result["paths"].items():
        entry.update(processes.medians(samples[impl], [
            "seconds", "data_bytes", "peak_rss_mb", "rss_after_imports_mb"]))
        entry["median_peak_rss_over_imports_mb"] = statistics.median(
            s["peak_rss_mb"] - s["rss_after_imports_mb"] for s in samples[impl])
    return dict(result, beam_args=beam_args)


def table(result: dict) -> Table:
    """Rate and times of each whole process, MiB of data files on disk, and peak RSS minus
    the RSS right after imports."""
    for entry in result["paths"].values():
        entry["median_data_mib"] = entry["median_data_bytes"] / 2 ** 20
    return Table(result["paths"], [
        ("rows/s (process)", "rows_per_second", "{:,.0f}"),
        ("process s", "median_process_seconds", "{:.2f}"),
        ("in-run s", "median_seconds", "{:.2f}"),
        (f"vs {result['baseline']}", "vs_baseline", "{:.2f}x"),
        ("MiB", "median_data_mib", "{:,.1f}"),
        ("peak RSS MiB", "median_peak_rss_mb", "{:,.0f}"),
        ("over imports", "median_peak_rss_over_imports_mb", "{:,.0f}")])


if __name__ == "__main__":
    impl, data_dir, work_dir, beam_args = sys.argv[1:5]
    print(json.dumps(_child(impl, data_dir, work_dir, json.loads(beam_args))))
