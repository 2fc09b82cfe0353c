"""StatisticsGen's Beam job (components/statistics_gen/beam_job.py) against the in-process
`scan`: which runs where (`engine.runs_on_beam`), the merge of shard accumulators in any order
and grouping, and the whole job on the DirectRunner's worker processes (from the command
line's entry and from the TFX executor with the pipeline's Beam args), on gzip and plain
shards.

Counts, extremes, lengths, uniques and top values must be equal; means and deviations equal
to rounding; every sketched quantile (both sides') within the sketch's rank error of the
exact values (epsilon, plus the thinning's 1/_SUMMARY_POINTS), compared by rank."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pyarrow as pa
import pytest

from tfrecord_shards import tfrecord_io
from components.statistics_gen import accumulators, engine, stats_job
from components.statistics_gen import plan as stats_plan
from components.statistics_gen.options import StatisticsGenOptions
from test_statistics_gen import _check_quantiles

SPLITS = ["train", "eval"]
MULTI_PROCESSING = ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
                    "--direct_num_workers=2"]


# --- Data ----------------------------------------------------------------------------------

def _examplegen(source: str, out: str, **settings) -> str:
    from components.example_gen import engine as example_gen
    from components.example_gen.options import ExampleGenOptions
    from tfrecord_shards.options import from_flat

    example_gen.run(from_flat(ExampleGenOptions, {"source": source, **settings}), out)
    return out


@pytest.fixture(scope="module", params=["gzip", "none"])
def taxi_shards(request, taxi_csv, tmp_path_factory) -> str:
    """The taxi sample (15,002 trips) through our ExampleGen, 4 shards a split, gzip (our
    default) or plain."""
    folder = tmp_path_factory.mktemp(f"taxi-{request.param}")
    return _examplegen(taxi_csv, str(folder / "examples"), num_shards=4,
                       compression=request.param)


def exact_values(examples_uri: str, split: str) -> dict[str, np.ndarray]:
    """Every value of each numeric feature of a split, sorted, NaNs left out: the reference
    the sketched quantiles are ranked against."""
    from tfrecord_shards.packing.arrow import RowDecoder

    (_, files, plan), = stats_job.split_inputs(examples_uri, [split])
    decoder = RowDecoder(plan.schema)
    columns: dict[str, list] = {f.name: [] for f in plan.features if f.role == stats_plan.NUMERIC}
    for path in files:
        for block in tfrecord_io.iter_record_blocks(path):
            batch = decoder.decode(block)
            for name, found in columns.items():
                found.append(batch.column(name).flatten().to_numpy(zero_copy_only=False))
    values = {}
    for name, parts in columns.items():
        joined = np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)
        values[name] = np.sort(joined[~np.isnan(joined)])
    return values


# --- Comparing -----------------------------------------------------------------------------

def assert_equivalent(got, expected, values: dict[str, np.ndarray], moments_rel: float,
                      epsilon: float = StatisticsGenOptions().epsilon) -> None:
    """Two DatasetFeatureStatisticsLists of the same rows: equal but for the moments (to
    `moments_rel` relative) and the sketches' quantiles (each within the rank error)."""
    tolerance = epsilon + 1 / accumulators._SUMMARY_POINTS
    (mine,), (theirs,) = got.datasets, expected.datasets
    assert mine.num_examples == theirs.num_examples
    assert [f.path.step[0] for f in mine.features] == [f.path.step[0] for f in theirs.features]
    for a, b in zip(mine.features, theirs.features):
        name = a.path.step[0]
        assert a.type == b.type, name
        kind = b.WhichOneof("stats")
        assert a.WhichOneof("stats") == kind, name
        ours, reference = getattr(a, kind), getattr(b, kind)
        assert ours.common_stats == reference.common_stats, name
        if kind == "num_stats":
            for field in ("num_zeros", "min", "max"):
                assert getattr(ours, field) == getattr(reference, field), (name, field)
            for field in ("mean", "std_dev"):
                assert getattr(ours, field) == pytest.approx(
                    getattr(reference, field), rel=moments_rel, nan_ok=True), (name, field)
            assert [(h.type, h.num_nan, len(h.buckets)) for h in ours.histograms] == \
                [(h.type, h.num_nan, len(h.buckets)) for h in reference.histograms], name
            if not reference.histograms or not reference.histograms[0].buckets:
                continue
            standard, standard_reference = ours.histograms[0], reference.histograms[0]
            # Equal-width bounds come from the exact extremes; the counts from the sketch.
            assert [(x.low_value, x.high_value) for x in standard.buckets] == \
                [(x.low_value, x.high_value) for x in standard_reference.buckets], name
            count = sum(x.sample_count for x in standard_reference.buckets)
            for x, y in zip(standard.buckets, standard_reference.buckets):
                assert abs(x.sample_count - y.sample_count) <= 2 * tolerance * count, name
            _check_quantiles(ours, values[name], tolerance)
            _check_quantiles(reference, values[name], tolerance)
        elif kind == "string_stats":
            assert ours == reference, name  # uniques, top values, rank histogram
        else:
            assert ours == reference, name


