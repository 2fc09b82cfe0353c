"""Every source format, by name. Adding a format: its module, and one entry here."""
from __future__ import annotations

from typing import Iterator, Optional, Sequence

from tfrecord_shards import fileio
from components.example_gen.sources import (
    csv_source, image_source, jsonl_source, parquet_source, tfrecord_source)
from components.example_gen.sources.base import (
    FileProfile, Item, Source, SourceError, SourceFormat, SourceRange, source_path)

FORMATS: dict[str, SourceFormat] = {f.name: f for f in (
    csv_source.FORMAT, parquet_source.FORMAT, jsonl_source.FORMAT, tfrecord_source.FORMAT,
    image_source.FORMAT)}


def elements(files: Sequence[str], splits: Sequence[Optional[str]], fmt: str,
             piece_bytes: Optional[int]) -> list[tuple[int, Source, Optional[str]]]:
    """The engine's units of work, (index, source, split): each file, or with `piece_bytes`
    each range of a file the format cuts there (`SourceFormat.ranges`), in file order.
    Ranges must be surveyed and placed (`ranges.survey`, `ranges.layout`, `ranges.place`)
    before they are read."""
    ranges = FORMATS[fmt].ranges if piece_bytes else None
    # Sizes from one listing a bucket, not a request a file.
    sizes = {path: v.size for path, v in fileio.file_versions(files).items()} if ranges \
        else {}
    found: list[tuple[int, Source, Optional[str]]] = []
    for path, split in zip(files, splits):
        for source in (ranges.cut(path, sizes[path], piece_bytes) if ranges else []) or [path]:
            found.append((len(found), source, split))
    return found


def ranges_of(found: Sequence[tuple]) -> list[SourceRange]:
    """The ranges among `elements`' sources, which need a survey before they are read."""
    return [source for _, source, _ in found if isinstance(source, SourceRange)]


def profile_file(source: Source, fmt: str) -> tuple[FileProfile, int]:
    """(profile, bad record count) of one file (or a range of one), reading every batch."""
    try:
        return FORMATS[fmt].profile(source)
    except (OSError, UnicodeDecodeError) as e:
        raise _unreadable(source_path(source), e) from e


def read_file(source: Source, fmt: str, kinds: dict) -> Iterator[Item]:
    """The encoding pass: batches typed by the merged profile."""
    try:
        yield from FORMATS[fmt].read(source, kinds)
    except (OSError, UnicodeDecodeError) as e:
        raise _unreadable(source_path(source), e) from e


def read_inferring(source: Source, fmt: str) -> Iterator:
    """Both passes in one read, for a format with `read_inferring` (its batches, bad
    records and RESTART marks)."""
    try:
        yield from FORMATS[fmt].read_inferring(source)
    except (OSError, UnicodeDecodeError) as e:
        raise _unreadable(source_path(source), e) from e


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
