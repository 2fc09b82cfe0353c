"""The Trainer chooses its weights on validation rows, never on the eval split: rows held out
of the train split by a stable hash (or a `validation` split of the Examples' own), on real
taxi shards written by our ExampleGen."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import config as framework_config
from tfx.components.trainer.fn_args_utils import FnArgs

from components.transform import taxi
from tfrecord_shards.codec import schema_file
from components.trainer import fit, module
from components.trainer.input import Holdout, build_dataset, mixed_row_keys, resolve_files
from components.trainer.options import InputConfig, TrainerOptions
from conftest import packed_copy


def fn_args(examples: str, out, **kwargs) -> FnArgs:
    return FnArgs(train_files=[os.path.join(examples, "Split-train", "*")],
                  eval_files=[os.path.join(examples, "Split-eval", "*")],
                  schema_path=os.path.join(examples, "schema.pbtxt"),
                  model_run_dir=str(out / "model_run"), serving_model_dir=str(out / "serving"),
                  **kwargs)


def trip_ids(files, schema, holdout=None) -> list[tuple]:
    """Each row read, as the values that tell the taxi trips apart."""
    keys = ["trip_start_timestamp", "trip_seconds", "fare", "trip_miles"]
    data = build_dataset(files, schema, None, feature_keys=keys, holdout=holdout,
                         config=InputConfig(batch_size=500, training=False, num_epochs=1))
    return [tuple(row) for batch in data
            for row in zip(*(batch[k].numpy().ravel().tolist() for k in keys))]


def records_with(split: str, folder, change) -> None:
    """The split's records, each changed by `change`, written as one file in `folder`."""
    os.makedirs(folder)
    with tf.io.TFRecordWriter(os.path.join(folder, "data.tfrecord")) as writer:
        for path in resolve_files(os.path.join(split, "*")):
            for record in tf.data.TFRecordDataset(path, compression_type="GZIP"):
                example = tf.train.Example.FromString(record.numpy())
                if change(example):
                    writer.write(example.SerializeToString())


@pytest.mark.parametrize("packed", [False, True])
def test_a_tenth_of_the_train_rows_is_held_out_the_same_each_time(taxi_examples, tmp_path,
                                                                  packed):
    """About 10 % of the rows, the same ones on every read, and training reads exactly the
    others. Packed into a single block of 1,024 rows, a tenth of the rows is still held out
    (each row is hashed with its block and its place in it), not the whole block or none."""
    schema = schema_file.load_schema(taxi_examples)
    files = resolve_files(os.path.join(taxi_examples, "Split-train", "*"))
    if packed:
        files, schema = packed_copy(os.path.join(taxi_examples, "Split-train"),
                                    tmp_path / "packed", rows_per_block=1024, files=1)
    every = trip_ids(files, schema)
    held_out = trip_ids(files, schema, Holdout(0.1, validation=True))
    trained = trip_ids(files, schema, Holdout(0.1, validation=False))
    assert len(every) == len(set(every)) > 1000
    assert set(held_out).isdisjoint(trained)
    assert sorted(held_out + trained) == sorted(every)
    assert 0.07 < len(held_out) / len(every) < 0.13, len(held_out)
    assert trip_ids(files, schema, Holdout(0.1, validation=True)) == held_out
    more = trip_ids(files, schema, Holdout(0.3, validation=True))
    assert set(held_out) < set(more) and 0.25 < len(more) / len(every) < 0.35


