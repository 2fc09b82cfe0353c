"""JSON Lines: one object per line; lines Arrow rejects are retried in Python, so only the
bad lines themselves are quarantined."""
from __future__ import annotations

import io
import json
from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.json as pajson

from tfrecord_shards.codec import serializer
from components.example_gen.sources.base import (
    BATCH_ROWS, BadRecord, Item, SourceFormat, arrow_kinds, flatten_nested, open_input,
    parse_times, profile_batches)

JSONL_BLOCK_BYTES = 16 << 20


def _line_blocks(path: str) -> Iterator[tuple[int, bytes]]:
    """(first line number, block) with blocks cut at line ends."""
    line = 1
    with open_input(path) as f:
        rest = b""
        while True:
            chunk = f.read(JSONL_BLOCK_BYTES)
            if not chunk:
                break
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            yield line, data[:cut]
            line += data[:cut].count(b"\n")
            rest = data[cut:]
        if rest.strip():
            yield line, rest + b"\n"


def _json_value_kind(value) -> tuple[str, bool]:
    if isinstance(value, list):
        kind = serializer.NULL
        for item in value:
            kind = serializer.widen(kind, _json_value_kind(item)[0])
        return kind, True
    if value is None:
        return serializer.NULL, False
    if isinstance(value, bool):
        return serializer.BOOL, False
    if isinstance(value, int):
        return serializer.INT, False
    if isinstance(value, float):
        return serializer.FLOAT, False
    return serializer.BYTES, False


def _python_rows_to_batch(rows: list[dict]) -> pa.RecordBatch:
    """Slow path for blocks pyarrow rejects (mixed types): widen per column in Python."""
    names: list[str] = []
    for row in rows:
        names += [k for k in row if k not in names]
    arrays = []
    for name in names:
        values = [row.get(name) for row in rows]
        kind, is_list = serializer.NULL, False
        for value in values:
            k, lst = _json_value_kind(value)
            kind, is_list = serializer.widen(kind, k), is_list or lst
        if is_list:
            values = [v if isinstance(v, list) or v is None else [v] for v in values]
        if kind == serializer.BYTES:
            def text(v):
                return v if isinstance(v, str) else json.dumps(v)
            values = [None if v is None else ([text(x) for x in v] if is_list else text(v))
                      for v in values]
        elif kind == serializer.FLOAT:
            values = [None if v is None else ([float(x) for x in v] if is_list else float(v))
                      for v in values]
        arrays.append(pa.array(values))
    return pa.RecordBatch.from_arrays(arrays, names)


def _typed_times(batch: pa.RecordBatch, kinds: Optional[dict]) -> pa.RecordBatch:
    """Columns profiled as times, parsed from the text the Python path keeps, as Arrow's
    reader parsed them in the blocks it read."""
    if not kinds:
        return batch
    columns = list(batch.columns)
    for index, name in enumerate(batch.schema.names):
        if kinds.get(name, (None,))[0] == serializer.TIME and (
                pa.types.is_string(columns[index].type) or pa.types.is_null(columns[index].type)):
            columns[index] = parse_times(columns[index])
    return pa.RecordBatch.from_arrays(columns, batch.schema.names)


def _times_as_text(table: pa.Table, kinds: dict) -> bool:
    return any((pa.types.is_timestamp(t) or pa.types.is_date(t))
               and kinds.get(name, (serializer.BYTES, False))[0] != serializer.TIME
               for name, t in zip(table.schema.names, table.schema.types))


def read_jsonl(path: str, kinds: Optional[dict] = None
               ) -> Iterator[Item]:
    for first_line, block in _line_blocks(path):
        try:
            table = pajson.read_json(io.BytesIO(block),
                                     read_options=pajson.ReadOptions(block_size=len(block) + 1))
            table.schema.names  # a key that is not UTF-8 fails here, not downstream
            if kinds is not None and _times_as_text(table, kinds):
                # Arrow read this block's ISO strings as times, but other blocks made the
                # column text: the Python path keeps them as written.
                raise pa.ArrowInvalid("times in a text column")
            batches = table.to_batches(max_chunksize=BATCH_ROWS)
        except (pa.ArrowInvalid, UnicodeDecodeError):
            rows = []
            for number, line in enumerate(block.split(b"\n")[:-1], start=first_line):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    yield BadRecord(path, f"line {number}", f"invalid JSON: {e}",
                                    line.decode("utf-8", "replace"))
                    continue
                if not isinstance(row, dict):
                    yield BadRecord(path, f"line {number}", "not a JSON object",
                                    line.decode("utf-8", "replace"))
                    continue
                rows.append(row)
            batches = [_typed_times(_python_rows_to_batch(rows), kinds)] if rows else []
        for batch in batches:
            yield flatten_nested(batch)


def profile_jsonl(path: str):
    return profile_batches(path, read_jsonl, arrow_kinds)


FORMAT = SourceFormat("jsonl", (".jsonl", ".json", ".ndjson"), read_jsonl, profile_jsonl)
