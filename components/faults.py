"""Faults injected on purpose, off unless `TFRP_INJECT_FAULT` is set: the retry tests make a
real engine (a Spark cluster, Beam's bundle-retrying DirectRunner) retry our tasks the way a
cluster does when a machine fails or a task is slow, and check that nothing is lost or doubled.

`TFRP_INJECT_FAULT` is one of:
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

A task's first attempt is told from its retries by a marker file in the run's staging folder
(created exclusively), which works across processes and engines alike."""
from __future__ import annotations

import os
import time

from components import fileio

ENVIRONMENT = "TFRP_INJECT_FAULT"
FAIL_FIRST_ATTEMPT = "fail-first-attempt"
SLOW_FIRST_TASK = "slow-first-task"
KILL_IN_COMMIT = "kill-in-commit"
MARKERS = "_faults"


class InjectedFault(RuntimeError):
    """Raised on purpose by `TFRP_INJECT_FAULT=fail-first-attempt`."""


def _first_attempt(staging: str, key: str) -> bool:
    folder = fileio.join(staging, MARKERS)
    fileio.makedirs(folder)
    return fileio.create_new(fileio.join(folder, key))


def before_task(staging: str, task: int, stage: str) -> None:
    """Where a task starts: with `slow-first-task=S`, task 0's first attempt waits S seconds."""
    setting = os.environ.get(ENVIRONMENT, "")
    if setting.startswith(SLOW_FIRST_TASK + "=") and task == 0 and \
            _first_attempt(staging, f"{stage}-slow-{task}"):
        time.sleep(float(setting.split("=", 1)[1]))


def after_output(staging: str, task: int, stage: str) -> None:
    """Where a task has written its files and not yet returned them: with
    `fail-first-attempt`, its first attempt fails here."""
    setting = os.environ.get(ENVIRONMENT, "")
    if setting.partition("=")[0] != FAIL_FIRST_ATTEMPT:
        return
    only = setting.partition("=")[2]
    if (not only or int(only) == task) and _first_attempt(staging, f"{stage}-fail-{task}"):
        raise InjectedFault(f"{ENVIRONMENT}={FAIL_FIRST_ATTEMPT}: {stage} task {task}'s first "
                            "attempt fails after writing its files")


def in_commit(moved: int) -> None:
    """Where a commit has moved `moved` entries: with `kill-in-commit=N`, at the N-th the
    process is SIGKILLed (no handler, no cleanup)."""
    setting = os.environ.get(ENVIRONMENT, "")
    if setting.startswith(KILL_IN_COMMIT + "=") and int(setting.split("=", 1)[1]) == moved:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
