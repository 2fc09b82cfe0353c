"""Source readers: every format becomes a stream of Arrow RecordBatches plus bad records.

Each reader is used twice. The profiling pass sees every batch to settle column kinds (a CSV
column that holds ints and then "n/a" is bytes), presence and small string domains; the
encoding pass reads again with those kinds fixed. Both passes stream in record batches, so
memory does not grow with the file.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import re
from typing import Iterator, Optional, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf

from components import codec, tfrecord_io

FORMATS = ("csv", "parquet", "jsonl", "tfrecord", "images")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp")
LABELS_FILE = "labels.csv"
BATCH_ROWS = 65_536
CSV_BLOCK_BYTES = 4 << 20
JSONL_BLOCK_BYTES = 16 << 20
TFRECORD_BATCH = 4_096
IMAGE_BATCH = 256

# Data that ships inside an installed package, named rather than pathed so that a compiled
# pipeline finds it wherever the package is installed (a laptop's venv, the container image).
BUNDLED_PREFIX = "bundled:"
BUNDLED_SOURCES = {
    "taxi": ("tfx", "examples/chicago_taxi_pipeline/data/simple/data.csv"),
}

_TRUE_WORDS = ["true", "True", "TRUE"]
_FALSE_WORDS = ["false", "False", "FALSE"]
_BOOL_WORDS = pa.array(_TRUE_WORDS + _FALSE_WORDS)


def open_input(path: str, seekable: bool = False):
    """A pyarrow stream for a local path or any URI pyarrow.fs knows (gs://, s3://, hdfs://)."""
    import pyarrow.fs as pafs

    if "://" in path:
        filesystem, inner = pafs.FileSystem.from_uri(path)
    else:
        filesystem, inner = pafs.LocalFileSystem(), os.path.abspath(path)
    return filesystem.open_input_file(inner) if seekable else \
        filesystem.open_input_stream(inner)


class SourceError(ValueError):
    """Bad input that stops the run: the message names the file and the row or offset."""


@dataclasses.dataclass
class BadRecord:
    file: str
    location: str  # "row 12" (CSV record, header is row 1), "line 7", "offset 4096", ...
    reason: str
    raw: str = ""

    def describe(self) -> str:
        return f"{self.file}: {self.location}: {self.reason}"


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
            old_kind, old_list = self.columns.get(name, (codec.NULL, False))
            self.columns[name] = (codec.widen(old_kind, kind), old_list or is_list)
            self.non_null[name] = self.non_null.get(name, 0) + len(array) - array.null_count
            self._add_values(name, array, kind)

    def _add_values(self, name: str, array: pa.Array, kind: str) -> None:
        seen = self.string_values.get(name, set())
        if seen is None or kind not in (codec.BYTES, codec.NULL):
            return
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            array = array.flatten()
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        unique = pc.unique(array.drop_null()).to_pylist() if len(array) else []
        seen.update(unique)
        self.string_values[name] = seen if len(seen) <= codec.MAX_DOMAIN_VALUES else None

    def merge(self, other: "FileProfile") -> "FileProfile":
        merged = FileProfile(rows=self.rows + other.rows)
        for name in list(self.columns) + [n for n in other.columns if n not in self.columns]:
            a = self.columns.get(name, (codec.NULL, False))
            b = other.columns.get(name, (codec.NULL, False))
            merged.columns[name] = (codec.widen(a[0], b[0]), a[1] or b[1])
            merged.non_null[name] = self.non_null.get(name, 0) + other.non_null.get(name, 0)
            sa, sb = self.string_values.get(name, set()), other.string_values.get(name, set())
            union = None if sa is None or sb is None else sa | sb
            merged.string_values[name] = (
                union if union is not None and len(union) <= codec.MAX_DOMAIN_VALUES else None)
        return merged


def resolve_source(source: str) -> str:
    """A path for `source`: itself, or where a `bundled:<name>` file is installed here."""
    if not source.startswith(BUNDLED_PREFIX):
        return source
    name = source[len(BUNDLED_PREFIX):]
    if name not in BUNDLED_SOURCES:
        raise SourceError(f"{source}: unknown bundled source; known: "
                          f"{', '.join(BUNDLED_PREFIX + n for n in BUNDLED_SOURCES)}")
    import importlib

    package, relative = BUNDLED_SOURCES[name]
    path = os.path.join(os.path.dirname(importlib.import_module(package).__file__), relative)
    if not os.path.exists(path):
        raise SourceError(f"{source}: {path} is missing from the installed {package} package")
    return path


def local_fingerprint(source: str) -> Optional[str]:
    """A digest of the local files under `source` (names, sizes, mtimes), or None for bundled
    and remote sources, which are not listed when the pipeline is built."""
    import hashlib

    if source.startswith(BUNDLED_PREFIX) or "://" in source:
        return None
    try:
        paths = list_files(source)  # a folder: every file below it, an image folder's too
    except SourceError:
        return None  # the executor reports the missing source with its own message
    digest = hashlib.sha256()
    for path in paths:
        stat = os.stat(path)
        digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def detect_format(path: str) -> str:
    """The format of a file or folder, from its extension(s) or, for images, a labels.csv."""
    files = [path] if not tf.io.gfile.isdir(path) else list_files(path)
    if tf.io.gfile.isdir(path) and tf.io.gfile.exists(os.path.join(path, LABELS_FILE)):
        return "images"
    exts = {_extension(f) for f in files}
    if not exts:
        raise SourceError(f"{path}: no source files found")
    if len(exts) > 1:
        raise SourceError(f"{path}: mixed file types {sorted(exts)}; pass --format")
    ext = exts.pop()
    by_ext = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".pq": "parquet",
              ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".tfrecord": "tfrecord",
              ".tfrecords": "tfrecord", "": "tfrecord"}
    if ext in by_ext:
        return by_ext[ext]
    raise SourceError(f"{path}: cannot tell the format of '{ext}' files; pass --format")


