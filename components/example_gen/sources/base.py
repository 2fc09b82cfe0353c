"""What every source reader shares: its errors, bad records, the profile and file access.

Each reader is used twice. The profiling pass sees every batch to settle column kinds (a CSV
column that holds ints and then "n/a" is bytes), presence and small string domains; the
encoding pass reads again with those kinds fixed. A reader that types its columns as it
reads (`SourceFormat.read_inferring`) lets ExampleGen take both in one read. Both passes
stream in record batches, so memory does not grow with the file.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterator, Optional, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from tfrecord_shards import fileio
from tfrecord_shards.codec import serializer

BATCH_ROWS = 65_536

Item = Union[pa.RecordBatch, "BadRecord"]
Reader = Callable[[str, Optional[dict]], Iterator[Item]]


def open_input(path: str, seekable: bool = False):
    """A pyarrow stream for a local path or a URI (gs://, s3://, hdfs://), through the file
    layer's stores (their endpoints and credentials)."""
    if not fileio.is_remote(path):
        local = pafs.LocalFileSystem()
        path = fileio.absolute(path)
        return local.open_input_file(path) if seekable else local.open_input_stream(path)
    store, inner = fileio.filesystem(path)
    with fileio.calling_store(path):
        return store.open_input_file(inner) if seekable else store.open_input_stream(inner)


def compression(path: str) -> Optional[str]:
    """The codec pyarrow's streams infer from the name; None for a plain file (pyarrow 10
    fails to name the codec of a name with no codec suffix, hence TypeError)."""
    try:
        return pa.Codec.detect(path).name
    except (ValueError, pa.ArrowInvalid, TypeError):
        return None


def range_input(path: str, start: int, end: int) -> pa.BufferReader:
    """The bytes [start, end) of `path` as a native stream: a local file's mapped, a
    store's read into memory. Not a Python file object: Arrow's CSV reader reads ahead on
    its own threads, which would call into Python for each block, and a reader dropped
    mid-file (a column widened, the range begun again) waits for those threads while its
    own thread holds the interpreter lock they need."""
    if not fileio.is_remote(path):
        return pa.BufferReader(pa.memory_map(fileio.absolute(path)).read_at(end - start, start))
    with open_input(path, seekable=True) as stream:
        return pa.BufferReader(stream.read_at(end - start, start))


class SourceError(ValueError):
    """Bad input that stops the run: the message names the file and the row or offset.
    It is one line, whatever the library it quotes put in (pyarrow's errors span lines)."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


# A task's error reaches Beam's or Spark's caller wrapped in the engine's own, with the task's
# traceback or message as text and the engine's context (Beam's " [while running ...]") after.
_WRAPPED_INPUT_ERROR = re.compile(r"\b(?:SourceError|BadRecordError|UnsupportedColumnError): (.+)")
_ENGINE_CONTEXT = re.compile(r" \[while running .*\]$")


def input_error_line(error: BaseException) -> Optional[str]:
    """The one line a user sees for an error caused by the input or the settings (it names
    the file and the row or offset), whichever engine ran the task that raised it, or None
    for an error of ours, which keeps its traceback."""
    found = _WRAPPED_INPUT_ERROR.findall(str(error))
    if found:
        return _ENGINE_CONTEXT.sub("", found[-1].strip())
    link: Optional[BaseException] = error
    while link is not None:
        if isinstance(link, SourceError):
            return _ENGINE_CONTEXT.sub("", str(link))
        link = link.__cause__ or link.__context__
    if isinstance(error, (ValueError, FileExistsError, FileNotFoundError)):
        lines = str(error).strip().splitlines() or [repr(error)]
        line = next((line for line in reversed(lines) if "Error: " in line), lines[-1])
        return _ENGINE_CONTEXT.sub("", re.sub(r"^.*?\w*Error: ", "", line))
    return None


@dataclasses.dataclass
class BadRecord:
    """One bad row, or (with `lost_bytes`) a damaged region of a file whose records are lost:
    `lost_records` of them when the file's index says how many, else an unknown number."""

    file: str
    location: str  # "row 12" (CSV record, header is row 1), "line 7", "offset 4096", ...
    reason: str
    raw: str = ""
    lost_bytes: int = 0
    lost_records: Optional[int] = None

    def describe(self) -> str:
        return f"{self.file}: {self.location}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class SourceRange:
    """Bytes [start, end) of a source file of `size` bytes: the records that begin there,
    for a format that finds them from the middle of a file (`SourceFormat.ranges`).
    `quotes_before` and `quotes_through` are the quote characters before `start` and
    before `end` (`csv_ranges.place`), which the reader needs to find those records."""

    path: str
    start: int
    end: int
    size: int
    quotes_before: Optional[int] = None
    quotes_through: Optional[int] = None

    def __str__(self) -> str:
        return f"{self.path} bytes {self.start}-{self.end}"


Source = Union[str, SourceRange]


def source_path(source: Source) -> str:
    """The file a source (a file, or a range of one) is of."""
    return source.path if isinstance(source, SourceRange) else source


class Restart:
    """A `read_inferring` reader's mark that it begins the file again, with wider types:
    what it gave before is void."""


RESTART = Restart()


@dataclasses.dataclass
class FileProfile:
    """What the profiling pass learned about one file (or several, once merged)."""

    rows: int = 0
    columns: dict = dataclasses.field(default_factory=dict)  # name -> (kind, is_list)
    non_null: dict = dataclasses.field(default_factory=dict)  # name -> count
    string_values: dict = dataclasses.field(default_factory=dict)  # name -> set | None

    def add_batch(self, batch: pa.RecordBatch, kinds: dict) -> None:
        self.rows += batch.num_rows
        for name, (kind, is_list) in kinds.items():
            array = batch.column(batch.schema.get_field_index(name))
            old_kind, old_list = self.columns.get(name, (serializer.NULL, False))
            self.columns[name] = (serializer.widen(old_kind, kind), old_list or is_list)
            self.non_null[name] = self.non_null.get(name, 0) + len(array) - array.null_count
            self._add_values(name, array, kind)

    def _add_values(self, name: str, array: pa.Array, kind: str) -> None:
        seen = self.string_values.get(name, set())
        if seen is None or kind not in (serializer.BYTES, serializer.NULL):
            return
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            array = array.flatten()
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        unique = pc.unique(array.drop_null()).to_pylist() if len(array) else []
        seen.update(unique)
        self.string_values[name] = seen if len(seen) <= serializer.MAX_DOMAIN_VALUES else None

    def merge(self, other: "FileProfile") -> "FileProfile":
        merged = FileProfile(rows=self.rows + other.rows)
        for name in list(self.columns) + [n for n in other.columns if n not in self.columns]:
            a = self.columns.get(name, (serializer.NULL, False))
            b = other.columns.get(name, (serializer.NULL, False))
            merged.columns[name] = (serializer.widen(a[0], b[0]), a[1] or b[1])
            merged.non_null[name] = self.non_null.get(name, 0) + other.non_null.get(name, 0)
            sa, sb = self.string_values.get(name, set()), other.string_values.get(name, set())
            union = None if sa is None or sb is None else sa | sb
            merged.string_values[name] = (
                union if union is not None and len(union) <= serializer.MAX_DOMAIN_VALUES else None)
        return merged


@dataclasses.dataclass(frozen=True)
class SourceFormat:
    """One source format: how to recognise its files, read them and profile them.

    `read(path, kinds)` streams typed batches (kinds None while profiling) and bad records;
    `profile(path)` returns (FileProfile, bad record count). A format read from one marker
    file in a folder (an image folder's labels.csv) names it in `folder_marker`."""

    name: str
    extensions: tuple[str, ...]
    read: Reader
    profile: Callable[[str], tuple["FileProfile", int]]
    folder_marker: Optional[str] = None
    # `read_inferring(path)`, for a format that types its columns as it reads: batches typed
    # throughout, bad records, and a mark where it begins again with wider types (CSV's
    # `csv_source.read_inferring`). ExampleGen then profiles and encodes in one pass.
    read_inferring: Optional[Callable[[str], Iterator]] = None
    # For a format whose records can be found from the middle of a file (plain CSV): its
    # `csv_ranges`-like module (`cut`, `survey`, `place`). Its readers then take a
    # SourceRange too, and a large file is read by several workers.
    ranges: Optional[object] = None


def profile_batches(path: str, read: Reader,
                    kinds_of: Callable[[pa.RecordBatch], dict]) -> tuple["FileProfile", int]:
    """(profile, bad record count) of one file, reading every batch with `read`."""
    profile, bad = FileProfile(), 0
    for item in read(path, None):
        if isinstance(item, BadRecord):
            bad += 1
        elif item.num_rows:
            profile.add_batch(item, kinds_of(item))
    return profile, bad


def arrow_kinds(batch: pa.RecordBatch) -> dict:
    """Column kinds straight from the Arrow types (Parquet, JSON Lines)."""
    return {n: serializer.arrow_kind(t) for n, t in zip(batch.schema.names, batch.schema.types)}


def flatten_nested(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Struct columns become `parent.child` columns, as tf.Example has no nesting."""
    if not any(pa.types.is_struct(t) for t in batch.schema.types):
        return batch
    table = pa.Table.from_batches([batch])
    while any(pa.types.is_struct(t) for t in table.schema.types):
        table = table.flatten()
    return table.combine_chunks().to_batches()[0]


_ZONED = r"(?:[zZ]|[+-]\d\d:?\d\d)$"


class TimeParseError(ValueError):
    def __init__(self, value: str):
        super().__init__(f"{value!r} is not an ISO 8601 date or time")
        self.value = value


def parse_times(strings: pa.Array) -> pa.Array:
    """ISO 8601 dates and times (`2007-11-11`, `2013-01-01 10:00:00`, `...T10:00:00.5Z`,
    `...+02:00`) as a timestamp[us, UTC] array; a time without a zone is taken as UTC. The
    one parser of text that looks like times, in every pass of every text format, so that a
    column's kind cannot differ between profiling and encoding. Raises TimeParseError naming
    the first value that does not parse."""
    strings = strings.cast(pa.string())
    valid = np.asarray(strings.is_valid())
    zoned = np.asarray(pc.fill_null(pc.match_substring_regex(strings, _ZONED), False))
    micros = np.zeros(len(strings), np.int64)
    for mask, target in ((valid & ~zoned, pa.timestamp("us")),
                         (valid & zoned, pa.timestamp("us", "UTC"))):
        rows = np.flatnonzero(mask)
        if not len(rows):
            continue
        part = strings.take(pa.array(rows))
        try:
            micros[rows] = part.cast(target).cast(pa.int64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise TimeParseError(_first_unparsed(part, target)) from None
    return pa.array(micros, pa.int64(), mask=~valid).cast(pa.timestamp("us", "UTC"))


def _first_unparsed(strings: pa.Array, target) -> str:
    for value in strings.to_pylist():
        try:
            pa.array([value]).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return value
    return ""
