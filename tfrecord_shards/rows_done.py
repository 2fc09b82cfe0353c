"""Rows done so far by this process's row loops, for the live line of `tfrp run`
(pipeline/progress.py). It imports nothing of ours, TFX's or any engine's.

The heavy loops call `add(rows)` once per block of records they finish: ExampleGen's encode
loop (rows read), StatisticsGen's scan (rows summarised), Transform's columnar apply loop
(rows transformed) and the Evaluator's scoring loop (rows read for scoring). A call costs a
lock taken once per block and one (time, total) mark kept; nothing is done per row.

Only this process's count is here: a loop running in a worker process (Beam's DirectRunner
with direct_num_workers, Spark's Python workers) counts in that process, which the live line
does not see. The components of a local run execute one at a time, so the rows a component
did are those counted after its execution began (`rows_after`)."""
from __future__ import annotations

import collections
import threading
import time
from typing import Optional

# Marks (wall time of the block's end, total after it), newest last. The live line looks
# back a few seconds at most, a few thousand blocks.
_MARKS = 4096
_lock = threading.Lock()
_total = 0
_marks: collections.deque = collections.deque(maxlen=_MARKS)


def add(rows: int) -> None:
    """Counts `rows` more rows done, once per block."""
    global _total
    with _lock:
        _total += rows
        _marks.append((time.time(), _total))


def total() -> int:
    """Every row counted in this process so far."""
    return _total


def total_at(when: float) -> Optional[int]:
    """The count as it stood at wall time `when` (seconds since the epoch), or None when the
    marks kept no longer reach back that far."""
    with _lock:
        marks, full = list(_marks), len(_marks) == _MARKS
    before = 0
    for at, count in marks:
        if at > when:
            break
        before = count
    else:
        return before
    if marks and marks[0][0] > when and full:
        return None  # older marks were dropped: the count at `when` is unknown
    return before


def rows_after(when: float) -> Optional[int]:
    """Rows counted after wall time `when`, or None when that is no longer known."""
    before = total_at(when)
    return None if before is None else total() - before
