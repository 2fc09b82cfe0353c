"""bench/arenas.py's reading of glibc's arenas, on a real `malloc_info` report of a process
whose thread holds 6.4 MiB in its own arena."""
from __future__ import annotations

import json
import os
import subprocess
import sys

_THREAD_HOLDING = """
import json, sys, threading
sys.path.insert(0, sys.argv[1])
from bench.arenas import arenas_now

held, ready, done = [], threading.Event(), threading.Event()

def hold():
    held.extend(bytearray(64 << 10) for _ in range(100))  # below glibc's first mmap threshold
    ready.set()
    done.wait()

worker = threading.Thread(target=hold)
worker.start()
ready.wait()
holding = arenas_now()
done.set()
worker.join()
print(json.dumps(holding))
"""


def test_a_threads_arena_is_found_with_its_size():
    result = subprocess.run([sys.executable, "-c", _THREAD_HOLDING, os.getcwd()],
                            capture_output=True, text=True, check=True)
    arenas = {int(number): size for number, size in json.loads(result.stdout).items()}
    others = {number: size for number, size in arenas.items() if number != 0}
    assert others and max(others.values()) >= 100 * (64 << 10), arenas
    assert all(size >= 4 << 20 for size in arenas.values()), arenas
