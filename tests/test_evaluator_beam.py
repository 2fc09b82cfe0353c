"""The fast Evaluator as a Beam pipeline (components/evaluator/beam_job.py) against its
in-process path (evaluate.evaluate): which runner takes which; shard statistics that merge in
any order and grouping; and, on the taxi models of tests/test_evaluator.py, the DirectRunner's
multi_processing mode (two worker processes) giving every metric of every slice within 1e-6
of the in-process run, and the same blessing, on gzip and plain shards and on 1M rows, and
on Transform's eval split (a file a worker, checked against serving_default once).

"Within 1e-6": |beam - in-process| <= 1e-6 + 1e-6 * |in-process| (np.isclose's rule), that is
absolute for values below 1 and relative above: Keras's metric variables (the compiled loss,
binary cross-entropy) are float32 sums, added shard by shard here and at once in process."""
from __future__ import annotations

import glob
import gzip
import logging
import os
import random
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_model_analysis as tfma

from components.transform import taxi
from components.evaluator import beam_job, evaluate, executor, keras_metrics, kinds, slice_stats
from components.evaluator.config import metric_keys
from components.evaluator.options import EvaluatorOptions, UnsupportedSetting
from components.evaluator.scores import Scores

ATOL = RTOL = 1e-6
MULTI_PROCESSING = ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
                    "--direct_num_workers=2", "--sdk_container_image=unused"]


# --- which path ---------------------------------------------------------------------------------
@pytest.mark.parametrize("args, on_beam", [
    (None, False), ([], False),
    (["--runner=DirectRunner"], False),
    (["--runner=DirectRunner", "--sdk_container_image=tfrecord-pipeline:latest"], False),
    (["--direct_num_workers=2"], False),  # in_memory: one process
    (["--runner=DirectRunner", "--direct_running_mode=multi_threading",
      "--direct_num_workers=2"], False),
    (["--runner=direct"], False), (["--runner=BundleBasedDirectRunner"], False),
    (["--runner=DirectRunner", "--direct_running_mode=multi_processing",
      "--direct_num_workers=2"], True),
    (["--direct_running_mode=multi_processing"], True),
    (["--runner=DataflowRunner", "--project=p", "--region=r"], True),
    (["--runner=FlinkRunner", "--flink_master=host:8081"], True),
    (["--runner=SparkRunner"], True), (["--runner=PortableRunner"], True),
    (["--runner=apache_beam.runners.dataflow.dataflow_runner.DataflowRunner"], True),
])
def test_runs_on_beam_off_the_local_runner_only(args, on_beam):
    assert beam_job.runs_on_beam(args) is on_beam


def test_the_pipeline_default_scores_in_process():
    """`make run`'s Beam args (the DirectRunner, in process) keep the in-process path; the
    direct_num_workers setting turns on the Beam pipeline."""
    from pipeline.configs import PipelineConfig

    assert not beam_job.runs_on_beam(PipelineConfig().beam_pipeline_args)
    assert beam_job.runs_on_beam(PipelineConfig(direct_num_workers=2).beam_pipeline_args)


# --- merging ------------------------------------------------------------------------------------
def synthetic_parts(seed: int = 7, parts: int = 5) -> list[Scores]:
    """A binary model's labels and predictions in parts of different sizes (one of 3 rows),
    predictions on bucket edges and at 0 and 1 among them."""
    rng = np.random.default_rng(seed)
    found = []
    for rows in (3, 400, 1250, 77, 2000)[:parts]:
        predictions = rng.random(rows).astype(np.float32)
        predictions[: min(rows, 4)] = np.float32([0.0, 1.0, 0.5, 0.25])[: min(rows, 4)]
        labels = (rng.random(rows) < predictions).astype(np.float32)
        found.append(Scores(labels.reshape(-1, 1), predictions.reshape(-1, 1)))
    return found


def binary_config() -> tfma.EvalConfig:
    return tfma.utils.update_eval_config_with_defaults(tfma.EvalConfig(
        model_specs=[tfma.ModelSpec(label_key="y")],
        metrics_specs=[tfma.MetricsSpec(metrics=[
            tfma.MetricConfig(class_name=name) for name in
            ("ExampleCount", "AUC", "BinaryAccuracy", "Precision", "Recall", "Calibration",
             "MeanLabel", "MeanPrediction", "MeanSquaredError", "MeanAbsoluteError",
             "BinaryCrossentropy")] + [  # the last: Keras's, through TFMA's wrapper
            tfma.MetricConfig(class_name="AUC", config='{"curve": "PR", "name": "auc_pr"}'),
            tfma.MetricConfig(class_name="AUC", config='{"num_thresholds": 200, '
                                                       '"name": "auc_200"}'),
            tfma.MetricConfig(class_name="Precision",
                              config='{"thresholds": [0.25, 0.75], "name": "precision_at"}')])]))


