"""`python -m bench scale`: does ExampleGen's cost grow linearly with the data, and does the driver
stay flat? The same seeded taxi-like CSV (`testsupport.data`) at N/10 and N rows goes through
`tfrp examplegen` on Beam and with `--engine spark` on a Spark standalone cluster (given, or a
local one of two workers started here), each a whole process. While it runs, the resident
memory of its process trees is sampled every 0.2 s (psutil): the `tfrp` process and what it
starts (Beam's workers; for Spark, the driver's JVM), and each executor JVM with its Python
workers. Rows in and out come from the manifest.

`--beam-workers N` runs the Beam side on the DirectRunner's N worker processes instead of in
process, and `--piece-bytes B` is ExampleGen's setting of that name for both sides: Spark and
Beam's worker processes read the one large CSV in byte ranges of B (`csv_ranges`); a B above
the file's size reads it whole, one task, as before ranges."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

import psutil

from bench.display import Table

SAMPLE_SECONDS = 0.2


def _tree_rss(root: int) -> int:
    """Resident bytes of `root` and its descendants (0 once it has gone)."""
    try:
        process = psutil.Process(root)
        tree = [process] + process.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for member in tree:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return total


def _run(command: list[str], executors: Callable[[], list[int]]) -> dict:
    """One whole process, its seconds and the peak RSS of its tree and of each executor's."""
    started = time.monotonic()
    # Its log goes to a file: Beam's worker processes log more than a pipe holds, and a pipe
    # read only at the end would stop them.
    with tempfile.TemporaryFile("w+") as log_file:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log_file,
                                   text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        driver_peak, executor_peaks = 0, {}
        while process.poll() is None:
            driver_peak = max(driver_peak, _tree_rss(process.pid))
            for pid in executors():
                executor_peaks[pid] = max(executor_peaks.get(pid, 0), _tree_rss(pid))
            time.sleep(SAMPLE_SECONDS)
        seconds = time.monotonic() - started
        log_file.seek(0)
        log = log_file.read()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} failed:\n{log[-2000:]}")
    return {"seconds": seconds, "driver_peak_mib": driver_peak / 2**20,
            "executor_peak_mib": max(executor_peaks.values(), default=0) / 2**20,
            "executors": len(executor_peaks)}


def run_benchmark(rows: int, work_dir: str, spark_master: Optional[str] = None,
                  log: Callable[[str], None] = print, beam_workers: Optional[int] = None,
                  piece_bytes: Optional[int] = None) -> dict:
    from testsupport import data
    from tfrecord_shards import shards
    from local_cluster.spark import LocalCluster

    results: dict[str, dict] = {}
    pieces = ["--piece-bytes", str(piece_bytes)] if piece_bytes else []
    sources = {size: data.write_taxi_csv(size, os.path.join(work_dir, f"scale-{size}"))
               for size in (rows // 10, rows)}

    def measure(engine: str, extra: list[str], executors: Callable[[], list[int]]) -> None:
        for size, source in sources.items():
            out = os.path.join(work_dir, f"scale-out-{engine}-{size}")
            shutil.rmtree(out, ignore_errors=True)
            measured = _run([sys.executable, "-W", "ignore", "-m", "pipeline.cli",
                             "examplegen", source, out, *extra], executors)
            manifest = shards.read_manifest(out)
            if manifest["rows_in"] != size or manifest["rows_written"] != size:
                raise RuntimeError(f"{engine} at {size:,} rows: {manifest['rows_in']:,} in, "
                                   f"{manifest['rows_written']:,} written")
            measured.update(rows=size, rows_per_second=size / measured["seconds"])
            results[f"{engine}, {size:,} rows"] = measured
            log(f"{engine} {size:,} rows: {measured['seconds']:.1f} s, driver peak "
                f"{measured['driver_peak_mib']:,.0f} MiB, executor peak "
                f"{measured['executor_peak_mib']:,.0f} MiB")
            shutil.rmtree(out, ignore_errors=True)

    # The Beam side runs before the local Spark cluster starts, so that an idle cluster's
    # JVMs hold none of the memory or cores while Beam runs.
    measure("beam", [*pieces, *(["--direct_running_mode=multi_processing",
                                 f"--direct_num_workers={beam_workers}"]
                                if beam_workers else [])], list)
    cluster = None
    if spark_master is None:
        cluster = LocalCluster(workers=2, work_dir=os.path.join(work_dir, "cluster")).start()
    try:
        master = spark_master or cluster.master
        conf = [] if cluster is None else [
            flag for key, value in cluster.conf.items()
            for flag in ("--spark-conf", f"{key}={value}")]
        measure("spark", ["--engine", "spark", "--spark-master", master, *conf, *pieces],
                cluster.executor_pids if cluster else list)
    finally:
        if cluster is not None:
            cluster.stop()
    for engine in ("beam", "spark"):
        small, large = (results[f"{engine}, {n:,} rows"] for n in (rows // 10, rows))
        small["time_vs_tenth"] = small["driver_vs_tenth"] = 1.0
        large["time_vs_tenth"] = large["seconds"] / small["seconds"]
        large["driver_vs_tenth"] = large["driver_peak_mib"] / small["driver_peak_mib"]
    return {"rows": rows, "beam_workers": beam_workers, "piece_bytes": piece_bytes,
            "runs": results}


def table(result: dict) -> Table:
    return Table(result["runs"], [
        ("rows/s", "rows_per_second", "{:,.0f}"), ("seconds", "seconds", "{:.1f}"),
        ("driver peak MiB", "driver_peak_mib", "{:,.0f}"),
        ("executor peak MiB", "executor_peak_mib", "{:,.0f}"),
        ("time vs N/10", "time_vs_tenth", "{:.2f}x"),
        ("driver vs N/10", "driver_vs_tenth", "{:.2f}x")],
        summary="time vs N/10 is linear at 10.00x; a driver that holds no rows stays near "
                "1.00x")
