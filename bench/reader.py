"""`python -m bench reader`: the TensorFlow-free reader on packed and per-row shards, and the PyPI
`tfrecord` package (what PyTorch users commonly read TFRecords with) on the same per-row shards.

Each measurement is a whole child process pinned to one core, with TensorFlow blocked as on a
machine without it: the whole process is timed from outside (imports included) and the read
from inside. All paths read every feature of every row of the same taxi-like data, which
`python -m bench input` also uses; the files are read once beforehand so the page cache is warm.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable

from bench import processes

PATHS = ("tfrecord-package", "ours-packed", "ours-per-row")  # the first is the baseline


def _read(path_name: str, files: list[str], schema_path: str) -> int:
    """Reads every row; returns the row count."""
    if path_name == "tfrecord-package":
        from tfrecord.reader import tfrecord_loader

        return sum(1 for path in files for _ in tfrecord_loader(path, None))
    from shard_readers import numpy_reader
    from tfrecord_shards.codec import schema_file

    schema = schema_file.load_schema(schema_path)
    first = schema.feature[0].name
    return sum(len(batch[first]) for batch in numpy_reader.iter_batches(files, schema))


def _child(path_name: str, files: list[str], schema_path: str) -> dict:
    processes.pin_to_one_core()
    sys.modules["tensorflow"] = None  # as on a machine without TensorFlow
    start = time.perf_counter()
    rows = _read(path_name, files, schema_path)
    return {"rows": rows, "seconds": time.perf_counter() - start}


def run_benchmark(rows: int, work_root: str, repeats: int = 3,
                  log: Callable[[str], None] = print) -> dict:
    from bench import input as input_bench

    data = input_bench.write_data(rows, os.path.join(work_root, f"input-{rows}"))
    inputs = {"ours-packed": (data["packed"], data["packed_schema"]),
              "ours-per-row": (data["tfrecords"], data["schema"]),
              "tfrecord-package": (data["tfrecords"], data["schema"])}
    for path in data["tfrecords"] + data["packed"]:
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass
    return dict(processes.interleaved(PATHS, repeats, rows, lambda name: processes.run_child(
        "bench.reader", [name, inputs[name][1], *inputs[name][0]]), log), cores=1)

if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], sys.argv[3:], sys.argv[2])))
