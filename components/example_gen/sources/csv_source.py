"""CSV with a header row, parsed by Arrow in both passes so cells convert identically."""
from __future__ import annotations

import contextlib
import re
import sys
from typing import Iterator, Optional

import pyarrow as pa

from components.codec import serializer
from components.example_gen.sources.base import (
    BadRecord, FileProfile, Item, SourceError, SourceFormat, open_input)

CSV_BLOCK_BYTES = 4 << 20
_TRUE_WORDS = ["true", "True", "TRUE"]
_FALSE_WORDS = ["false", "False", "FALSE"]
_CSV_ARROW_TYPES = {serializer.INT: pa.int64(), serializer.FLOAT: pa.float64(), serializer.BOOL: pa.bool_(),
                    serializer.BYTES: pa.binary(), serializer.NULL: pa.binary()}
_CONVERSION_ERROR = re.compile(r"In CSV column #(\d+): .*conversion error to (\w+): "
                               r"invalid value '(.*)'", re.S)


def _cell_kind(text: str) -> str:
    """The kind of one CSV cell, for widening a column when Arrow rejects a value."""
    for kind, arrow_type in ((serializer.INT, pa.int64()), (serializer.FLOAT, pa.float64())):
        try:
            pa.array([text]).cast(arrow_type)
            return kind
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    return serializer.BOOL if text in _TRUE_WORDS + _FALSE_WORDS else serializer.BYTES


@contextlib.contextmanager
def _invalid_row_decode_errors_muted():
    """pyarrow decodes a bad row's text before calling our handler; when that text is not
    UTF-8 the decode fails inside pyarrow, which prints it as an "Exception ignored"
    traceback and then fails the read with its own parse error (row number included), which
    we report. The printed traceback is noise, so it is dropped."""
    previous = sys.unraisablehook

    def hook(unraisable):
        if not (isinstance(unraisable.exc_value, UnicodeDecodeError)
                and getattr(unraisable.object, "__module__", None) == __name__):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def _csv_header(path: str) -> list[str]:
    import pyarrow.csv as pacsv

    try:
        with open_input(path) as f, _invalid_row_decode_errors_muted():
            reader = pacsv.open_csv(
                f, read_options=pacsv.ReadOptions(block_size=1 << 20, use_threads=False),
                parse_options=pacsv.ParseOptions(newlines_in_values=True,
                                                  invalid_row_handler=lambda row: "skip"))
            return reader.schema.names
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            return []
        if "parse error" in str(e):  # a bad row in the first block, with its number
            raise SourceError(f"{path}: {e}") from e
        raise SourceError(f"{path}: unreadable CSV header: {e}") from e


def read_csv(path: str, kinds: Optional[dict] = None
             ) -> Iterator[Item]:
    """Streams a CSV with a header row, each column converted to its profiled kind."""
    header = _csv_header(path)
    if header:
        yield from _read_csv_typed(path, {
            name: _CSV_ARROW_TYPES[(kinds or {}).get(name, (serializer.BYTES, False))[0]]
            for name in header})


def profile_csv(path: str) -> tuple[FileProfile, int]:
    """Profiles a CSV with Arrow's own converter, so both passes parse cells identically.

    Arrow infers types from the first block; when a later block holds a value the inferred
    type rejects, that column is widened (to the rejected cell's kind at least) and the file
    is profiled again. Clean files are read once; each widening costs one more read.
    """
    header = _csv_header(path)
    types: dict = {}
    while True:
        profile, bad = FileProfile(), 0
        if not header:
            return profile, bad
        try:
            for item in _read_csv_typed(path, types, numbered=False):
                if isinstance(item, BadRecord):
                    bad += 1
                    continue
                if not types:
                    types = dict(zip(item.schema.names, item.schema.types))
                profile.add_batch(item, {n: serializer.arrow_kind(t) for n, t in
                                         zip(item.schema.names, item.schema.types)})
            return profile, bad
        except _ConversionError as error:
            name = header[error.column]
            current = serializer.arrow_kind(types[name])[0]
            widened = serializer.widen(serializer.widen(current, error.kind), _next_kind(current))
            types[name] = _CSV_ARROW_TYPES[widened] if widened != serializer.NULL else pa.binary()


class _ConversionError(Exception):
    def __init__(self, column: int, value: str):
        super().__init__(f"column {column}: {value!r}")
        self.column, self.kind = column, _cell_kind(value)


def _next_kind(kind: str) -> str:
    return {serializer.NULL: serializer.BOOL, serializer.BOOL: serializer.INT, serializer.INT: serializer.FLOAT,
            serializer.FLOAT: serializer.BYTES, serializer.BYTES: serializer.BYTES}[kind]


def _read_csv_typed(path: str, types: dict, numbered: bool = True
                    ) -> Iterator[Item]:
    """`numbered` gives bad rows their row number, which Arrow knows only single-threaded."""
    import pyarrow.csv as pacsv

    bad: list[BadRecord] = []

    def on_invalid_row(row) -> str:
        bad.append(BadRecord(path, f"row {row.number}" if row.number else "row ?",
                             f"expected {row.expected_columns} fields, got "
                             f"{row.actual_columns}", row.text))
        return "skip"

    with open_input(path) as f, _invalid_row_decode_errors_muted():
        try:
            reader = pacsv.open_csv(
                f,
                read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES,
                                               use_threads=not numbered),
                parse_options=pacsv.ParseOptions(newlines_in_values=True,
                                                  invalid_row_handler=on_invalid_row),
                convert_options=pacsv.ConvertOptions(
                    column_types=types, strings_can_be_null=True, null_values=[""],
                    true_values=_TRUE_WORDS, false_values=_FALSE_WORDS,
                    timestamp_parsers=[]))
            for batch in reader:
                yield from bad
                bad.clear()
                yield batch
        except pa.ArrowInvalid as e:
            match = _CONVERSION_ERROR.search(str(e))
            if match:
                raise _ConversionError(int(match.group(1)), match.group(3)) from e
            raise SourceError(f"{path}: {e}") from e
    yield from bad


FORMAT = SourceFormat("csv", (".csv", ".tsv"), read_csv, profile_csv)
