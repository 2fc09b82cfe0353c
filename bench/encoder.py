"""`python -m bench encoder`: our columnar tf.Example encoder against tfx_bsl's
RecordBatchToExamplesEncoder on the same taxi-like record batches, one core each.

Each side runs in a whole child process pinned to one core: it builds the same seeded table,
converts it to the encoders' list<T> batches of 65,536 rows (untimed; the same work for
both), encodes one row to get ready (untimed: tfx_bsl builds its encoder, ours loads its
compiled loops), then times encoding every batch. Both produce a Python list of serialized Examples
(the same output form); `ours-arrow` also reports our encoder's native output, one Arrow
binary array per batch, which is what ExampleGen and Transform write from. The whole process
time, imports and data included, is reported beside.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Callable

from bench import processes

ENCODERS = ("tfx_bsl", "ours", "ours-arrow")  # the first is the baseline
BATCH_ROWS = 65_536


def _child(encoder: str, rows: int) -> dict:
    processes.pin_to_one_core()
    from testsupport import data
    from tfrecord_shards.codec import serializer

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
    # Each side is ready before the clock starts: tfx_bsl's encoder is built, and ours has
    # loaded its compiled loops (numba's cache), by encoding one row. Both costs are in the
    # whole-process time.
    encode(batches[0].slice(0, 1))
    start = time.perf_counter()
    encoded = sum(len(encode(batch)) for batch in batches)
    return {"rows": encoded, "seconds": time.perf_counter() - start}


def run_benchmark(rows: int, repeats: int = 3, log: Callable[[str], None] = print) -> dict:
    return dict(processes.interleaved(ENCODERS, repeats, rows, lambda name: processes.run_child(
        "bench.encoder", [name, str(rows)]), log), cores=1, batch_rows=BATCH_ROWS)

if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], int(sys.argv[2]))))
