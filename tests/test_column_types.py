"""Every column type a real CSV, JSON Lines or Parquet file has: the profiling pass and the
encoding pass agree on each column's kind whatever mix of dates, times, numbers, text and
nulls it holds, and dates and times become one representation (int64 epoch seconds, UTC)."""
from __future__ import annotations

import datetime
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfrecord_shards.codec import serializer
from components.example_gen import beam_job
from components.example_gen.options import ExampleGenOptions
from components.example_gen.sources import registry
from components.example_gen.sources.base import parse_times

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_moments = st.datetimes(min_value=datetime.datetime(1900, 1, 1),
                        max_value=datetime.datetime(2200, 1, 1))
# One CSV or JSON cell: what real tables hold, as text.
cells = st.one_of(
    st.none(),
    _moments.map(lambda d: d.date().isoformat()),
    _moments.map(lambda d: d.replace(microsecond=0).isoformat(sep=" ")),
    _moments.map(lambda d: d.replace(microsecond=0).isoformat() + "Z"),
    st.integers(-10 ** 12, 10 ** 12).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.sampled_from(["NA", "cab", "2013-13-45", "yes", "", "10:30"]),
)
columns = st.lists(st.lists(cells, min_size=1, max_size=3), min_size=1, max_size=4)


def _rows(cell_columns: list[list], rows: int) -> list[list]:
    return [[column[row % len(column)] for column in cell_columns] for row in range(rows)]


def _write_csv(path: str, names: list[str], rows: list[list]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(",".join(names) + "\n")
        for row in rows:
            f.write(",".join("" if v is None else v for v in row) + "\n")


def _write_jsonl(path: str, names: list[str], rows: list[list]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({n: _json_value(v) for n, v in zip(names, row)}) + "\n")


def _json_value(text):
    """A cell as JSON would hold it: numbers as numbers, the rest as strings."""
    if text is None:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _passes_agree(files: list[str], fmt: str) -> dict:
    """Profiles the files, then encodes them with the merged kinds, checking that each
    column of every encoded batch has the profiled kind; returns the kinds."""
    profiles = [registry.profile_file(path, fmt)[0] for path in files]
    merged = profiles[0]
    for profile in profiles[1:]:
        merged = merged.merge(profile)
    kinds = merged.columns
    rows = 0
    for path in files:
        for batch in registry.read_file(path, fmt, kinds):
            if not isinstance(batch, pa.RecordBatch):
                continue
            rows += batch.num_rows
            for name, column in zip(batch.schema.names, batch.columns):
                found, expected = serializer.arrow_kind(column.type)[0], kinds[name][0]
                if expected == serializer.NULL:
                    assert column.null_count == len(column), (path, name)
                else:  # the encoder casts a narrower kind (an int file of a float column)
                    assert serializer.widen(found, expected) == expected, \
                        (path, name, found, expected)
            serializer.encode_examples(serializer.to_example_batch(batch, kinds))
    assert rows == merged.rows
    return kinds


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=columns, second=columns)
def test_text_formats_profile_and_encode_every_mix_alike(tmp_path, fmt, first, second):
    """Two files of the same columns, each column a cycle of 1-3 kinds of cell."""
    width = min(len(first), len(second))
    names = [f"c{i}" for i in range(width)]
    write = _write_csv if fmt == "csv" else _write_jsonl
    files = []
    for index, cell_columns in enumerate((first[:width], second[:width])):
        path = str(tmp_path / f"part{index}-{os.urandom(4).hex()}.{fmt}")
        write(path, names, _rows(cell_columns, 7))
        files.append(path)
    kinds = _passes_agree(files, fmt)
    for name, column in zip(names, zip(first[:width], second[:width])):
        values = [v for part in column for v in part if v not in (None, "", "NA")]
        if kinds.get(name, (None,))[0] == serializer.TIME:
            parse_times(pa.array(values))  # every value of a time column is a time


_typed_columns = st.sampled_from([
    pa.array([datetime.datetime(2013, 1, 1, 10), None, datetime.datetime(1969, 12, 31, 23)],
             pa.timestamp("ms")),
    pa.array([datetime.datetime(2013, 1, 1, 10, tzinfo=datetime.timezone.utc), None, None],
             pa.timestamp("us", "UTC")),
    pa.array([datetime.date(2007, 11, 11), None, datetime.date(1900, 1, 1)], pa.date32()),
    pa.array([1, None, 3], pa.int64()),
    pa.array([1.5, None, 2.0], pa.float64()),
    pa.array(["a", None, "2007-11-11"], pa.string()),
    pa.nulls(3, pa.string()),
])


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.lists(_typed_columns, min_size=1, max_size=3),
       second=st.lists(_typed_columns, min_size=1, max_size=3))
def test_parquet_files_with_other_types_per_column_profile_and_encode_alike(tmp_path, first,
                                                                          second):
    width = min(len(first), len(second))
    files = []
    for index, arrays in enumerate((first[:width], second[:width])):
        path = str(tmp_path / f"part{index}-{os.urandom(4).hex()}.parquet")
        pq.write_table(pa.table({f"c{i}": a for i, a in enumerate(arrays)}), path)
        files.append(path)
    _passes_agree(files, "parquet")


@pytest.mark.parametrize("gzipped", [True, False], ids=["gzip", "plain"])
def test_dates_and_times_are_epoch_seconds_in_utc_with_the_schema_saying_so(tmp_path,
                                                                             gzipped):
    import gzip

    text = ("id,day,at,mixed\n"
            "1,2007-11-11,2013-01-01T10:00:00Z,2007-11-11\n"
            "2,1969-12-31,2013-01-01T12:00:00+02:00,cab\n"
            "3,,2013-01-01T10:00:00.75Z,\n")
    source = tmp_path / ("times.csv.gz" if gzipped else "times.csv")
    source.write_bytes(gzip.compress(text.encode()) if gzipped else text.encode())
    out = tmp_path / "out"
    beam_job.run(ExampleGenOptions(source=str(source), splits="all:1"), str(out))
    from tfrecord_shards import example_rows
    from tfrecord_shards.codec import schema_file

    rows = {row["id"]: row for row in example_rows.iter_rows(str(out))}
    expected_day = int((datetime.datetime(2007, 11, 11, tzinfo=datetime.timezone.utc)
                        - EPOCH).total_seconds())
    assert rows[1]["day"] == expected_day and rows[2]["day"] == -86_400
    assert rows[3]["day"] is None
    ten = int((datetime.datetime(2013, 1, 1, 10, tzinfo=datetime.timezone.utc)
               - EPOCH).total_seconds())
    assert [rows[i]["at"] for i in (1, 2, 3)] == [ten, ten, ten]  # zone applied, .75 dropped
    assert rows[1]["mixed"] == b"2007-11-11" and rows[2]["mixed"] == b"cab"
    features = {f.name: f for f in schema_file.load_schema(str(out)).feature}
    for name in ("day", "at"):
        assert serializer.TIME_TAG in features[name].annotation.tag
        assert features[name].annotation.comment[0] == serializer.TIME_COMMENT
    assert serializer.TIME_TAG not in features["mixed"].annotation.tag
