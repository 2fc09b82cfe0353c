"""CSV with a header row, parsed by Arrow in both passes so cells convert identically.

Nulls: an unquoted empty cell and the R and pandas spellings of a missing value (`NA`, `NaN`,
`N/A`, `NULL`, ...: `NULL_SPELLINGS`) are nulls in every column; a quoted cell is always its
text, so `"NA"` (as R's write.csv writes the string NA) stays the string. Dates and times in
ISO 8601 are parsed by `parse_times` in both passes. An empty header cell names its column
`column_<position>`, a repeated one `<name>_2`, `<name>_3`, ...; both with a warning.
"""
from __future__ import annotations

import contextlib
import logging
import re
import sys
from typing import Iterator, Optional, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from tfrecord_shards import fileio
from tfrecord_shards.codec import serializer
from components.example_gen.sources import csv_ranges
from components.example_gen.sources.base import (
    RESTART, BadRecord, FileProfile, Item, Restart, Source, SourceError, SourceFormat,
    SourceRange, TimeParseError, arrow_kinds, compression, open_input, parse_times,
    range_input, source_path)

CSV_BLOCK_BYTES = 4 << 20
_TRUE_WORDS = ["true", "True", "TRUE"]
_FALSE_WORDS = ["false", "False", "FALSE"]
NULL_SPELLINGS = ["", "NA", "N/A", "n/a", "NaN", "nan", "-NaN", "NULL", "null", "#N/A", "<NA>"]
# A time column is read as text and parsed by `parse_times`.
_CSV_ARROW_TYPES = {serializer.INT: pa.int64(), serializer.FLOAT: pa.float64(),
                    serializer.BOOL: pa.bool_(), serializer.BYTES: pa.binary(),
                    serializer.NULL: pa.binary(), serializer.TIME: pa.string()}
_log = logging.getLogger(__name__)
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


def _block_bytes(path: str, begin: int = 0, stop: Optional[int] = None) -> int:
    """The read block size for `path`: CSV_BLOCK_BYTES, or the first size above it whose
    block boundaries split no CRLF. pyarrow's CSV reader drops a line feed that starts a block
    after a block ending in CR, even inside a quoted cell (apache/arrow#51368), so a quoted
    CRLF astride a boundary came back as CR alone. The check reads two bytes a block (one
    coalesced ranged read a block on a store); a compressed file's blocks are of the
    inflated text, which only a whole read would show, so it keeps CSV_BLOCK_BYTES. For the
    bytes [begin, stop) of a range, the blocks start at `begin`."""
    if compression(path):
        return CSV_BLOCK_BYTES
    stop = fileio.size(path) if stop is None else stop
    for block in range(CSV_BLOCK_BYTES, CSV_BLOCK_BYTES + 64):
        pairs = fileio.read_ranges(path, [(end - 1, 2)
                                          for end in range(begin + block, stop, block)])
        if b"\r\n" not in pairs:
            return block
    return CSV_BLOCK_BYTES


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


def _csv_header(path: str, warn: bool = False) -> list[str]:
    """The column names, made stable (see the module's docstring); with `warn`, each name
    that differs from its header cell is logged (the profiling pass does it, once)."""
    try:
        with open_input(path) as f, _invalid_row_decode_errors_muted():
            reader = pacsv.open_csv(
                f, read_options=pacsv.ReadOptions(block_size=1 << 20, use_threads=False),
                parse_options=pacsv.ParseOptions(newlines_in_values=True,
                                                  invalid_row_handler=lambda row: "skip"))
            header = reader.schema.names
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            return []
        if "parse error" in str(e):  # a bad row in the first block, with its number
            raise SourceError(f"{path}: {e}") from e
        raise SourceError(f"{path}: unreadable CSV header: {e}") from e
    names = stable_names(header)
    for position, (given, name) in enumerate(zip(header, names), start=1):
        if warn and given != name:
            _log.warning("%s: header cell %d is %s; the column is named %r", path, position,
                         "empty" if not given.strip() else f"{given!r} again", name)
    return names


def stable_names(header: list[str]) -> list[str]:
    """Header cells as column names: an empty cell is `column_<position>`, a repeat of an
    earlier name `<name>_2`, `<name>_3`, ... (skipping names the header already has)."""
    taken = set(header)
    names: list[str] = []
    for position, given in enumerate(header, start=1):
        name = given if given.strip() else f"column_{position}"
        if name in names or (name != given and name in taken):
            base, count = name, 2
            while f"{base}_{count}" in taken or f"{base}_{count}" in names:
                count += 1
            name = f"{base}_{count}"
        names.append(name)
    return names


