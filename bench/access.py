"""`python -m bench access`: what reading by index costs.

On the input bench's data (`bench.input.write_data`: taxi-like rows, fixed seed, 8 files, per
row and packed 1,024 rows a block, plain):
- a training epoch of the packed records through the Trainer's input function with the
  global shuffle (a seeded permutation of every block, read by the records' index) against
  today's buffer shuffle, each side a whole child process, interleaved repeat by repeat;
- single records read at random by index (`record_index.FileRecords`) against a sequential
  read of the same files, per-row records, warm page cache, one process;
- the same per-row records written by our sharding writer as seekable gzip (members of
  `gzip_member_kib`, the default), as our gzip before it (one member per 8 MiB chunk) and as
  stock ExampleGen's Beam sink writes them (one zlib stream at level 6): sizes, and random
  single-record reads from each of ours, one process;
- what saving the input's position costs mid-epoch: tf.data's iterator checkpoint of the
  buffer-shuffled packed chain against the global order's position file.
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
# On a bucket each single read is a request: fewer of them, and the first batches of the
# global order's per-row reads (each batch's ranges coalesced).
REMOTE_READS = 500
REMOTE_BATCHES = 20


def _epoch(shuffle: str, rows: int, folder: str, root: str = "") -> dict:
    """One epoch of packed records through `build_dataset`, in this (fresh) process; with a
    `root`, from the copies there (`uploaded`)."""
    import tensorflow as tf

    from bench import input as input_bench
    from tfrecord_shards import fileio
    from tfrecord_shards.codec import schema_file
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    paths = input_bench.write_data(rows, folder)
    if root:
        paths = input_bench.uploaded(paths, root)
    schema = schema_file.load_schema(paths["packed_schema"])
    dataset = build_dataset(paths["packed"], schema, input_bench.LABEL, config=InputConfig(
        batch_size=input_bench.BATCH_SIZE, num_epochs=1, shuffle=shuffle))
    started, seen = time.perf_counter(), 0
    for _, label in dataset:
        seen += int(tf.shape(label)[0])
    seconds = time.perf_counter() - started
    if seen != rows:
        raise RuntimeError(f"{shuffle}: an epoch gave {seen} rows of {rows}")
    return {"seconds": seconds, "rows": seen, "ranged_reads": fileio.ranged_reads,
            "ranged_mib": fileio.ranged_bytes / 2**20}


def _remote_reads(rows: int, folder: str, root: str) -> dict:
    """Per-row records by index from the copies at `root`: single records at random (one
    ranged read each) and the same records a batch of the global order at a time
    (`FileRecords.read`: ranges coalesced), each with the ranged reads sent."""
    import numpy as np

    from bench import input as input_bench
    from tfrecord_shards import fileio, record_index

    files = input_bench.uploaded(input_bench.write_data(rows, folder), root)["tfrecords"]
    started = time.perf_counter()
    records = record_index.FileRecords(files)
    index_seconds = time.perf_counter() - started
    picks = random.Random(0).sample(range(len(records)), min(REMOTE_READS, len(records)))
    before, started = fileio.ranged_reads, time.perf_counter()
    for number in picks:
        records[number]
    single = {"reads_per_second": len(picks) / (time.perf_counter() - started),
              "ranged_reads": fileio.ranged_reads - before, "records": len(picks)}
    batch = input_bench.BATCH_SIZE
    order = np.random.default_rng(0).permutation(len(records))[:REMOTE_BATCHES * batch]
    before, started = fileio.ranged_reads, time.perf_counter()
    for first in range(0, len(order), batch):
        records.read(order[first:first + batch])
    batched = {"records_per_second": len(order) / (time.perf_counter() - started),
               "ranged_reads": fileio.ranged_reads - before, "records": len(order)}
    return {"index_seconds": index_seconds, "single": single, "batched": batched}


def _reads(rows: int, folder: str) -> dict:
    """Random single-record reads per second, and a sequential read's records per second."""
    from bench import input as input_bench
    from tfrecord_shards import record_index, tfrecord_io

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


