"""Fills numba's on-disk cache with the machine code of our compiled loops (the tf.Example
encoder and the TFRecord framing, the split hash, the statistics), so that the first run
after an install or an image build loads them instead of compiling them. Compiled on first
use they cost the first run about 10 s in ExampleGen and 15 s in StatisticsGen
(openintro::resume, 2 cores), and every StatisticsGen task of a compiled pipeline paid them
again in a fresh container. `make install` and the image build run
`python -m pipeline.jit_cache`.

It runs the real jobs (ExampleGen's Beam job, then StatisticsGen's) on small tables holding
each column kind the sources give (whole numbers narrow and wide, fractional ones, text,
with gaps, and lists), so the loops are compiled for the argument types real runs pass
them. numba keys its cache by the source file and the CPU: an edited module or another kind
of CPU compiles once more, on first use, as before.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time

from tfrecord_shards import fileio

# One row in three holds gaps; the lists hold 0 to 2 values.
_ROWS = 60


def _csv_text() -> str:
    # `seconds` spans more values than StatisticsGen counts one by one, so they are sorted.
    lines = ["count,ratio,name,flag,seconds"]
    for row in range(_ROWS):
        gap = row % 3 == 0
        lines.append(",".join([
            "" if gap else str(row - 20),
            "" if gap else f"{row / 7:.4f}",
            "" if gap else f"name {row % 5}",
            str(row % 2),
            str(1_400_000_000 + row * 86_400)]))
    return "\n".join(lines) + "\n"


def _jsonl_text() -> str:
    return "".join(json.dumps({
        "ids": list(range(row % 3)),
        "scores": [row / 3.0] * (row % 3),
        "tags": [f"t{row % 4}"] * (row % 3),
        "value": None if row % 4 == 0 else row * 1.5,
    }) + "\n" for row in range(_ROWS))


def warm(work_dir: str) -> dict[str, int]:
    """Runs ExampleGen and StatisticsGen over each small table in `work_dir`; returns the
    rows each table's statistics counted."""
    # ExampleGen's engine, stats_job: 0.35 s to import (numba); only warming needs them.
    from components.example_gen import engine
    from components.example_gen.options import ExampleGenOptions
    from components.statistics_gen import stats_job

    counted = {}
    for name, text in (("table.csv", _csv_text()), ("table.jsonl", _jsonl_text())):
        folder = fileio.join(work_dir, name.replace(".", "-"))
        source = fileio.join(folder, "source", name)
        fileio.makedirs(fileio.dirname(source))
        fileio.write_text(source, text)
        examples = fileio.join(folder, "examples")
        engine.run(ExampleGenOptions(source=source), examples)
        written = stats_job.run(examples, fileio.join(folder, "statistics"),
                                stats_job.artifact_splits(examples))
        counted[name] = sum(written.values())
    return counted


def main() -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfrp-jit-cache-") as work_dir:
        counted = warm(work_dir)
    print(f"numba cache filled in {time.perf_counter() - started:.1f} s "
          f"({', '.join(f'{name}: {rows} rows' for name, rows in counted.items())})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
