"""A Spark standalone cluster on this machine: a master and N workers as separate JVMs on
127.0.0.1, started from pyspark's bundled `spark-class` (nothing downloaded). For trying the
cluster path on a laptop and for the tests: the same `spark://` master a real cluster has, so
executors are other processes that can die, and Spark retries their tasks elsewhere.

Every JVM binds to 127.0.0.1 and the cluster runs with `spark.authenticate` and a secret
generated at start: nobody else on the machine's network can reach it, and a local process
needs the secret to run work on it."""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional

import psutil

from local_cluster.listening import free_ports
from spark_shards.session import check_java

LOOPBACK = "127.0.0.1"


class LocalCluster:
    """`with LocalCluster(workers=2) as cluster: get_session(cluster.master, cluster.conf)`."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g",
                 work_dir: Optional[str] = None, distinct_hosts: bool = False):
        """`distinct_hosts`: worker i on 127.0.0.(i+1) (Linux routes all of 127/8 to
        loopback), so Spark sees each worker as another machine. Speculation needs that: it
        never runs a second attempt of a task on a host already running the first."""
        self.workers, self.cores, self.memory = workers, cores, memory
        self.worker_hosts = [f"127.0.0.{i + 1}" if distinct_hosts else LOOPBACK
                             for i in range(workers)]
        self.work_dir = work_dir or tempfile.mkdtemp(prefix="spark-cluster-")
        self.secret = secrets.token_hex(16)
        self.port = free_ports(1)[0]
        self.master = f"spark://{LOOPBACK}:{self.port}"
        self.processes: list[subprocess.Popen] = []

    @property
    def conf(self) -> dict:
        """The driver's settings for this cluster."""
        return {"spark.authenticate": "true", "spark.authenticate.secret": self.secret,
                "spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK,
                "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
                "spark.pyspark.python": sys.executable}

    def _spark_class(self, *args: str, log: str, host: str = LOOPBACK) -> subprocess.Popen:
        # pyspark: 0.2 s to import; only starting a JVM needs its install folder
        import pyspark

        home = os.path.dirname(pyspark.__file__)
        env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP=host,
                   PYSPARK_PYTHON=sys.executable,
                   SPARK_MASTER_OPTS="-Dspark.authenticate=true "
                                     f"-Dspark.authenticate.secret={self.secret}",
                   SPARK_WORKER_OPTS="-Dspark.authenticate=true "
                                     f"-Dspark.authenticate.secret={self.secret}")
        out = open(os.path.join(self.work_dir, log), "wb")
        return subprocess.Popen([os.path.join(home, "bin", "spark-class"), *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)

    def start(self) -> "LocalCluster":
        check_java()
        os.makedirs(self.work_dir, exist_ok=True)
        self.processes.append(self._spark_class(
            "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port",
            str(self.port), "--webui-port", str(free_ports(1)[0]), log="master.log"))
        self._wait_for_port(self.port)
        for i, host in enumerate(self.worker_hosts):
            folder = os.path.join(self.work_dir, f"worker-{i}")
            os.makedirs(folder, exist_ok=True)
            self.processes.append(self._spark_class(
                "org.apache.spark.deploy.worker.Worker", self.master, "--host", host,
                "--cores", str(self.cores), "--memory", self.memory, "--work-dir", folder,
                "--webui-port", str(free_ports(1)[0]), log=f"worker-{i}.log", host=host))
        self._wait_for_workers()
        return self

    def _wait_for_port(self, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex((LOOPBACK, port)) == 0:
                    return
            if self.processes[0].poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the Spark master did not start; see {self.work_dir}/master.log")

    def _wait_for_workers(self, timeout: float = 60) -> None:
        log = os.path.join(self.work_dir, "master.log")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(log, errors="replace") as f:
                if f.read().count("Registering worker") >= self.workers:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.workers} Spark workers did not register; see "
                           f"{self.work_dir}")

    def executor_pids(self) -> list[int]:
        """The executor JVMs the workers started (CoarseGrainedExecutorBackend)."""
        found = []
        for process in psutil.process_iter(["cmdline", "cwd"]):
            command, folder = process.info["cmdline"] or [], process.info["cwd"] or ""
            # A worker runs its executors in a folder below its work dir.
            if any("CoarseGrainedExecutorBackend" in part for part in command) and \
                    folder.startswith(self.work_dir + os.sep):
                found.append(process.pid)
        return found

    def stop(self, grace_seconds: float = 15) -> None:
        """SIGTERM to every JVM's process group (a worker's executors are in its group), one
        grace period for all of them together, then SIGKILL to what is left."""
        def signal_all(number: int) -> None:
            for process in self.processes:
                if process.poll() is None:
                    try:
                        os.killpg(process.pid, number)
                    except ProcessLookupError:
                        pass

        signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and any(p.poll() is None for p in self.processes):
            time.sleep(0.2)
        signal_all(signal.SIGKILL)
        for process in self.processes:
            process.wait()
        self.processes = []

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
