"""ShardedTransform's columnar path on Beam's multi-processing DirectRunner (two worker
processes, as a cluster runner spreads the reads) gives the TransformGraph the default
in-process run gives: every constant the analysis put in the graph, byte for byte, and the
same transformed rows, in the input's order."""
from __future__ import annotations

import glob
import os

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from tfrecord_shards import tfrecord_io

MULTI_PROCESSING = ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
                    "--direct_num_workers=2"]


def graph_constants(graph_dir: str) -> dict[str, list[bytes]]:
    """{node path: its serialized tensors} of every Const in the transform_fn SavedModel, the
    graph's own nodes and its functions' (where tf.Transform puts the analyzers' results). A
    function's name ends in a number TensorFlow counts up in each process, so it is left out
    of the path."""
    import re

    from tensorflow.core.protobuf import saved_model_pb2

    model = saved_model_pb2.SavedModel()
    with open(os.path.join(graph_dir, "transform_fn", "saved_model.pb"), "rb") as f:
        model.ParseFromString(f.read())
    constants = {}
    for graph in model.meta_graphs:
        nodes = [("", node) for node in graph.graph_def.node] + [
            (function.signature.name, node) for function in graph.graph_def.library.function
            for node in function.node_def]
        for scope, node in nodes:
            if node.op == "Const":
                constants.setdefault(f"{re.sub(r'_[0-9]+$', '', scope)}/{node.name}", []).append(
                    node.attr["value"].tensor.SerializeToString(deterministic=True))
    return {name: sorted(values) for name, values in constants.items()}


def transform_both_ways(examples: str, out, compression: str, **settings) -> dict[str, str]:
    from tfrecord_shards.codec import parser, schema_file
    from components.transform import beam_job
    from components.transform.options import TransformOptions
    from tfrecord_shards.shards import ShardingOptions

    graphs = {}
    for mode, make_pipeline in (
            ("in-process", None),
            ("multi-processing", lambda: beam.Pipeline(options=PipelineOptions(
                MULTI_PROCESSING)))):
        options = TransformOptions(label_key="tips", task="regression",
                                   sharding=ShardingOptions(compression=compression), **settings)
        manifest = beam_job.run(
            options, examples, parser.active_schema(schema_file.load_schema(examples)),
            str(out / mode / "graph"), str(out / mode / "examples"), make_pipeline=make_pipeline)
        graphs[mode] = str(out / mode / "graph")
        graphs[f"{mode} rows"] = manifest["rows_written"]
    return graphs


def assert_same_graph(graphs: dict) -> None:
    ours, theirs = (graph_constants(graphs[m]) for m in ("in-process", "multi-processing"))
    assert sum(map(len, ours.values())) > 50 and ours.keys() == theirs.keys()
    assert [name for name in ours if ours[name] != theirs[name]] == []
    assert graphs["in-process rows"] == graphs["multi-processing rows"]
    for name in sorted(glob.glob(os.path.join(graphs["in-process"], "transform_fn", "assets",
                                              "*"))):
        with open(name, "rb") as a, open(name.replace("in-process", "multi-processing"),
                                         "rb") as b:
            assert a.read() == b.read(), name


@pytest.mark.slow
def test_multi_processing_gives_the_in_process_graph_on_the_taxi_sample(taxi_csv, tmp_path,
                                                                       caplog):
    """Gzip shards, each cut into pieces of about 1,000 records (whole gzip members), so
    the workers analyse and transform parts of one shard side by side; the million rows
    below are plain ones, a piece a shard."""
    import logging

    from components.example_gen import beam_job
    from components.example_gen.options import ExampleGenOptions
    from tfrecord_shards.shards import ShardingOptions

    from test_transform import assert_rows_in_input_order

    examples = str(tmp_path / "examples")
    # Three files a split, so the two workers transform files side by side.
    beam_job.run(ExampleGenOptions(source=taxi_csv, sharding=ShardingOptions(
        compression="gzip", num_shards=3)), examples)
    with caplog.at_level(logging.INFO):
        graphs = transform_both_ways(examples, tmp_path, "gzip", piece_records=1000)
    lines = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("Transform: analysing")]
    assert len(lines) == 2, lines  # once a run
    pieces = int(lines[0].split()[2])
    train_rows = sum(1 for path in glob.glob(os.path.join(examples, "Split-train", "*"))
                     for _ in tfrecord_io.iter_records(path))
    assert pieces >= train_rows // 2000 > 3, lines
    assert_same_graph(graphs)
    for mode in ("in-process", "multi-processing"):
        assert assert_rows_in_input_order(examples, graphs[mode], str(
            tmp_path / mode / "examples")) == graphs[f"{mode} rows"]


@pytest.mark.slow
def test_multi_processing_gives_the_in_process_graph_on_a_million_rows(tmp_path):
    """Plain shards, three of the train split: past the quantiles sketch's capacity, whose
    merge depends on the order of merging, which the analysis fixes by file order."""
    from components.example_gen import beam_job
    from components.example_gen.options import ExampleGenOptions
    from tfrecord_shards.shards import ShardingOptions
    from testsupport import data

    source = data.write_taxi_csv(1_000_000, str(tmp_path / "source"))
    examples = str(tmp_path / "examples")
    beam_job.run(ExampleGenOptions(source=source, sharding=ShardingOptions(
        compression="none")), examples)
    assert len(glob.glob(os.path.join(examples, "Split-train", "*"))) > 1
    graphs = transform_both_ways(examples, tmp_path, "none")
    assert graphs["in-process rows"] == 1_000_000
    assert_same_graph(graphs)
