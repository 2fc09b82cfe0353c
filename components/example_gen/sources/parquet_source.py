"""Parquet, read in record batches; nested structs are flattened to `parent.child`."""
from __future__ import annotations

from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from components.example_gen.sources.base import (
    BATCH_ROWS, Item, SourceError, SourceFormat, arrow_kinds, flatten_nested, open_input,
    profile_batches)


def read_parquet(path: str, kinds: Optional[dict] = None) -> Iterator[Item]:
    """`kinds` is not needed: Parquet columns carry their own types."""
    try:
        with open_input(path, seekable=True) as f:
            parquet = pq.ParquetFile(f)
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
                yield flatten_nested(batch)
    except (pa.ArrowInvalid, OSError) as e:
        raise SourceError(f"{path}: unreadable Parquet: {e}") from e


def profile_parquet(path: str):
    return profile_batches(path, read_parquet, arrow_kinds)


FORMAT = SourceFormat("parquet", (".parquet", ".pq"), read_parquet, profile_parquet)
