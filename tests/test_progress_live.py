"""The live line of `tfrp run` on a terminal: the component running, the rows it has done and
their rate; piped output (logs, CI) has none of it."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from conftest import taxi_run_args

# A live line with rows: "  Evaluator   running     3 s  1,340 rows  402 rows/s".
LIVE_ROWS = re.compile(
    r"^  (\S+)\s+running\s+\d+ s  ([\d,]+) rows  (\d+(?:\.\d+)?)([kMG]?) rows/s")


def run_on_terminal(args: list[str], timeout: float = 900) -> tuple[int, str, str]:
    """`tfrp ARGS` with stdout on a pseudo-terminal of 160 columns, as a person's shell runs
    it: (exit status, what the terminal received, stderr)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    env = {name: value for name, value in os.environ.items() if name != "COLUMNS"}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    child = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args],
                             stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
                             env=env)
    os.close(slave)
    received, deadline = bytearray(), time.monotonic() + timeout
    stderr = bytearray()
    streams = {master: received, child.stderr.fileno(): stderr}
    try:
        while streams and time.monotonic() < deadline:
            ready, _, _ = select.select(list(streams), [], [], 1.0)
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the terminal's last writer has closed it
                    chunk = b""
                if chunk:
                    streams[fd] += chunk
                else:
                    del streams[fd]
    finally:
        if child.poll() is None and streams:
            child.kill()
        status = child.wait()
        os.close(master)
        child.stderr.close()
    return status, received.decode(errors="replace"), stderr.decode(errors="replace")


@pytest.fixture(scope="module")
def terminal_run(taxi_cli_run, tmp_path_factory):
    """The shared taxi run's settings run again on a terminal, into an output root of its
    own (nothing cached)."""
    config, _, _ = taxi_cli_run
    config = config.replace(output_root=str(tmp_path_factory.mktemp("tty-runs")))
    status, shown, stderr = run_on_terminal(["run", *taxi_run_args(config)])
    assert status == 0, stderr[-3000:]
    return shown


@pytest.mark.pipeline
def test_live_line_shows_rows_and_a_rate_on_a_terminal(terminal_run):
    # The live line is rewritten in place with carriage returns; each state of it is a piece.
    pieces = [piece.rstrip() for line in terminal_run.split("\n") for piece in line.split("\r")]
    counted = [LIVE_ROWS.match(piece) for piece in pieces]
    counted = [m for m in counted if m]
    assert counted, terminal_run[-4000:]
    for match in counted:
        name, rows, rate, unit = match.groups()
        assert int(rows.replace(",", "")) > 0
        assert float(rate) >= 0 and unit in ("", "k", "M", "G")
    # At most the slice's 2,000 rows in one pass: a component's count starts at its own start.
    assert all(int(m.group(2).replace(",", "")) <= 2000 for m in counted), counted
    # The lines per component and the summary are the same as when piped.
    assert re.search(r"^  ShardedExampleGen\s+ran\s", terminal_run.replace("\r", "\n"), re.M)
    assert re.search(r"^Reused from cache: 0 of 9 components", terminal_run, re.M)


@pytest.mark.pipeline
def test_piped_run_shows_no_live_line(taxi_cli_run):
    """The same run with its output to a pipe: the lines per component and the summary, and
    no live line (no carriage return, no rows or rate)."""
    _, _, result = taxi_cli_run
    assert "\r" not in result.stdout
    assert " running " not in result.stdout
    assert "rows/s" not in result.stdout + result.stderr
    assert re.search(r"^  ShardedExampleGen\s+ran\s", result.stdout, re.M)
    assert re.search(r"^Reused from cache: 0 of 9 components$", result.stdout, re.M)


def test_live_line_writes_rows_with_separators_and_a_scaled_rate():
    from pipeline import progress

    assert progress.live_line("ShardedExampleGen", 2.4, 1234567, 512_345.0) == (
        f"  {'ShardedExampleGen':<29} running     2 s  1,234,567 rows  512k rows/s")
    assert progress.live_line("Trainer", 7) == f"  {'Trainer':<29} running     7 s ..."
    assert progress.live_line("Trainer", 7, 0, None).endswith("running     7 s ...")
    assert progress.live_line("StatisticsGen", 1, 999, None).endswith("  999 rows")
    assert [progress.rate_text(r) for r in (0.4, 812, 999.6, 5123, 51_234, 512_345,
                                            1_234_567, 12e6, 3e9)] == [
        "0", "812", "1.00k", "5.12k", "51.2k", "512k", "1.23M", "12.0M", "3.00G"]


def test_rows_and_rate_count_only_what_came_after_the_start(monkeypatch):
    """A component's rows are those counted after its execution began; the rate is over the
    last few seconds, and falls when the rows stop."""
    import collections
    import types

    from tfrecord_shards import rows_done
    from pipeline import progress

    monkeypatch.setattr(rows_done, "_marks", collections.deque(maxlen=rows_done._MARKS))
    monkeypatch.setattr(rows_done, "_total", 0)
    clock = [1000.0]
    monkeypatch.setattr(rows_done, "time", types.SimpleNamespace(time=lambda: clock[0]))
    rows_done.add(500)  # the component before
    for _ in range(10):  # 100 rows a second from 1001 to 1010
        clock[0] += 1
        rows_done.add(100)
    assert progress.rows_and_rate(1000.5, 1010.0) == (1000, pytest.approx(100.0))
    assert progress.rows_and_rate(1010.5, 1011.0) == (0, None)  # nothing since it began
    assert progress.rows_and_rate(1000.5, 1030.0) == (1000, 0.0)  # stopped long ago
    # Marks dropped beyond the start: rows unknown, not a guess.
    for _ in range(rows_done._MARKS):
        clock[0] += 0.001
        rows_done.add(1)
    assert rows_done.rows_after(1000.5) is None
    assert progress.rows_and_rate(1000.5, clock[0]) == (None, None)
