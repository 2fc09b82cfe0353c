"""Spark, in Python: DataFrames to sharded TFRecords and back, and ShardedExampleGen's work on
a Spark cluster. Executors encode Arrow batches with the same codec, sharding writer, split
hashing and manifest as the Beam path, so the output is the same layout; no JVM jar is used.
"""
