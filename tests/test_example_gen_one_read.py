"""ExampleGen reads a CSV file once: it profiles and encodes each file with the types Arrow
infers as it reads, begins a file again where a later block widens a column, and encodes a
file again where another file widened one. Its output must be the two-pass path's, byte for
byte: that path (profile every file, merge, encode with the merged types) is what every
other format takes, and the reference here."""
from __future__ import annotations

import csv
import dataclasses
import gzip
import os
import shutil

import pytest

from components.example_gen import beam_job
from components.example_gen.options import ExampleGenOptions
from components.example_gen.sources import csv_source, registry


def _folder_bytes(folder: str) -> dict[str, bytes]:
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = f.read()
    return found


def _run_both_ways(monkeypatch, options: ExampleGenOptions, out: str
                   ) -> tuple[dict, dict, int, int]:
    """(the one-read run's files, the two-pass run's, CSV reads each took), both written
    to `out` in turn so that any path the output names is the same."""
    reads = []
    real_read = csv_source._read_csv_typed

    def counted(*args, **kwargs):
        reads.append(args[0])
        return real_read(*args, **kwargs)

    monkeypatch.setattr(csv_source, "_read_csv_typed", counted)
    beam_job.run(options, out)
    one_read, one_read_reads = _folder_bytes(out), len(reads)
    shutil.rmtree(out)
    reads.clear()
    two_pass_csv = dataclasses.replace(registry.FORMATS["csv"], read_inferring=None)
    with monkeypatch.context() as patch:
        patch.setitem(registry.FORMATS, "csv", two_pass_csv)
        beam_job.run(options, out)
    return one_read, _folder_bytes(out), one_read_reads, len(reads)


@pytest.mark.parametrize("compression", ["gzip", "none"])
@pytest.mark.parametrize("source_gzipped", [False, True])
def test_one_read_writes_the_two_pass_output_of_the_taxi_sample(
        tmp_path, monkeypatch, taxi_csv, compression, source_gzipped):
    """The whole bundled sample (15,002 trips): one read a file against two, the same
    shards, schema and manifest, gzip and plain, from a plain and a gzipped CSV."""
    source = tmp_path / "source"
    source.mkdir()
    if source_gzipped:
        with open(taxi_csv, "rb") as src, gzip.open(source / "data.csv.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copy(taxi_csv, source / "data.csv")
    options = ExampleGenOptions.from_json(
        f'{{"source": "{source}", "sharding": {{"compression": "{compression}"}}}}')
    one_read, two_pass, one_read_reads, two_pass_reads = _run_both_ways(
        monkeypatch, options, str(tmp_path / "out"))
    assert one_read == two_pass
    assert any(name.startswith("Split-train") for name in one_read)
    assert (one_read_reads, two_pass_reads) == (1, 2)


def test_a_column_widened_late_in_a_file_or_by_another_file_gives_the_same_output(
        tmp_path, monkeypatch, taxi_csv):
    """Small read blocks, so that a column empty in a file's first block (the census
    tracts) is widened by a later one and the file is begun again; the sample cut into
    two files, the first with its tips rounded to whole dollars (an int column where the
    second's is float), so that the first is encoded again with the merged types; bad rows
    (a field too many, a field too few) before and after the widening, quarantined under
    the same row numbers."""
    with open(taxi_csv, encoding="utf-8", newline="") as f:
        header, *rows = list(csv.reader(f))
    tips = header.index("tips")
    first = [row[:tips] + [str(int(float(row[tips])))] + row[tips + 1:] if row[tips] else row
             for row in rows[:400]]
    first[3] = first[3] + ["extra"]
    second = rows[400:]
    second[5000] = ["1"] * (len(header) - 2)
    source = tmp_path / "source"
    source.mkdir()
    for index, part in enumerate((first, second)):
        with open(source / f"part-{index}.csv", "w", encoding="utf-8", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows([header] + part)
    monkeypatch.setattr(csv_source, "CSV_BLOCK_BYTES", 64 << 10)
    own_kinds = [csv_source.profile_csv(str(source / f"part-{i}.csv"))[0].columns
                 for i in (0, 1)]
    assert own_kinds[0]["tips"][0] == "int" and own_kinds[1]["tips"][0] == "float"
    assert csv_source.RESTART in csv_source.read_inferring(str(source / "part-1.csv"))
    options = ExampleGenOptions(source=str(source), on_bad_record="quarantine")
    one_read, two_pass, one_read_reads, two_pass_reads = _run_both_ways(
        monkeypatch, options, str(tmp_path / "out"))
    assert one_read == two_pass
    quarantined = sorted(name for name in one_read if "bad_records" in name)
    assert len(quarantined) == 2
    assert b'"row 5"' in one_read[quarantined[0]]
    assert b'"row 5002"' in one_read[quarantined[1]]
    # Each file read once and begun again where widened, the first encoded again.
    assert one_read_reads > 2