# --- Which path runs where -------------------------------------------------------------------

@pytest.mark.parametrize("args, beam", [
    (None, False),
    ([], False),
    (["--runner=DirectRunner"], False),
    (["--runner", "DirectRunner", "--sdk_container_image=tfrecord-pipeline:0.1.0"], False),
    (["--direct_num_workers=2"], False),  # in_memory: the workers setting is ignored
    (["--direct_running_mode=multi_threading", "--direct_num_workers=2"], False),
    (["--runner=BundleBasedDirectRunner"], False),
    (["--runner=apache_beam.runners.direct.direct_runner.DirectRunner"], False),
    (MULTI_PROCESSING, True),
    (["--direct_running_mode=multi_processing"], True),
    (["--direct_running_mode=multi_processing", "--direct_running_mode=in_memory"], False),
    (["--runner=DataflowRunner", "--project=p", "--region=r"], True),
    (["--runner", "FlinkRunner", "--flink_master=flink:8081"], True),
    (["--runner=SparkRunner"], True),
    (["--runner=PortableRunner", "--job_endpoint=localhost:8099"], True),
    (["--runner=PrismRunner"], True),
])
def test_the_runner_picks_the_path(args, beam):
    """In this process for the DirectRunner running here (`make run`'s default); the Beam
    job for worker processes and every other runner."""
    assert engine.runs_on_beam(args) is beam


def test_the_config_s_beam_args_pick_the_path():
    """`make run`'s Beam args keep the in-process path; direct_num_workers takes Beam."""
    from pipeline.configs import PipelineConfig

    assert not engine.runs_on_beam(PipelineConfig().beam_pipeline_args)
    assert engine.runs_on_beam(PipelineConfig(direct_num_workers=2).beam_pipeline_args)


# --- Merging -------------------------------------------------------------------------------

def _shard_stats(examples_uri: str, split: str) -> list[accumulators.SplitStats]:
    (_, files, plan), = stats_job.split_inputs(examples_uri, [split])
    options = StatisticsGenOptions(threads=1)
    return [stats_job.scan([(split, [path], plan)], options)[split].compact() for path in files]


def _copy(stats: accumulators.SplitStats) -> accumulators.SplitStats:
    return pickle.loads(pickle.dumps(stats, protocol=pickle.HIGHEST_PROTOCOL))


def test_merge_is_order_free(taxi_shards):
    """Four shards' accumulators merged as ((a+b)+c)+d and as a+(d+(c+b)): the same
    statistics, the moments to 1e-12, the quantiles within the sketch's error; and those of
    `scan` over the whole split (block by block, in file order)."""
    for split in SPLITS:
        a, b, c, d = _shard_stats(taxi_shards, split)
        assert min(s.num_examples for s in (a, b, c, d)) > 0
        left = _copy(a).merge(b).merge(c).merge(d)
        right = _copy(a).merge(_copy(d).merge(_copy(c).merge(b)))
        values = exact_values(taxi_shards, split)
        first, second = left.statistics(), right.statistics()
        assert first.datasets[0].num_examples == sum(s.num_examples for s in (a, b, c, d))
        assert_equivalent(first, second, values, moments_rel=1e-12)
        whole = stats_job.split_statistics(taxi_shards, [split])[split]
        assert_equivalent(first, whole, values, moments_rel=1e-12)
        names = {f.path.step[0] for f in first.datasets[0].features if f.HasField("string_stats")}
        assert {"company", "payment_type"} <= names


def test_merge_leaves_its_argument_as_it_was(taxi_shards):
    a, b = _shard_stats(taxi_shards, "train")[:2]
    before = _copy(b).statistics()
    a.merge(b)
    assert b.statistics() == before


