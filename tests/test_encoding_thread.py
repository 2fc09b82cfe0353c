"""The columnar transform encodes on a thread of its own (`encoding.EncodingThread`): the
chunks must be those the encoder writes on the caller's thread, byte for byte, and an
encoding error must reach the caller."""
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from components.transform.encoding import EncodingThread, SplitEncoder
from testsupport.data import taxi_csv_path
from tfrecord_shards import packing
from tfrecord_shards.shards import ShardingOptions

ROW_SCHEMA = """
feature { name: "fare" type: FLOAT shape { dim { size: 1 } } }
feature { name: "trip_start_hour" type: INT shape { dim { size: 1 } } }
feature { name: "company" type: BYTES }
"""
# Uneven batches, so rows carry over from one batch's last block to the next.
BATCH_ROWS = (1000, 37, 2500, 1, 4096, 777)


def _one_a_row(values: pa.Array) -> pa.LargeListArray:
    return pa.LargeListArray.from_arrays(pa.array(np.arange(len(values) + 1), pa.int64()),
                                         values)


def _batches() -> list[pa.RecordBatch]:
    """Taxi rows as tf.Transform's converter gives them: a large_list a column, the company
    missing (no value) where the sample has none."""
    table = pacsv.read_csv(taxi_csv_path())
    company = table.column("company").combine_chunks()
    present = np.asarray(company.is_valid())
    offsets = np.concatenate([[0], np.cumsum(present)]).astype(np.int64)
    columns = {
        "fare": _one_a_row(table.column("fare").combine_chunks().fill_null(0.0)
                           .cast(pa.float32())),
        "trip_start_hour": _one_a_row(table.column("trip_start_hour").combine_chunks()),
        "company": pa.LargeListArray.from_arrays(
            pa.array(offsets), company.drop_null().cast(pa.large_binary())),
    }
    whole = pa.RecordBatch.from_pydict(columns)
    starts = np.cumsum((0,) + BATCH_ROWS)
    return [whole.slice(start, rows) for start, rows in zip(starts, BATCH_ROWS)]


def _encoder(tmp_path, name: str, compression: str) -> SplitEncoder:
    schema = packing.annotate(text_format.Parse(ROW_SCHEMA, schema_pb2.Schema()), 64)
    # Small chunks, so one file's rows roll over several chunk files.
    sharding = ShardingOptions(compression=compression, shard_size_mb=0.5)
    return SplitEncoder("train", schema, str(tmp_path / name), sharding, writer_id=3)


def _written(chunks) -> list[tuple]:
    return [(chunk.order, chunk.rows, open(chunk.path, "rb").read()) for chunk in chunks]


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_the_thread_writes_the_chunks_the_caller_s_thread_writes(tmp_path, compression):
    batches = _batches()
    direct = _encoder(tmp_path, "direct", compression)
    for batch in batches:
        direct.add(batch)
    expected = _written(direct.close())

    threaded = _encoder(tmp_path, "threaded", compression)
    with EncodingThread(threaded) as encoding:
        for batch in batches:
            encoding.add(batch)
        found = _written(encoding.close())

    assert len(expected) > 1
    assert found == expected
    assert threaded.rows == direct.rows == sum(BATCH_ROWS)
    assert threaded.records == direct.records == -(-sum(BATCH_ROWS) // 64)


def test_an_encoding_error_reaches_the_caller(tmp_path):
    batches = _batches()
    encoder = _encoder(tmp_path, "failing", "gzip")
    broken = pa.RecordBatch.from_arrays(batches[0].columns, ["fare_typo", "trip_start_hour",
                                                            "company"])
    with pytest.raises(KeyError, match="fare_typo"):
        with EncodingThread(encoder) as encoding:
            encoding.add(broken)
            encoding.add(batches[1])
            encoding.close()