def splitmix64_finaliser(block: int, place: int) -> int:
    """splitmix64 as its authors' C code writes it (Python integers masked to 64 bits)."""
    mask = (1 << 64) - 1
    z = (block + (place + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_a_packed_rows_key_is_splitmix64_of_its_block_and_place():
    """The packed rows' keys, wrapping uint64 arithmetic in the graph, equal splitmix64
    computed with Python's exact integers, at the edges of the block hashes' range too; and
    the held-out share of one block of 200,000 rows is the fraction asked for."""
    rng = np.random.default_rng(7)
    blocks = np.concatenate([[0, 1, (1 << 62) - 1], rng.integers(0, 1 << 62, 200)])
    places = np.concatenate([[0, 1023, 0], rng.integers(0, 1 << 20, 200)])
    keys = mixed_row_keys(tf.constant(blocks, tf.int64), tf.constant(places, tf.int64))
    assert keys.dtype == tf.uint64
    assert [int(k) for k in keys.numpy()] == [
        splitmix64_finaliser(int(b), int(p)) for b, p in zip(blocks, places)]
    held = Holdout(0.1, validation=True).keeps_packed_rows(
        tf.constant([b"one block"]), tf.constant([200_000], tf.int64)).numpy()
    assert held.shape == (200_000,) and 0.098 < held.mean() < 0.102, held.mean()


@pytest.mark.slow
def test_the_eval_splits_rows_cannot_change_the_trained_model(taxi_examples, tmp_path):
    """Two runs with the same train split and seed, one with the eval split's labels turned
    over (a big tipper tips nothing, any other tips the whole fare): the weights come out
    the same to the last bit. Chosen on those eval rows, the second run's early stop would
    have kept its earliest, least trained weights."""
    flipped = tmp_path / "flipped"
    shutil.copytree(taxi_examples, flipped)
    shutil.rmtree(flipped / "Split-eval")

    def turn_over(example: tf.train.Example) -> bool:
        features = example.features.feature
        fare, tips = features["fare"].float_list.value, features["tips"].float_list.value
        if not fare or not tips:
            return False
        features["tips"].float_list.value[:] = [0.0 if tips[0] > 0.2 * fare[0] else fare[0]]
        return True

    records_with(os.path.join(taxi_examples, "Split-eval"), flipped / "Split-eval", turn_over)
    settings = {**taxi.TRAINER_SETTINGS, "batch_size": 64, "early_stopping_min_steps": 20}
    weights, reports = [], []
    for examples, out in ((taxi_examples, tmp_path / "a"), (str(flipped), tmp_path / "b")):
        args = fn_args(examples, out, train_steps=150, eval_steps=4, custom_config=settings)
        # tf.data's parallel stages hand batches over in any order unless told not to; the
        # switch is the process's, so it is turned off again (no public call does that).
        tf.config.experimental.enable_op_determinism()
        try:
            module.run_fn(args)
        finally:
            framework_config.disable_op_determinism()
        saved = os.path.join(args.serving_model_dir, "variables", "variables")
        reader = tf.train.load_checkpoint(saved)
        weights.append({name: reader.get_tensor(name)
                        for name, _ in tf.train.list_variables(saved)
                        if name.startswith("layer_with_weights")})
        reports.append(fit.load_report(args.model_run_dir))
    assert sorted(weights[0]) == sorted(weights[1]) and len(weights[0]) > 4
    for name, value in weights[0].items():
        np.testing.assert_array_equal(value, weights[1][name], err_msg=name)
    assert reports[0]["early_stopping"] == reports[1]["early_stopping"]
    validation = reports[0]["validation"]
    assert validation["eval_split_read"] is False and validation["fraction"] == 0.1
    assert validation["hashed"] == "record" and validation["split"] is None
    train_rows = len(trip_ids(resolve_files(os.path.join(taxi_examples, "Split-train", "*")),
                              schema_file.load_schema(taxi_examples)))
    held_out = train_rows - validation["rows_trained"]
    assert 0.07 < held_out / train_rows < 0.13
    assert 0 < validation["rows_choosing_weights"] <= held_out


def test_a_validation_split_of_the_examples_own_is_used_when_they_have_one(taxi_examples,
                                                                             tmp_path):
    """With a Split-validation beside the train split, its rows choose the weights and every
    train row trains; with validation_split "" the train split's tenth is held out instead;
    the eval split is refused as the validation split."""
    examples = tmp_path / "examples"
    shutil.copytree(taxi_examples, examples)
    records_with(os.path.join(taxi_examples, "Split-eval"), examples / "Split-validation",
                 lambda example: True)
    args = fn_args(str(examples), tmp_path, train_steps=30, eval_steps=100,
                   custom_config={**taxi.TRAINER_SETTINGS, "batch_size": 64})
    options = TrainerOptions.from_custom_config(args.custom_config)
    named = module.resolve_validation(args, options)
    assert named.split == "validation" and named.holdout is None
    assert resolve_files(list(named.files)) == [str(examples / "Split-validation" /
                                                    "data.tfrecord")]
    hashed = module.resolve_validation(args, TrainerOptions.from_custom_config(
        {**args.custom_config, "validation_split": ""}))
    assert hashed.holdout == Holdout(0.1, validation=True) and hashed.split is None
    with pytest.raises(ValueError, match="validation_split='eval' is the split the Evaluator"):
        module.resolve_validation(args, TrainerOptions.from_custom_config(
            {**args.custom_config, "validation_split": "eval"}))

    module.run_fn(args)
    validation = fit.load_report(args.model_run_dir)["validation"]
    schema = schema_file.load_schema(taxi_examples)
    assert validation["split"] == "validation" and validation["fraction"] is None
    assert validation["rows_trained"] == len(trip_ids(
        resolve_files(os.path.join(taxi_examples, "Split-train", "*")), schema))
    assert validation["rows_choosing_weights"] == len(trip_ids(
        resolve_files(str(examples / "Split-validation" / "*")), schema))
    assert validation["eval_split_read"] is False


def model_rows(files, schema, feature_keys, holdout=None) -> list[tuple]:
    """Each row read, as the tuple of the model's features."""
    data = build_dataset(files, schema, None, feature_keys=feature_keys, holdout=holdout,
                         config=InputConfig(batch_size=500, training=False, num_epochs=1))
    return [tuple(row) for batch in data for row in zip(
        *(np.asarray(batch[k]).ravel().tolist() for k in feature_keys))]


@pytest.mark.slow
def test_a_small_train_split_is_fitted_again_on_every_train_row_never_an_eval_row(
        taxi_examples, tmp_path, monkeypatch):
    """Below refit_below_rows the validation rows choose the training length, then a new model
    trains on every train row for that many passes: the first fit reads the training side
    only, the refit every train row, the held-out tenth included, and neither a row of the
    eval split. Each fit's rows are taken from the batches it trained on."""
    fits: list[list[tuple]] = []
    train = fit.train

    def recorded(*args, **kwargs):
        rows: list[tuple] = []
        fits.append(rows)

        def seen(step, batch):
            features = batch[0]
            rows.extend(zip(*(np.asarray(features[k]).ravel().tolist() for k in keys)))
        return train(*args, on_batch=seen, **kwargs)

    monkeypatch.setattr(fit, "train", recorded)
    settings = {**taxi.TRAINER_SETTINGS, "batch_size": 64, "early_stopping_min_steps": 20}
    args = fn_args(taxi_examples, tmp_path, train_steps=200, eval_steps=4,
                   custom_config=settings)
    options = TrainerOptions.from_custom_config(settings)
    schema = schema_file.load_schema(taxi_examples)
    keys = module.model_feature_keys(schema, options.label_key, options.excluded(), {},
                                     options.label_inputs)
    files = resolve_files(os.path.join(taxi_examples, "Split-train", "*"))
    every = model_rows(files, schema, keys)
    held_out = set(model_rows(files, schema, keys, Holdout(0.1, validation=True)))
    trained = set(model_rows(files, schema, keys, Holdout(0.1, validation=False)))
    eval_only = set(model_rows(resolve_files(os.path.join(taxi_examples, "Split-eval", "*")),
                               schema, keys)) - set(every)
    held_out_only = held_out - trained
    assert len(every) < options.refit_below_rows and held_out_only and eval_only

    module.run_fn(args)
    report = fit.load_report(args.model_run_dir)
    assert len(fits) == 2
    first, refit = (set(rows) for rows in fits)
    assert first <= trained and first.isdisjoint(held_out_only)
    # At least one whole pass (the chosen step is at least one), and every train row in it.
    assert report["refit"]["steps"] >= -(-len(every) // 64)
    assert refit == set(every) and held_out_only <= refit
    assert first.isdisjoint(eval_only) and refit.isdisjoint(eval_only)
    assert len(fits[1]) <= report["refit"]["steps"] * 64
    validation = report["validation"]
    assert validation["refit_rows"] == len(every) == report["refit"]["rows"]
    assert validation["rows_trained"] == len(every) - len(
        model_rows(files, schema, keys, Holdout(0.1, validation=True)))
    assert validation["eval_split_read"] is False
    best = report["early_stopping"]["best_step"]
    one_pass = -(-validation["rows_trained"] // 64)
    assert report["refit"]["steps"] == round(best * -(-len(every) // 64) / one_pass)

    # Off (refit_below_rows 0), or a train split at the threshold: one fit, the chosen one.
    fits.clear()
    for threshold in (0, len(every)):
        off = fn_args(taxi_examples, tmp_path / f"off{threshold}", train_steps=200,
                      eval_steps=4, custom_config={**settings, "refit_below_rows": threshold})
        module.run_fn(off)
        assert fit.load_report(off.model_run_dir)["refit"] is None
        assert fit.load_report(off.model_run_dir)["validation"]["refit_rows"] is None
    assert len(fits) == 2


def test_the_run_summary_says_when_every_train_row_trained_again():
    from pipeline.run_summary import trainer_line

    rows = {"rows_trained": 700, "rows_choosing_weights": 80, "fraction": 0.1,
            "hashed": "record", "eval_split_read": False}
    assert trainer_line(dict(rows, refit_rows=780, refit_steps=1_200)) == (
        "Trainer: 700 rows trained; 80 validation rows chose the training length (10% of the "
        "train split, held out by a hash of each record); then all 780 train rows trained the "
        "exported model for 1,200 steps; eval split untouched")
    assert trainer_line(dict(rows, refit_rows=None)) == (
        "Trainer: 700 rows trained; 80 validation rows chose the weights (10% of the train "
        "split, held out by a hash of each record); eval split untouched")
