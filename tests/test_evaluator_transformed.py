"""The Evaluator on Transform's eval split: each model's layers after the Transform graph
score the rows Transform wrote, and serving_default is checked against them on the first
rows. Same metrics and blessing as scoring the raw records; rows that do not pair are not
blessed, with one line saying why; and where the rows cannot pair, the raw records are
scored as before."""
from __future__ import annotations

import json
import keyword
import logging
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_model_analysis as tfma

from components.evaluator import executor
from components.evaluator.options import EvaluatorOptions
from components.evaluator.output import SERVING_CHECK_FILE
from components.evaluator.transformed import SERVING_TOLERANCE
from tfrecord_shards import shards
from test_evaluator import (TAXI_SLICES, binary_taxi_metrics, blessing_facts, bound, failures,
                            metric_table, run_evaluator, taxi_config)


def transformed_dir(models: dict) -> str:
    """The Transform output the taxi models were trained on (the fixture's folder)."""
    return os.path.join(os.path.dirname(models["candidate"]), "transformed")


def passing_config() -> tfma.EvalConfig:
    """Bounds both models meet, so the only thing that can withhold the blessing is the
    check against serving_default."""
    return taxi_config([tfma.MetricConfig(class_name="BinaryAccuracy", threshold=bound(lower=0.5)),
                        tfma.MetricConfig(class_name="AUC", threshold=bound(lower=0.5)),
                        tfma.MetricConfig(class_name="ExampleCount")])


def evaluate_both(folder, examples: str, models: dict, config, transformed: str,
                  options: EvaluatorOptions | None = None) -> dict:
    """Ours on the raw records and ours on Transform's split, same models and config."""
    return {name: run_evaluator(executor.Executor, os.path.join(str(folder), name), examples,
                                config, models["candidate"], models["baseline"],
                                transformed=given, options=options)
            for name, given in (("raw", None), ("transformed", transformed))}


