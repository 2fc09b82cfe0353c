"""Reads tf.Example shards back as rows, for `tfrp inspect` and for tests.

The stored schema.pbtxt gives the types when there is one; otherwise tfx_bsl infers them from
the records, so nobody hand-writes a feature spec to look at data.
"""
from __future__ import annotations

import json
from typing import Iterator, Optional

from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import fileio, shards, tfrecord_io
from tfrecord_shards.codec import parser, schema_file
from tfrecord_shards.packing.arrow import RowDecoder
from tfrecord_shards.record_index import INDEX_FOLDER


def record_files(path: str) -> list[str]:
    """TFRecord files at `path`: the file itself, or every data file below a folder. Names
    starting with "." or "_" at any depth are a writer's bookkeeping, never data, and an
    output of ours whose commit was stopped is refused (`shards.check_committed`)."""
    if not fileio.isdir(path):
        return [path]
    shards.check_committed(path)
    files = []
    for root, _, names in fileio.walk(path):
        inside = fileio.parts(fileio.relpath(root, path))
        if any(fileio.is_hidden(p) for p in inside) or \
                (inside[:1] in (["quarantine"], [INDEX_FOLDER])):
            continue
        files += [fileio.join(root, n) for n in sorted(names)
                  if not n.endswith((".json", ".pbtxt", ".pb", ".jsonl", ".idx", ".part"))
                  and not fileio.is_hidden(n)]
    return sorted(files)


def iter_rows(path: str, limit: Optional[int] = None,
              schema: Optional[schema_pb2.Schema] = None) -> Iterator[dict]:
    """Rows as {feature: python value(s)}; a scalar feature gives a value or None."""
    schema = schema if schema is not None else schema_file.find_schema(path)
    scalars = {f.name for f in schema.feature if parser.is_scalar(f)} if schema else None
    # Packed data is read as its rows; without a stored schema, tfx_bsl infers the types.
    decoder = RowDecoder(schema) if schema is not None else None
    count = 0
    for file in record_files(path):
        batch: list[bytes] = []
        first = 0  # the file offset of the batch's first record
        for offset, record in tfrecord_io.iter_records(file):
            if not batch:
                first = offset
            batch.append(record)
            if limit is not None and count + len(batch) >= limit:
                break
        if batch:
            if decoder is None:
                decoded = parser.decode_examples(batch).to_pydict()
            else:
                decoded = decoder.decode(tfrecord_io.RecordBlock.of_records(
                    file, first, batch)).to_pydict()
            names = list(decoded)
            for i in range(len(next(iter(decoded.values()), []))):
                if limit is not None and count >= limit:
                    return
                row = {}
                for name in names:
                    value = decoded[name][i]
                    if value is not None and (
                            (scalars is not None and name in scalars) or
                            (scalars is None and len(value) == 1)):
                        value = value[0] if value else None
                    row[name] = value
                yield row
                count += 1
        if limit is not None and count >= limit:
            return


def _show(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
            return text if text.isprintable() else f"<{len(value)} bytes>"
        except UnicodeDecodeError:
            return f"<{len(value)} bytes>"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _json_value(value):
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"bytes": len(value)}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def format_rows(rows: list[dict], fmt: str = "table", max_width: int = 24) -> str:
    if fmt == "json":
        return "\n".join(json.dumps({k: _json_value(v) for k, v in row.items()})
                         for row in rows)
    if not rows:
        return "(no records)"
    names = list(rows[0])
    cells = [[_show(row.get(n))[:max_width] for n in names] for row in rows]
    widths = [max(len(n[:max_width]), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    lines = ["  ".join(n[:max_width].ljust(w) for n, w in zip(names, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
