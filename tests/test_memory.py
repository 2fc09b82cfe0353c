"""Freed memory handed back to the kernel (`tfrecord_shards.memory`), measured on a real
fragmented heap in a process of its own."""
from __future__ import annotations

import os
import subprocess
import sys

_FRAGMENTED_HEAP = """
import sys
sys.path.insert(0, sys.argv[1])
from tfrecord_shards.memory import release_free_memory

def resident_mib():
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) // 1024

kept, freed = [], []
for i in range(150_000):
    (kept if i % 64 == 0 else freed).append(bytearray(4096))
before = resident_mib()
del freed
after_free = resident_mib()
assert release_free_memory()
print(before, after_free, resident_mib())
"""


def test_freed_pages_go_back_to_the_kernel_when_released():
    """600 MB of 4 KiB buffers, every 64th kept: freed, the holes stay resident (glibc keeps
    them for reuse); released, they go back. Locally every component runs in one process,
    and this is what each leaves behind."""
    result = subprocess.run([sys.executable, "-c", _FRAGMENTED_HEAP, os.getcwd()],
                            capture_output=True, text=True, check=True)
    before, after_free, released = map(int, result.stdout.split())
    assert after_free > before - 100, (before, after_free)
    assert released < after_free - 400, (before, after_free, released)
