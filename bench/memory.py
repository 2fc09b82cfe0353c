"""Peak resident memory of a process tree over time, exactly: every `interval` seconds the
sampler reads each process's high-water mark (VmHWM) and resets it (`clear_refs` 5), so each
sample is the highest resident size the tree's processes reached since the one before, not
a snapshot that could fall between two peaks. The processes' peaks are added up (a
component's worker processes count with it), which can only overstate the tree's peak."""
from __future__ import annotations

import os
import threading
import time
from typing import Optional

INTERVAL_S = 0.05


def _children(pid: int) -> list[int]:
    """The processes `pid`'s threads started (the kernel's own list; no scan of /proc)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
    except OSError:
        pass  # the process has ended
    return found


def tree(pid: int) -> list[int]:
    """`pid` and every process below it."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(_children(current))
    return found


def peak_and_reset(pid: int) -> int:
    """The process's resident high-water mark in bytes since the last reset (0 when it is
    gone), and a reset."""
    try:
        with open(f"/proc/{pid}/status") as f:
            peak = next((int(line.split()[1]) * 1024 for line in f
                         if line.startswith("VmHWM:")), 0)
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return peak
    except OSError:
        return 0


class PeakSampler:
    """Samples (epoch seconds, bytes) of a process tree's peak since the sample before, in a
    thread of its own, until stopped."""

    def __init__(self, pid: int, interval: float = INTERVAL_S):
        self._pid, self._interval = pid, interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            total = sum(peak_and_reset(pid) for pid in tree(self._pid))
            if total:
                self.samples.append((time.time(), total))
            self._stop.wait(self._interval)

    def peak(self, start: Optional[float] = None, end: Optional[float] = None) -> int:
        """The highest peak between `start` and `end` (epoch seconds; all when None): each
        sample covers the time since the one before, so the first sample after `end` counts
        too."""
        peak, previous = 0, float("-inf")
        for at, value in self.samples:
            if (start is None or at >= start) and (end is None or previous <= end):
                peak = max(peak, value)
            previous = at
        return peak
