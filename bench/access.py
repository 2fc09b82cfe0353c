"""`tfrp bench access`: what reading by index costs.

On the input bench's data (`bench.input.write_data`: taxi-like rows, fixed seed, 8 files, per
row and packed 1,024 rows a block, plain):
- a training epoch of the packed records through the Trainer's input function with the
  global shuffle (a seeded permutation of every block, read by the records' index) against
  today's buffer shuffle, each side a whole child process, interleaved repeat by repeat;
- single records read at random by index (`record_index.FileRecords`) against a sequential
  read of the same files, per-row records, warm page cache, one process.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import time
from typing import Callable

from bench.display import Table

SHUFFLES = ("buffer", "global")
RANDOM_READS = 20_000


def _epoch(shuffle: str, rows: int, folder: str) -> dict:
    """One epoch of packed records through `build_dataset`, in this (fresh) process."""
    import tensorflow as tf

    from bench import input as input_bench
    from components.codec import schema_file
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    paths = input_bench.write_data(rows, folder)
    schema = schema_file.load_schema(paths["packed_schema"])
    dataset = build_dataset(paths["packed"], schema, input_bench.LABEL, config=InputConfig(
        batch_size=input_bench.BATCH_SIZE, num_epochs=1, shuffle=shuffle))
    started, seen = time.perf_counter(), 0
    for _, label in dataset:
        seen += int(tf.shape(label)[0])
    seconds = time.perf_counter() - started
    if seen != rows:
        raise RuntimeError(f"{shuffle}: an epoch gave {seen} rows of {rows}")
    return {"seconds": seconds, "rows": seen}


def _reads(rows: int, folder: str) -> dict:
    """Random single-record reads per second, and a sequential read's records per second."""
    from bench import input as input_bench
    from components import record_index, tfrecord_io

    files = input_bench.write_data(rows, folder)["tfrecords"]
    started = time.perf_counter()
    records = record_index.FileRecords(files)  # builds each file's index in one pass
    index_seconds = time.perf_counter() - started
    picks = random.Random(0).sample(range(len(records)), min(RANDOM_READS, len(records)))
    started = time.perf_counter()
    for number in picks:
        records[number]
    random_seconds = time.perf_counter() - started
    started, sequential = time.perf_counter(), 0
    for path in files:
        for block in tfrecord_io.iter_record_blocks(path):
            sequential += len(block.ends)
    sequential_seconds = time.perf_counter() - started
    return {"index_seconds": index_seconds,
            "random_reads_per_second": len(picks) / random_seconds,
            "sequential_records_per_second": sequential / sequential_seconds}


def run_benchmark(rows: int, work_root: str, repeats: int = 3,
                  log: Callable[[str], None] = print) -> dict:
    from bench import input as input_bench
    from bench import processes

    folder = os.path.join(work_root, f"input-{rows}")
    paths = input_bench.write_data(rows, folder)
    for path in paths["packed"] + paths["tfrecords"]:
        with open(path, "rb") as f:  # warm the page cache
            while f.read(16 << 20):
                pass
    samples: dict[str, list[dict]] = {s: [] for s in SHUFFLES}
    for repeat in range(repeats):
        for shuffle in SHUFFLES:
            samples[shuffle].append(processes.run_child(
                "bench.access", ["epoch", shuffle, str(rows), folder]))
        log(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
            f"{s} {samples[s][-1]['seconds']:.2f}s" for s in SHUFFLES))
    result = {"rows": rows, "repeats": repeats, "shuffles": {}}
    for shuffle in SHUFFLES:
        median = statistics.median(s["seconds"] for s in samples[shuffle])
        result["shuffles"][shuffle] = {
            "median_seconds": median, "rows_per_second": rows / median,
            "median_process_seconds": statistics.median(
                s["process_seconds"] for s in samples[shuffle])}
    for entry in result["shuffles"].values():
        entry["vs_buffer"] = entry["median_seconds"] / \
            result["shuffles"]["buffer"]["median_seconds"]
    result["reads"] = processes.run_child("bench.access", ["reads", str(rows), folder])
    return result


def table(result: dict) -> Table:
    reads = result["reads"]
    return Table(
        {f"packed epoch, {name} shuffle": row for name, row in result["shuffles"].items()},
        [("rows/s", "rows_per_second", "{:,.0f}"), ("median s", "median_seconds", "{:.2f}"),
         ("process s", "median_process_seconds", "{:.2f}"),
         ("vs buffer", "vs_buffer", "{:.2f}x")],
        summary=f"per-row records by index: {reads['random_reads_per_second']:,.0f} random "
                f"reads/s, sequential {reads['sequential_records_per_second']:,.0f} records/s "
                f"(index built in {reads['index_seconds']:.2f} s); {result['rows']:,} rows")


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "epoch":
        print(json.dumps(_epoch(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
    else:
        print(json.dumps(_reads(int(sys.argv[2]), sys.argv[3])))
