"""The manifest of a sharded output (`manifest.json`): each split's shards with their rows and
bytes (and a gzip shard's members, the seekable gzip layout), and the row accounting that a
run's rows in, written, quarantined and lost must balance. Written last by a commit
(`commit.py`): an output with its manifest is complete."""
from __future__ import annotations

import dataclasses
from typing import Optional

from tfrecord_shards import fileio

MANIFEST_FILE = "manifest.json"
# A manifest's `row_order` when each split lists its rows in the order of its inputs' split
# files (by name, the inputs in the order given), each file's rows in turn.
ROW_ORDER_INPUT = "input"


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard written, as its manifest entry lists it."""

    partition: str
    split: str
    path: str  # relative to the output folder
    rows: int
    nbytes: int  # on disk
    # Gzip shards: (compressed offset, records) of each gzip member, so a reader can skip a
    # damaged member and count exactly what it lost (tfrecord_io.iter_records).
    gzip_members: tuple = ()


def write_manifest(staging: str, manifest: dict) -> None:
    fileio.write_json(fileio.join(staging, MANIFEST_FILE), manifest)


def build_manifest(shards: list[Shard], sources: list[dict], compression: str,
                   quarantined: int, **extra) -> dict:
    splits: dict[str, dict] = {}
    for shard in sorted(shards, key=lambda s: s.path):
        entry = splits.setdefault(shard.split, {"rows": 0, "bytes": 0, "shards": []})
        entry["rows"] += shard.rows
        entry["bytes"] += shard.nbytes
        entry["shards"].append({"path": shard.path, "rows": shard.rows, "bytes": shard.nbytes,
                                "partition": shard.partition})
        if shard.gzip_members:
            entry["shards"][-1]["gzip_members"] = [list(m) for m in shard.gzip_members]
    rows_written = sum(s.rows for s in shards)
    rows_in = sum(s.get("rows_in", 0) for s in sources)
    return {
        "rows_in": rows_in,
        "rows_written": rows_written,
        "rows_quarantined": quarantined,
        "compression": compression,
        "splits": splits,
        "sources": sources,
        **extra,
    }


def check_row_accounting(manifest: dict) -> None:
    """Every row read is written, quarantined, counted as lost to damage in the source or
    left out for a null label; anything else is a row lost silently, and fatal."""
    rows_in, written = manifest["rows_in"], manifest["rows_written"]
    quarantined, lost = manifest["rows_quarantined"], manifest.get("rows_lost", 0)
    unlabelled = manifest.get("rows_unlabelled", 0)
    if rows_in != written + quarantined + lost + unlabelled:
        raise RuntimeError(f"Row accounting failed: {rows_in} rows in, {written} written, "
                           f"{quarantined} quarantined, {lost} lost to damage, {unlabelled} "
                           f"without a label")


def read_manifest(folder: str) -> Optional[dict]:
    return fileio.read_json(fileio.join(folder, MANIFEST_FILE))


def split_names(manifest: dict) -> list[str]:
    return sorted(manifest["splits"])