def _gzip(rows: int, folder: str) -> dict:
    """Sizes of the three gzip layouts and random reads from ours (see the module's text)."""
    import gzip as gzip_module
    import shutil

    from bench import input as input_bench
    from tfrecord_shards import record_index, shards, tfrecord_io

    files = input_bench.write_data(rows, folder)["tfrecords"]
    records = [bytes(block.buffer[s:e]) for path in files
               for block in tfrecord_io.iter_record_blocks(path)
               for s, e in zip(block.starts.tolist(), block.ends.tolist())]
    result = {}
    for name, member_kib in (("seekable", shards.ShardingOptions.gzip_member_kib),
                             ("8 MiB members", 8192)):
        out = os.path.join(folder, f"gzip-{member_kib}")
        shutil.rmtree(out, ignore_errors=True)
        sharding = shards.ShardingOptions(num_shards=len(files), gzip_member_kib=member_kib)
        writer = shards.ChunkWriter(os.path.join(out, "_chunks"), 0, sharding)
        for start in range(0, len(records), 50_000):
            writer.add("", "train", records[start:start + 50_000])
        written = [shards.write_shard(spec, out, sharding)
                   for spec in shards.plan_shards(writer.close(), sharding)]
        shards.write_manifest(out, shards.build_manifest(written, [], "gzip", 0))
        paths = [os.path.join(out, shard.path) for shard in written]
        readable = record_index.FileRecords(paths)
        picks = random.Random(0).sample(range(len(readable)), min(RANDOM_READS, len(readable)))
        started = time.perf_counter()
        for number in picks:
            readable[number]
        seconds = time.perf_counter() - started
        result[name] = {"bytes": sum(shard.nbytes for shard in written),
                        "members": sum(len(shard.gzip_members) for shard in written),
                        "random_reads_per_second": len(picks) / seconds}
    framed = [open(path, "rb").read() for path in files]
    result["stock (one zlib stream, level 6)"] = {
        "bytes": sum(len(gzip_module.compress(data, 6)) for data in framed)}
    reference = result["8 MiB members"]["bytes"]
    for entry in result.values():
        entry["size_vs_8mib"] = entry["bytes"] / reference - 1
    return result


def _checkpoint(rows: int, folder: str) -> dict:
    """Bytes and seconds to save the input's position after 100 batches of an epoch."""
    import tempfile

    import tensorflow as tf

    from bench import input as input_bench
    from tfrecord_shards import fileio
    from tfrecord_shards.codec import schema_file
    from components.trainer import fit
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    paths = input_bench.write_data(rows, folder)
    schema = schema_file.load_schema(paths["packed_schema"])
    dataset = build_dataset(paths["packed"], schema, input_bench.LABEL, config=InputConfig(
        batch_size=input_bench.BATCH_SIZE, num_epochs=1))
    iterator = iter(dataset)
    for _ in range(100):
        next(iterator)
    scratch = tempfile.mkdtemp(dir=folder)
    started = time.perf_counter()
    prefix = tf.train.Checkpoint(iterator=iterator).write(os.path.join(scratch, "iterator"))
    iterator_seconds = time.perf_counter() - started
    iterator_bytes = sum(tf.io.gfile.stat(f).length for f in tf.io.gfile.glob(prefix + ".*"))
    started = time.perf_counter()
    text = fit.input_position_text(42, 100, 0, 100 * input_bench.BATCH_SIZE)
    fileio.write_text(os.path.join(scratch, "ckpt-100" + fit.INPUT_POSITION_SUFFIX), text)
    position_seconds = time.perf_counter() - started
    fileio.rmtree(scratch)
    return {"iterator_bytes": iterator_bytes, "iterator_seconds": iterator_seconds,
            "position_bytes": len(text), "position_seconds": position_seconds}