def part_statistics(parts: list[Scores], keys, instances, runners) -> list[tuple]:
    found = []
    for scores in parts:
        statistics = {}
        for key in keys:
            if slice_stats.statistic_id(instances[key.name], key) not in statistics:
                statistics.update(slice_stats.metric_statistics(
                    instances[key.name], key, scores, runners.get(key.name)))
        found.append(((), statistics))
    return found


def values_of(statistics: dict, keys, instances, runners) -> dict:
    return {key: slice_stats.statistics_value(instances[key.name], key, statistics,
                                              runners.get(key.name)) for key in keys}


def test_shard_statistics_merge_in_any_order_and_grouping():
    """The CombineFn's accumulators of five parts merged in two orders and groupings (as
    Beam's combiner lifting may: adding inputs one by one, then merging partial merges)
    give the same metrics within 1e-9, and those of all the rows at once within 1e-6."""
    config = binary_config()
    keys, instances = metric_keys(config)
    runners = {name: keras_metrics.KerasRunner.of_metric(instance)
               for name, instance in instances.items() if kinds.is_keras(instance)}
    parts = synthetic_parts()
    accumulators = part_statistics(parts, keys, instances, runners)
    combine = beam_job.MergeStatistics()

    one_by_one = combine.create_accumulator()
    for accumulator in accumulators:
        one_by_one = combine.add_input(one_by_one, accumulator)
    a, b, c, d, e = accumulators
    grouped = combine.merge_accumulators([
        combine.merge_accumulators([e, combine.create_accumulator(), c]),
        combine.add_input(combine.add_input(combine.create_accumulator(), b), d),
        combine.merge_accumulators([a])])
    first = values_of(combine.extract_output(one_by_one)[1], keys, instances, runners)
    second = values_of(combine.extract_output(grouped)[1], keys, instances, runners)
    assert len(first) == len(keys) >= 14
    for key in keys:
        np.testing.assert_allclose(first[key], second[key], rtol=1e-9, atol=1e-9,
                                   err_msg=str(key))
    # ... and they are the metrics of all the rows at once.
    whole = Scores(np.concatenate([p.labels for p in parts]),
                   np.concatenate([p.predictions for p in parts]))
    for key in keys:
        expected = slice_stats.metric_value(instances[key.name], key, whole,
                                            runners.get(key.name))
        np.testing.assert_allclose(first[key], expected, rtol=RTOL, atol=ATOL,
                                   err_msg=str(key))
    assert first[next(k for k in keys if k.name == "example_count")] == len(whole)
    # The parts themselves were not changed by merging.
    again = part_statistics(parts, keys, instances, runners)
    for (_, mine), (_, theirs) in zip(accumulators, again):
        assert values_of(mine, keys, instances, runners).keys() == \
            values_of(theirs, keys, instances, runners).keys()
        for key, value in values_of(mine, keys, instances, runners).items():
            np.testing.assert_array_equal(value, values_of(theirs, keys, instances,
                                                           runners)[key])


