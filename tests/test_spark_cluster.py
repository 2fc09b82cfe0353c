"""A real Spark standalone cluster (a master and two workers, separate JVMs on 127.0.0.1,
from pyspark's own spark-class) and a fault on it: an executor JVM killed with SIGKILL in the
middle of `write_examples`. Spark starts another executor and retries the lost tasks; every
source row is in the output exactly once, and the counts say so."""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from components import example_rows, shards
from components.spark.cluster import LocalCluster

ROWS = 400_000

WRITE = """
import json, sys
from components.spark.session import get_session
from components.spark.write import write_examples
master, conf, source, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
spark = get_session(master, dict(conf, **{"spark.task.maxFailures": "4"}))
frame = spark.read.csv(source, header=True, inferSchema=True).repartition(16)
write_examples(frame, out, num_shards=4)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(workers=2, work_dir=str(tmp_path_factory.mktemp("cluster"))) as running:
        yield running


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    """Seeded rows with a unique id, some numbers and text."""
    rng = np.random.default_rng(38)
    path = str(tmp_path_factory.mktemp("cluster_source") / "rows.csv")
    pacsv.write_csv(pa.table({
        "row_id": np.arange(ROWS), "fare": np.round(rng.gamma(2, 7, ROWS), 2),
        "miles": rng.integers(0, 40, ROWS),
        "company": rng.choice(np.array(["Flash Cab", "Taxi Affiliation", "Sun Taxi"]), ROWS),
    }), path)
    return path


def write(cluster: LocalCluster, source: str, out: str) -> subprocess.Popen:
    import json

    return subprocess.Popen([sys.executable, "-c", WRITE, cluster.master,
                             json.dumps(cluster.conf), source, out],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def chunks_written(out: str) -> bool:
    """Whether write tasks have begun writing their chunk files (in the staging folder)."""
    for _, _, names in os.walk(out):
        if any(name.endswith(".rec") for name in names):
            return True
    return False


def row_ids(out: str) -> collections.Counter:
    return collections.Counter(row["row_id"] for row in example_rows.iter_rows(out))


def test_the_cluster_binds_to_loopback_and_asks_for_its_secret(cluster):
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A":  # LISTEN
                    address, port = local.split(":")
                    listening.add((address, int(port, 16)))
    master = [address for address, port in listening if port == cluster.port]
    # 127.0.0.1 as /proc writes it, IPv4 or (Java's) IPv4-mapped IPv6; never 0.0.0.0 or ::.
    assert master and all(a in ("0100007F", "0000000000000000FFFF00000100007F")
                          for a in master), master
    assert cluster.conf["spark.authenticate"] == "true" and len(cluster.secret) == 32


def test_an_executor_killed_mid_write_loses_and_doubles_no_row(cluster, source, tmp_path):
    clean = str(tmp_path / "clean")
    run = write(cluster, source, clean)
    assert run.wait(timeout=600) == 0, run.stderr.read()[-3000:]
    expected = collections.Counter(range(ROWS))
    assert row_ids(clean) == expected

    faulty = str(tmp_path / "faulty")
    run = write(cluster, source, faulty)
    killed = None
    while run.poll() is None and killed is None:
        executors = cluster.executor_pids()
        # Once the write is under way (tasks have written chunks) on both executors: one dies.
        if len(executors) == 2 and chunks_written(faulty):
            os.kill(executors[0], signal.SIGKILL)
            killed = executors[0]
        time.sleep(0.1)
    _, log = run.communicate(timeout=600)
    assert run.returncode == 0, log[-3000:]
    assert killed is not None, "the write finished before an executor could be killed"
    # Spark saw the executor go and ran its tasks again.
    assert "ExecutorLostFailure" in log or "Lost executor" in log, log[-3000:]
    manifest = shards.read_manifest(faulty)
    assert manifest["rows_in"] == manifest["rows_written"] == ROWS
    assert row_ids(faulty) == expected
    assert {s: v["rows"] for s, v in manifest["splits"].items()} == \
        {s: v["rows"] for s, v in shards.read_manifest(clean)["splits"].items()}


def test_tfrp_spark_cluster_runs_examplegen_given_the_flags_it_prints(taxi_slice_dir, tmp_path):
    """`tfrp spark-cluster` in one terminal, `tfrp examplegen … --engine spark` with the
    flags it prints in another; Ctrl-C stops the cluster's JVMs."""
    import re
    import socket

    from conftest import tfrp

    server = subprocess.Popen([sys.executable, "-W", "ignore", "-m", "pipeline.cli",
                               "spark-cluster", "--workers", "1"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        first, second = server.stdout.readline(), server.stdout.readline()
        master = re.search(r"spark://127\.0\.0\.1:(\d+)", first)
        assert master and second.startswith("tfrp examplegen SOURCE OUT --engine spark "), \
            first + second
        flags = second.split("--engine spark ", 1)[1].split()
        out = tmp_path / "out"
        tfrp("examplegen", os.path.join(taxi_slice_dir, "data.csv"), str(out),
             "--engine", "spark", *flags)
        manifest = shards.read_manifest(str(out))
        assert manifest["rows_in"] == manifest["rows_written"] == 2000
        logs = re.search(r"logs in (\S+)\)", first).group(1)
        with open(os.path.join(logs, "master.log")) as f:
            assert "Registering app" in f.read()  # the work ran on this cluster
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", int(master.group(1)))) != 0  # the master is gone
