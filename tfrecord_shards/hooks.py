"""Named points in long work where an installed hook runs: where a task starts, where it has
written its files and not yet returned them, and after each move of an output's commit. The
retry tests install one (testsupport/faults.py) to fail, stall or kill a task at exactly such
a point, as a lost machine or a slow one would; none is installed in normal use, and a point
with no hook costs one empty loop."""
from __future__ import annotations

from typing import Any, Callable

TASK_STARTED = "task-started"  # where: staging, task, stage
TASK_WROTE = "task-wrote"  # where: staging, task, stage
COMMIT_MOVED = "commit-moved"  # where: moved (0: the commit marker written, nothing moved)

Hook = Callable[..., None]
_installed: list[Hook] = []


def install(hook: Hook) -> None:
    """Runs `hook(point, **where)` at every point from now on in this process."""
    if hook not in _installed:
        _installed.append(hook)


def uninstall(hook: Hook) -> None:
    if hook in _installed:
        _installed.remove(hook)


def reached(point: str, **where: Any) -> None:
    for hook in _installed:
        hook(point, **where)
