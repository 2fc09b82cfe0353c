"""`tfrp data-service` and `tfrp spark-cluster`: servers that run until interrupted."""
from __future__ import annotations

import signal
import socket
import time

import click

from local_cluster import listening
from components.trainer.options import DATA_SERVICE_PORT
from pipeline.cli.group import main


@main.group("data-service")
def data_service() -> None:
    """tf.data service servers, for a Trainer run with --set data_service=grpc://HOST:PORT."""


@data_service.command("dispatcher")
@click.option("--port", default=DATA_SERVICE_PORT, show_default=True, type=int)
@click.option("--work-dir", default=None,
              help="A shared folder where the dispatcher journals its state (fault tolerance).")
def data_service_dispatcher(port, work_dir) -> None:
    """Run a dispatcher until interrupted."""
    # data_service: 2.4 s to import (TensorFlow); `tfrp --help` and other commands need none.
    from components.trainer import data_service as service

    server = service.start_dispatcher(port, work_dir)
    bound = int(server.target.rsplit(":", 1)[1])
    click.echo(f"tf.data service dispatcher listening on {listening.describe(bound)}; "
               f"trainers and workers reach it at grpc://{socket.getfqdn()}:{bound}", err=True)
    _unauthenticated_warning(bound)
    server.join()


@data_service.command("worker")
@click.option("--dispatcher", required=True, help="The dispatcher's host:port.")
@click.option("--port", default=0, show_default=True, type=int, help="0: any free port.")
@click.option("--host", default="localhost", show_default=True,
              help="The name the dispatcher and trainers reach this worker by.")
def data_service_worker(dispatcher, port, host) -> None:
    """Run a worker until interrupted."""
    # data_service: 2.4 s to import (TensorFlow); `tfrp --help` and other commands need none.
    from components.trainer import data_service as service

    server = service.start_worker(dispatcher, port, host)
    bound = server._address.rsplit(":", 1)[1]  # the port TensorFlow chose for port 0
    click.echo(f"tf.data service worker listening on {listening.describe(int(bound))}, "
               f"registered with {dispatcher} as {host}:{bound}", err=True)
    _unauthenticated_warning(int(bound))
    server.join()


def _unauthenticated_warning(port: int) -> None:
    """tf.data service has no authentication and TensorFlow (2.16) binds its servers to every
    interface, with no setting to choose one: say so, with the rule that closes the gap."""
    if listening.listening_addresses(port) - {"127.0.0.1", "::1"}:
        click.echo(f"warning: port {port} is open to every network this machine is on, and "
                   "tf.data service asks no one for credentials: whoever reaches it can run "
                   "dataset graphs that read any file this user can. Allow only the trainers "
                   f"and workers to reach it, e.g. iptables -A INPUT -p tcp --dport {port} "
                   "! -s <cluster subnet> -j DROP", err=True)


@main.command("spark-cluster")
@click.option("--workers", default=2, show_default=True, type=int)
@click.option("--cores", default=1, show_default=True, type=int, help="Cores per worker.")
@click.option("--memory", default="1g", show_default=True, help="Memory per worker.")
def spark_cluster(workers, cores, memory) -> None:
    """Run a Spark standalone cluster on this machine (a master and workers as separate JVMs
    on 127.0.0.1, with a generated secret) until interrupted, for trying `--engine spark` on
    a cluster. Prints the flags that reach it."""
    # local_cluster.spark, spark_shards: 31 ms to import; only this command needs them.
    from local_cluster.spark import LocalCluster
    from spark_shards.session import SparkSetupError

    try:
        cluster = LocalCluster(workers, cores, memory).start()
    except (SparkSetupError, RuntimeError) as error:
        raise click.ClickException(str(error)) from None
    flags = " ".join([f"--spark-master {cluster.master}"] + [
        f"--spark-conf {key}={value}" for key, value in cluster.conf.items()])
    click.echo(f"Spark standalone cluster at {cluster.master} ({workers} workers; logs in "
               f"{cluster.work_dir})\ntfrp examplegen SOURCE OUT --engine spark {flags}")
    # Stop on Ctrl-C or SIGTERM even when started with SIGINT ignored (as a non-interactive
    # shell starts background jobs): Python keeps an inherited SIG_IGN, so set both here.
    def stop(*_) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
