"""Every source format, by name. Adding a format: its module, and one entry here."""
from __future__ import annotations

from typing import Iterator

from tfrecord_shards import fileio
from components.example_gen.sources import (
    csv_source, image_source, jsonl_source, parquet_source, tfrecord_source)
from components.example_gen.sources.base import FileProfile, Item, SourceError, SourceFormat

FORMATS: dict[str, SourceFormat] = {f.name: f for f in (
    csv_source.FORMAT, parquet_source.FORMAT, jsonl_source.FORMAT, tfrecord_source.FORMAT,
    image_source.FORMAT)}


def profile_file(path: str, fmt: str) -> tuple[FileProfile, int]:
    """(profile, bad record count) of one file, reading every batch."""
    try:
        return FORMATS[fmt].profile(path)
    except (OSError, UnicodeDecodeError) as e:
        raise _unreadable(path, e) from e


def read_file(path: str, fmt: str, kinds: dict) -> Iterator[Item]:
    """The encoding pass: batches typed by the merged profile."""
    try:
        yield from FORMATS[fmt].read(path, kinds)
    except (OSError, UnicodeDecodeError) as e:
        raise _unreadable(path, e) from e


def read_inferring(path: str, fmt: str) -> Iterator:
    """Both passes in one read, for a format with `read_inferring` (its batches, bad
    records and RESTART marks)."""
    try:
        yield from FORMATS[fmt].read_inferring(path)
    except (OSError, UnicodeDecodeError) as e:
        raise _unreadable(path, e) from e


def _unreadable(path: str, error: Exception) -> SourceError:
    """A file the readers cannot go on with: a damaged compressed stream (pyarrow reports
    zlib's error as OSError, with no offset into the file) or text that is not UTF-8 where
    a name must be."""
    if isinstance(error, UnicodeDecodeError):
        return SourceError(f"{path}: not UTF-8 where a column name must be "
                           f"(byte {error.start} of the name): {error.reason}")
    if isinstance(error, fileio.StorageError):
        return SourceError(str(error))
    # A store's network or credential error met while streaming is not damage in the file.
    cause = fileio.store_cause(str(error)) if fileio.is_remote(path) else None
    if cause is not None and not isinstance(error, FileNotFoundError):
        return SourceError(str(fileio.StorageError(path, cause, str(error))))
    if isinstance(error, FileNotFoundError):
        return SourceError(f"{path}: the file is gone: {error}")
    return SourceError(f"{path}: unreadable, the file is damaged and nothing after the damage "
                       f"can be read: {error}")
