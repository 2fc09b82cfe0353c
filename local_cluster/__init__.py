"""Servers on this machine: a Spark standalone cluster (`spark`, for `tfrp spark-cluster`,
the tests and the benchmarks) and which addresses a port listens on (`listening`, checked by
it and by the tf.data service's servers)."""
