"""`python -m bench spark`: our Spark writer and reader against Spark's own Parquet and the per-row
TFRecord recipe, and ExampleGen on Spark against ExampleGen on Beam.

One taxi-like DataFrame (from `testsupport.data`, fixed seed) is cached once; every write and read
works on it in the same SparkSession (local[2] by default), interleaved repeat by repeat,
after one warm-up pass whose times are reported apart (a session's first write and read).
Session start-up is timed on its own. The ExampleGen comparison runs each engine as a whole
`tfrp examplegen` process on the same CSV files (imports and JVM start included).
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable

from bench.display import MEDIAN, RATE, Table

CSV_FILES = 8
SHARDS = 4


def per_row_recipe(df, out: str) -> None:
    """The usual hand-written writer: foreachPartition, one tf.train.Example per row, one
    TFRecordWriter per partition (gzip at our level, 1)."""
    def write_partition(rows) -> None:
        import tensorflow as tf
        from pyspark import TaskContext

        path = os.path.join(out, f"part-{TaskContext.get().partitionId():05d}.tfrecord.gz")
        options = tf.io.TFRecordOptions(compression_type="GZIP", compression_level=1)
        with tf.io.TFRecordWriter(path, options) as writer:
            for row in rows:
                feature = {}
                for name, value in row.asDict().items():
                    if value is None:
                        continue
                    if isinstance(value, (bool, int)):
                        feature[name] = tf.train.Feature(
                            int64_list=tf.train.Int64List(value=[int(value)]))
                    elif isinstance(value, float):
                        feature[name] = tf.train.Feature(
                            float_list=tf.train.FloatList(value=[value]))
                    else:
                        feature[name] = tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[str(value).encode()]))
                writer.write(tf.train.Example(
                    features=tf.train.Features(feature=feature)).SerializeToString())

    os.makedirs(out, exist_ok=True)
    df.foreachPartition(write_partition)


def python_floor_read(spark, parquet_folder: str):
    """The floor under any reader that decodes in Python executors, as ours must with no jar:
    the Parquet files read by pyarrow inside `mapInArrow` (C++ decoding, nothing to parse)
    and handed to the JVM as Arrow batches, like read_examples hands its decoded rows."""
    import glob

    files = sorted(glob.glob(os.path.join(parquet_folder, "*.parquet")))
    schema = spark.read.parquet(parquet_folder).schema

    def read(batches):
        import pyarrow.parquet as pq

        for batch in batches:
            for path in batch.column(0).to_pylist():
                yield from pq.ParquetFile(path).iter_batches(batch_size=16_384)

    paths = spark.createDataFrame([(f,) for f in files], "path string").repartition(len(files))
    return paths.mapInArrow(read, schema)


def read_actions(spark, outputs: dict[str, str]) -> dict[str, Callable[[], None]]:
    """The reads compared, each consuming every row (Spark's `noop` sink), over the folders
    `outputs` names for "ours", "ours-plain" and "parquet"."""
    from spark_shards.read import read_examples

    def consume(frame) -> None:
        frame.write.format("noop").mode("overwrite").save()

    return {
        "ours": lambda: consume(read_examples(spark, outputs["ours"])),
        "ours-plain": lambda: consume(read_examples(spark, outputs["ours-plain"])),
        "parquet": lambda: consume(spark.read.parquet(outputs["parquet"])),
        "python-floor": lambda: consume(python_floor_read(spark, outputs["parquet"])),
    }


def _timed(action: Callable[[], None]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(root, n)) for root, _, names in os.walk(folder)
               for n in names)


def _gunzip_seconds(folder: str) -> float:
    """One core's time to decompress every gzip shard under `folder`, reading nothing else,
    with the inflate our reader uses (ISA-L's)."""
    from isal import isal_zlib

    from tfrecord_shards.tfrecord_io import gzip_member_index

    seconds = 0.0
    for root, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".gz"):
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    data = memoryview(f.read())
                starts = [offset for offset, _ in gzip_member_index(path)] + [len(data)]
                start = time.perf_counter()
                for begin, end in zip(starts, starts[1:]):
                    isal_zlib.decompress(data[begin:end], wbits=31)
                seconds += time.perf_counter() - start
    return seconds


def _write_inputs(rows: int, folder: str) -> tuple[str, str]:
    """(parquet file, folder of CSV files) holding the same rows, written once."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from testsupport.data import taxi_like_table

    parquet, csv_folder = os.path.join(folder, "source.parquet"), os.path.join(folder, "csv")
    stamp = os.path.join(folder, "done")
    if os.path.exists(stamp):
        return parquet, csv_folder
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(csv_folder)
    table = taxi_like_table(rows)
    pq.write_table(table, parquet)
    step = -(-rows // CSV_FILES)
    for index in range(CSV_FILES):
        pacsv.write_csv(table.slice(index * step, step),
                        os.path.join(csv_folder, f"part-{index}.csv"))
    open(stamp, "w").close()
    return parquet, csv_folder


def _examplegen_process(csv_folder: str, out: str, engine: str, master: str) -> float:
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "pipeline.cli", "examplegen", csv_folder, out]
    if engine == "spark":
        command += ["--engine", "spark", "--spark-master", master]
    else:
        command += ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if result.returncode != 0:
        raise RuntimeError(f"examplegen --engine {engine} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - start


def import_seconds(modules: str) -> float:
    """Wall time of a fresh Python importing `modules`: what an executor's Python worker pays
    before its first task."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {modules}"], check=True,
                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True)
    return time.perf_counter() - start


