"""Runs the pipeline with TFX's LocalDagRunner and SQLite metadata, then summarises the run.

One run at a time per pipeline: a run holds a lock beside the metadata store from before it
builds the pipeline until its summary is read, and a second run started meanwhile refuses in
one line naming the run in progress, having changed nothing (docs/USER_GUIDE.md, "Two runs at
once"). The lock is the kernel's (flock): a run killed while holding it releases it as it
dies, and the next run takes it."""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
import sys
from typing import Callable, Iterator, Optional

from tfx.dsl.compiler import constants
from tfx.orchestration import metadata
from tfx.orchestration.local.local_dag_runner import LocalDagRunner
from tfx.orchestration.portable import launcher, runtime_parameter_utils

from tfrecord_shards import fileio, tf_filesystems
from tfrecord_shards.memory import (cap_kept_free_memory, limit_arenas, objects_frozen,
                                    release_free_memory)
from pipeline import progress, run_summary
from pipeline.configs import PipelineConfig
from pipeline.pipeline import create_pipeline


def local_config(config: PipelineConfig) -> PipelineConfig:
    """The config with every local folder absolute (TFX records artifact URIs as given) and
    every URI (gs://, s3://) as it is. ML Metadata's SQLite file is always local."""
    metadata_path = config.resolved_metadata_path
    if fileio.is_remote(metadata_path):
        raise ValueError(f"metadata_path {metadata_path}: ML Metadata's SQLite file must be "
                         "on a local disk; the pipeline root and serving folder may be URIs")
    return config.replace(
        pipeline_root=fileio.absolute(config.resolved_pipeline_root),
        serving_dir=fileio.absolute(config.resolved_serving_dir),
        metadata_path=fileio.absolute(metadata_path))


LOCK_SUFFIX = ".lock"


class AlreadyRunning(RuntimeError):
    """Another run of the pipeline holds its lock. One line: which run, where, since when."""


class _RunIdRunner(LocalDagRunner):
    """LocalDagRunner with the run id chosen before the run starts (LocalDagRunner makes one
    inside `run`, the same way, where nothing else can see it): the lock, the progress line
    and the summary name this run's `pipeline_run` context by it."""

    def __init__(self, run_id: str):
        super().__init__()
        self._run_id = run_id

    def run_with_ir(self, pipeline, run_options=None) -> None:
        # Substituted here, LocalDagRunner's own substitution finds nothing left to replace.
        runtime_parameter_utils.substitute_runtime_parameter(
            pipeline, {constants.PIPELINE_RUN_ID_PARAMETER_NAME: self._run_id})
        return super().run_with_ir(pipeline, run_options=run_options)


@contextlib.contextmanager
def memory_released_after_each_component() -> Iterator[None]:
    """Every component of this process's run followed by `release_free_memory`. Locally the
    components share one process: at 30M taxi rows Transform's stage left its 1.7 GiB peak
    resident and the Trainer and the Evaluator started above it. LocalDagRunner launches
    each one from a loop of its own with no hook between them, so `Launcher.launch` is
    wrapped for the run's length."""
    launch = launcher.Launcher.launch

    def launch_then_release(self, *args, **kwargs):
        try:
            return launch(self, *args, **kwargs)
        finally:
            release_free_memory()

    launcher.Launcher.launch = launch_then_release
    try:
        yield
    finally:
        launcher.Launcher.launch = launch


def lock_path(config: PipelineConfig) -> str:
    """The lock file of a (local_config'd) config: beside its SQLite store, which is local."""
    return config.metadata_path + LOCK_SUFFIX


@contextlib.contextmanager
def run_lock(config: PipelineConfig, run_id: str) -> Iterator[None]:
    """Holds the pipeline's lock for the run `run_id`, or raises AlreadyRunning.

    flock, not a file made with O_EXCL: the kernel drops it when its holder dies, however it
    dies (a SIGKILL, an OOM kill), so a killed run never blocks the next. The file stays
    between runs (deleting it would race a run opening it); it holds the holder's pid, host,
    run id and start, for the refusal's line."""
    path = lock_path(config)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AlreadyRunning(_refusal(config, _holder(fd))) from None
        except OSError as e:  # a filesystem without locks (some network mounts)
            logging.warning("%s: cannot lock (%s); two runs at once are not refused", path, e)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id,
            "pipeline_root": config.pipeline_root}).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


def _holder(fd: int) -> dict:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:  # caught between the holder's truncate and its write
        return {}
    return holder if isinstance(holder, dict) else {}


def _refusal(config: PipelineConfig, holder: dict) -> str:
    who = (f"run {holder['run_id']} (pid {holder.get('pid')} on {holder.get('host')})"
           if holder.get("run_id") else "another run")
    return (f"{config.pipeline_name} is already running on {config.pipeline_root}: {who}; "
            f"nothing was changed. Wait for it to finish, or use another --output-root "
            f"(lock: {lock_path(config)})")


def run(config: PipelineConfig, echo: Optional[Callable[[str], None]] = None
        ) -> run_summary.RunSummary:
    """Runs the pipeline; with `echo`, each component's line is passed to it as it finishes.
    Raises AlreadyRunning, having changed nothing, while another run of it is in progress."""
    config = local_config(config)
    fileio.makedirs(fileio.dirname(config.metadata_path))
    # The id LocalDagRunner itself would give the run (its `pipeline_run` context's name).
    run_id = datetime.datetime.now().isoformat()
    with run_lock(config, run_id):
        return _run_locked(config, run_id, echo)


def _run_locked(config: PipelineConfig, run_id: str,
                echo: Optional[Callable[[str], None]]) -> run_summary.RunSummary:
    # The components run in this process and the stock ones open the pipeline's URIs with
    # tf.io.gfile. Beam's DirectRunner workers (direct_num_workers) inherit S3_ENDPOINT from
    # this process's environment and load tensorflow-io with tf.Transform and TFMA.
    tf_filesystems.register_for(config.pipeline_root, config.data_root, config.serving_dir)
    connection = metadata.sqlite_metadata_connection_config(config.metadata_path)
    pipeline = create_pipeline(config, connection)
    # TFX's Beam executors parse sys.argv with absl's flags, where `tfrp -v run` reads as
    # `--verbosity=run` and stops the Evaluator; the pipeline takes nothing from the command
    # line, so the executors see the program name alone.
    command_line, sys.argv = sys.argv, sys.argv[:1]
    if config.allocator_arenas:
        limit_arenas(config.allocator_arenas)
    if config.allocator_kept_free_bytes:
        cap_kept_free_memory(config.allocator_kept_free_bytes)
    try:
        with objects_frozen(), memory_released_after_each_component():
            if echo is None:
                _RunIdRunner(run_id).run(pipeline)
            else:
                with progress.RunProgress(config.metadata_path, echo, run_id=run_id):
                    _RunIdRunner(run_id).run(pipeline)
            return run_summary.summarize(config.metadata_path, config.pipeline_name, run_id)
    finally:
        sys.argv = command_line
