"""The compact form Transform's analysis keeps its decoded batches in: every kind of column
the codec decodes comes back equal, and batches of different forms share one copy (the taxi
files' copies: test_transform_reuse.py)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from components.transform.compact_batches import compact, expanded
from components.transform.inputs import ArrowCopy, kept_batches

INT64 = pa.large_list(pa.int64())


def forms(stored: pa.RecordBatch) -> list[str]:
    return stored.schema.metadata[b"tfrp.forms"].decode().split(",")


def round_trip(batch: pa.RecordBatch) -> pa.RecordBatch:
    stored = compact(batch)
    # Through the IPC bytes the copy is written as, not only in memory.
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, stored.schema) as writer:
        writer.write_batch(stored)
    read = pa.ipc.open_stream(sink.getvalue()).read_next_batch()
    back = expanded(read, {})
    assert back.schema.equals(batch.schema, check_metadata=True)
    assert back.equals(batch)
    return stored


def test_every_kind_of_column_comes_back_equal():
    batch = pa.RecordBatch.from_arrays([
        pa.array([[1], [2], [3], [4]], INT64),                      # one a row, int8
        pa.array([[70000], None, [-5], [1]], INT64),                 # missing rows, int32
        pa.array([[1 << 40], [2], [3], [4]], INT64),                 # needs int64
        pa.array([[1.5], [], None, [2.5]], pa.large_list(pa.float32())),  # empty, missing
        pa.array([[1.0, 2.0], [3.0], None, []], pa.large_list(pa.float64())),  # several
        pa.array([[b"a"], [b""], None, [b"xyz"]], pa.large_list(pa.large_binary())),
        pa.array([[b"p", b"q"], [b"r"], [b""], [b"s"]], pa.large_list(pa.large_binary())),
        pa.array([None, None, None, None], INT64),                   # never present
        pa.array([[1], [2], [3], [4]], pa.large_list(pa.int32())),   # not a decoded kind
    ], names=list("abcdefghi"))
    stored = round_trip(batch)
    assert forms(stored) == ["one", "list32", "one", "list32", "list32", "list32", "list32",
                             "list32", "list"]
    assert stored.column(0).type == pa.int8() and stored.column(2).type == pa.int64()
    assert stored.column(1).type.value_type == pa.int32()


def test_a_sliced_batch_and_an_empty_one_come_back_equal():
    rows = 1000
    generator = np.random.default_rng(7)
    lengths = generator.integers(0, 2, rows)
    values = [[int(v)] if n else None for v, n in zip(generator.integers(-300, 300, rows),
                                                      lengths)]
    strings = [[b"x" * int(n)] for n in generator.integers(0, 5, rows)]
    batch = pa.RecordBatch.from_arrays([pa.array(values, INT64), pa.array(
        strings, pa.large_list(pa.large_binary()))], names=["n", "s"])
    for part in (batch.slice(13, 500), batch.slice(999), batch.slice(0, 0)):
        round_trip(part)
    assert forms(compact(batch.slice(13, 500))) == ["list32", "one"]


def test_the_copy_of_batches_of_different_forms_reads_back_in_order(tmp_path):
    copy = str(tmp_path / "mixed.arrow")
    first = pa.RecordBatch.from_arrays([pa.array([[1], [2]], INT64)], names=["n"])
    second = pa.RecordBatch.from_arrays([pa.array([[1, 2], None], INT64)], names=["n"])
    with ArrowCopy(copy) as kept:
        kept.write(first)
        kept.write(second)
    assert [forms(compact(b)) for b in (first, second)] == [["one"], ["list32"]]
    again = list(kept_batches(copy))
    assert len(again) == 2 and again[0].equals(first) and again[1].equals(second)
