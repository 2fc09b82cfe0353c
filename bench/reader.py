"""`tfrp bench reader`: the TensorFlow-free reader on packed and per-row shards, and the PyPI
`tfrecord` package (what PyTorch users commonly read TFRecords with) on the same per-row shards.

Each measurement is a whole child process pinned to one core, with TensorFlow blocked as on a
machine without it: the whole process is timed from outside (imports included) and the read
from inside. All paths read every feature of every row of the same taxi-like data, which
`tfrp bench input` also uses; the files are read once beforehand so the page cache is warm.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

PATHS = ("ours-packed", "ours-per-row", "tfrecord-package")


def _read(path_name: str, files: list[str], schema_path: str) -> int:
    """Reads every row; returns the row count."""
    if path_name == "tfrecord-package":
        from tfrecord.reader import tfrecord_loader

        return sum(1 for path in files for _ in tfrecord_loader(path, None))
    from components import numpy_reader
    from components.codec import schema_file

    schema = schema_file.load_schema(schema_path)
    first = schema.feature[0].name
    return sum(len(batch[first]) for batch in numpy_reader.iter_batches(files, schema))


def _child(path_name: str, files: list[str], schema_path: str) -> dict:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    sys.modules["tensorflow"] = None  # as on a machine without TensorFlow
    start = time.perf_counter()
    rows = _read(path_name, files, schema_path)
    return {"rows": rows, "read_seconds": time.perf_counter() - start}


def measure(path_name: str, files: list[str], schema_path: str) -> dict:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "bench.reader", path_name, schema_path, *files],
                         capture_output=True, text=True)
    whole = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{path_name} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]), process_seconds=whole)


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
    runs: dict[str, list[dict]] = {name: [] for name in PATHS}
    for repeat in range(repeats):
        for name in PATHS:  # interleaved, so drift in the machine hits every path alike
            runs[name].append(measure(name, *inputs[name]))
            if runs[name][-1]["rows"] != rows:
                raise RuntimeError(f"{name} read {runs[name][-1]['rows']} rows, not {rows}")
        log(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
            f"{n} {runs[n][-1]['read_seconds']:.2f}s" for n in PATHS))
    result = {"rows": rows, "repeats": repeats, "cores": 1, "paths": {}}
    for name, items in runs.items():
        read = statistics.median(r["read_seconds"] for r in items)
        result["paths"][name] = {
            "rows_per_second": rows / read, "median_seconds": read,
            "median_process_seconds": statistics.median(r["process_seconds"] for r in items),
            "read_seconds": [r["read_seconds"] for r in items]}
    base = result["paths"]["tfrecord-package"]["rows_per_second"]
    for entry in result["paths"].values():
        entry["vs_tfrecord_package"] = entry["rows_per_second"] / base
    return result


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], sys.argv[3:], sys.argv[2])))
