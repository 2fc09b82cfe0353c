"""A SparkSession that runs our code: executors on this interpreter, and a clear error when
Java is missing."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import threading
from typing import Optional

JAVA_MISSING = ("Spark needs a Java runtime and `java` is not on PATH: install Java 17 "
                "(Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME")


class SparkSetupError(RuntimeError):
    pass


def check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (
            java_home and os.path.exists(os.path.join(java_home, "bin", "java"))):
        raise SparkSetupError(JAVA_MISSING)


def get_session(master: Optional[str] = None, conf: Optional[dict] = None,
                app_name: str = "tfrecord-pipeline"):
    """The active SparkSession, or a new one on `master` (default local[*]) with `conf`.

    Executors run this interpreter (PYSPARK_PYTHON), so they import the same packages; on a
    cluster, set PYSPARK_PYTHON in `conf` (spark.pyspark.python) to the workers' Python."""
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # pyspark.sql: 0.17 s to import; check_java and deal_by_weight need no Spark
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(master or "local[*]")
    # Arrow moves batches between the JVM and Python; our tasks write files, so Spark's own
    # result size limit never sees rows.
    for key, value in {"spark.sql.execution.arrow.pyspark.enabled": "true",
                       "spark.ui.enabled": "false", **(conf or {})}.items():
        builder = builder.config(key, value)
    with _jvm_started_without_fork():
        try:
            return builder.getOrCreate()
        except Exception as error:  # pyspark's PySparkRuntimeError
            if "JAVA_GATEWAY_EXITED" not in str(error):
                raise
            logging.warning("Spark's JVM exited as it started (%s); starting it once more",
                            error)
            return builder.getOrCreate()


@contextlib.contextmanager
def _jvm_started_without_fork():
    """pyspark starts the JVM with a preexec_fn that ignores SIGINT (so that Ctrl-C does not
    reach it), which makes Python fork() and run Python in the child. In a process with
    threads inside gRPC (a TFX or Beam run), gRPC's fork handlers then run too, and they can
    break the child before it execs: "Java gateway process exited before sending its port
    number", seen in whole-pipeline runs, twice in a row once. Without a preexec_fn Python
    starts the child with vfork, which runs no fork handlers; the JVM inherits SIGINT
    ignored instead, set around the start (only the main thread can set it; from another
    thread the JVM gets its own process group, which keeps the terminal's Ctrl-C from it)."""
    # pyspark: 0.3 s to import; check_java and deal_by_weight need no Spark
    from pyspark import java_gateway

    popen = java_gateway.Popen

    def start(command, **kwargs):
        kwargs.pop("preexec_fn", None)
        if threading.current_thread() is not threading.main_thread():
            return popen(command, process_group=0, **kwargs)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return popen(command, **kwargs)
        finally:
            signal.signal(signal.SIGINT, previous)

    java_gateway.Popen = start
    try:
        yield
    finally:
        java_gateway.Popen = popen


def deal_by_weight(weights: list[int], tasks: int) -> list[list[int]]:
    """Indices of `weights` dealt into at most `tasks` groups of about equal total weight
    (heaviest first, each to the lightest group), for one Spark task a group: a Python task
    costs Spark about 0.2 s to start (measured on local[2] with a trivial mapInArrow), so
    one task per file or shard paid that once each."""
    groups: list[list[int]] = [[] for _ in range(max(1, min(tasks, len(weights))))]
    loads = [0] * len(groups)
    for index in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        lightest = loads.index(min(loads))
        groups[lightest].append(index)
        loads[lightest] += weights[index]
    return groups
