"""Transform's adapter from decoded rows to tensors (`inputs.RawTensorAdapter`) against the
library it speeds up, tfx_bsl's TensorAdapter for tf.Examples: the same tensors (kind,
dtype, coordinates, values, shape) on the taxi sample, gzip and plain, and on the cases its
faster way has to tell apart: rows with no value, a column with none at all, rows of several
values, empty and non-UTF-8 strings, a batch sliced out of a larger one, and no rows."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2
from tfx_bsl.tfxio import tensor_adapter

from components.transform.inputs import (RawTensorAdapter, record_batches, split_paths,
                                         tensor_adapter_config)
from tfrecord_shards.codec import parser, schema_file
from tfrecord_shards.shards import ShardingOptions


def assert_same_tensors(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    for name, reference in theirs.items():
        made = ours[name]
        assert type(made) is type(reference), name
        assert made.dtype == reference.dtype, name
        if isinstance(reference, tf.SparseTensor):
            for part in ("indices", "values", "dense_shape"):
                mine, library = getattr(made, part), getattr(reference, part)
                assert mine.dtype == library.dtype, (name, part)
                assert np.array_equal(mine.numpy(), library.numpy()), (name, part)
        else:
            assert np.array_equal(made.numpy(), reference.numpy()), name


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_the_taxi_sample_gives_tfx_bsls_tensors(taxi_csv, tmp_path, compression):
    from components.example_gen import beam_job as example_gen
    from components.example_gen.options import ExampleGenOptions

    out = str(tmp_path / "examples")
    example_gen.run(ExampleGenOptions(source=taxi_csv, sharding=ShardingOptions(
        compression=compression, num_shards=2)), out)
    raw_schema = parser.active_schema(schema_file.load_schema(out))
    ours = RawTensorAdapter(raw_schema)
    theirs = tensor_adapter.TensorAdapter(tensor_adapter_config(raw_schema))
    assert ours.type_specs() == theirs.TypeSpecs()
    rows = 0
    for split in ("train", "eval"):
        for path in split_paths(out, split):
            for batch in record_batches(path, raw_schema):
                rows += batch.num_rows
                assert_same_tensors(ours.to_tensors(batch),
                                    theirs.ToBatchTensors(batch, produce_eager_tensors=True))
                # A batch that starts inside a column's buffers, as a slice does.
                part = batch.slice(7, 300)
                assert_same_tensors(ours.to_tensors(part),
                                    theirs.ToBatchTensors(part, produce_eager_tensors=True))
    assert rows == 15_002


def edge_schema() -> schema_pb2.Schema:
    schema = schema_pb2.Schema()
    for name, kind in (("fare", schema_pb2.FLOAT), ("trips", schema_pb2.INT),
                       ("company", schema_pb2.BYTES), ("never", schema_pb2.FLOAT),
                       ("tags", schema_pb2.BYTES), ("counts", schema_pb2.INT)):
        schema.feature.add(name=name, type=kind)
    return schema


def edge_batch(adapter_schema: pa.Schema) -> pa.RecordBatch:
    columns = {
        "fare": [[1.5], None, [], [2.25], [-0.0], [3.0]],
        "trips": [[1], [2], [3], [4], [5], [6]],
        "company": [[b"Flash Cab"], [b""], None, [b"\xff\xfe not utf-8"], [b"x"], []],
        "never": [None, [], None, [], None, []],
        "tags": [[b"a", b"b"], [b"c"], [], None, [b""], [b"d", b"", b"e"]],
        "counts": [[1], [2, 3], [4], [5], [6], [7]],
    }
    return pa.RecordBatch.from_arrays(
        [pa.array(columns[field.name], field.type) for field in adapter_schema],
        schema=adapter_schema)


def test_the_cases_the_faster_way_tells_apart_give_tfx_bsls_tensors():
    schema = edge_schema()
    ours = RawTensorAdapter(schema)
    theirs = tensor_adapter.TensorAdapter(tensor_adapter_config(schema))
    batch = edge_batch(tensor_adapter_config(schema).arrow_schema)
    for part in (batch, batch.slice(1, 4), batch.slice(2, 1), batch.slice(0, 0),
                 batch.slice(3)):
        assert_same_tensors(ours.to_tensors(part),
                            theirs.ToBatchTensors(part, produce_eager_tensors=True))


def test_a_batch_of_other_columns_is_refused_by_name():
    schema = edge_schema()
    batch = pa.RecordBatch.from_arrays([pa.array([[1.0]], pa.large_list(pa.float32()))],
                                       names=["fare"])
    with pytest.raises(ValueError, match=r"columns \['fare'\] where the raw schema has"):
        RawTensorAdapter(schema).to_tensors(batch)
