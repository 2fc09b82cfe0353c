"""`python -m bench faults`: what each fault costs and whether it loses or doubles a row.

The faults of `tests/test_spark_cluster.py`, the Beam retry test and the Trainer's fault
tests, at a size of your choosing. Writes: rows with a unique id (fixed seed) written by
`write_examples` on a local Spark standalone cluster (two workers, on 127.0.0.1 and
127.0.0.2) and by ExampleGen on Beam's bundle-retrying BundleBasedDirectRunner, once clean
and once per fault, each a whole process; the output is read back and every id counted. The
Trainer's faults are in `testsupport/trainer_faults.py`. Rows lost (ids missing) and duplicates
(ids seen more than once) are counted, not assumed. Time is the whole run against the clean
run's on the same engine.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

from bench.display import Table

WRITE = """
import json, sys
from spark_shards.session import get_session
from components.example_gen.spark_write import write_examples
master, conf, source, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
spark = get_session(master, dict({"spark.task.maxFailures": "4"}, **conf))
frame = spark.read.csv(source, header=True, inferSchema=True).repartition(16)
write_examples(frame, out, num_shards=4)
"""
SPECULATION = {"spark.speculation": "true", "spark.speculation.interval": "200ms",
               "spark.speculation.multiplier": "2", "spark.speculation.quantile": "0.5",
               "spark.speculation.minTaskRuntime": "1s"}
STALL_SECONDS = 60
BEAM_FILES = 8
ENGINES = ("spark", "beam", "trainer")


def write_source(folder: str, rows: int) -> tuple[str, str]:
    """(one CSV file, a folder of BEAM_FILES CSV parts) of the same seeded rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(38)
    table = pa.table({
        "row_id": np.arange(rows), "fare": np.round(rng.gamma(2, 7, rows), 2),
        "miles": rng.integers(0, 40, rows),
        "company": rng.choice(np.array(["Flash Cab", "Taxi Affiliation", "Sun Taxi"]), rows)})
    whole = os.path.join(folder, "rows.csv")
    pacsv.write_csv(table, whole)
    parts = os.path.join(folder, "parts")
    os.makedirs(parts, exist_ok=True)
    step = -(-rows // BEAM_FILES)
    for i in range(BEAM_FILES):
        pacsv.write_csv(table.slice(i * step, step), os.path.join(parts, f"part-{i}.csv"))
    return whole, parts


def count_ids(out: str, rows: int) -> dict:
    """Rows written (the manifest), ids missing and ids seen more than once (read back)."""
    import numpy as np

    from shard_readers import numpy_reader
    from tfrecord_shards import shards

    manifest = shards.read_manifest(out)
    files = [os.path.join(out, shard["path"]) for split in manifest["splits"].values()
             for shard in split["shards"]]
    seen = np.zeros(rows, dtype=np.int64)
    for batch in numpy_reader.iter_batches(files, features=["row_id"], batch_size=65536):
        np.add.at(seen, batch["row_id"].ravel(), 1)
    return {"rows_in": manifest["rows_in"], "rows_out": manifest["rows_written"],
            "rows_lost": int((seen == 0).sum()), "duplicates": int((seen > 1).sum()),
            "splits": {s: v["rows"] for s, v in manifest["splits"].items()}}


def _spark_run(cluster, source: str, out: str, conf: Optional[dict] = None,
               kill: bool = False) -> tuple[float, str]:
    """(seconds, log) of one `write_examples` process; with `kill`, one executor JVM gets
    SIGKILL once chunk files are on disk."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-c", WRITE, cluster.master, json.dumps({**cluster.conf, **(conf or {})}),
         source, out], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    killed = not kill
    while kill and process.poll() is None and not killed:
        executors = cluster.executor_pids()
        if len(executors) == 2 and any(name.endswith(".rec") for _, _, names in os.walk(out)
                                       for name in names):
            os.kill(executors[0], signal.SIGKILL)
            killed = True
        time.sleep(0.1)
    _, log = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"write_examples failed:\n{log[-2000:]}")
    if not killed:
        raise RuntimeError("the write finished before an executor could be killed; use more rows")
    return time.monotonic() - started, log


def _beam_run(parts: str, out: str, fault: Optional[str]) -> float:
    from testsupport import faults

    env = faults.child_env(fault, dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    started = time.monotonic()
    subprocess.run([sys.executable, "-W", "ignore", "-m", "pipeline.cli", "examplegen", parts,
                    out, "--runner=BundleBasedDirectRunner"], check=True, env=env,
                   capture_output=True)
    return time.monotonic() - started


def run_benchmark(rows: int, work_dir: str, train_rows: int = 30_000,
                  engines: tuple[str, ...] = ENGINES, log: Callable[[str], None] = print
                  ) -> dict:
    from testsupport import faults, trainer_faults
    from local_cluster.spark import LocalCluster

    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    if "spark" in engines or "beam" in engines:
        source, parts = write_source(work_dir, rows)
    results: dict[str, dict] = {}

    def record(name: str, engine: str, seconds: float, out: str, clean: Optional[str]) -> None:
        counted = count_ids(out, rows)
        results[name] = {"engine": engine, "seconds": seconds, **counted,
                         "vs_clean": seconds / results[clean]["seconds"] if clean else 1.0,
                         "splits_as_clean": counted["splits"] == results[clean]["splits"]
                         if clean else True}
        log(f"{name}: {seconds:.1f} s, {counted['rows_out']:,} rows out, "
            f"{counted['rows_lost']} lost, {counted['duplicates']} doubled")

    if "spark" in engines:
        with LocalCluster(workers=2, work_dir=os.path.join(work_dir, "cluster"),
                          distinct_hosts=True) as cluster:
            for name, conf, kill in (
                    ("spark: clean", None, False),
                    ("spark: executor SIGKILL", None, True),
                    ("spark: every first attempt fails",
                     faults.spark_conf(faults.FAIL_FIRST_ATTEMPT),
                     False),
                    (f"spark: task 0 stalls {STALL_SECONDS} s, speculation on",
                     {**faults.spark_conf(f"{faults.SLOW_FIRST_TASK}={STALL_SECONDS}"),
                      **SPECULATION}, False)):
                out = os.path.join(work_dir, name.split(":")[1].strip().replace(" ", "-"))
                seconds, _ = _spark_run(cluster, source, out, conf, kill)
                record(name, "spark", seconds, out, None if kill is False and conf is None
                       else "spark: clean")
    if "beam" in engines:
        for name, fault in (("beam: clean", None),
                            ("beam: file 2's first attempt fails (bundle retried)",
                             f"{faults.FAIL_FIRST_ATTEMPT}=2")):
            out = os.path.join(work_dir, "beam-" + ("fault" if fault else "clean"))
            seconds = _beam_run(parts, out, fault)
            record(name, "beam", seconds, out, None if fault is None else "beam: clean")
    if "trainer" in engines:
        trained = trainer_faults.run_benchmark(train_rows, os.path.join(work_dir, "trainer"),
                                               log)
        results.update({name: {"splits_as_clean": "-", **run}
                        for name, run in trained["runs"].items()})
        train_split_rows = trained["split_rows"]
    return {"rows": rows, "train_rows": train_rows, "runs": results,
            **({"train_split_rows": train_split_rows} if "trainer" in engines else {})}


def table(result: dict) -> Table:
    """One line per run. Only the tf.data service may lose rows (its epoch is at most once);
    its runs show the rows the Trainer said were missed beside the rows counted missing."""
    runs = {name: {**run, "reported_missed": f"{run['reported_missed']:,}"
                   if "reported_missed" in run else "-"} for name, run in result["runs"].items()}
    wrong = sum(r["rows_lost"] + r["duplicates"] for r in runs.values()
                if r["engine"] != "tf.data service")
    sizes = [f"{result['rows']:,} rows per write"] if any(
        r["engine"] in ("spark", "beam") for r in runs.values()) else []
    if any(r["engine"] not in ("spark", "beam") for r in runs.values()):
        sizes.append(f"the Trainer's faults: {result['train_rows']:,} rows, "
                     f"{result['train_split_rows']:,} of them in the train split")
    return Table(runs, [
        ("rows in", "rows_in", "{:,}"), ("rows out", "rows_out", "{:,}"),
        ("lost", "rows_lost", "{:,}"), ("said missed", "reported_missed", "{}"),
        ("doubled", "duplicates", "{:,}"), ("splits as clean", "splits_as_clean", "{}"),
        ("seconds", "seconds", "{:.1f}"), ("vs clean", "vs_clean", "{:.2f}x")],
        summary="; ".join(sizes) + f". Rows lost or doubled where no loss is allowed: {wrong}")
