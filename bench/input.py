"""`python -m bench input`: training input paths over the same taxi-like rows.

Paths, each reading one full epoch of `rows` rows with the same batch size:
  packed      our `build_dataset` over packed records (1,024 rows per Example), first epoch
  packed-again the same dataset's second epoch, read and parsed again from disk (packed
              data is not cached) through a new iterator, in the same process
  service     the packed path with its reading and parsing on a tf.data service (a
              dispatcher and two workers on loopback, in the same process)
  ours        our `build_dataset` (training mode) from per-row TFRecords, first epoch from disk
  ours-cached the same dataset's second epoch, served by `cache()` after parsing
  stock       TFX's stock Trainer path: tfx_bsl `TFExampleRecord.TensorFlowDataset` over the
              raw per-row records (sparse where a value can be missing)
  stock-transformed
              the same tfx_bsl path over per-row records holding exactly the dense features
              the packed path holds: what a stock Trainer reads after Transform
  csv         `tf.data.experimental.make_csv_dataset` over the same rows as CSV
  naive       `TFRecordDataset -> map(parse_single_example) -> batch`, no parallelism

Each path runs as a user runs it, in a whole fresh child process (bench/processes.py): it
imports, builds its dataset and reads its epoch(s); the in-run time of an epoch (its
iterator's start included) is the rate, and the whole process's wall time is beside
(`packed-again` and `ours-cached` share their first epoch's process). The children are
interleaved across repeats and medians reported. Every file is read once beforehand, so
every path starts with a warm page cache.

The consumer is a training loop's: a `tf.function` iterating the dataset in the graph and
counting rows, traced before the clock starts (a training loop traces its step once).
`consumer_floor` reports what it costs alone, and what `Dataset.reduce` costs, the consumer
used before 2026-11-25.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from typing import Callable

from bench.display import MEDIAN, PROCESS, RATE, Table

BATCH_SIZE = 256
NUM_FILES = 8
LABEL = "tips"
PACKED_ROWS = 1024
PATHS = ("packed", "packed-again", "service", "ours", "ours-cached", "stock",
         "stock-transformed", "csv", "naive")


def write_data(rows: int, folder: str) -> dict:
    """Per-row TFRecords (uncompressed, NUM_FILES files), the same rows as CSV files, and
    the checked-in taxi schema. Reused when the stamp says the same rows were written."""
    import pyarrow.csv as pacsv
    import tensorflow as tf

    from testsupport import data
    from tfrecord_shards.codec import serializer

    os.makedirs(folder, exist_ok=True)
    stamp = os.path.join(folder, "stamp")
    tfrecords = [os.path.join(folder, f"data-{i:02d}.tfrecord") for i in range(NUM_FILES)]
    csvs = [os.path.join(folder, f"data-{i:02d}.csv") for i in range(NUM_FILES)]
    packed = [os.path.join(folder, f"packed-{i:02d}.tfrecord") for i in range(NUM_FILES)]
    packed_schema = os.path.join(folder, "packed_schema.pbtxt")
    dense = [os.path.join(folder, f"dense-{i:02d}.tfrecord") for i in range(NUM_FILES)]
    dense_schema = os.path.join(folder, "dense_schema.pbtxt")
    schema_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "schemas", "taxi", "schema.pbtxt")
    version = f"{rows}:{data.SEED}:packed{PACKED_ROWS}:dense:dictionary"
    if not (os.path.exists(stamp) and open(stamp).read() == version):
        table = data.taxi_like_table(rows)
        columns = {name: serializer.arrow_kind(col.type)
                   for name, col in zip(table.column_names, table.columns)}
        per_file = -(-rows // NUM_FILES)
        for i in range(NUM_FILES):
            part = table.slice(i * per_file, per_file)
            pacsv.write_csv(part, csvs[i])
            with tf.io.TFRecordWriter(tfrecords[i]) as writer:
                for batch in part.to_batches(max_chunksize=8192):
                    for record in serializer.encode_examples(serializer.to_example_batch(batch, columns)):
                        writer.write(record)
        _write_dense(table, schema_path, packed, packed_schema, dense, dense_schema)
        with open(stamp, "w") as f:
            f.write(version)
    return {"tfrecords": tfrecords, "csvs": csvs, "packed": packed,
            "packed_schema": packed_schema, "dense": dense, "dense_schema": dense_schema,
            "schema": schema_path}


def uploaded(paths: dict, root: str) -> dict:
    """The bench's files copied to `root` (a URI: gs://, s3://), `paths` with their URIs;
    a file already there at its size is not copied again."""
    from tfrecord_shards import fileio

    moved = {}
    for key, value in paths.items():
        if key not in ("tfrecords", "packed", "packed_schema"):
            continue
        local = value if isinstance(value, list) else [value]
        remote = [fileio.join(root, fileio.basename(p)) for p in local]
        for source, target in zip(local, remote):
            if not fileio.exists(target) or fileio.size(target) != fileio.size(source):
                fileio.copy_file(source, target)
        moved[key] = remote if isinstance(value, list) else remote[0]
    return {**paths, **moved}


def _write_dense(table, schema_path: str, packed_files: list[str], packed_schema: str,
                 dense_files: list[str], dense_schema: str) -> None:
    """The same rows as a Transform would hand them over: every scalar dense (gaps filled with
    the schema default, as the per-row reader fills them). Written twice: packed PACKED_ROWS to
    an Example (ours), and one row per Example with a schema of dense features (stock)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import tensorflow as tf

    from tfrecord_shards import packing
    from tfrecord_shards.packing.write import pack_batch
    from tfrecord_shards.codec import parser, schema_file, serializer

    schema = schema_file.load_schema(schema_path)
    for feature in schema.feature:
        feature.presence.min_fraction = 1.0
        feature.presence.min_count = 1
        feature.ClearField("shape")
        feature.shape.dim.add().size = 1
    schema_file.write_schema(schema, dense_schema)
    features = parser.feature_by_name(schema)
    filled = pa.table({name: pc.fill_null(column, parser.default_value(features[name])
                                          if not pa.types.is_string(column.type) else "")
                       for name, column in zip(table.column_names, table.columns)})
    columns = {name: serializer.arrow_kind(column.type)
               for name, column in zip(filled.column_names, filled.columns)}
    packed = packing.annotate(schema, PACKED_ROWS)
    schema_file.write_schema(packed, packed_schema)
    per_file = -(-filled.num_rows // NUM_FILES)
    for i, (packed_path, dense_path) in enumerate(zip(packed_files, dense_files)):
        part = filled.slice(i * per_file, per_file)
        with tf.io.TFRecordWriter(packed_path) as writer:
            for block in pack_batch(part, packing.PackedLayout.from_schema(packed)):
                writer.write(block)
        with tf.io.TFRecordWriter(dense_path) as writer:
            for batch in part.to_batches(max_chunksize=8192):
                for record in serializer.encode_examples(
                        serializer.to_example_batch(batch, columns)):
                    writer.write(record)


def _rows_in(label):
    import tensorflow as tf

    if isinstance(label, tf.SparseTensor):
        return label.dense_shape[0]
    return tf.shape(label, out_type=tf.int64)[0]


def _counter():
    """A training loop's consumer: every batch is taken in the graph, as a compiled training
    step takes it, and its rows counted; nothing is turned into Python objects."""
    import tensorflow as tf

    @tf.function
    def count_rows(dataset):
        rows = tf.constant(0, tf.int64)
        for batch in dataset:
            rows += _rows_in(batch[1])
        return rows
    return count_rows


def _time_epochs(dataset, rows: int, epochs: int = 1) -> list[float]:
    """Seconds per full pass, each through a new iterator (its start included). The
    consumer is traced first, outside the clock."""
    count_rows = _counter()
    count_rows.get_concrete_function(dataset)
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        seen = int(count_rows(dataset))
        times.append(time.perf_counter() - start)
        if seen != rows:
            raise RuntimeError(f"one pass gave {seen} rows, expected {rows}")
    return times


def _ours(files, schema, rows) -> list[float]:
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    config = InputConfig(batch_size=BATCH_SIZE, cache="memory", num_epochs=1)
    return _time_epochs(build_dataset(files, schema, LABEL, config=config), rows, epochs=2)


def _packed(files, schema, rows) -> list[float]:
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    config = InputConfig(batch_size=BATCH_SIZE, num_epochs=1)
    return _time_epochs(build_dataset(files, schema, LABEL, config=config), rows, epochs=2)


def _service(files, schema, rows) -> list[float]:
    """The packed path with its reading and parsing on tf.data service workers: a dispatcher
    and two workers on loopback ports, in this process."""
    from components.trainer import data_service
    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    dispatcher = data_service.start_dispatcher(port=0)
    workers = [data_service.start_worker(dispatcher.target) for _ in range(2)]
    config = InputConfig(batch_size=BATCH_SIZE, num_epochs=1, data_service=dispatcher.target)
    seconds = _time_epochs(build_dataset(files, schema, LABEL, config=config), rows)
    for server in workers + [dispatcher]:
        server.stop()
    return seconds


def checkpoint_costs(files, schema, steps: int = 50, repeats: int = 3) -> dict:
    """What saving the training iterator costs (tf.train.Checkpoint(iterator=...)) after
    `steps` batches: median seconds and bytes of one save. The shuffle buffers are most of
    it, and packed data buffers whole blocks, not rows."""
    import tempfile

    import tensorflow as tf

    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    iterator = iter(build_dataset(files, schema, LABEL, config=InputConfig(
        batch_size=BATCH_SIZE)))
    for _ in range(steps):
        next(iterator)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    seconds, sizes = [], []
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(repeats):
            start = time.perf_counter()
            prefix = checkpoint.write(os.path.join(folder, f"ckpt-{repeat}"))
            seconds.append(time.perf_counter() - start)
            sizes.append(sum(os.path.getsize(os.path.join(folder, n))
                             for n in os.listdir(folder)
                             if n.startswith(os.path.basename(prefix) + ".")))
    return {"median_seconds": statistics.median(seconds), "bytes": statistics.median(sizes),
            "after_steps": steps, "shuffle_buffer": InputConfig.shuffle_buffer}


def _stock(files, schema, rows) -> list[float]:
    from tfx_bsl.public import tfxio

    source = tfxio.TFExampleRecord(file_pattern=files, schema=schema,
                                   telemetry_descriptors=["bench"])
    dataset = source.TensorFlowDataset(tfxio.TensorFlowDatasetOptions(
        batch_size=BATCH_SIZE, label_key=LABEL, num_epochs=1))
    return _time_epochs(dataset, rows)


def consumer_floor(files, schema, rows: int) -> dict:
    """What the consumer costs alone: one packed batch, already made, passed through a
    prefetch and the consumer as many times as an epoch has batches. Every path pays about
    this much on top of its own work. Beside it, the same through `Dataset.reduce` (the
    consumer before 2026-11-25, which also traced its function inside the clock), and a probe
    of this machine's per-element cost in tf.data (a 100,000-element range through a reduce),
    which moves from day to day here and weighs most on paths that handle rows one by one."""
    import tensorflow as tf

    from components.trainer.input import build_dataset
    from components.trainer.options import InputConfig

    batch = next(iter(build_dataset(files, schema, LABEL, config=InputConfig(
        batch_size=BATCH_SIZE, num_epochs=1))))
    batches = -(-rows // BATCH_SIZE)
    ready = tf.data.Dataset.from_tensors(batch).repeat(batches).prefetch(tf.data.AUTOTUNE)
    ready_seconds = _time_epochs(ready, batches * BATCH_SIZE, epochs=3)
    reduce_seconds = []
    for _ in range(3):
        start = time.perf_counter()
        ready.reduce(tf.constant(0, tf.int64),
                     lambda total, batch: total + _rows_in(batch[1])).numpy()
        reduce_seconds.append(time.perf_counter() - start)
    probe_elements, probe_seconds = 100_000, []
    for _ in range(3):
        start = time.perf_counter()
        tf.data.Dataset.range(probe_elements).reduce(
            tf.constant(0, tf.int64), lambda total, _: total + 1).numpy()
        probe_seconds.append(time.perf_counter() - start)
    return {"ready_batches": batches, "median_seconds": statistics.median(ready_seconds),
            "seconds": ready_seconds,
            "reduce_median_seconds": statistics.median(reduce_seconds),
            "range_reduce_us_per_element": statistics.median(probe_seconds)
            / probe_elements * 1e6}


def _csv(files, schema, rows) -> list[float]:
    import tensorflow as tf

    dataset = tf.data.experimental.make_csv_dataset(
        files, batch_size=BATCH_SIZE, label_name=LABEL, num_epochs=1,
        num_parallel_reads=tf.data.AUTOTUNE)
    return _time_epochs(dataset, rows)


def _naive(files, schema, rows) -> list[float]:
    import tensorflow as tf

    from tfrecord_shards.codec import parser

    spec = parser.feature_spec_from_schema(schema)
    def parse(record):
        features = tf.io.parse_single_example(record, spec)
        return features, features.pop(LABEL)

    dataset = tf.data.TFRecordDataset(files).map(parse).batch(BATCH_SIZE)
    return _time_epochs(dataset, rows)


# Each child: (the function, the files and schema it reads, the paths its epochs report).
CHILDREN = {
    "packed": (_packed, "packed", ("packed", "packed-again")),
    "service": (_service, "packed", ("service",)),
    "ours": (_ours, "tfrecords", ("ours", "ours-cached")),
    "stock": (_stock, "tfrecords", ("stock",)),
    "stock-transformed": (_stock, "dense", ("stock-transformed",)),
    "csv": (_csv, "csvs", ("csv",)),
    "naive": (_naive, "tfrecords", ("naive",)),
}
SCHEMA_OF = {"packed": "packed_schema", "dense": "dense_schema"}


def _child(name: str, rows: int, folder: str, root: str = "") -> dict:
    """One child's work in this (fresh) process: epoch seconds per path it reports; the
    `floor` child measures the consumer alone and the iterator checkpoints instead. With a
    `root`, the files read are the copies there (`uploaded`)."""
    from tfrecord_shards.codec import schema_file

    paths = write_data(rows, folder)
    if root:
        paths = uploaded(paths, root)
    if name == "floor":
        packed_schema = schema_file.load_schema(paths["packed_schema"])
        return {"consumer_floor": consumer_floor(paths["packed"], packed_schema, rows),
                "checkpoint": {
                    "per-row": checkpoint_costs(paths["tfrecords"],
                                                schema_file.load_schema(paths["schema"])),
                    "packed": checkpoint_costs(paths["packed"], packed_schema)}}
    run, files, reports = CHILDREN[name]
    schema = schema_file.load_schema(paths[SCHEMA_OF.get(files, "schema")])
    return {"rows": rows, "epochs": dict(zip(reports, run(paths[files], schema, rows)))}


# The paths also read from an object store with --root: ours from packed and per-row records.
REMOTE_CHILDREN = ("packed", "ours")


def run_benchmark(rows: int, work_root: str, repeats: int = 3,
                  log: Callable[[str], None] = print, root: str = "") -> dict:
    """With a `root` (gs://, s3://), the packed and per-row paths also read copies of the
    files there, in the same repeats, interleaved with the local ones."""
    from bench import processes

    folder = os.path.join(work_root, f"input-{rows}")
    paths = write_data(rows, folder)
    for path in paths["tfrecords"] + paths["csvs"] + paths["packed"] + paths["dense"]:
        # Warm the page cache for every path.
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass
    remote = [(name, f" on {root}") for name in REMOTE_CHILDREN if root]
    if root:
        log(f"copying the files to {root}")
        uploaded(paths, root)
    names = list(PATHS) + [f"{p}{where}" for name, where in remote
                           for p in CHILDREN[name][2]]
    seconds = {p: [] for p in names}
    process_seconds = {p: [] for p in names}
    for repeat in range(repeats):
        for name, where in [(name, "") for name in CHILDREN] + remote:
            sample = processes.run_child("bench.input", [name, str(rows), folder,
                                                         root if where else ""])
            for path, epoch in sample["epochs"].items():
                seconds[path + where].append(epoch)
                process_seconds[path + where].append(sample["process_seconds"])
        log(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
            f"{p} {s[-1]:.2f}s" for p, s in seconds.items()))
    result = {"rows": rows, "repeats": repeats, "batch_size": BATCH_SIZE, "paths": {},
              "root": root}
    stock = statistics.median(seconds["stock"])
    stock_transformed = statistics.median(seconds["stock-transformed"])
    for path, values in seconds.items():
        median = statistics.median(values)
        result["paths"][path] = {"median_seconds": median, "rows_per_second": rows / median,
                                 "median_process_seconds":
                                     statistics.median(process_seconds[path]),
                                 "vs_stock": stock / median,
                                 "vs_stock_transformed": stock_transformed / median,
                                 "seconds": values, "process_seconds": process_seconds[path]}
        result["paths"][path]["vs_local"] = median / statistics.median(
            seconds[path.split(" on ")[0]])
    result["ours_vs_csv"] = statistics.median(seconds["csv"]) / statistics.median(seconds["ours"])
    result["service_overhead"] = statistics.median(seconds["service"]) / \
        statistics.median(seconds["packed"])
    result.update(processes.run_child("bench.input", ["floor", str(rows), folder]))
    result.pop("process_seconds", None)
    return result


def table(result: dict) -> Table:
    saves = "; ".join(f"{name} iterator checkpoint {c['bytes']:,} bytes in "
                      f"{c['median_seconds'] * 1000:.0f} ms"
                      for name, c in result["checkpoint"].items())
    floor = result["consumer_floor"]
    return Table(result["paths"], [
        RATE, MEDIAN, PROCESS, ("vs stock", "vs_stock", "{:.2f}x"),
        ("vs stock-transformed", "vs_stock_transformed", "{:.2f}x")]
        + ([("time vs local", "vs_local", "{:.2f}x")] if result.get("root") else []),
        f"ours (first epoch) vs csv: {result['ours_vs_csv']:.2f}x; service / packed: "
        f"{result['service_overhead']:.2f}x; {saves}; the consumer alone: "
        f"{floor['ready_batches']:,} ready batches in {floor['median_seconds']:.2f} s "
        f"({floor['reduce_median_seconds']:.2f} s through Dataset.reduce), a range "
        f"through reduce {floor['range_reduce_us_per_element']:.1f} us an element")


if __name__ == "__main__":
    import sys

    print(json.dumps(_child(sys.argv[1], int(sys.argv[2]), sys.argv[3], *sys.argv[4:])))