def test_the_coder_carries_the_whole_state(taxi_shards):
    """A shard's accumulator through the Beam job's coder (the quantile sketch pickled with
    its state) gives the same statistics."""
    from components.statistics_gen import beam_job

    shard = _shard_stats(taxi_shards, "train")[0]
    coder = beam_job.SplitStatsCoder()
    assert coder.decode(coder.encode(shard)).statistics() == _copy(shard).statistics()
    fare = shard.features["fare"]
    assert fare.sketch is not None and fare.count > 0


def test_the_beam_job_in_this_process_writes_what_scan_writes(taxi_shards, tmp_path):
    """The Beam job on the DirectRunner in this process (the pipeline, its Combine and its
    writes, without the worker processes' start-up) against `scan`."""
    from components.statistics_gen import beam_job

    inputs = stats_job.split_inputs(taxi_shards, SPLITS)
    written = beam_job.run(inputs, str(tmp_path / "beam"), beam_pipeline_args=[])
    expected = stats_job.run(taxi_shards, str(tmp_path / "scan"), SPLITS)
    assert written == expected
    for split in SPLITS:
        assert_equivalent(_load(tmp_path / "beam", split), _load(tmp_path / "scan", split),
                          exact_values(taxi_shards, split), moments_rel=1e-9)


def test_shards_cut_into_pieces_give_what_scan_gives(taxi_shards, tmp_path, caplog):
    """Each shard summarised in pieces of about 300 records (whole gzip members, or records
    of a plain shard by its .idx), so one large shard spreads over workers: the same
    statistics, every row once."""
    import logging

    from components.statistics_gen import beam_job

    inputs = stats_job.split_inputs(taxi_shards, SPLITS)
    options = StatisticsGenOptions(piece_records=300)
    with caplog.at_level(logging.INFO):
        written = beam_job.run(inputs, str(tmp_path / "beam"), options, beam_pipeline_args=[])
    expected = stats_job.run(taxi_shards, str(tmp_path / "scan"), SPLITS)
    assert written == expected
    shards = sum(len(files) for _, files, _ in inputs)
    (line,) = [r.getMessage() for r in caplog.records if "pieces" in r.getMessage()]
    pieces = int(line.split(" in ")[1].split()[0])
    assert line.startswith(f"StatisticsGen: summarising {shards} shards in ")
    assert pieces >= sum(expected.values()) // 300 * 3 // 4 > shards
    for split in SPLITS:
        assert_equivalent(_load(tmp_path / "beam", split), _load(tmp_path / "scan", split),
                          exact_values(taxi_shards, split), moments_rel=1e-9)


def test_a_split_with_no_shards_is_written_empty(taxi_shards, tmp_path):
    from components.statistics_gen import beam_job

    (split, _, plan), = stats_job.split_inputs(taxi_shards, ["eval"])
    assert beam_job.run([(split, [], plan)], str(tmp_path / "beam")) == {"eval": 0}
    assert _load(tmp_path / "beam", "eval").datasets[0].num_examples == 0


def _load(statistics_uri, split: str):
    from tensorflow_metadata.proto.v0 import statistics_pb2

    with open(os.path.join(statistics_uri, f"Split-{split}", stats_job.STATS_FILE), "rb") as f:
        return statistics_pb2.DatasetFeatureStatisticsList.FromString(f.read())


# --- On worker processes -------------------------------------------------------------------

def _assert_beam_matches_scan(examples_uri: str, tmp_path,
                              options: StatisticsGenOptions = StatisticsGenOptions()) -> None:
    beam = engine.run(examples_uri, str(tmp_path / "beam"), SPLITS, options,
                      beam_pipeline_args=MULTI_PROCESSING)
    here = engine.run(examples_uri, str(tmp_path / "scan"), SPLITS,
                      beam_pipeline_args=["--runner=DirectRunner"])
    assert beam == here
    for split in SPLITS:
        assert_equivalent(_load(tmp_path / "beam", split), _load(tmp_path / "scan", split),
                          exact_values(examples_uri, split), moments_rel=1e-9)


@pytest.mark.slow
def test_worker_processes_match_the_in_process_run(taxi_shards, tmp_path):
    """The taxi sample's shards, gzip and plain, summarised by two DirectRunner worker
    processes in pieces of about 700 records (several a shard)."""
    _assert_beam_matches_scan(taxi_shards, tmp_path, StatisticsGenOptions(piece_records=700))


