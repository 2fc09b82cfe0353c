"""tf.data service servers: a dispatcher, and workers that run the Trainer's input chain.

A trainer whose host CPUs cannot parse fast enough sets `data_service` to the dispatcher's
address; the reading and parsing then run on the workers, and more CPU machines means more
input throughput. `tfrp data-service dispatcher|worker` starts them; on a cluster, run one
dispatcher and a worker per CPU machine, each worker told the dispatcher's address.
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from components.trainer.options import DATA_SERVICE_PORT



def start_dispatcher(port: int = DATA_SERVICE_PORT, work_dir: Optional[str] = None
                     ) -> tf.data.experimental.service.DispatchServer:
    """A dispatcher on `port`. With `work_dir` (a shared path) it journals its state there,
    so a restarted dispatcher resumes its jobs."""
    return tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(
            port=port, work_dir=work_dir, fault_tolerant_mode=bool(work_dir)))


def start_worker(dispatcher: str, port: int = 0, host: str = "localhost"
                 ) -> tf.data.experimental.service.WorkerServer:
    """A worker on `port` (0: any free port) that registers with `dispatcher` (host:port) and
    tells it to reach this worker at `host`."""
    return tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(
            dispatcher_address=dispatcher.replace("grpc://", ""), port=port,
            worker_address=f"{host}:%port%"))
