"""Where the Spark write spends its time: `python -m bench.profile_spark_write [ROWS]`.

On the cached DataFrame `python -m bench spark --rows ROWS` reads (its Parquet copy, repartitioned
to the same 4 partitions), one stage of `write_examples` at a time, each a Spark job on
local[2]: Arrow batches handed to Python executors and only counted (the floor under any
writer with no jar), then also encoded (ExampleGen's encoder, split hash included, the
output dropped), then the encode and chunk files (write_examples' first phase), then the
shards cut from those chunks (its second phase), plain and gzip (gzip chunks are gzipped in
the first phase); Spark's Parquet write beside.
Median of 3 each.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time


def main(rows: int, work_root: str = "tfrp_runs/bench") -> dict:
    import pyarrow as pa

    from bench.spark import SHARDS
    from tfrecord_shards import shards
    from components.example_gen import encode
    from components.example_gen.options import ExampleGenOptions
    from tfrecord_shards.shards import ShardingOptions
    from spark_shards import columns as spark_columns
    from components.example_gen import spark_write as write
    from spark_shards.session import get_session

    spark = get_session("local[2]")
    parquet = os.path.join(work_root, f"spark-{rows}", "source.parquet")
    df = spark.read.parquet(parquet).repartition(SHARDS).cache()
    assert df.count() == rows
    planned = spark_columns.plan_columns(df.schema)
    features = spark_columns.select_features(df, planned)
    kinds = write._kinds(features, [c.name for c in planned])
    names = list(kinds)
    options = ExampleGenOptions(source="profile", format=write.FORMAT, engine="spark")

    def count_only(batches):
        total = sum(batch.num_rows for batch in batches)
        yield pa.RecordBatch.from_arrays([pa.array([total])], ["rows"])

    def encode_only(batches):
        from components.example_gen.sources.base import FileProfile

        split_names, weights, key_columns = encode.split_plan(options, kinds)
        profile, total = FileProfile(columns=dict(kinds)), 0
        for batch in batches:
            batch = pa.RecordBatch.from_arrays(batch.columns, names)
            total += batch.num_rows
            profile.add_batch(batch, kinds)
            for _ in encode.encode_batch(options, "profile", batch, profile.columns, split_names,
                                         weights, key_columns):
                pass
        yield pa.RecordBatch.from_arrays([pa.array([total])], ["rows"])

    scratch = tempfile.mkdtemp(dir=work_root, prefix="profile-spark-")
    results: dict[str, list[float]] = {}

    def timed(name: str, action) -> None:
        start = time.perf_counter()
        action()
        results.setdefault(name, []).append(time.perf_counter() - start)

    for repeat in range(3):
        timed("Arrow batches to Python executors, counted",
              lambda: features.mapInArrow(count_only, "rows long").collect())
        timed("+ encoded (split hash, profile, encoder)",
              lambda: features.mapInArrow(encode_only, "rows long").collect())
        for compression in ("none", "gzip"):
            sharding = ShardingOptions(num_shards=SHARDS, compression=compression)
            phase_options = dataclasses.replace(options, sharding=sharding)
            staging = os.path.join(scratch, f"staging-{repeat}-{compression}")
            os.makedirs(staging)
            payloads = []
            timed(f"+ chunk files, {compression} (write_examples' first phase)",
                  lambda: payloads.extend(features.mapInArrow(
                      write._PartitionEncoder(phase_options, kinds, staging),
                      "payload binary").collect()))
            chunks = [c for row in payloads for c in pickle.loads(row.payload)[1]]
            timed(f"shards from the chunks, {compression} (second phase)",
                  lambda: write.write_shards(spark, shards.plan_shards(chunks, sharding),
                                             staging, sharding))
            shutil.rmtree(staging)
        parquet_out = os.path.join(scratch, f"parquet-{repeat}")
        timed("Spark Parquet write", lambda: df.write.parquet(parquet_out))
        shutil.rmtree(parquet_out)
        print(f"repeat {repeat + 1}/3: " + ", ".join(
            f"{k} {v[-1]:.2f}s" for k, v in results.items()), file=sys.stderr)
    shutil.rmtree(scratch)
    return {name: {"median_seconds": statistics.median(v), "seconds": v}
            for name, v in results.items()}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3_000_000), indent=2))