def run_benchmark(rows: int, work_root: str, repeats: int = 3, master: str = "local[2]",
                  log: Callable[[str], None] = print) -> dict:
    from tfrecord_shards.shards import read_manifest
    from spark_shards.read import read_examples
    from components.example_gen.spark_write import write_examples

    parquet, csv_folder = _write_inputs(rows, os.path.join(work_root, f"spark-{rows}"))
    start = time.perf_counter()
    from spark_shards.session import get_session

    spark = get_session(master)
    session_seconds = time.perf_counter() - start
    df = spark.read.parquet(parquet).repartition(SHARDS).cache()
    if df.count() != rows:
        raise RuntimeError("the cached DataFrame lost rows")
    outputs = {name: os.path.join(work_root, f"spark-{rows}-out", name)
               for name in ("ours", "ours-plain", "parquet", "per-row")}

    def fresh(name: str) -> str:
        shutil.rmtree(outputs[name], ignore_errors=True)
        return outputs[name]

    writers = {
        # As many shards as the DataFrame has partitions, the files Parquet writes.
        "ours": lambda: write_examples(df, fresh("ours"), num_shards=SHARDS),
        "ours-plain": lambda: write_examples(df, fresh("ours-plain"), num_shards=SHARDS,
                                             compression="none"),
        "parquet": lambda: df.write.parquet(fresh("parquet")),
        "per-row": lambda: per_row_recipe(df, fresh("per-row")),
    }
    readers = read_actions(spark, outputs)
    engines = {"spark": lambda: _examplegen_process(
        csv_folder, os.path.join(work_root, f"spark-{rows}-gen", "spark"), "spark", master),
               "beam": lambda: _examplegen_process(
        csv_folder, os.path.join(work_root, f"spark-{rows}-gen", "beam"), "beam", master)}
    # The first write and the first read of a session also pay for the JVM's warm-up and
    # the Python workers' start (and our decoder's compiled code loading): one untimed-in-
    # the-medians pass reports that cost on its own. Each repeat then starts its group at
    # another path, so no path always runs after the same one (the slow per-row recipe left
    # the read after it slower in earlier runs).
    first = {f"write:{name}": _timed(action) for name, action in writers.items()
             if name != "per-row"}
    first.update({f"read:{name}": _timed(action) for name, action in readers.items()})
    log("first in the session: " + ", ".join(f"{key} {value:.1f}s"
                                              for key, value in first.items()))
    runs: dict[str, list[float]] = {}
    for repeat in range(repeats):
        for group, actions in (("write", writers), ("read", readers),
                               ("examplegen", engines)):
            names = list(actions)
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                runs.setdefault(f"{group}:{name}", []).append(_timed(actions[name]))
        log(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
            f"{key} {values[-1]:.1f}s" for key, values in runs.items()))
    if read_manifest(outputs["ours"])["rows_written"] != rows:
        raise RuntimeError("our writer did not write every row")
    if read_examples(spark, outputs["ours"]).count() != rows:
        raise RuntimeError("read_examples did not read every row")
    medians = {key: statistics.median(values) for key, values in runs.items()}
    executor_imports = {
        name: statistics.median(import_seconds(modules) for _ in range(repeats))
        for name, modules in (("encode path", "components.example_gen.spark_write, pyarrow"),
                              ("tensorflow", "tensorflow"))}
    paths = {key: {"median_seconds": seconds, "rows_per_second": rows / seconds,
                   "seconds": runs[key], "first_in_session_seconds": first.get(key),
                   "bytes": _bytes(outputs[key.split(":")[1]]) if key.startswith("write:")
                   else None}
             for key, seconds in medians.items()}
    cores = spark.sparkContext.defaultParallelism
    spark.stop()
    gunzip = statistics.median(_gunzip_seconds(outputs["ours"]) for _ in range(repeats))
    return {
        "rows": rows, "repeats": repeats, "master": master,
        "session_start_seconds": session_seconds, "paths": paths,
        "executor_import_seconds": executor_imports,
        # The floor under our reader of gzip shards: inflating alone, shared by the cores.
        "gunzip_seconds_per_core": gunzip / cores, "cores": cores,
        "ratios": {
            "per_row_over_ours_write": medians["write:per-row"] / medians["write:ours"],
            "ours_over_parquet_write": medians["write:ours"] / medians["write:parquet"],
            "ours_over_parquet_read": medians["read:ours"] / medians["read:parquet"],
            "ours_plain_over_parquet_read": medians["read:ours-plain"] /
            medians["read:parquet"],
            "gunzip_floor_over_parquet_read": gunzip / cores / medians["read:parquet"],
            "python_floor_over_parquet_read": medians["read:python-floor"] /
            medians["read:parquet"],
            "beam_over_spark_examplegen": medians["examplegen:beam"] /
            medians["examplegen:spark"]},
    }


def table(result: dict) -> Table:
    ratios = result["ratios"]
    return Table(result["paths"], [RATE, MEDIAN], (
        f"SparkSession start: {result['session_start_seconds']:.1f} s; executor imports: "
        f"encode path {result['executor_import_seconds']['encode path']:.1f} s, tensorflow "
        f"{result['executor_import_seconds']['tensorflow']:.1f} s; per-row recipe / our "
        f"write: {ratios['per_row_over_ours_write']:.2f}x; our write / Parquet write: "
        f"{ratios['ours_over_parquet_write']:.2f}x; read_examples / Parquet read: "
        f"{ratios['ours_over_parquet_read']:.2f}x (plain shards "
        f"{ratios['ours_plain_over_parquet_read']:.2f}x; gunzip alone per core "
        f"{ratios['gunzip_floor_over_parquet_read']:.2f}x; Parquet read in Python executors "
        f"{ratios['python_floor_over_parquet_read']:.2f}x); Beam / Spark ExampleGen (whole "
        f"processes): {ratios['beam_over_spark_examplegen']:.2f}x"))
