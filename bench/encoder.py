"""`tfrp bench encoder`: our columnar tf.Example encoder against tfx_bsl's
RecordBatchToExamplesEncoder on the same taxi-like record batches, one core each.

Each side runs in a whole child process pinned to one core: it builds the same seeded table,
converts it to the encoders' list<T> batches of 65,536 rows (untimed; the same work for
both), then times encoding every batch. Both produce a Python list of serialized Examples
(the same output form); `ours-arrow` also reports our encoder's native output, one Arrow
binary array per batch, which is what ExampleGen and Transform write from. The whole process
time, imports and data included, is reported beside.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

ENCODERS = ("tfx_bsl", "ours", "ours-arrow")
BATCH_ROWS = 65_536


def _child(encoder: str, rows: int) -> dict:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from bench import data
    from components.codec import serializer

    table = data.taxi_like_table(rows)
    kinds = {n: serializer.arrow_kind(c.type) for n, c in zip(table.column_names, table.columns)}
    batches = [serializer.to_example_batch(b, kinds)
               for b in table.to_batches(max_chunksize=BATCH_ROWS)]
    if encoder == "tfx_bsl":
        from tfx_bsl.coders import example_coder

        encode = example_coder.RecordBatchToExamplesEncoder().encode
    elif encoder == "ours":
        encode = serializer.encode_examples
    else:
        encode = serializer.encode_examples_array
    start = time.perf_counter()
    encoded = sum(len(encode(batch)) for batch in batches)
    return {"rows": encoded, "encode_seconds": time.perf_counter() - start}


def measure(encoder: str, rows: int) -> dict:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "bench.encoder", encoder, str(rows)],
                         capture_output=True, text=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    whole = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{encoder} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]), process_seconds=whole)


def run_benchmark(rows: int, repeats: int = 3, log: Callable[[str], None] = print) -> dict:
    runs: dict[str, list[dict]] = {name: [] for name in ENCODERS}
    for repeat in range(repeats):
        for name in ENCODERS:  # interleaved, so drift in the machine hits every side alike
            runs[name].append(measure(name, rows))
        log(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
            f"{n} {runs[n][-1]['encode_seconds']:.2f}s" for n in ENCODERS))
    result = {"rows": rows, "repeats": repeats, "cores": 1, "batch_rows": BATCH_ROWS,
              "paths": {}}
    for name, items in runs.items():
        seconds = statistics.median(r["encode_seconds"] for r in items)
        result["paths"][name] = {
            "rows_per_second": rows / seconds, "median_seconds": seconds,
            "median_process_seconds": statistics.median(r["process_seconds"] for r in items),
            "encode_seconds": [r["encode_seconds"] for r in items]}
    base = result["paths"]["tfx_bsl"]["rows_per_second"]
    for entry in result["paths"].values():
        entry["vs_tfx_bsl"] = entry["rows_per_second"] / base
    return result


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], int(sys.argv[2]))))
