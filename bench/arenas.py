"""`python -m bench arenas`: what each component of a local run leaves resident for the next.

A local run's components share one process, so a stage's peak includes what the stages before
it left. Each size runs as a whole `tfrp run` of its own (the seeded taxi-like CSV of
`testsupport.data`, the pipeline benchmark's steps), with every component followed by the
local runner's `malloc_trim` and then a report: the process's resident size and glibc's
arenas above `ARENA_MIN_BYTES` (`malloc_info`: each arena's heap size, live and free). Beside
two sizes it shows what the larger run kept above the smaller after each component.

Where an arena's heap stays large after `malloc_trim`, its free top is resident: glibc trims
that only for the main arena (tfrecord_shards/memory.py, `cap_kept_free_memory`)."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import re
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator, Sequence

from bench.display import Table
from bench.processes import resident_bytes
from tfrecord_shards import fileio
from tfrecord_shards.memory import release_free_memory

ARENA_MIN_BYTES = 4 << 20
REPORT_PREFIX = "ARENAS "


@functools.cache
def _malloc_info() -> Callable[[str], None]:
    """glibc's `malloc_info`, writing its XML report to a file."""
    libc = ctypes.CDLL(None)
    libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p] * 2
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]

    def write(path: str) -> None:
        stream = libc.fopen(path.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
    return write


def arena_sizes(report: str, min_bytes: int = ARENA_MIN_BYTES) -> dict[int, int]:
    """Each arena's heap size in bytes (`<system type="current">`) from a `malloc_info`
    report, for those of at least `min_bytes`."""
    heaps = re.findall(r'<heap nr="(\d+)">.*?<system type="current" size="(\d+)"/>', report,
                       re.S)
    return {int(number): int(size) for number, size in heaps if int(size) >= min_bytes}


def arenas_now(min_bytes: int = ARENA_MIN_BYTES) -> dict[int, int]:
    with tempfile.NamedTemporaryFile("r", suffix=".xml") as report:
        _malloc_info()(report.name)
        return arena_sizes(report.read(), min_bytes)


@contextlib.contextmanager
def reported_after_each_component(report: Callable[[dict], None]) -> Iterator[None]:
    """Every component TFX's launcher runs followed by `release_free_memory` (as the local
    runner does) and `report({component, seconds, resident_bytes, arenas})`."""
    from tfx.orchestration.portable import launcher

    launch = launcher.Launcher.launch

    def launch_then_report(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return launch(self, *args, **kwargs)
        finally:
            release_free_memory()
            report({"component": self._pipeline_node.node_info.id,
                    "seconds": time.perf_counter() - start,
                    "resident_bytes": resident_bytes(), "arenas": arenas_now()})

    launcher.Launcher.launch = launch_then_report
    try:
        yield
    finally:
        launcher.Launcher.launch = launch


def run_benchmark(sizes: Sequence[int], work_dir: str, assignments: Sequence[str] = (),
                  log: Callable[[str], None] = print) -> dict:
    """Each size as a run of its own process (`python -m bench arenas-run`)."""
    from bench.pipeline import STOCK_TRAIN_STEPS, run_arguments, taxi_data

    runs = {}
    for rows in sorted(set(sizes)):
        data_dir = taxi_data(work_dir, rows)
        run_dir = fileio.join(work_dir, "arenas-runs", str(rows))
        if fileio.exists(run_dir):
            fileio.rmtree(run_dir)
        command = [sys.executable, "-m", "bench", "arenas-run",
                   *run_arguments(data_dir, run_dir, STOCK_TRAIN_STEPS)]
        for assignment in assignments:
            command += ["--set", assignment]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"the {rows:,}-row run failed (exit {result.returncode}):\n"
                               f"{result.stderr[-3000:]}")
        runs[str(rows)] = [json.loads(line[len(REPORT_PREFIX):])
                           for line in result.stdout.splitlines()
                           if line.startswith(REPORT_PREFIX)]
        fileio.rmtree(run_dir)
        log(f"{rows:,} rows: " + ", ".join(
            f"{r['component']} {r['resident_bytes'] / 2**20:,.0f} MiB" for r in runs[str(rows)]))
    return {"sizes": sorted(set(sizes)), "settings": list(assignments), "runs": runs}


def table(result: dict) -> Table:
    """A line per component: after it, each size's resident MiB and arenas of at least
    `ARENA_MIN_BYTES`, and the largest size's resident MiB over the smallest's."""
    sizes = [str(rows) for rows in result["sizes"]]
    reports = {rows: {r["component"]: r for r in result["runs"][rows]} for rows in sizes}
    lines: dict[str, dict] = {}
    for component in reports[sizes[-1]]:
        line = lines.setdefault(component, {})
        for rows in sizes:
            report = reports[rows].get(component, {"resident_bytes": 0, "arenas": {}})
            line[f"resident {rows}"] = report["resident_bytes"] / 2**20
            line[f"arenas {rows}"] = len(report["arenas"])
        line["kept"] = line[f"resident {sizes[-1]}"] - line[f"resident {sizes[0]}"]
    columns = []
    for rows in sizes:
        columns += [(f"{int(rows):,} rows: MiB", f"resident {rows}", "{:,.0f}"),
                    ("arenas", f"arenas {rows}", "{:d}")]
    columns.append(("largest - smallest MiB", "kept", "{:+,.0f}"))
    return Table(lines, columns, summary=f"resident after each component and its malloc_trim; "
                 f"arenas: glibc's of at least {ARENA_MIN_BYTES >> 20} MiB")
