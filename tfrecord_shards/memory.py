"""Memory a process freed, handed back to the kernel.

glibc's allocator keeps freed pages for reuse, in as many arenas as threads have allocated
from, so a long job's resident size climbs with what its threads freed, not with what they
hold: on 30M taxi rows Transform's analysis, a file after another, rose from 1.2 to 1.6 GiB
holding about 1 MiB a file. `release_free_memory` returns those pages (`malloc_trim`).

What `malloc_trim` cannot return is a page that still holds one live block. Each thread that
allocates gets an arena of its own, up to 8 per core, and live blocks spread over all of
them: after ExampleGen's 30M rows the process kept 197 MiB more than after 3M, in arenas
of about 20 MiB each. `limit_arenas` caps their number for a process that runs one stage
after another.

Those 20 MiB were mostly not live blocks but each arena's free top, which `malloc_trim`
hands back for the main arena only. glibc lets that top grow to twice the largest block
freed from a mapping of its own (up to 64 MiB an arena) before it shrinks it, and a 30M-row
ExampleGen ends with 14 arenas above 4 MiB where a 3M one ends with 5. `cap_kept_free_memory`
fixes both thresholds, so an arena never keeps more than the cap free at its top and larger
blocks get mappings of their own, which go back to the kernel when freed.

The garbage collector's own cost grows with what a process has imported: `objects_frozen`
keeps its full passes off the objects alive when a run starts."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
import threading
from typing import Callable, Iterator, Optional

# glibc's `mallopt` parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


@functools.cache
def _libc_function(name: str) -> Optional[Callable]:
    """The C library's function `name`, looked up once; None where it has none."""
    return getattr(ctypes.CDLL(None), name, None)


def release_free_memory() -> bool:
    """Hands the pages glibc's allocator holds free back to the kernel; False where the C
    library has no `malloc_trim` (musl, macOS)."""
    trim = _libc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def limit_arenas(count: int) -> bool:
    """Lets glibc's allocator make at most `count` arenas from now on (threads then share
    them), unless the process was started with a limit of its own (`MALLOC_ARENA_MAX`, or
    `arena_max` in `GLIBC_TUNABLES`). glibc fixes its limit once, when it first makes more
    than 8 arenas, so this is called early, before a stage's threads start. False where the
    C library has no `mallopt` or a limit was given."""
    if "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    mallopt = _libc_function("mallopt")
    return mallopt is not None and mallopt(_M_ARENA_MAX, count) == 1


def cap_kept_free_memory(cap_bytes: int) -> bool:
    """At most `cap_bytes` free at the top of each of glibc's arenas, and blocks of `cap_bytes`
    or more in mappings of their own, from now on: glibc's own thresholds start at 128 KiB
    and rise with the largest block freed (up to 32 MiB, and 64 MiB kept), and stay there.
    Left as they are where the process was started with either threshold of its own
    (`MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`, or `GLIBC_TUNABLES`). False then,
    or where the C library has no `mallopt`."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if ("MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ
            or "trim_threshold" in tunables or "mmap_threshold" in tunables):
        return False
    mallopt = _libc_function("mallopt")
    return (mallopt is not None and mallopt(_M_MMAP_THRESHOLD, cap_bytes) == 1
            and mallopt(_M_TRIM_THRESHOLD, cap_bytes) == 1)


_frozen_depth = 0  # objects_frozen blocks open, in any thread
_frozen_lock = threading.Lock()


@contextlib.contextmanager
def objects_frozen() -> Iterator[None]:
    """Every object alive on entry left out of the garbage collector's passes until the
    outermost such block ends (`gc.freeze`). With TensorFlow, TFX and Beam imported a process
    holds about 850,000 objects, and a full pass walks them all each time a few hundred
    thousand new ones have lived a while: parsing a 30M-row run's 10 MB ExampleGen manifest
    took 0.41 s in such a process, 0.04 s with them frozen. Unfrozen on the way out, so what
    dies later is still collected."""
    global _frozen_depth
    with _frozen_lock:
        if _frozen_depth == 0:
            gc.freeze()
        _frozen_depth += 1
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen_depth -= 1
            if _frozen_depth == 0:
                gc.unfreeze()
