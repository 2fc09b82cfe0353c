"""Memory a process freed, handed back to the kernel.

glibc's allocator keeps freed pages for reuse, in as many arenas as threads have allocated
from, so a long job's resident size climbs with what its threads freed, not with what they
hold: on 30M taxi rows Transform's analysis, a file after another, rose from 1.2 to 1.6 GiB
holding about 1 MiB a file. `release_free_memory` returns those pages (`malloc_trim`)."""
from __future__ import annotations

import ctypes
import functools
from typing import Callable, Optional


@functools.cache
def _malloc_trim() -> Optional[Callable[[int], int]]:
    """The C library's `malloc_trim`, looked up once; None where it has none."""
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


def release_free_memory() -> bool:
    """Hands the pages glibc's allocator holds free back to the kernel; False where the C
    library has no `malloc_trim` (musl, macOS)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