def _extension(path: str) -> str:
    name = os.path.basename(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if "data_tfrecord-" in name:  # TFX's own shard names carry no extension
        return ".tfrecord"
    return os.path.splitext(name)[1]


def list_files(path: str, fmt: Optional[str] = None) -> list[str]:
    """Source files under `path`, sorted; hidden files and TFX's Split-* nesting included."""
    if fmt == "images":
        return [os.path.join(path, LABELS_FILE)]
    if not tf.io.gfile.isdir(path):
        matched = sorted(tf.io.gfile.glob(path))
        if not matched:
            raise SourceError(f"{path}: no such file")
        return matched
    found = []
    for root, _, names in tf.io.gfile.walk(path):
        found += [os.path.join(root, n) for n in names if not n.startswith((".", "_"))]
    return sorted(found)


# --------------------------------------------------------------------------------------------
# CSV
# --------------------------------------------------------------------------------------------
_CSV_ARROW_TYPES = {codec.INT: pa.int64(), codec.FLOAT: pa.float64(), codec.BOOL: pa.bool_(),
                    codec.BYTES: pa.binary(), codec.NULL: pa.binary()}
_CONVERSION_ERROR = re.compile(r"In CSV column #(\d+): .*conversion error to (\w+): "
                               r"invalid value '(.*)'", re.S)


def _cell_kind(text: str) -> str:
    """The kind of one CSV cell, for widening a column when Arrow rejects a value."""
    for kind, arrow_type in ((codec.INT, pa.int64()), (codec.FLOAT, pa.float64())):
        try:
            pa.array([text]).cast(arrow_type)
            return kind
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    return codec.BOOL if text in _TRUE_WORDS + _FALSE_WORDS else codec.BYTES


def _csv_header(path: str) -> list[str]:
    import pyarrow.csv as pacsv

    try:
        with open_input(path) as f:
            reader = pacsv.open_csv(
                f, read_options=pacsv.ReadOptions(block_size=1 << 20),
                parse_options=pacsv.ParseOptions(newlines_in_values=True,
                                                  invalid_row_handler=lambda row: "skip"))
            return reader.schema.names
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            return []
        raise SourceError(f"{path}: unreadable CSV header: {e}") from e


def read_csv(path: str, kinds: Optional[dict] = None
             ) -> Iterator[Union[pa.RecordBatch, BadRecord]]:
    """Streams a CSV with a header row, each column converted to its profiled kind."""
    header = _csv_header(path)
    if header:
        yield from _read_csv_typed(path, {
            name: _CSV_ARROW_TYPES[(kinds or {}).get(name, (codec.BYTES, False))[0]]
            for name in header})


def profile_csv(path: str) -> tuple["FileProfile", int]:
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
                profile.add_batch(item, {n: codec.arrow_kind(t) for n, t in
                                         zip(item.schema.names, item.schema.types)})
            return profile, bad
        except _ConversionError as error:
            name = header[error.column]
            current = codec.arrow_kind(types[name])[0]
            widened = codec.widen(codec.widen(current, error.kind), _next_kind(current))
            types[name] = _CSV_ARROW_TYPES[widened] if widened != codec.NULL else pa.binary()


class _ConversionError(Exception):
    def __init__(self, column: int, value: str):
        super().__init__(f"column {column}: {value!r}")
        self.column, self.kind = column, _cell_kind(value)


def _next_kind(kind: str) -> str:
    return {codec.NULL: codec.BOOL, codec.BOOL: codec.INT, codec.INT: codec.FLOAT,
            codec.FLOAT: codec.BYTES, codec.BYTES: codec.BYTES}[kind]


def _read_csv_typed(path: str, types: dict, numbered: bool = True
                    ) -> Iterator[Union[pa.RecordBatch, BadRecord]]:
    """`numbered` gives bad rows their row number, which Arrow knows only single-threaded."""
    import pyarrow.csv as pacsv

    bad: list[BadRecord] = []

    def on_invalid_row(row) -> str:
        bad.append(BadRecord(path, f"row {row.number}" if row.number else "row ?",
                             f"expected {row.expected_columns} fields, got "
                             f"{row.actual_columns}", row.text))
        return "skip"

    with open_input(path) as f:
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


# --------------------------------------------------------------------------------------------
# JSON Lines
# --------------------------------------------------------------------------------------------
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
        kind = codec.NULL
        for item in value:
            kind = codec.widen(kind, _json_value_kind(item)[0])
        return kind, True
    if value is None:
        return codec.NULL, False
    if isinstance(value, bool):
        return codec.BOOL, False
    if isinstance(value, int):
        return codec.INT, False
    if isinstance(value, float):
        return codec.FLOAT, False
    return codec.BYTES, False


def _python_rows_to_batch(rows: list[dict]) -> pa.RecordBatch:
    """Slow path for blocks pyarrow rejects (mixed types): widen per column in Python."""
    names: list[str] = []
    for row in rows:
        names += [k for k in row if k not in names]
    arrays = []
    for name in names:
        values = [row.get(name) for row in rows]
        kind, is_list = codec.NULL, False
        for value in values:
            k, lst = _json_value_kind(value)
            kind, is_list = codec.widen(kind, k), is_list or lst
        if is_list:
            values = [v if isinstance(v, list) or v is None else [v] for v in values]
        if kind == codec.BYTES:
            def text(v):
                return v if isinstance(v, str) else json.dumps(v)
            values = [None if v is None else ([text(x) for x in v] if is_list else text(v))
                      for v in values]
        elif kind == codec.FLOAT:
            values = [None if v is None else ([float(x) for x in v] if is_list else float(v))
                      for v in values]
        arrays.append(pa.array(values))
    return pa.RecordBatch.from_arrays(arrays, names)


def read_jsonl(path: str, kinds: Optional[dict] = None
               ) -> Iterator[Union[pa.RecordBatch, BadRecord]]:
    import pyarrow.json as pajson

    for first_line, block in _line_blocks(path):
        try:
            table = pajson.read_json(io.BytesIO(block),
                                     read_options=pajson.ReadOptions(block_size=len(block) + 1))
            batches = table.to_batches(max_chunksize=BATCH_ROWS)
        except pa.ArrowInvalid:
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
            batches = [_python_rows_to_batch(rows)] if rows else []
        for batch in batches:
            yield _flatten_nested(batch, path)


def _flatten_nested(batch: pa.RecordBatch, path: str) -> pa.RecordBatch:
    """Struct columns become `parent.child` columns, as tf.Example has no nesting."""
    if not any(pa.types.is_struct(t) for t in batch.schema.types):
        return batch
    table = pa.Table.from_batches([batch])
    while any(pa.types.is_struct(t) for t in table.schema.types):
        table = table.flatten()
    return table.combine_chunks().to_batches()[0]


# --------------------------------------------------------------------------------------------
# Parquet
# --------------------------------------------------------------------------------------------
def read_parquet(path: str, kinds: Optional[dict] = None
                 ) -> Iterator[Union[pa.RecordBatch, BadRecord]]:
    import pyarrow.parquet as pq

    try:
        with open_input(path, seekable=True) as f:
            parquet = pq.ParquetFile(f)
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
                yield _flatten_nested(batch, path)
    except (pa.ArrowInvalid, OSError) as e:
        raise SourceError(f"{path}: unreadable Parquet: {e}") from e


# --------------------------------------------------------------------------------------------
# TFRecord of tf.Example
# --------------------------------------------------------------------------------------------
def read_tfrecord(path: str, kinds: Optional[dict] = None
                  ) -> Iterator[Union[pa.RecordBatch, BadRecord]]:
    records: list[bytes] = []
    for offset, record in tfrecord_io.iter_records(path, resync=True):
        if isinstance(record, tfrecord_io.CorruptRegion):
            yield BadRecord(path, f"offset {offset}", f"{record.reason} "
                            f"({record.length} bytes skipped)")
            continue
        records.append(record)
        if len(records) >= TFRECORD_BATCH:
            yield from _decode_records(path, records, offset)
            records = []
    if records:
        yield from _decode_records(path, records, None)


def _decode_records(path, records, offset) -> Iterator[Union[pa.RecordBatch, BadRecord]]:
    try:
        yield codec.decode_examples(records)
    except RuntimeError as e:
        # One bad payload spoils the whole batch decode; find it record by record.
        good = []
        for record in records:
            try:
                codec.decode_examples([record])
                good.append(record)
            except RuntimeError as error:
                yield BadRecord(path, f"record near offset {offset}",
                                f"not a tf.Example: {error}")
        if good:
            yield codec.decode_examples(good)


def profile_list_batch(batch: pa.RecordBatch) -> dict:
    """Decoded tf.Examples are all lists; a column is a list only if some row has 2+ values."""
    kinds = {}
    for i, name in enumerate(batch.schema.names):
        array = batch.column(i)
        kind, is_list = codec.arrow_kind(array.type)
        if is_list and len(array):
            lengths = pc.list_value_length(array).fill_null(0)
            is_list = pc.max(lengths).as_py() > 1
        kinds[name] = (kind, is_list)
    return kinds


# --------------------------------------------------------------------------------------------
# Image folder + labels.csv
# --------------------------------------------------------------------------------------------
IMAGE_FEATURE = "image"
IMAGE_COLUMNS = {IMAGE_FEATURE: (codec.BYTES, False), "height": (codec.INT, False),
                 "width": (codec.INT, False), "channels": (codec.INT, False),
                 "format": (codec.BYTES, False)}
_CHANNELS = {"1": 1, "L": 1, "P": 1, "LA": 2, "RGB": 3, "YCbCr": 3, "RGBA": 4, "CMYK": 4,
             "I": 1, "F": 1, "I;16": 1}


def read_images(labels_path: str, kinds: Optional[dict] = None
                ) -> Iterator[Union[pa.RecordBatch, BadRecord]]:
    """labels.csv (filename,label[,extra...]) joined with the image files it names.

    The image keeps its original encoded bytes; size, channels and format come from the file
    header, so nothing is decoded here.
    """
    from PIL import Image, UnidentifiedImageError

    folder = os.path.dirname(labels_path)
    label_kinds = None if kinds is None else {
        k: v for k, v in kinds.items() if k not in IMAGE_COLUMNS}
    for item in read_csv(labels_path, label_kinds):
        if isinstance(item, BadRecord):
            yield item
            continue
        if "filename" not in item.schema.names or "label" not in item.schema.names:
            raise SourceError(f"{labels_path}: the header must start with filename,label")
        names = item.column(item.schema.get_field_index("filename")).to_pylist()
        keep, columns = [], {k: [] for k in IMAGE_COLUMNS}
        for row, name in enumerate(names):
            name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            path = os.path.normpath(os.path.join(folder, name))
            if not path.startswith(os.path.normpath(folder) + os.sep):
                yield BadRecord(labels_path, f"filename {name!r}", "path leaves the folder")
                continue
            try:
                with tf.io.gfile.GFile(path, "rb") as f:
                    data = f.read()
                with Image.open(io.BytesIO(data)) as image:
                    width, height = image.size
                    channels = _CHANNELS.get(image.mode, len(image.getbands()))
                    fmt = (image.format or "").lower()
            except (tf.errors.NotFoundError, FileNotFoundError):
                yield BadRecord(labels_path, f"filename {name!r}", "image file missing")
                continue
            except (UnidentifiedImageError, OSError, SyntaxError) as e:
                yield BadRecord(path, "offset 0", f"not a readable image: {e}")
                continue
            keep.append(row)
            for key, value in (("image", data), ("height", height), ("width", width),
                               ("channels", channels), ("format", fmt.encode())):
                columns[key].append(value)
        if not keep:
            continue
        labels = item.take(pa.array(keep, pa.int64()))
        arrays = [pa.array(columns["image"], pa.binary()), pa.array(columns["height"]),
                  pa.array(columns["width"]), pa.array(columns["channels"]),
                  pa.array(columns["format"], pa.binary())]
        extra = [n for n in labels.schema.names if n != "filename"]
        arrays += [labels.column(labels.schema.get_field_index(n)) for n in extra]
        yield pa.RecordBatch.from_arrays(arrays, list(IMAGE_COLUMNS) + extra)


READERS = {"csv": read_csv, "jsonl": read_jsonl, "parquet": read_parquet,
           "tfrecord": read_tfrecord, "images": read_images}


def profile_file(path: str, fmt: str) -> tuple[FileProfile, int]:
    """(profile, bad record count) of one file, reading every batch."""
    if fmt == "csv":
        return profile_csv(path)
    if fmt == "images":
        labels, bad = profile_csv(path)
        profile = FileProfile(rows=labels.rows)
        for name, kind in IMAGE_COLUMNS.items():
            profile.columns[name], profile.non_null[name] = kind, labels.rows
        for name, kind in labels.columns.items():
            if name != "filename":
                profile.columns[name], profile.non_null[name] = kind, labels.non_null[name]
                profile.string_values[name] = labels.string_values.get(name, set())
        return profile, bad
    profile, bad = FileProfile(), 0
    for item in READERS[fmt](path, None):
        if isinstance(item, BadRecord):
            bad += 1
        elif item.num_rows:
            kinds = profile_list_batch(item) if fmt == "tfrecord" else {
                n: codec.arrow_kind(t) for n, t in zip(item.schema.names, item.schema.types)}
            profile.add_batch(item, kinds)
    return profile, bad


def read_file(path: str, fmt: str, kinds: dict) -> Iterator[Union[pa.RecordBatch, BadRecord]]:
    """The encoding pass: batches typed by the merged profile."""
    return READERS[fmt](path, kinds)


def hash_rows(batch: pa.RecordBatch, columns: list[str]) -> np.ndarray:
    """A stable uint64 per row from the named columns' values (pandas' fixed-key SipHash)."""
    import pandas as pd

    combined = np.zeros(batch.num_rows, dtype=np.uint64)
    for name in columns:
        index = batch.schema.get_field_index(name)
        if index < 0:
            raise SourceError(f"split key column {name!r} is not in the data")
        array = batch.column(index)
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            values = np.array([repr(v) for v in array.to_pylist()], dtype=object)
        else:
            values = array.to_numpy(zero_copy_only=False)
            if values.dtype == object:
                values = np.array([v if v is None or isinstance(v, (bytes, str)) else repr(v)
                                   for v in values], dtype=object)
        hashed = pd.util.hash_array(values, categorize=False)
        combined = combined * np.uint64(1_000_003) ^ hashed
    return combined