def test_a_keras_metric_whose_state_does_not_add_up_is_refused_in_one_line():
    from tensorflow_model_analysis.utils.keras_lib import tf_keras

    class Largest(tf_keras.metrics.Metric):
        def __init__(self, name="largest", **kwargs):
            super().__init__(name=name, **kwargs)
            self.largest = self.add_weight("largest", initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.largest.assign(tf.maximum(self.largest, tf.reduce_max(y_pred)))

        def result(self):
            return self.largest

    class MeanOfRows(tf_keras.metrics.Mean):  # Keras's sums, our update: not trusted
        def update_state(self, values, sample_weight=None):
            return super().update_state(values, sample_weight)

    keras_metrics.KerasRunner.of_metric(tf_keras.metrics.BinaryAccuracy()).check_additive()
    keras_metrics.KerasRunner.of_metric(tf_keras.losses.BinaryCrossentropy()).check_additive()
    for metric, name in ((Largest(), "largest"), (MeanOfRows(name="mean_of_rows"),
                                                   "mean_of_rows")):
        with pytest.raises(UnsupportedSetting) as raised:
            keras_metrics.KerasRunner.of_metric(metric).check_additive()
        message = str(raised.value)
        assert message.startswith(f"{name} (") and "\n" not in message
        assert "does not add up" in message


# --- on the taxi models: Beam's multi_processing against in process ------------------------------
def run_executor(folder, examples: str, config, models: dict, beam_args=None,
                 transformed: str | None = None, options: EvaluatorOptions | None = None):
    """Our executor as TFX runs it, with the pipeline's Beam args (None: none), and
    Transform's output of `examples` and the Evaluator's options when given."""
    from tfx.dsl.components.base import base_beam_executor
    from test_evaluator import run_evaluator

    context = base_beam_executor.BaseBeamExecutor.Context(
        beam_pipeline_args=beam_args, tmp_dir=str(folder) + "-tmp", unique_id="1")
    return run_evaluator(lambda: executor.Executor(context), folder, examples, config,
                         models["candidate"], models["baseline"], transformed=transformed,
                         options=options)


def assert_same_tables(beam_uri: str, local_uri: str) -> dict:
    from test_evaluator import metric_table

    beam, local = metric_table(beam_uri), metric_table(local_uri)
    assert sorted(beam) == sorted(local)
    far = {key: (local[key], beam[key]) for key in local
           if not np.allclose(beam[key], local[key], atol=ATOL, rtol=RTOL, equal_nan=True)}
    assert not far, far
    return local


def binary_taxi_config() -> tfma.EvalConfig:
    """test_evaluator's binary config (every kind of metric, thresholds met and missed), and
    two regression errors."""
    from test_evaluator import TAXI_SLICES, binary_taxi_metrics, taxi_config

    return taxi_config(binary_taxi_metrics() + [
        tfma.MetricConfig(class_name="MeanSquaredError"),
        tfma.MetricConfig(class_name="MeanAbsoluteError")], TAXI_SLICES)


@pytest.mark.slow
def test_multi_processing_matches_in_process_on_taxi(taxi_examples, taxi_models, tmp_path,
                                                     caplog):
    """Every metric of both models and their diffs, on every slice, within 1e-6, and the same
    blessing and failed thresholds, with two worker processes scoring the raw records in
    pieces of whole gzip members (about 128 records asked: a member each), by the manifest."""
    from test_evaluator import blessing_facts, failures

    config = binary_taxi_config()
    options = EvaluatorOptions(part_rows=128)
    local_uri, local_blessing = run_executor(tmp_path / "local", taxi_examples, config,
                                             taxi_models, options=options)
    with caplog.at_level(logging.INFO):
        beam_uri, beam_blessing = run_executor(tmp_path / "beam", taxi_examples, config,
                                               taxi_models, MULTI_PROCESSING, options=options)
    (line,) = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("Evaluator on Beam")]
    shards = glob.glob(os.path.join(taxi_examples, "Split-eval", "*"))
    pieces = int(line.split("model(s): ")[1].split()[0])
    assert line.split("model(s): ")[1].startswith(f"{pieces} piece(s) of raw records"), line
    assert pieces > len(shards), line
    table = assert_same_tables(beam_uri, local_uri)
    assert len({where for where, _ in table}) > 20
    assert blessing_facts(beam_blessing) == blessing_facts(local_blessing)
    assert blessing_facts(beam_blessing)[0] == ["NOT_BLESSED"]
    local, beam = failures(local_uri), failures(beam_uri)
    assert sorted(beam) == sorted(local) and local
    # The summary the pipeline leaves in the executor's temp folder is read and removed.
    assert not glob.glob(str(tmp_path / "beam-tmp" / "**" / "evaluator-summary-*"),
                         recursive=True)


def split_records(taxi_examples: str) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(
        sorted(glob.glob(os.path.join(taxi_examples, "Split-eval", "*"))),
        compression_type="GZIP")]


