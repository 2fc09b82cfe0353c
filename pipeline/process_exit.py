"""How our processes end: with the status Python exits with, not an abort from a native
library's static destructors afterwards. Called once by each process entry point (`tfrp`, the
compiled pipeline's task command) and by nothing else.

Two libraries abort at that point, after a command has finished and said so:

- tensorflow-io's S3 client, once it has connected (tensorflow-io 0.37.1 with TensorFlow
  2.16: the AWS SDK's static EC2 metadata client is destroyed after the SDK's logger; "pure
  virtual method called", SIGABRT, status 134), so an orchestrator sees a finished task as
  failed;
- Arrow's thread pools, whose workers outlive the interpreter ("terminate called without an
  active exception", status -6: apache/arrow#34314, #39862).

Python's own exit runs as usual (threads joined, exit handlers, output flushed, the
interpreter finalized) and then calls C's `exit(status)`. Registered at Python's exit, after
anything a library registered while the process ran, a glibc `on_exit` handler is the first
C exit handler to run: it calls `_exit` with that status, and the static destructors never
run. A C library without `on_exit` (musl) keeps its ordinary exit.
"""
from __future__ import annotations

import atexit
import ctypes

_installed = False


def keep_exit_status() -> bool:
    """Makes this process end with Python's exit status (once); False where the C library
    has no `on_exit`."""
    global _installed
    if _installed:
        return True
    if not hasattr(_libc(), "on_exit"):
        return False
    atexit.register(_end_at_c_exit)
    _installed = True
    return True


def _libc():
    return ctypes.CDLL(None)


def _end_at_c_exit() -> None:
    libc = _libc()
    libc.on_exit(ctypes.cast(libc._exit, ctypes.c_void_p), None)