def run_benchmark(rows: int, work_root: str, repeats: int = 3,
                  log: Callable[[str], None] = print, root: str = "") -> dict:
    """With a `root` (gs://, s3://), the epochs also read copies of the files there, in the
    same repeats, and random reads from there are measured beside the local ones."""
    from bench import input as input_bench
    from bench import processes

    folder = os.path.join(work_root, f"input-{rows}")
    paths = input_bench.write_data(rows, folder)
    for path in paths["packed"] + paths["tfrecords"]:
        with open(path, "rb") as f:  # warm the page cache
            while f.read(16 << 20):
                pass
    sides = [(s, "") for s in SHUFFLES] + [(f"{s} on {root}", root) for s in SHUFFLES
                                           if root]
    samples: dict[str, list[dict]] = {name: [] for name, _ in sides}
    if root:
        log(f"copying the files to {root}")
        input_bench.uploaded(paths, root)
    for repeat in range(repeats):
        for name, where in sides:
            samples[name].append(processes.run_child(
                "bench.access", ["epoch", name.split()[0], str(rows), folder, where]))
        log(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
            f"{s} {samples[s][-1]['seconds']:.2f}s" for s in samples))
    result = {"rows": rows, "repeats": repeats, "shuffles": {}, "root": root,
              "packed_mib": sum(os.path.getsize(p) for p in paths["packed"]) / 2**20}
    for name, _ in sides:
        median = statistics.median(s["seconds"] for s in samples[name])
        result["shuffles"][name] = {
            "median_seconds": median, "rows_per_second": rows / median,
            "median_process_seconds": statistics.median(
                s["process_seconds"] for s in samples[name]),
            "ranged_reads": statistics.median(s["ranged_reads"] for s in samples[name]),
            "ranged_mib": statistics.median(s["ranged_mib"] for s in samples[name])}
    for name, entry in result["shuffles"].items():
        entry["vs_buffer"] = entry["median_seconds"] / \
            result["shuffles"]["buffer"]["median_seconds"]
        entry["vs_local"] = entry["median_seconds"] / \
            result["shuffles"][name.split()[0]]["median_seconds"]
    if root:
        result["remote_reads"] = processes.run_child("bench.access",
                                                     ["remote_reads", str(rows), folder, root])
    result["reads"] = processes.run_child("bench.access", ["reads", str(rows), folder])
    result["gzip"] = processes.run_child("bench.access", ["gzip", str(rows), folder])
    result["checkpoint"] = processes.run_child("bench.access", ["checkpoint", str(rows), folder])
    return result


def table(result: dict) -> Table:
    reads, checkpoint = result["reads"], result["checkpoint"]
    layouts = "; ".join(
        f"{name} {entry['bytes'] / 2**20:,.1f} MiB ({entry['size_vs_8mib']:+.1%})"
        + (f", {entry['random_reads_per_second']:,.0f} random reads/s"
           if "random_reads_per_second" in entry else "")
        for name, entry in result["gzip"].items() if isinstance(entry, dict))
    return Table(
        {f"packed epoch, {name.replace(' on ', ' shuffle on ')}"
         + ("" if " on " in name else " shuffle"): row
         for name, row in result["shuffles"].items()},
        [("rows/s", "rows_per_second", "{:,.0f}"), ("median s", "median_seconds", "{:.2f}"),
         ("process s", "median_process_seconds", "{:.2f}"),
         ("vs buffer", "vs_buffer", "{:.2f}x"), ("vs local", "vs_local", "{:.2f}x"),
         ("ranged reads", "ranged_reads", "{:,.0f}"), ("MiB asked", "ranged_mib", "{:,.1f}")],
        summary=f"per-row records by index: {reads['random_reads_per_second']:,.0f} random "
                f"reads/s, sequential {reads['sequential_records_per_second']:,.0f} records/s "
                f"(index built in {reads['index_seconds']:.2f} s); {result['rows']:,} rows, "
                f"packed files {result['packed_mib']:,.1f} MiB\n"
                f"gzip, per-row records: {layouts}\n"
                f"input position mid-epoch: tf.data iterator checkpoint "
                f"{checkpoint['iterator_bytes']:,} bytes in {checkpoint['iterator_seconds']:.3f}"
                f" s; global order's position {checkpoint['position_bytes']:,} bytes in "
                f"{checkpoint['position_seconds']:.4f} s" + _remote_summary(result))


def _remote_summary(result: dict) -> str:
    remote = result.get("remote_reads")
    if not remote:
        return ""
    single, batched = remote["single"], remote["batched"]
    return (f"\nper-row records by index on {result['root']}: {single['reads_per_second']:,.0f}"
            f" single random reads/s ({single['ranged_reads']:,} ranged reads for "
            f"{single['records']:,} records); a batch of the global order at a time "
            f"{batched['records_per_second']:,.0f} records/s ({batched['ranged_reads']:,} "
            f"ranged reads for {batched['records']:,} records)")


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "epoch":
        print(json.dumps(_epoch(sys.argv[2], int(sys.argv[3]), sys.argv[4], *sys.argv[5:])))
    elif sys.argv[1] == "remote_reads":
        print(json.dumps(_remote_reads(int(sys.argv[2]), sys.argv[3], sys.argv[4])))
    else:
        measure = {"reads": _reads, "gzip": _gzip, "checkpoint": _checkpoint}[sys.argv[1]]
        print(json.dumps(measure(int(sys.argv[2]), sys.argv[3])))
