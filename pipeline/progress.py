"""Live progress of a local run: one line per component as it finishes, read from the run's
ML Metadata store while LocalDagRunner works, and on a terminal a line naming the component
now running, with the rows it has done and their rate when its loops count them
(tfrecord_shards/rows_done.py: LocalDagRunner runs each executor in this process, one at a time)."""
from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from typing import Callable, Optional

from ml_metadata.proto import metadata_store_pb2

from tfrecord_shards import rows_done
from pipeline import run_summary

_DONE = (metadata_store_pb2.Execution.COMPLETE, metadata_store_pb2.Execution.CACHED,
         metadata_store_pb2.Execution.FAILED)
# The context TFX gives each run's executions, named by its run id.
PIPELINE_RUN = "pipeline_run"
# The live line's rate is the rows of the last few seconds over those seconds (or over the
# component's seconds so far, when fewer): it falls when the rows stop.
RATE_WINDOW_S = 5.0


def rate_text(per_second: float) -> str:
    """A rate as tqdm's unit_scale writes one: three figures and k, M or G (812, 51.2k,
    512k, 1.23M)."""
    for unit in ("", "k", "M", "G"):
        if per_second < 999.5 or unit == "G":
            break
        per_second /= 1000
    if not unit:
        return f"{per_second:.0f}"
    digits = 2 if per_second < 9.995 else 1 if per_second < 99.95 else 0
    return f"{per_second:.{digits}f}{unit}"


def live_line(name: str, seconds: float, rows: Optional[int] = None,
              per_second: Optional[float] = None) -> str:
    """The live line of the component running: its name and seconds so far, then the rows
    it has done and their rate when it counts them."""
    line = f"  {name:<{run_summary.NODE_WIDTH}} running {seconds:>5.0f} s"
    if not rows:
        return line + " ..."
    line += f"  {rows:,} rows"
    if per_second is not None:
        line += f"  {rate_text(per_second)} rows/s"
    return line


def rows_and_rate(started: float, now: float) -> tuple[Optional[int], Optional[float]]:
    """(rows counted since `started`, their rate over the last RATE_WINDOW_S seconds), both
    None when not known; wall times in seconds since the epoch."""
    rows = rows_done.rows_after(started)
    if not rows:
        return rows, None
    since = max(started, now - RATE_WINDOW_S)
    recent = rows_done.rows_after(since)
    if recent is None:
        return rows, None
    return rows, recent / max(now - since, 1e-3)


class RunProgress:
    """Polls the metadata store every `interval` seconds on a thread of its own.

    With `run_id`, it reports the executions of that run alone (its `pipeline_run` context):
    another run writing to the same store is not this one. Without, the executions made after
    `start()`."""

    def __init__(self, metadata_path: str, echo: Callable[[str], None] = print,
                 live: Optional[bool] = None, interval: float = 0.5,
                 run_id: Optional[str] = None):
        self._path, self._echo, self._interval = metadata_path, echo, interval
        self._run_id = run_id
        self._live = sys.stdout.isatty() if live is None else live
        self._baseline: Optional[int] = None
        self._reported: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="run-progress")
        self._live_width = 0
        self.lines: list[str] = []

    def __enter__(self) -> "RunProgress":
        if self._run_id is None:
            self._baseline = self._max_execution_id()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()  # whatever finished since the last look
        self._clear_live()

    def _store(self):
        if not os.path.exists(self._path):
            return None
        return run_summary.open_store(self._path)

    def _max_execution_id(self) -> int:
        store = self._store()
        return max((e.id for e in store.get_executions()), default=0) if store else 0

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._poll()
            except Exception:  # the writer may hold the database for a moment; look again
                continue

    def _poll(self) -> None:
        store = self._store()
        if store is None:
            return
        executions = self._executions(store)
        running = []
        for execution in sorted(executions, key=lambda e: e.id):
            if execution.last_known_state not in _DONE:
                running.append(execution)
                continue
            if execution.id in self._reported:
                continue
            self._reported.add(execution.id)
            seconds = (execution.last_update_time_since_epoch -
                       execution.create_time_since_epoch) / 1000
            produced = run_summary.describe_resolved(store, execution) \
                if run_summary.is_resolver(execution) else run_summary.describe_outputs(
                    run_summary.output_artifacts(store, [execution]))
            name = run_summary.node_name(store, execution)
            self._report(f"  {name:<{run_summary.NODE_WIDTH}} "
                         f"{run_summary.state_name(execution):<7}{seconds:>7.1f} s  {produced}")
        if self._live and running:
            execution = running[-1]
            now, started = time.time(), execution.create_time_since_epoch / 1000
            name = run_summary.node_name(store, execution)
            self._show_live(live_line(name, now - started, *rows_and_rate(started, now)))

    def _executions(self, store) -> list:
        if self._run_id is None:
            return [e for e in store.get_executions() if e.id > (self._baseline or 0)]
        run = store.get_context_by_type_and_name(PIPELINE_RUN, self._run_id)
        return store.get_executions_by_context(run.id) if run else []

    def _report(self, line: str) -> None:
        self._clear_live()
        self.lines.append(line)
        self._echo(line)

    def _show_live(self, line: str) -> None:
        # Cut to the terminal's width: a line that wraps is not rewritten by a carriage return.
        line = line[:max(shutil.get_terminal_size().columns - 1, 20)]
        sys.stdout.write("\r" + line.ljust(self._live_width))
        sys.stdout.flush()
        self._live_width = len(line)

    def _clear_live(self) -> None:
        if self._live and self._live_width:
            sys.stdout.write("\r" + " " * self._live_width + "\r")
            sys.stdout.flush()
            self._live_width = 0