@pytest.mark.slow
def test_the_executor_takes_the_pipeline_s_beam_args(taxi_shards, tmp_path, monkeypatch):
    """The TFX executor with the DirectRunner's worker processes in its Beam args runs the
    Beam job (and with none, `scan`): the same statistics."""
    from tfx.dsl.components.base import base_beam_executor
    from tfx.types import artifact_utils, standard_artifacts

    from components.example_gen import artifacts as tfx_artifacts
    from components.statistics_gen import beam_job, executor

    ran = []
    monkeypatch.setattr(beam_job, "build_pipeline", _recorded(beam_job.build_pipeline, ran))

    def run(name: str, args: list[str]):
        examples = standard_artifacts.Examples()
        examples.uri = taxi_shards
        tfx_artifacts.set_examples_properties(examples, SPLITS)
        statistics = standard_artifacts.ExampleStatistics()
        statistics.uri = str(tmp_path / name)
        statistics.split_names = artifact_utils.encode_split_names([])
        context = base_beam_executor.BaseBeamExecutor.Context(beam_pipeline_args=args)
        executor.Executor(context).Do({"examples": [examples]}, {"statistics": [statistics]},
                                      {"exclude_splits": "[]"})

    run("beam", MULTI_PROCESSING)
    assert len(ran) == 1
    run("scan", ["--runner=DirectRunner"])
    assert len(ran) == 1
    for split in SPLITS:
        assert_equivalent(_load(tmp_path / "beam", split), _load(tmp_path / "scan", split),
                          exact_values(taxi_shards, split), moments_rel=1e-9)


def _recorded(function, calls: list):
    def recorded(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)
    return recorded


@pytest.mark.slow
def test_a_million_rows_on_worker_processes(tmp_path_factory, tmp_path):
    """A million generated taxi-like rows (testsupport/data.py's fixed seed), gzip shards."""
    from testsupport.data import write_taxi_csv

    root = tmp_path_factory.mktemp("million")
    source = write_taxi_csv(1_000_000, str(root / "csv"))
    examples = _examplegen(source, str(root / "examples"), num_shards=4)
    assert all(tfrecord_io.is_gzip(path) for path in stats_plan.split_files(examples, "train"))
    _assert_beam_matches_scan(examples, tmp_path)


def _string_stats(values: list[bytes]) -> accumulators.SplitStats:
    """A one-block state of string feature `s` holding `values`, one a row."""
    stats = accumulators.SplitStats(stats_plan.make_plan(_schema_with_string("s")),
                                    StatisticsGenOptions())
    column = pa.array([[v] for v in values], pa.list_(pa.large_binary()))
    part = accumulators._FeaturePart(accumulators._presence(column))
    part.bytes_total = sum(len(v) for v in values)
    part.value_counts = column.flatten().value_counts()
    stats.add(accumulators._BlockPart(len(values), {"s": part}))
    return stats


def test_value_tables_merge_by_summing():
    """The string side of a merge: value counts summed per value, whichever order."""
    plan = stats_plan.make_plan(_schema_with_string("s"))
    options = StatisticsGenOptions()
    one, two = _string_stats([b"a", b"b", b"a"]), _string_stats([b"b", b"c", b"b", b"b"])
    forward = accumulators.SplitStats(plan, options).merge(one).merge(two).statistics()
    backward = accumulators.SplitStats(plan, options).merge(two).merge(one).statistics()
    assert forward == backward
    strings = forward.datasets[0].features[0].string_stats
    assert strings.unique == 3
    assert [(v.value, v.frequency) for v in strings.top_values] == [("b", 4), ("a", 2),
                                                                    ("c", 1)]


def test_value_tables_merge_again_after_a_compaction():
    """A merged state compacted (its value tables summed into one) then merged with more:
    the summed table keeps the (value, count) columns' order. It did not, and the pipeline
    failed on movielens ("Schema at index 1 was different"): movie and user ids, many
    distinct values, compacted between a Beam bundle's merges."""
    merged = _string_stats([b"a", b"b", b"a"]).merge(_string_stats([b"b", b"c"])).compact()
    merged.merge(_string_stats([b"c", b"c", b"d"])).merge(_string_stats([b"a", b"a"])).compact()
    strings = merged.statistics().datasets[0].features[0].string_stats
    assert strings.unique == 4
    assert [(v.value, v.frequency) for v in strings.top_values] == [
        ("a", 4), ("c", 3), ("b", 2), ("d", 1)]


def _schema_with_string(name: str):
    from tensorflow_metadata.proto.v0 import schema_pb2

    schema = schema_pb2.Schema()
    schema.feature.add(name=name, type=schema_pb2.BYTES)
    return schema