def read_csv(source: Source, kinds: Optional[dict] = None
             ) -> Iterator[Item]:
    """Streams a CSV with a header row (or a range of one), each column converted to its
    profiled kind. A cell the profile's kind does not take (which profiling all rows should
    rule out) is an error naming the file, row, column and value."""
    path = source_path(source)
    header = _csv_header(path)
    if not header:
        return
    column_kinds = {name: (kinds or {}).get(name, (serializer.BYTES, False))[0]
                    for name in header}
    try:
        yield from _read_csv_typed(source, header, {
            name: _CSV_ARROW_TYPES[kind] for name, kind in column_kinds.items()},
            [name for name, kind in column_kinds.items() if kind == serializer.TIME])
    except _ConversionError as error:
        name = header[error.column]
        raise SourceError(f"{path}: row {_row_of(source, header, name, error.value)}: column "
                          f"{name!r}: {error.value!r} is not "
                          f"{_KIND_WORDS[column_kinds[name]]}, as the column's other values "
                          f"are") from None


_KIND_WORDS = {serializer.INT: "an integer", serializer.FLOAT: "a number",
               serializer.BOOL: "true or false", serializer.TIME: "an ISO 8601 date or time",
               serializer.BYTES: "text", serializer.NULL: "empty"}


def _row_of(source: Source, header: list[str], name: str, value: str) -> str:
    """The CSV row (the header is row 1) where `name` first holds `value`; in a range
    that starts later, the row counted from the range's first record."""
    begin = csv_ranges.record_bounds(source)[0] if isinstance(source, SourceRange) else 0
    seen = 1 if not begin else 0
    for batch in _read_csv_typed(source, header, {n: pa.string() for n in header}, []):
        if isinstance(batch, BadRecord):
            continue
        column = batch.column(header.index(name))
        found = pc.index(column, value).as_py()
        if found is not None and found >= 0:
            return _row_name(seen + found + 1, begin)
        seen += batch.num_rows
    return "?"


def _row_name(number: int, begin: int) -> str:
    """Row `number` of a file, or of the records from byte `begin` of a range."""
    return str(number) if not begin else f"{number} counted from byte {begin}"


def profile_csv(source: Source) -> tuple[FileProfile, int]:
    """Profiles a CSV with Arrow's own converter, so both passes parse cells identically
    (`read_inferring`: each widening costs one more read; clean files are read once)."""
    profile, bad = FileProfile(), 0
    for item in read_inferring(source, numbered=False):
        if item is RESTART:
            profile, bad = FileProfile(), 0
        elif isinstance(item, BadRecord):
            bad += 1
        else:
            profile.add_batch(item, arrow_kinds(item))
    return profile, bad


def read_inferring(source: Source, numbered: bool = True
                   ) -> Iterator[Union[Item, Restart]]:
    """Streams a CSV with a header row, each column typed as Arrow infers it from the first
    block: the profile and the encoding in one read, for a file whose types hold throughout.

    When a later block holds a value the inferred type rejects, that column is widened (to
    the rejected cell's kind at least), RESTART is yielded and the file is read again from
    its start: what came before RESTART is void. A column Arrow reads as dates or times is
    read again as text parsed by `parse_times`, which `read_csv` uses too. `numbered` gives
    bad rows their row number (Arrow reads single-threaded then). A range reads its records
    with the file's header (`csv_ranges`); only the file's first range warns of it."""
    header = _csv_header(source_path(source), warn=not isinstance(source, SourceRange)
                         or source.start == 0)
    if not header:
        return
    types: dict = {}
    times: list[str] = []
    while True:
        try:
            for item in _read_csv_typed(source, header, types, times, numbered=numbered):
                if isinstance(item, BadRecord):
                    yield item
                    continue
                inferred = [n for n, t in zip(item.schema.names, item.schema.types)
                            if n not in times and (pa.types.is_timestamp(t) or
                                                   pa.types.is_date(t))]
                if inferred:
                    raise _Retype(inferred, pa.string())
                clocks = [n for n, t in zip(item.schema.names, item.schema.types)
                          if pa.types.is_time(t)]
                if clocks:  # times of day stay text, as written
                    raise _Retype(clocks, pa.binary())
                for name, arrow_type in zip(item.schema.names, item.schema.types):
                    types.setdefault(name, arrow_type)
                yield item
            return
        except _Retype as found:
            if found.arrow_type == pa.string():  # dates and times: parsed by parse_times
                times += found.names
            types.update({name: found.arrow_type for name in found.names})
        except _ConversionError as error:
            name = header[error.column]
            current = serializer.TIME if name in times else \
                serializer.arrow_kind(types[name])[0]
            if name in times:
                times.remove(name)
            widened = serializer.widen(serializer.widen(current, error.kind),
                                       _next_kind(current))
            types[name] = _CSV_ARROW_TYPES[widened] if widened not in (
                serializer.NULL, serializer.TIME) else pa.binary()
        yield RESTART