def serving_check(uri: str) -> dict | None:
    path = os.path.join(uri, SERVING_CHECK_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize("config, options, checked", [
    (passing_config, None, 4096),
    (lambda: taxi_config(binary_taxi_metrics()), None, 4096),
    # Parts of 100 rows, each reduced to its metric statistics and merged; 64 rows checked.
    (lambda: taxi_config(binary_taxi_metrics()),
     EvaluatorOptions(part_rows=100, serving_check_rows=64, transformed_batch_rows=30), 64)],
    ids=["blessed", "thresholds-missed", "in-parts"])
def test_the_transformed_split_gives_the_raw_records_metrics_and_blessing(
        taxi_examples, taxi_models, config, options, checked, tmp_path):
    runs = evaluate_both(tmp_path, taxi_examples, taxi_models, config(),
                         transformed_dir(taxi_models), options)
    eval_rows = shards.read_manifest(taxi_examples)["splits"]["eval"]["rows"]
    assert serving_check(runs["raw"][0]) is None
    check = serving_check(runs["transformed"][0])
    assert check is not None and check["refusal"] is None
    assert check["rows"] == min(checked, eval_rows) and \
        check["largest_difference"] <= SERVING_TOLERANCE
    raw, transformed = metric_table(runs["raw"][0]), metric_table(runs["transformed"][0])
    assert sorted(raw) == sorted(transformed) and len(raw) > 10
    far = {key: (raw[key], transformed[key]) for key in raw
           if not np.allclose(raw[key], transformed[key], atol=1e-6, rtol=0, equal_nan=True)}
    assert not far, far
    raw_failures, transformed_failures = (failures(runs[n][0]) for n in ("raw", "transformed"))
    assert sorted(raw_failures) == sorted(transformed_failures)
    assert all(abs(raw_failures[k] - transformed_failures[k]) <= 1e-6 for k in raw_failures)
    assert blessing_facts(runs["raw"][1]) == blessing_facts(runs["transformed"][1])


@pytest.mark.slow
def test_a_plain_transformed_split_scores_as_the_gzip_one(taxi_examples, taxi_models, tmp_path):
    """Transform's split with its shards inflated to plain files (manifest to match): the
    same metrics as from the gzip shards, and serving_default agrees on the first rows."""
    import gzip

    plain = str(tmp_path / "plain-split")
    shutil.copytree(transformed_dir(taxi_models), plain)
    manifest = shards.read_manifest(plain)
    assert manifest["compression"] == "gzip"
    for entry in manifest["splits"].values():
        for shard in entry["shards"]:
            packed = os.path.join(plain, shard["path"])
            with gzip.open(packed, "rb") as source, open(packed[:-len(".gz")], "wb") as out:
                out.write(source.read())
            os.remove(packed)
            shard["path"] = shard["path"][:-len(".gz")]
            shard.pop("gzip_members", None)
    manifest["compression"] = "none"
    shards.write_manifest(plain, manifest)
    config = passing_config()
    runs = {name: run_evaluator(executor.Executor, str(tmp_path / name), taxi_examples, config,
                                taxi_models["candidate"], taxi_models["baseline"],
                                transformed=given)
            for name, given in (("gzip", transformed_dir(taxi_models)), ("plain", plain))}
    for name in runs:
        check = serving_check(runs[name][0])
        assert check is not None and check["refusal"] is None, name
    assert metric_table(runs["gzip"][0]) == metric_table(runs["plain"][0])
    assert blessing_facts(runs["gzip"][1]) == blessing_facts(runs["plain"][1])


def reversed_eval_rows(source: str, folder: str) -> str:
    """A copy of Transform's output `source` in `folder` whose eval rows come in reverse
    order (each packed block's rows reversed, every feature alike, so each row stays whole),
    so that they no longer pair with the raw rows."""
    from tfrecord_shards.packing.layout import ROWS_KEY

    shutil.copytree(source, folder)
    for shard in shards.read_manifest(folder)["splits"]["eval"]["shards"]:
        path = os.path.join(folder, shard["path"])
        blocks = [tf.train.Example.FromString(r.numpy())
                  for r in tf.data.TFRecordDataset(path, "GZIP")]
        with tf.io.TFRecordWriter(path, "GZIP") as writer:
            for block in reversed(blocks):
                rows = block.features.feature[ROWS_KEY].int64_list.value[0]
                for name, feature in block.features.feature.items():
                    values = getattr(feature, feature.WhichOneof("kind")).value
                    if name != ROWS_KEY:
                        assert len(values) >= rows > 1, name  # one value a row
                        values[:rows] = list(values[:rows])[::-1]
                writer.write(block.SerializeToString())
    return folder


@pytest.mark.slow
def test_rows_that_do_not_pair_are_not_blessed_with_one_line(taxi_examples, taxi_models,
                                                             tmp_path, caplog):
    """Transform's eval rows in reverse order (each packed block's rows reversed, every
    feature alike, so each row stays whole): the rows no longer pair with the raw ones, so
    serving_default disagrees with the transformed split, and the model that the raw
    records bless is not blessed."""
    tampered = reversed_eval_rows(transformed_dir(taxi_models), str(tmp_path / "tampered"))
    with caplog.at_level(logging.ERROR):
        runs = evaluate_both(tmp_path, taxi_examples, taxi_models, passing_config(), tampered)
    assert blessing_facts(runs["raw"][1])[0] == ["BLESSED"]
    assert blessing_facts(runs["transformed"][1])[0] == ["NOT_BLESSED"]
    check = serving_check(runs["transformed"][0])
    assert check["largest_difference"] > SERVING_TOLERANCE
    refusals = [r.getMessage() for r in caplog.records if "not blessed" in r.getMessage()]
    assert len(refusals) == 1 and "\n" not in refusals[0]
    assert check["refusal"] in refusals[0] and "serving_default" in refusals[0]


@pytest.mark.slow
def test_where_rows_cannot_pair_the_raw_records_are_scored(taxi_examples, taxi_models,
                                                           tmp_path, caplog):
    """Raw slicing columns exist only in the raw rows; a Transform output without the
    row order, of other examples, or made by another graph than the model embeds (a cached
    Trainer's model beside a new Transform) does not pair. Each is scored on the raw records,
    with the same metrics as without the transformed split, and the reason logged."""
    sliced = taxi_config([tfma.MetricConfig(class_name="BinaryAccuracy"),
                          tfma.MetricConfig(class_name="ExampleCount")], TAXI_SLICES)
    unordered = str(tmp_path / "unordered")
    shutil.copytree(transformed_dir(taxi_models), unordered)
    manifest = shards.read_manifest(unordered)
    del manifest["row_order"]
    shards.write_manifest(unordered, manifest)
    other = str(tmp_path / "other")
    shutil.copytree(transformed_dir(taxi_models), other)
    manifest = shards.read_manifest(other)
    manifest["inputs"] = [str(tmp_path / "elsewhere")]
    shards.write_manifest(other, manifest)
    regraphed = str(tmp_path / "regraphed")  # as from a later Transform than the model's
    shutil.copytree(transformed_dir(taxi_models), regraphed)
    manifest = shards.read_manifest(regraphed)
    manifest["transform_graph_digest"] = "0" * 64
    shards.write_manifest(regraphed, manifest)
    cases = [(sliced, transformed_dir(taxi_models), "exist only in the raw rows"),
             (passing_config(), unordered, "do not keep the raw rows' order"),
             (passing_config(), other, "made from other examples"),
             (passing_config(), regraphed, "embeds another Transform graph")]
    for number, (config, given, reason) in enumerate(cases):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            runs = evaluate_both(tmp_path / str(number), taxi_examples, taxi_models, config,
                                 given)
        assert serving_check(runs["transformed"][0]) is None
        assert metric_table(runs["raw"][0]) == metric_table(runs["transformed"][0])
        assert any(reason in r.getMessage() and "scoring the raw records" in r.getMessage()
                   for r in caplog.records), reason


@pytest.mark.slow
def test_a_compiled_signature_gives_the_raw_records_metrics(taxi_examples, taxi_models,
                                                            tmp_path, caplog):
    """With every split large enough to compile (jit_compile_rows=1), both models' layers
    are scored compiled by XLA, and the metrics and blessing are those of the raw records,
    as the uncompiled signature's are."""
    config = taxi_config(binary_taxi_metrics())
    with caplog.at_level(logging.INFO):
        runs = evaluate_both(tmp_path, taxi_examples, taxi_models, config,
                             transformed_dir(taxi_models), EvaluatorOptions(jit_compile_rows=1))
    compiled = [r.getMessage() for r in caplog.records if "compiled by XLA" in r.getMessage()]
    assert len(compiled) == 2, compiled  # the candidate and the baseline
    check = serving_check(runs["transformed"][0])
    assert check["refusal"] is None and check["largest_difference"] <= SERVING_TOLERANCE
    raw, transformed = metric_table(runs["raw"][0]), metric_table(runs["transformed"][0])
    assert sorted(raw) == sorted(transformed) and len(raw) > 10
    far = {key: (raw[key], transformed[key]) for key in raw
           if not np.allclose(raw[key], transformed[key], atol=1e-6, rtol=0, equal_nan=True)}
    assert not far, far
    assert blessing_facts(runs["raw"][1]) == blessing_facts(runs["transformed"][1])


def test_a_signature_xla_cannot_compile_is_scored_as_it_is(caplog):
    """String hashing has no XLA kernel: the signature is then called as it is, and the
    log says so; a numeric one is compiled and scores the same."""
    from components.evaluator.transformed import scoring_function

    class Layers(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.string),
                                      tf.TensorSpec([None, 1], tf.float32)])
        def hashed(self, company, fare):
            bucket = tf.strings.to_hash_bucket_fast(company, 7)
            return {"probability": tf.sigmoid(tf.cast(bucket, tf.float32) * fare)}

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32)])
        def numeric(self, fare):
            return {"probability": tf.sigmoid(tf.sin(fare) * 3.0 + fare)}

    layers = Layers()
    inputs = {"company": tf.constant([[b"Flash Cab"], [b"Taxi Affiliation"], [b""]]),
              "fare": tf.constant([[4.5], [12.25], [-1.0]])}
    with caplog.at_level(logging.INFO):
        hashed = scoring_function(layers.hashed.get_concrete_function(), inputs, True, "m1")
        numeric = scoring_function(layers.numeric.get_concrete_function(),
                                   {"fare": inputs["fare"]}, True, "m2")
    messages = [r.getMessage() for r in caplog.records]
    assert any("m1 is scored without XLA" in m for m in messages), messages
    assert any("m2 is scored compiled by XLA" in m for m in messages), messages
    assert np.array_equal(hashed(inputs)["probability"].numpy(),
                          layers.hashed(**inputs)["probability"].numpy())
    longer = {"fare": tf.constant([[0.5], [2.0], [30.0], [7.0], [-3.5]])}
    np.testing.assert_allclose(numeric(longer)["probability"].numpy(),
                               layers.numeric(**longer)["probability"].numpy(), atol=1e-6)


def test_signature_input_names_are_tensorflows_and_keep_apart():
    from components.trainer.options import signature_input_name

    names = ["Body Mass (g)", "Delta 15 N (o/oo)__missing", "trip_miles", "_private", "a.b-c",
             "class", "1st", "lambda"]
    made = [signature_input_name(n) for n in names]
    assert made == ["Body_Mass__g_", "Delta_15_N__o_oo___missing", "trip_miles", "f_private",
                    "a_b_c", "f_class", "f_1st", "f_lambda"]
    # A signature's inputs become a Python function's parameters when it is saved.
    assert all(m.isidentifier() and not keyword.iskeyword(m) for m in made)