@pytest.mark.slow
def test_gzip_and_plain_shards_on_beam(taxi_examples, taxi_models, tmp_path):
    """The eval rows in six shards, three gzip and three plain, one empty: the Beam pipeline
    (two worker processes) gives the in-process metrics on the same files."""
    records = split_records(taxi_examples)
    random.Random(5).shuffle(records)
    folder = tmp_path / "shards"
    folder.mkdir()
    bounds = [0, 300, 301, 900, 1200, len(records)]
    files = []
    for i, (start, end) in enumerate(zip(bounds, bounds[1:] + [len(records)])):
        compression = "GZIP" if i % 2 else ""
        path = str(folder / (f"part-{i}.tfrecord" + (".gz" if compression else "")))
        with tf.io.TFRecordWriter(path, options=compression or None) as writer:
            for record in records[start:end]:
                writer.write(record)
        files.append(path)
    assert sum(open(p, "rb").read(2) == b"\x1f\x8b" for p in files) == 3
    config = tfma.utils.update_eval_config_with_defaults(binary_taxi_config(),
                                                         has_baseline=True)
    paths = {spec.name: taxi_models["baseline" if spec.is_baseline else "candidate"] +
             "/Format-Serving" for spec in config.model_specs}
    local = evaluate.evaluate(config, files, paths, str(tmp_path / "local"))
    beam = beam_job.run(config, files, paths, str(tmp_path / "beam"),
                        beam_pipeline_args=MULTI_PROCESSING[:3])
    assert (beam.rows, beam.slices) == (local.rows, local.slices) == (len(records),
                                                                      local.slices)
    assert beam.validation.validation_ok == local.validation.validation_ok
    assert_same_tables(str(tmp_path / "beam"), str(tmp_path / "local"))


@pytest.mark.slow
def test_multi_processing_matches_in_process_on_a_million_rows(tmp_path_factory):
    """1M taxi-like rows (testsupport/data.py, its fixed seed) through our ExampleGen, all but
    a thousandth in the eval split (8 gzip shards), scored both ways by two taxi models
    trained on the whole bundled sample (the 2,000-trip slice's models cannot parse the
    sample's rows with missing values): bench/evaluator_beam.py's data and models."""
    from bench.evaluator_beam import prepare
    from test_evaluator import blessing_facts

    root = tmp_path_factory.mktemp("million")
    prepare(str(root))
    models = {name: str(root / name) for name in ("candidate", "baseline")}
    examples = str(root / "million")
    config = binary_taxi_config()
    local_uri, local_blessing = run_executor(root / "local", examples, config, models)
    beam_uri, beam_blessing = run_executor(root / "beam", examples, config, models,
                                           MULTI_PROCESSING)
    table = assert_same_tables(beam_uri, local_uri)
    count = [v for (where, key), v in table.items()
             if not where and 'name: "example_count" model_name: "candidate"' in key]
    assert count and count[0] > 990_000
    assert blessing_facts(beam_blessing) == blessing_facts(local_blessing)


# --- Transform's eval split on Beam --------------------------------------------------------------
def eval_split_in_files(source: str, folder: str, files: int, block_rows: int) -> str:
    """A copy of Transform's output `source` whose eval rows are cut, in order, into `files`
    gzip shards, each packed anew by the product's packer in blocks of `block_rows` (the
    schema and manifest to match; only the eval split is read from it)."""
    import pyarrow as pa

    from shard_readers import numpy_reader
    from tfrecord_shards import shards, tfrecord_io
    from tfrecord_shards.codec import schema_file
    from tfrecord_shards.packing import PackedLayout, annotate
    from tfrecord_shards.packing.write import pack_batch

    shutil.copytree(source, folder)
    manifest = shards.read_manifest(folder)
    entry = manifest["splits"]["eval"]
    schema = schema_file.load_schema(folder)
    paths = [os.path.join(folder, shard["path"]) for shard in entry["shards"]]
    parts = list(numpy_reader.iter_batches(paths, schema, batch_size=entry["rows"]))
    assert len(parts) == 1
    columns = {}
    for name, values in parts[0].items():
        values = np.asarray(values).reshape(entry["rows"], -1)
        columns[name] = pa.ListArray.from_arrays(
            pa.array(np.arange(entry["rows"] + 1, dtype=np.int32) * values.shape[1]),
            pa.array(values.reshape(-1)))
    table = pa.table(columns)
    for path in paths:
        os.remove(path)
    schema = annotate(schema, block_rows)
    schema_file.write_schema(schema, os.path.join(folder, schema_file.SCHEMA_FILE))
    cuts = np.linspace(0, entry["rows"], files + 1).astype(int)
    entry["shards"] = []
    for i, (start, end) in enumerate(zip(cuts[:-1], cuts[1:])):
        name = f"Split-eval/part-{i:05d}-of-{files:05d}.tfrecord.gz"
        records = pack_batch(table.slice(start, end - start), PackedLayout.from_schema(schema))
        framed, ends = tfrecord_io.frame_records(records)
        bounds = [0] + ends.tolist()
        members = []
        # A gzip member a block, listed as our writer lists them, so a piece that starts
        # inside the shard is read from its member.
        with open(os.path.join(folder, name), "wb") as f:
            for number in range(len(records)):
                members.append([f.tell(), 1])
                f.write(gzip.compress(framed.tobytes()[bounds[number]:bounds[number + 1]], 1))
        # As the writer counts them: a shard's rows are its packed records.
        entry["shards"].append({"path": name, "rows": len(records), "gzip_members": members,
                                "bytes": os.path.getsize(os.path.join(folder, name)),
                                "partition": ""})
    shards.write_manifest(folder, manifest)
    return folder