class _Retype(Exception):
    """Columns Arrow typed in a way the profile reads again as `arrow_type`."""

    def __init__(self, names: list[str], arrow_type):
        super().__init__(names)
        self.names, self.arrow_type = names, arrow_type


class _ConversionError(Exception):
    def __init__(self, column: int, value: str):
        super().__init__(f"column {column}: {value!r}")
        self.column, self.value, self.kind = column, value, _cell_kind(value)


def _next_kind(kind: str) -> str:
    return {serializer.NULL: serializer.BOOL, serializer.BOOL: serializer.INT,
            serializer.INT: serializer.FLOAT, serializer.FLOAT: serializer.BYTES,
            serializer.BYTES: serializer.BYTES, serializer.TIME: serializer.BYTES}[kind]


def _read_csv_typed(source: Source, header: list[str], types: dict, times: list[str],
                    numbered: bool = True) -> Iterator[Item]:
    """Batches with `header`'s names; the `times` columns (read as text) parsed into
    timestamps. `numbered` gives bad rows their row number, which Arrow knows only
    single-threaded. A range gives the records that begin inside it, numbered from its
    first record."""
    path = source_path(source)
    begin, stop = csv_ranges.record_bounds(source) if isinstance(source, SourceRange) \
        else (0, None)
    if stop is not None and begin >= stop:  # a range no record begins in
        return
    bad: list[BadRecord] = []

    def on_invalid_row(row) -> str:
        bad.append(BadRecord(path, f"row {_row_name(row.number, begin)}" if row.number
                             else "row ?",
                             field_count_problem(row.expected_columns, row.actual_columns,
                                                 row.text), row.text))
        return "skip"

    opened = open_input(path) if stop is None else range_input(path, begin, stop)
    with opened as f, _invalid_row_decode_errors_muted():
        try:
            reader = pacsv.open_csv(
                f,
                read_options=pacsv.ReadOptions(block_size=_block_bytes(path, begin, stop),
                                               use_threads=not numbered, column_names=header,
                                               skip_rows=0 if begin else 1),
                parse_options=pacsv.ParseOptions(newlines_in_values=True,
                                                  invalid_row_handler=on_invalid_row),
                convert_options=pacsv.ConvertOptions(
                    column_types=types, strings_can_be_null=True,
                    quoted_strings_can_be_null=False, null_values=NULL_SPELLINGS,
                    true_values=_TRUE_WORDS, false_values=_FALSE_WORDS,
                    timestamp_parsers=[]))
            for batch in reader:
                yield from bad
                bad.clear()
                yield _with_times(batch, times)
        except pa.ArrowInvalid as e:
            match = _CONVERSION_ERROR.search(str(e))
            if match:
                raise _ConversionError(int(match.group(1)), match.group(3)) from e
            raise SourceError(f"{path}: {e}") from e
    yield from bad


def field_count_problem(expected: int, actual: int, text: str) -> str:
    """Why a row has another number of fields than the header, as far as its text tells: a
    quote opened and never closed (the cell then runs on to the end of the file: an odd
    number of quote characters, escaped quotes coming in pairs), else one field more or fewer
    than the header and what usually makes that."""
    counts = f"expected {expected} fields, got {actual}"
    if text.count('"') % 2:
        return (f"a quote opened in this row is never closed, so its cell runs on to the end "
                f"of the file ({counts})")
    if actual > expected:
        return (f"{counts}: {actual - expected} more than the header has (a delimiter inside "
                f"an unquoted value?)")
    return (f"{counts}: {expected - actual} fewer than the header has (a value left out, or "
            f"a line break inside an unquoted value?)")


def _with_times(batch: pa.RecordBatch, times: list[str]) -> pa.RecordBatch:
    if not times:
        return batch
    columns = list(batch.columns)
    for name in times:
        index = batch.schema.get_field_index(name)
        try:
            columns[index] = parse_times(columns[index])
        except TimeParseError as error:
            raise _ConversionError(index, error.value) from None
    return pa.RecordBatch.from_arrays(columns, batch.schema.names)


FORMAT = SourceFormat("csv", (".csv", ".tsv"), read_csv, profile_csv,
                      read_inferring=read_inferring, ranges=csv_ranges)
