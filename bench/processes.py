"""Measuring whole processes: each side of a benchmark runs as `python -m bench.<module>` in a
fresh child (imports included, nothing warmed up by an earlier side), the sides interleaved
across repeats so drift in the machine hits them alike, and medians reported."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence


def resident_bytes() -> int:
    """This process's resident size now (VmRSS)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def pin_to_one_core() -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def run_child(module: str, args: Sequence[str], env: Optional[dict] = None) -> dict:
    """The child's last stdout line (JSON, with its in-run `seconds`), plus the whole
    process's wall time as `process_seconds`. `env`: variables added to the child's."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {})))
    whole = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{module} {args[:1]} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]), process_seconds=whole)


def medians(samples: list[dict], keys: Sequence[str]) -> dict:
    """{"median_<key>": median of the samples' values} for each key."""
    return {f"median_{key}": statistics.median(s[key] for s in samples) for key in keys}


def interleaved(names: Sequence[str], repeats: int, rows: int, measure: Callable[[str], dict],
                log: Callable[[str], None], by: str = "seconds", also: Sequence[str] = ()
                ) -> dict:
    """Runs `measure(name)` for every name, `repeats` times, checks each handled `rows` rows,
    and returns medians per name with the ratio to the first name (the baseline). Rates and
    ratios come from the `by` time: in-run `seconds` or the whole `process_seconds`; the
    medians of the keys in `also` are reported too."""
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names:
            runs[name].append(measure(name))
            if runs[name][-1]["rows"] != rows:
                raise RuntimeError(f"{name} handled {runs[name][-1]['rows']} rows, not {rows}")
        log(f"repeat {repeat + 1}/{repeats}: " + ", ".join(
            f"{n} {runs[n][-1][by]:.2f}s" for n in names))
    paths = {}
    for name, items in runs.items():
        paths[name] = dict(
            medians(items, ["seconds", "process_seconds", *also]),
            rows_per_second=rows / statistics.median(r[by] for r in items), rate_from=by,
            seconds=[r["seconds"] for r in items],
            process_seconds=[r["process_seconds"] for r in items])
    base = paths[names[0]]["rows_per_second"]
    for entry in paths.values():
        entry["vs_baseline"] = entry["rows_per_second"] / base
    return {"rows": rows, "repeats": repeats, "baseline": names[0], "paths": paths}