@pytest.mark.slow
def test_multi_processing_scores_transformed_split_as_in_process(taxi_examples, taxi_models,
                                                                 tmp_path, caplog):
    """Transform's eval split in three shards of 64-row blocks, scored through
    score_transformed by two worker processes in pieces of two blocks (each read from its
    shard's member index): every metric within 1e-6 of the in-process run on the same split,
    the same blessing, and serving_default checked on the same first rows."""
    from test_evaluator import blessing_facts
    from test_evaluator_transformed import passing_config, serving_check, transformed_dir
    from tfrecord_shards import shards

    split = eval_split_in_files(transformed_dir(taxi_models), str(tmp_path / "three"), 3, 64)
    config = passing_config()
    options = EvaluatorOptions(part_rows=128)
    local_uri, local_blessing = run_executor(tmp_path / "local", taxi_examples, config,
                                             taxi_models, transformed=split, options=options)
    with caplog.at_level(logging.INFO):
        beam_uri, beam_blessing = run_executor(tmp_path / "beam", taxi_examples, config,
                                               taxi_models, MULTI_PROCESSING, transformed=split,
                                               options=options)
    (line,) = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("Evaluator on Beam")]
    # 220 rows a shard: blocks of 64, 64, 64 and 28 rows, two blocks a piece.
    assert "6 piece(s) of Transform's split through score_transformed" in line, line
    assert "raw records" not in line, line
    assert_same_tables(beam_uri, local_uri)
    assert blessing_facts(beam_blessing) == blessing_facts(local_blessing)
    assert blessing_facts(beam_blessing)[0] == ["BLESSED"]
    # Written only where the transformed split was scored.
    local_check, beam_check = serving_check(local_uri), serving_check(beam_uri)
    assert beam_check is not None and beam_check["refusal"] is None
    eval_split = shards.read_manifest(split)["splits"]["eval"]
    assert len(eval_split["shards"]) == 3
    # Fewer rows than the check takes: it reads all three files.
    assert beam_check["rows"] == local_check["rows"] == eval_split["rows"] < 4096
    assert beam_check["largest_difference"] <= beam_check["tolerance"]


@pytest.mark.slow
def test_on_beam_rows_that_do_not_pair_are_not_blessed_with_one_line(
        taxi_examples, taxi_models, tmp_path, caplog):
    """Transform's eval rows reversed: on two worker processes, as in process, the check
    against serving_default withholds the blessing the raw records give, in one line."""
    from test_evaluator import blessing_facts
    from test_evaluator_transformed import (passing_config, reversed_eval_rows, serving_check,
                                            transformed_dir)

    tampered = reversed_eval_rows(transformed_dir(taxi_models), str(tmp_path / "tampered"))
    config = passing_config()
    _, raw_blessing = run_executor(tmp_path / "raw", taxi_examples, config, taxi_models,
                                   MULTI_PROCESSING)
    with caplog.at_level(logging.ERROR):
        uri, blessing = run_executor(tmp_path / "beam", taxi_examples, config, taxi_models,
                                     MULTI_PROCESSING, transformed=tampered)
    assert blessing_facts(raw_blessing)[0] == ["BLESSED"]
    assert blessing_facts(blessing)[0] == ["NOT_BLESSED"]
    check = serving_check(uri)
    assert check["largest_difference"] > check["tolerance"]
    refusals = [r.getMessage() for r in caplog.records if "not blessed" in r.getMessage()]
    assert len(refusals) == 1 and "\n" not in refusals[0]
    assert check["refusal"] in refusals[0] and "serving_default" in refusals[0]
