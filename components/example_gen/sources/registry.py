"""Every source format, by name. Adding a format: its module, and one entry here."""
from __future__ import annotations

from typing import Iterator

from components.example_gen.sources import (
    csv_source, image_source, jsonl_source, parquet_source, tfrecord_source)
from components.example_gen.sources.base import FileProfile, Item, SourceFormat

FORMATS: dict[str, SourceFormat] = {f.name: f for f in (
    csv_source.FORMAT, parquet_source.FORMAT, jsonl_source.FORMAT, tfrecord_source.FORMAT,
    image_source.FORMAT)}


def profile_file(path: str, fmt: str) -> tuple[FileProfile, int]:
    """(profile, bad record count) of one file, reading every batch."""
    return FORMATS[fmt].profile(path)


def read_file(path: str, fmt: str, kinds: dict) -> Iterator[Item]:
    """The encoding pass: batches typed by the merged profile."""
    return FORMATS[fmt].read(path, kinds)
