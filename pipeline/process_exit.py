"""How our processes end: with the status their command exits with, as soon as Python's own
exit work is done. Each process entry point (`tfrp`, the compiled pipeline's task command)
runs its body through `run`; nothing else calls this module.

Python's exit runs as usual up to its exit handlers: other threads joined, every handler
registered with `atexit` run, logging flushed. What follows is skipped, with reason:

- the interpreter's finalization, which after a pipeline run spends seconds tearing down
  TensorFlow's and Beam's objects (5.5 s after `tfrp run` on the taxi sample, measured);
- the C runtime's exit, where native libraries' static destructors abort a process that has
  finished: tensorflow-io's S3 client once it has connected (the AWS SDK's EC2 metadata
  client destroyed after its logger: "pure virtual method called", status 134) and Arrow's
  thread pools, whose workers outlive the interpreter ("terminate called without an active
  exception": apache/arrow#34314, #39862).

The handler that ends the process is registered by `install`, which each entry point's module
calls before it imports anything else, so it runs after every exit handler the libraries
register (atexit runs them last in, first out); logging, imported before it, is flushed by it.
`os._exit` needs no C library function of its own, so this holds with glibc and musl alike.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import Callable, NoReturn, Optional

_status: Optional[int] = None  # set by `run`: until then the process exits as Python's do
_installed = False


def install() -> None:
    """Registers the handler that ends the process (once); call it first."""
    global _installed
    if not _installed:
        atexit.register(_end)
        _installed = True


def run(body: Callable[[], object]) -> NoReturn:
    """Runs `body` as the process and ends it with its exit status: 0, a SystemExit's code
    (a message: printed, status 1), or 1 for an exception Python reports itself."""
    global _status
    install()
    try:
        body()
    except SystemExit as finished:
        _status = _code_of(finished.code)
        raise
    except BaseException:
        _status = 1
        raise
    _status = 0
    raise SystemExit(0)


def _code_of(code) -> int:
    """What Python's own exit makes of `SystemExit(code)`: None is 0, a message is 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _end() -> None:
    if _status is None:  # the body did not run through `run`: Python's own exit, unchanged
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(_status)
