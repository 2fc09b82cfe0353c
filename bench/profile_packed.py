"""Where the packed first epoch spends its time: `python -m bench.profile_packed [FOLDER]`.

Reads the packed files `python -m bench input` wrote (FOLDER, default
tfrp_runs/bench/input-1000000) in one warm process, adding one stage at a time: the read, the
parse of the label alone, the unpack, the rebatch, then `build_dataset` with the label alone,
the numeric features and all of them, and all of them with the settings per-row records keep
(a final prefetch, ops free to use the thread pool). Best and median of 3 passes each,
consumed in the TF runtime through `Dataset.reduce` (`python -m bench input` uses a traced loop).
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import sys
import time


def main(folder: str) -> dict:
    import tensorflow as tf
    from tensorflow_metadata.proto.v0 import schema_pb2

    from bench import input as bench_input
    from tfrecord_shards import packing
    from tfrecord_shards.packing import graph as packed_graph
    from tfrecord_shards.codec import schema_file
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    files = sorted(glob.glob(os.path.join(folder, "packed-*.tfrecord")))
    schema = schema_file.load_schema(os.path.join(folder, "packed_schema.pbtxt"))
    label = bench_input.LABEL
    autotune = tf.data.AUTOTUNE
    results = {}

    def timed(name: str, dataset, count=lambda total, _: total + 1) -> None:
        seconds = []
        for _ in range(3):
            start = time.perf_counter()
            int(dataset.reduce(tf.constant(0, tf.int64), count))
            seconds.append(time.perf_counter() - start)
        results[name] = {"best": min(seconds), "median": statistics.median(seconds)}
        print(f"{name}: median {results[name]['median']:.3f} s", file=sys.stderr)

    def rows(total, batch):
        return total + bench_input._rows_in(batch[1])

    layout = packing.PackedLayout.from_schema(schema)
    spec = packed_graph.block_spec(layout, [label])
    records = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=8 << 20),
        cycle_length=autotune, num_parallel_calls=autotune, deterministic=False)
    unpacked = records.batch(10).map(
        lambda blocks: packed_graph.unpack(tf.io.parse_example(blocks, spec), layout, [label]),
        num_parallel_calls=autotune, deterministic=False)
    timed("read: records, sequential", tf.data.TFRecordDataset(files))
    timed("read: records, parallel interleave", records)
    timed("+ parse the label (10 blocks a map)", records.batch(10).map(
        lambda blocks: tf.io.parse_example(blocks, spec), num_parallel_calls=autotune,
        deterministic=False))
    timed("+ unpack", unpacked)
    timed(f"+ rebatch({bench_input.BATCH_SIZE})", unpacked.rebatch(bench_input.BATCH_SIZE))
    numeric = [f.name for f in schema.feature if f.type != schema_pb2.BYTES and f.name != label]
    results.update(_move_numbers(files, schema, numeric))
    for name, keys in (("label only", []), (f"{len(numeric)} numeric features", numeric),
                       ("every feature", None)):
        config = InputConfig(batch_size=bench_input.BATCH_SIZE, num_epochs=1)
        timed(f"build_dataset, training, {name}", build_dataset(
            files, schema, label, feature_keys=keys, config=config), rows)
    # The settings per-row records keep: a final prefetch and ops free to use the pool.
    config = InputConfig(batch_size=bench_input.BATCH_SIZE, num_epochs=1, prefetch=True,
                         intra_op_threads=0)
    timed("build_dataset, training, every feature, final prefetch, pooled ops",
          build_dataset(files, schema, label, config=config), rows)
    return results


def _move_numbers(files: list, schema, names: list) -> dict:
    """One group's numeric columns (10 blocks) put in a shuffled row order, by TF's gather and
    by the bit-pattern scatter `packing.graph.unpack` uses; checked equal, bit for bit."""
    import numpy as np
    import tensorflow as tf

    from tfrecord_shards import packing
    from tfrecord_shards.packing import graph as packed_graph

    parsed = tf.io.parse_example(next(iter(tf.data.TFRecordDataset(files[0]).batch(10))),
                                 packed_graph.block_spec(
                                     packing.PackedLayout.from_schema(schema), names))
    columns = [tf.reshape(parsed[name], [-1, 1]) for name in names]
    index = tf.random.experimental.stateless_shuffle(
        tf.range(tf.shape(columns[0])[0], dtype=tf.int64), seed=[0, 1])
    destination = packed_graph._destinations(index, tf.size(index))
    ways = {"gather": tf.function(lambda: [tf.gather(c, index) for c in columns]),
            "scatter": tf.function(lambda: [packed_graph._move_rows(c, index, destination)
                                             for c in columns])}
    moved = {way: move() for way, move in ways.items()}
    for by_gather, by_scatter in zip(moved["gather"], moved["scatter"]):
        if not np.array_equal(by_gather.numpy().view(np.uint8),
                              by_scatter.numpy().view(np.uint8)):
            raise AssertionError("the scatter moved a value differently from the gather")
    results = {}
    for way, move in ways.items():
        seconds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(100):
                move()
            seconds.append((time.perf_counter() - start) / 100)
        name = f"move {len(names)} numeric columns of one group ({int(tf.size(index))} rows), {way}"
        results[name] = {"best": min(seconds), "median": statistics.median(seconds)}
        print(f"{name}: median {results[name]['median'] * 1e3:.3f} ms", file=sys.stderr)
    return results


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else
                          "tfrp_runs/bench/input-1000000"), indent=2))
