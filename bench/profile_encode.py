"""Where the encode of one batch spends its time: `python -m bench.profile_encode [ROWS]`.

ExampleGen's per-batch work (`example_gen.encode.encode_batch`, which the Beam job, the Spark
writer's tasks and so Spark's ExampleGen all run), a stage at a time, on the seeded taxi-like
table cut into batches of 10,000 rows (Spark's default Arrow batch), in one process pinned to
one core. The split hash of the numeric columns is timed beside its reference, pandas'
`hash_array` of each column folded the same way (what `splits.hash_rows` computed with before
its compiled loop), and the two are checked equal. Best and median of 5.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

BATCH_ROWS = 10_000


def _pandas_hash_rows(batch, columns: list[str]):
    """The reference: pandas' hash of each numeric column's values in its own type, a null
    hashing as None does, folded as `splits.hash_rows` folds them."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    from components.example_gen.splits import HASH_STEP

    none_hash = pd.util.hash_array(np.array([None], dtype=object), categorize=False)[0]
    combined = np.zeros(batch.num_rows, np.uint64)
    for name in columns:
        array = batch.column(batch.schema.get_field_index(name))
        filled = pc.fill_null(array, pa.scalar(0, array.type)) if array.null_count else array
        hashed = pd.util.hash_array(filled.to_numpy(zero_copy_only=False), categorize=False)
        hashed[~array.is_valid().to_numpy(zero_copy_only=False)] = none_hash
        combined = combined * HASH_STEP ^ hashed
    return combined


def main(rows: int) -> dict:
    import numpy as np

    from bench import processes
    from testsupport import data
    from tfrecord_shards import tfrecord_io
    from tfrecord_shards.codec import serializer
    from components.example_gen import encode, splits
    from components.example_gen.options import ExampleGenOptions
    from components.example_gen.sources.base import FileProfile
    from tfrecord_shards.shards import gzip_member

    processes.pin_to_one_core()
    table = data.taxi_like_table(rows)
    kinds = {n: serializer.arrow_kind(c.type) for n, c in zip(table.column_names, table.columns)}
    batches = table.to_batches(max_chunksize=BATCH_ROWS)
    columns = list(kinds)
    options, profile = ExampleGenOptions(source="bench"), FileProfile(columns=kinds)
    split_names, weights, _ = encode.split_plan(options, kinds)
    numeric = [n for n, (kind, _) in kinds.items() if kind in (serializer.INT, serializer.FLOAT)]
    for batch in batches[:3]:
        np.testing.assert_array_equal(splits.hash_rows(batch, numeric),
                                      _pandas_hash_rows(batch, numeric))
    example_batches = [serializer.to_example_batch(b, kinds) for b in batches]
    orders = [np.argsort(splits.split_index(splits.hash_rows(b, columns), weights),
                         kind="stable") for b in batches]
    records = [serializer.encode_examples_array(b, o) for b, o in zip(example_batches, orders)]
    framed = [tfrecord_io.frame_records(r)[0].tobytes() for r in records]
    # Each stage drops a batch's output before the next batch, as the writers do: holding
    # them all would time the kernel's page faults for fresh memory instead.
    stages = {
        "split hash of the numeric columns: pandas' hash_array (the reference)":
            (_pandas_hash_rows, [(b, numeric) for b in batches]),
        "split hash of the numeric columns: ours (splits.hash_rows)":
            (splits.hash_rows, [(b, numeric) for b in batches]),
        "split hash of every column (splits.hash_rows)":
            (splits.hash_rows, [(b, columns) for b in batches]),
        "to list<T> columns (serializer.to_example_batch)":
            (serializer.to_example_batch, [(b, kinds) for b in batches]),
        "encode, rows grouped by split (serializer.encode_examples_array)":
            (serializer.encode_examples_array, list(zip(example_batches, orders))),
        "TFRecord framing, both CRCs (tfrecord_io.frame_records)":
            (tfrecord_io.frame_records, [(r,) for r in records]),
        "gzip level 1 (shards.gzip_member)": (gzip_member, [(f, 1) for f in framed]),
        "the whole of encode_batch (hash, group, to_example_batch, encode)":
            (encode.encode_batch, [(options, "bench", b, profile, split_names, weights, columns)
                                   for b in batches]),
    }
    results = {}
    for name, (stage, arguments) in stages.items():
        stage(*arguments[0])  # compiled loops loaded
        seconds = []
        for _ in range(5):
            start = time.perf_counter()
            for each in arguments:
                stage(*each)
            seconds.append(time.perf_counter() - start)
        results[name] = {"best_seconds": min(seconds), "median_seconds": statistics.median(
            seconds), "seconds": seconds}
        print(f"{name}: median {statistics.median(seconds):.3f}s", file=sys.stderr)
    return {"rows": rows, "batch_rows": BATCH_ROWS, "cores": 1, "stages": results,
            "record_bytes": int(sum(r.nbytes for r in records)),
            "batches": len(batches), "columns": len(columns)}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000), indent=2))
