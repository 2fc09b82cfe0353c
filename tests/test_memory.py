"""Freed memory handed back to the kernel (`tfrecord_shards.memory`), measured on a real
fragmented heap in a process of its own; and objects kept off the garbage collector's passes
for a run's length."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import weakref

from tfrecord_shards.memory import objects_frozen


def _printed(script: str, *args: str, **env: str) -> list[str]:
    """What `script` printed, run as a process of its own (this checkout first on its path,
    then `args`) with `env` added to the environment."""
    result = subprocess.run([sys.executable, "-c", script, os.getcwd(), *args],
                            capture_output=True, text=True, check=True,
                            env={**os.environ, **env})
    return result.stdout.split()


_FRAGMENTED_HEAP = """
import sys
sys.path.insert(0, sys.argv[1])
from bench.processes import resident_bytes
from tfrecord_shards.memory import release_free_memory

def resident_mib():
    return resident_bytes() >> 20

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
    before, after_free, released = map(int, _printed(_FRAGMENTED_HEAP))
    assert after_free > before - 100, (before, after_free)
    assert released < after_free - 400, (before, after_free, released)


_THREADS_ALLOCATING = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from bench.arenas import arenas_now
from tfrecord_shards.memory import limit_arenas

limited = limit_arenas(int(sys.argv[2])) if sys.argv[2] != "none" else None
together = threading.Barrier(8)
held = []

def allocate():
    held.append(bytearray(200_000))  # from this thread's arena
    together.wait()  # all alive at once: none takes over an arena another has let go

threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(limited, len(arenas_now(min_bytes=0)))
"""


def _arenas_after_eight_threads(limit: str, **env: str) -> tuple[str, int]:
    limited, arenas = _printed(_THREADS_ALLOCATING, limit, **env)
    return limited, int(arenas)


def test_threads_share_the_arenas_a_limit_allows():
    """Eight threads allocating at once make an arena each; limited to 2, they share 2. A
    limit the process was started with is left as it is."""
    _, unlimited = _arenas_after_eight_threads("none")
    assert unlimited > 4, unlimited
    assert _arenas_after_eight_threads("2") == ("True", 2)
    limited, arenas = _arenas_after_eight_threads("2", MALLOC_ARENA_MAX="3")
    assert (limited, arenas) == ("False", 3)


_THREAD_FREED = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from bench.processes import resident_bytes
from tfrecord_shards.memory import cap_kept_free_memory, release_free_memory

def resident_mib():
    return resident_bytes() >> 20

capped = cap_kept_free_memory(int(sys.argv[2])) if sys.argv[2] != "none" else None

def work():
    freed_first = bytearray(16 << 20)  # mapped apart; freed, glibc raises its thresholds
    del freed_first
    blocks = [bytearray(1 << 20) for _ in range(24)]  # 1 MiB blocks, from this thread's arena
    del blocks

before = resident_mib()
worker = threading.Thread(target=work)
worker.start()
worker.join()
assert release_free_memory()
print(capped, resident_mib() - before)
"""


def _kept_after_a_thread(cap: str, **env: str) -> tuple[str, int]:
    capped, kept_mib = _printed(_THREAD_FREED, cap, **env)
    return capped, int(kept_mib)


def test_a_capped_arena_hands_back_what_its_thread_freed():
    """A thread frees a 16 MiB block, then 24 MiB of 1 MiB blocks: with glibc's own
    thresholds the 1 MiB blocks come from the thread's arena and stay resident after it ends,
    released or not; capped at 512 KiB they get mappings of their own and go back. A
    threshold the process was started with is left as it is."""
    _, uncapped = _kept_after_a_thread("none")
    assert uncapped >= 20, uncapped
    capped, kept = _kept_after_a_thread(str(512 << 10))
    assert capped == "True" and kept <= 2, (capped, kept)
    capped, kept = _kept_after_a_thread(str(512 << 10), MALLOC_MMAP_THRESHOLD_=str(32 << 20),
                                        MALLOC_TRIM_THRESHOLD_=str(64 << 20))
    assert capped == "False" and kept >= 20, (capped, kept)


class _Node:
    pass


def test_objects_alive_on_entry_stay_uncollected_until_the_outermost_block_ends():
    """A cycle alive when the block starts is frozen: dropped inside, the collector leaves
    it, in a nested block and in another thread's block too; once the outermost block ends
    it is collected. A cycle made inside is collected as usual."""
    before = _Node()
    before.self = before
    was_alive = weakref.ref(before)
    with objects_frozen():
        assert gc.get_freeze_count() > 0
        del before
        inside = _Node()
        inside.self = inside
        made_inside = weakref.ref(inside)
        del inside
        entered = threading.Event()
        leave = threading.Event()

        def other_block():
            with objects_frozen():
                entered.set()
                leave.wait(10)

        other = threading.Thread(target=other_block)
        other.start()
        assert entered.wait(10)
        with objects_frozen():
            pass
        leave.set()
        other.join()
        gc.collect()
        assert was_alive() is not None
        assert made_inside() is None
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert was_alive() is None


def test_a_kubeflow_task_runs_its_executor_with_the_imported_objects_frozen(tmp_path):
    """A task as Kubeflow Pipelines and Vertex AI start it (`pipeline.task_entrypoint`, then
    TFX's v2 entrypoint, a process of its own): its executor's Do runs with the objects that
    the executor's module and TFX left alive on import (hundreds of thousands) frozen, as a
    local run's components do. Without the freeze the count is 0."""
    from pipeline import task_entrypoint

    probe = tmp_path / "probe.json"
    invocation = {"inputs": {"parameterValues": {"probe_path": str(probe)}},
                  "outputs": {"outputFile": str(tmp_path / "executor_output.json")}}
    inputs_spec = {"parameters": {"probe_path": {"parameterType": "STRING"}}}
    tests = os.path.dirname(os.path.abspath(__file__))
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.getcwd()]))
    subprocess.run([sys.executable, "-m", "pipeline.task_entrypoint",
                    "--executor_class_path", "frozen_probe.Executor",
                    "--json_serialized_invocation_args", json.dumps(invocation),
                    "--json_serialized_inputs_spec_args", json.dumps(inputs_spec)],
                   env=environment, check=True, capture_output=True)
    assert json.loads(probe.read_text())["frozen"] > 100_000
    for args in (["--executor_class_path", "a.b.Executor"], ["--executor_class_path=a.b.C"]):
        assert task_entrypoint.executor_module(["--x", "1", *args]) == "a.b"
    assert task_entrypoint.executor_module(["--json_serialized_invocation_args", "{}"]) is None
