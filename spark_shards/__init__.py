"""Spark in Python, with no JVM jar: a session on this interpreter (`session`), Spark types
as feature kinds (`columns`), and our shards read as a DataFrame (`read`). ExampleGen's Spark
writer is ExampleGen's (components/example_gen/spark_write.py)."""
