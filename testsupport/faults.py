"""Faults injected on purpose through the product's hook points (tfrecord_shards/hooks.py): the
retry tests make a real engine (a Spark cluster, Beam's bundle-retrying DirectRunner, a
retried pipeline task) retry our tasks the way a cluster does when a machine fails or a task
is slow, and check that nothing is lost or doubled.

`TFRP_INJECT_FAULT` (read here, never by the product) is one of:
  fail-first-attempt[=K]   every encode task's first attempt (or task K's alone) fails after
                           writing its chunk files, so the retry meets the failed attempt's
                           files on disk; Beam retries a whole bundle, so the tasks before K
                           in K's bundle run twice and succeed twice;
  slow-first-task=SECONDS  the first attempt of task 0 sleeps that long before it starts, so
                           Spark's speculation runs a second attempt of it;
  kill-in-commit=N         the process SIGKILLs itself after the N-th move of an output's
                           commit (0: after writing the commit marker, before any move), as a
                           preempted machine would part-way through copying a bucket's
                           objects into place.

The hook is installed in the test process (tests/conftest.py) and, through `SITE`'s
sitecustomize, in every Python process started with `child_env` or `spark_conf`: a tfrp
command, a Beam worker, a Spark executor's Python worker. A task's first attempt is told from
its retries by a marker file in the run's staging folder (created exclusively), which works
across processes and engines alike."""
from __future__ import annotations

import os
import signal
import time
from typing import Any, Optional

from tfrecord_shards import hooks

ENVIRONMENT = "TFRP_INJECT_FAULT"
FAIL_FIRST_ATTEMPT = "fail-first-attempt"
SLOW_FIRST_TASK = "slow-first-task"
KILL_IN_COMMIT = "kill-in-commit"
MARKERS = "_faults"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = os.path.join(REPO, "testsupport", "fault_site")


class InjectedFault(RuntimeError):
    """Raised on purpose by `TFRP_INJECT_FAULT=fail-first-attempt`."""


def _first_attempt(staging: str, key: str) -> bool:
    from tfrecord_shards import fileio

    folder = fileio.join(staging, MARKERS)
    fileio.makedirs(folder)
    return fileio.create_new(fileio.join(folder, key))


def inject(point: str, **where: Any) -> None:
    """The hook: does what `TFRP_INJECT_FAULT` asks at `point`, read at each call, so a test
    may set it for one run."""
    setting = os.environ.get(ENVIRONMENT, "")
    kind, _, value = setting.partition("=")
    if point == hooks.TASK_STARTED and kind == SLOW_FIRST_TASK and where["task"] == 0 and \
            _first_attempt(where["staging"], f"{where['stage']}-slow-0"):
        time.sleep(float(value))
    elif point == hooks.TASK_WROTE and kind == FAIL_FIRST_ATTEMPT and \
            (not value or int(value) == where["task"]) and \
            _first_attempt(where["staging"], f"{where['stage']}-fail-{where['task']}"):
        raise InjectedFault(f"{ENVIRONMENT}={FAIL_FIRST_ATTEMPT}: {where['stage']} task "
                            f"{where['task']}'s first attempt fails after writing its files")
    elif point == hooks.COMMIT_MOVED and kind == KILL_IN_COMMIT and int(value) == where["moved"]:
        os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    hooks.install(inject)


def python_path(existing: Optional[str] = None) -> str:
    """PYTHONPATH for a child that installs the hook at start-up (and imports this
    checkout)."""
    return os.pathsep.join(p for p in (SITE, REPO, existing) if p)


def child_env(fault: Optional[str] = None, base: Optional[dict] = None) -> dict:
    """An environment (`base`, else this process's) whose Python processes install the hook,
    with `fault` set (or none)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = python_path(env.get("PYTHONPATH"))
    env.pop(ENVIRONMENT, None)
    if fault:
        env[ENVIRONMENT] = fault
    return env


def spark_conf(fault: str) -> dict:
    """Spark settings that give each executor's Python workers the hook and `fault`."""
    return {f"spark.executorEnv.{ENVIRONMENT}": fault,
            "spark.executorEnv.PYTHONPATH": python_path()}
