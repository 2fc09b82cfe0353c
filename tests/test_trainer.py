"""The Trainer's input function, distribution path, training loop and input report, on real
shards written by our ExampleGen and by stock CsvExampleGen."""
from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2
from tfx.components.trainer.fn_args_utils import FnArgs

from components.transform import taxi
from tfrecord_shards import tfrecord_io
from tfrecord_shards.codec import schema_file
from components.trainer import distribute, export, fit, models, module
from components.trainer.corruption import corrupt_files_named
from components.trainer.input import build_dataset, resolve_files
from components.trainer.options import ImageSpec, InputConfig

HAND_SCHEMA = """
feature { name: "fare" type: FLOAT value_count { min: 1 max: 1 } presence { min_fraction: 0.5 } }
feature { name: "trips" type: INT value_count { min: 1 max: 1 } }
feature { name: "company" type: BYTES value_count { min: 1 max: 1 } }
feature { name: "tags" type: BYTES }
"""


def example(**features) -> bytes:
    def feature(value):
        if isinstance(value, float) or value == []:
            return tf.train.Feature(float_list=tf.train.FloatList(value=[value] if value else []))
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        values = value if isinstance(value, list) else [value]
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    return tf.train.Example(features=tf.train.Features(
        feature={k: feature(v) for k, v in features.items()})).SerializeToString()


HAND_ROWS = [
    example(fare=10.5, trips=2, company=b"Acme", tags=[b"a", b"b"]),
    example(fare=3.25, company=b"Zed"),  # trips and tags missing
    example(fare=[], trips=7, tags=[b"c"]),  # fare null (empty list), company missing
]


def write_records(path, records, compression=""):
    with tf.io.TFRecordWriter(str(path), options=compression or None) as writer:
        for record in records:
            writer.write(record)
    return str(path)


def fn_args(examples: str, tmp_path, schema_path=None, **kwargs) -> FnArgs:
    return FnArgs(
        train_files=[os.path.join(examples, "Split-train", "*")],
        eval_files=[os.path.join(examples, "Split-eval", "*")],
        schema_path=schema_path or os.path.join(examples, "schema.pbtxt"),
        model_run_dir=str(tmp_path / "model_run"), serving_model_dir=str(tmp_path / "serving"),
        **kwargs)


def rows_of(dataset) -> list:
    return [v for features, _ in dataset for v in features["fare"].numpy().ravel().tolist()]


# --- the chain: values, defaults, compression --------------------------------------------
@pytest.mark.parametrize("compression", ["", "GZIP"])
def test_dataset_matches_hand_checked_sample(tmp_path, compression):
    schema = text_format.Parse(HAND_SCHEMA, schema_pb2.Schema())
    path = write_records(tmp_path / "hand.tfrecord", HAND_ROWS, compression)
    assert tfrecord_io.is_gzip(path) == (compression == "GZIP")
    dataset = build_dataset(path, schema, "trips",
                            config=InputConfig(batch_size=3, training=False, num_epochs=1))
    batches = list(dataset)
    assert len(batches) == 1
    features, label = batches[0]
    assert sorted(features) == ["company", "fare", "tags"]
    assert features["fare"].dtype == tf.float32 and features["fare"].shape == (3, 1)
    np.testing.assert_array_equal(features["fare"].numpy(), [[10.5], [3.25], [0.0]])
    assert features["company"].numpy().tolist() == [[b"Acme"], [b"Zed"], [b""]]
    assert isinstance(features["tags"], tf.RaggedTensor)
    assert features["tags"].to_list() == [[b"a", b"b"], [], [b"c"]]
    assert label.dtype == tf.int64
    assert label.numpy().tolist() == [[2], [0], [7]]  # the missing count got the default 0


def test_unknown_feature_is_named(tmp_path):
    schema = text_format.Parse(HAND_SCHEMA, schema_pb2.Schema())
    path = write_records(tmp_path / "hand.tfrecord", HAND_ROWS)
    with pytest.raises(KeyError, match="tips"):
        build_dataset(path, schema, "tips")


@pytest.mark.slow
def test_reads_our_gzip_shards_and_stock_csv_example_gen_output(taxi_examples,
                                                                stock_taxi_examples):
    ours = schema_file.load_schema(taxi_examples)
    stock_dir, stock_schema_path = stock_taxi_examples
    stock = schema_file.load_schema(stock_schema_path)
    config = InputConfig(batch_size=500, training=False, num_epochs=1)
    for folder, schema in ((taxi_examples, ours), (stock_dir, stock)):
        files = resolve_files(os.path.join(folder, "Split-eval", "*"))
        assert tfrecord_io.is_gzip(files[0])
        features, label = next(iter(build_dataset(files, schema, "tips", config=config)))
        assert features["fare"].shape[1] == 1 and features["company"].dtype == tf.string
        assert label.shape == (features["fare"].shape[0], 1)
    # Both read the whole slice: the splits of each add up to the 2,000 source rows.
    for folder, schema in ((taxi_examples, ours), (stock_dir, stock)):
        total = sum(int(label.shape[0]) for split in ("train", "eval")
                    for _, label in build_dataset(os.path.join(folder, f"Split-{split}", "*"),
                                                  schema, "tips", config=config))
        assert total == 2000


@pytest.mark.parametrize("cache", ["none", "memory", "file"])
def test_cache_modes_give_every_row_each_epoch(taxi_examples, tmp_path, cache):
    schema = schema_file.load_schema(taxi_examples)
    files = os.path.join(taxi_examples, "Split-train", "*")
    where = str(tmp_path / "cache" / "train") if cache == "file" else cache
    if cache == "file":
        os.makedirs(tmp_path / "cache")
    one_epoch = rows_of(build_dataset(files, schema, "tips", config=InputConfig(
        batch_size=128, training=False, num_epochs=1)))
    two_epochs = rows_of(build_dataset(files, schema, "tips", config=InputConfig(
        batch_size=128, training=True, num_epochs=2, cache=where)))
    assert len(two_epochs) == 2 * len(one_epoch)
    first, second = two_epochs[:len(one_epoch)], two_epochs[len(one_epoch):]
    assert sorted(first) == sorted(one_epoch) == sorted(second)
    assert first != one_epoch  # training mode shuffled
    if cache == "file":
        assert glob.glob(where + "*.index"), "the file cache wrote nothing"


# --- corrupt shards ------------------------------------------------------------------------
@pytest.fixture
def corrupt_shard(taxi_examples, tmp_path):
    """An uncompressed copy of the eval split with one flipped byte in the 10th record."""
    schema = schema_file.load_schema(taxi_examples)
    records = [r.numpy() for r in tf.data.TFRecordDataset(
        resolve_files(os.path.join(taxi_examples, "Split-eval", "*")), "GZIP")]
    path = write_records(tmp_path / "shard-00000", records)
    offsets = [o for o, _ in tfrecord_io.iter_records(path)]
    data = bytearray(open(path, "rb").read())
    data[offsets[9] + 20] ^= 0xFF
    open(path, "wb").write(bytes(data))
    return path, schema, len(records), offsets[9]


def test_corrupt_shard_error_names_file_and_offset(corrupt_shard):
    path, schema, _, offset = corrupt_shard
    dataset = build_dataset(path, schema, "tips", config=InputConfig(training=False))
    with pytest.raises(tfrecord_io.CorruptRecordError) as error:
        with corrupt_files_named([path]):
            for _ in dataset.take(100):
                pass
    assert error.value.path == path and error.value.offset == offset
    assert path in str(error.value) and f"offset {offset}" in str(error.value)


def test_skip_corrupt_skips_only_the_bad_record_and_logs_it(corrupt_shard, caplog):
    path, schema, total, offset = corrupt_shard
    config = InputConfig(batch_size=64, training=False, num_epochs=1, skip_corrupt=True)
    with caplog.at_level("WARNING"):
        dataset = build_dataset(path, schema, "tips", config=config)
    assert sum(int(label.shape[0]) for _, label in dataset) == total - 1
    assert f"offset {offset} of {path}" in caplog.text
    assert "1 corrupt region(s) skipped in 1 of 1 file(s)" in caplog.text


# --- images --------------------------------------------------------------------------------
def test_image_examples_decode_in_the_input_chain(digits_examples):
    from sklearn.datasets import load_digits

    schema = schema_file.load_schema(digits_examples)
    for dtype in ("uint8", "float32"):
        config = InputConfig(batch_size=32, training=False, num_epochs=1,
                             image_specs={"image": ImageSpec(8, 8, 1, dtype)})
        features, label = next(iter(build_dataset(
            os.path.join(digits_examples, "Split-*", "*"), schema, "label",
            feature_keys=["image"], config=config)))
        image = features["image"]
        assert image.shape == (32, 8, 8, 1) and image.dtype == getattr(tf, dtype)
        assert label.shape == (32, 1)
        pixels = image.numpy().astype(np.float64) * (255 if dtype == "float32" else 1)
        # Every decoded image is one of the source digits, to PNG rounding.
        digits = np.round(load_digits().images * (255 / 16))
        first = pixels[0, :, :, 0]
        assert np.abs(digits - first).reshape(len(digits), -1).max(axis=1).min() <= 1


# --- distribution on CPU -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mirrored", [False, True])
def test_distributed_input_and_training_on_cpu(taxi_examples, tmp_path, mirrored):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"]) if mirrored else \
        distribute.make_strategy()
    schema = schema_file.load_schema(taxi_examples)
    keys = module.model_feature_keys(schema, taxi.TAXI_LABEL, taxi.TAXI_EXCLUDED, {})

    def dataset_fn(context):
        return build_dataset(os.path.join(taxi_examples, "Split-train", "*"), schema, None,
                             feature_keys=keys, label_fn=taxi.taxi_label,
                             label_inputs=("tips", "fare"), input_context=context,
                             config=InputConfig(batch_size=context.get_per_replica_batch_size(64)))
    data = distribute.distribute(strategy, dataset_fn)
    features, label = next(iter(data))
    assert strategy.experimental_local_results(label)[0].shape == (64, 1)
    with strategy.scope():
        statistics = models.DataStatistics.of(
            dataset_fn(tf.distribute.InputContext()).take(2), models.numeric_keys(schema, keys))
        model = models.build_tabular_model(schema, keys, statistics, models.Head("binary"))
    result = fit.train(model, strategy, data, steps=6, steps_per_epoch=3,
                       log_dir=str(tmp_path), global_batch_size=64)
    assert [e.steps for e in result.epochs] == [3, 3]
    assert all(np.isfinite(e.metrics["loss"]) for e in result.epochs)


@pytest.mark.slow
def test_numbers_enter_the_tabular_model_through_a_periodic_embedding_too(taxi_examples):
    """Each scaled number of the taxi slice reaches the first hidden layer as itself and as
    a ReLU layer over sines and cosines of it at trained frequencies, one set per number;
    periodic_frequencies=0 leaves the numbers alone."""
    from components.trainer import layers
    from components.trainer.options import TrainerOptions

    schema = schema_file.load_schema(taxi_examples)
    keys = module.model_feature_keys(schema, taxi.TAXI_LABEL, taxi.TAXI_EXCLUDED, {})
    numbers = models.numeric_keys(schema, keys)
    data = build_dataset(os.path.join(taxi_examples, "Split-train", "*"), schema, None,
                         feature_keys=keys, label_fn=taxi.taxi_label,
                         label_inputs=("tips", "fare"), config=InputConfig(batch_size=64))
    statistics = models.DataStatistics.of(data.take(2), numbers)
    options = TrainerOptions()
    model = models.build_tabular_model(schema, keys, statistics, models.Head("binary"),
                                       models.Periodic.of(options))
    (frequencies,) = model.get_layer(layers.FREQUENCIES_LAYER).trainable_weights
    assert tuple(frequencies.shape) == (len(numbers), options.periodic_frequencies)
    assert np.std(frequencies.numpy()) < 3 * options.periodic_sigma
    features, _ = next(iter(data))
    before = frequencies.numpy().copy()
    model.fit(data.take(5), verbose=0)
    assert not np.allclose(frequencies.numpy(), before)  # the frequencies train
    assert np.all(np.isfinite(model.predict(features, verbose=0)))
    plain = models.build_tabular_model(schema, keys, statistics, models.Head("binary"),
                                       models.Periodic(frequencies=0))
    assert layers.FREQUENCIES_LAYER not in [l.name for l in plain.layers]


def test_a_warm_start_from_a_model_without_the_periodic_layers_is_refused_in_one_line(
        taxi_examples, tmp_path):
    """A production model trained before the periodic embedding (or with it off) has the same
    features but fewer layers: warm-starting the new model from it says so, by name."""
    import json

    from components.trainer import layers

    schema = schema_file.load_schema(taxi_examples)
    keys = module.model_feature_keys(schema, taxi.TAXI_LABEL, taxi.TAXI_EXCLUDED, {})
    data = build_dataset(os.path.join(taxi_examples, "Split-train", "*"), schema, None,
                         feature_keys=keys, label_fn=taxi.taxi_label,
                         label_inputs=("tips", "fare"), config=InputConfig(batch_size=64))
    statistics = models.DataStatistics.of(data.take(1), models.numeric_keys(schema, keys))
    old = models.build_tabular_model(schema, keys, statistics, models.Head("binary"),
                                     models.Periodic(frequencies=0))
    base = str(tmp_path / "production")
    old.save(base, save_format="tf", save_traces=False)
    os.makedirs(os.path.join(base, "assets.extra"), exist_ok=True)
    with open(os.path.join(base, export.MODEL_INPUTS_FILE), "w") as f:
        json.dump({"features": sorted(old.input)}, f)
    new = models.build_tabular_model(schema, keys, statistics, models.Head("binary"))
    assert layers.FREQUENCIES_LAYER in [l.name for l in new.layers]
    with pytest.raises(ValueError, match="has other layers than this Trainer builds"):
        export.warm_start(new, base, keys)
    same = models.build_tabular_model(schema, keys, statistics, models.Head("binary"),
                                      models.Periodic(frequencies=0))
    export.warm_start(same, base, keys)  # the same layers: the weights load
    assert all(np.array_equal(a, b) for a, b in zip(same.get_weights(), old.get_weights()))


def test_a_small_tables_patience_lasts_early_stopping_min_steps(taxi_examples, tmp_path):
    """The taxi slice's training rows are a handful of batches of 256: five passes without a
    better eval loss would be a few dozen noisy steps, so the patience is counted up to
    early_stopping_min_steps; at batch 8 a reporting window (100 steps) is shorter than a
    pass and the patience stays 5 windows."""
    from components.trainer.input import split_rows
    from components.trainer.options import TrainerOptions

    args = fn_args(taxi_examples, tmp_path, train_steps=1000, eval_steps=5)
    rows = split_rows(args.train_files)
    rows -= round(rows * 0.1)  # the validation rows held out of the train split
    options = TrainerOptions.from_custom_config(dict(taxi.TRAINER_SETTINGS))
    budget = module.training_budget(args, options)
    one_pass = -(-rows // 256)
    assert budget.steps_per_epoch == one_pass < 20
    assert budget.patience == -(-options.early_stopping_min_steps // one_pass) > \
        options.early_stopping_patience
    small_batches = module.training_budget(args, TrainerOptions.from_custom_config(
        {**taxi.TRAINER_SETTINGS, "batch_size": 8}))
    assert small_batches.steps_per_epoch == 100 and small_batches.patience == 5
    never = module.training_budget(args, TrainerOptions.from_custom_config(
        {**taxi.TRAINER_SETTINGS, "early_stopping_patience": 0}))
    assert never.patience == 0


def test_a_small_table_trains_in_smaller_batches():
    """Below small_table_rows train rows the batch is at most small_table_batch_size (a
    smaller one set stays); a larger split, one of unknown size, images, or 0: as set."""
    from components.trainer.options import TrainerOptions

    default = TrainerOptions()
    assert default.input.batch_size == 256
    assert default.for_train_rows(500).input.batch_size == default.small_table_batch_size == 64
    assert default.for_train_rows(default.small_table_rows).input.batch_size == 256
    assert default.for_train_rows(None).input.batch_size == 256
    assert TrainerOptions.from_custom_config({"batch_size": 32}).for_train_rows(
        500).input.batch_size == 32
    assert TrainerOptions.from_custom_config({"small_table_rows": 0}).for_train_rows(
        500).input.batch_size == 256
    assert TrainerOptions.from_custom_config({"images": {"image": [8, 8, 1]}}).for_train_rows(
        500).input.batch_size == 256


def test_validation_batches_are_scored_in_few_large_calls(taxi_examples, tmp_path):
    """The validation rows the early stop and the final score read (eval_steps training
    batches, at most a pass over the tenth of the train split held out) are taken in calls of
    at most 16 batches, as many rows."""
    from components.trainer.input import split_rows
    from components.trainer.options import TrainerOptions

    options = TrainerOptions.from_custom_config({**taxi.TRAINER_SETTINGS, "batch_size": 16})
    validation_rows = round(split_rows(fn_args(taxi_examples, tmp_path).train_files) * 0.1)
    for eval_steps in (1, 2, 3, 16, 17, 40):
        budget = module.training_budget(
            fn_args(taxi_examples, tmp_path, train_steps=1000, eval_steps=eval_steps), options)
        wanted = min(eval_steps, -(-validation_rows // options.input.batch_size))
        assert budget.validation_batches_per_step <= module.VALIDATION_BATCHES_PER_STEP
        assert budget.validation_steps == -(-wanted // module.VALIDATION_BATCHES_PER_STEP)
        scored = budget.validation_steps * budget.validation_batches_per_step
        assert wanted <= scored < wanted + budget.validation_steps


def taxi_training_input(taxi_examples: str, tmp_path):
    """(FnArgs, TrainingInput) of the taxi examples at batch 64, as run_fn makes them."""
    from components.trainer.options import TrainerOptions

    options = TrainerOptions.from_custom_config({**taxi.TRAINER_SETTINGS, "batch_size": 64})
    schema = schema_file.load_schema(taxi_examples)
    keys = module.model_feature_keys(schema, taxi.TAXI_LABEL, taxi.TAXI_EXCLUDED, {},
                                     options.label_inputs)
    args = fn_args(taxi_examples, tmp_path)
    return args, module.TrainingInput(options, schema, keys, module._label_fn(options, schema),
                                      {}, resolve_files(args.train_files))


def test_every_early_stop_check_scores_the_same_eval_rows(taxi_examples, tmp_path):
    """The eval reader repeats its first `eval_steps` calls, not the split: each check's loss
    then differs by the model alone. Without that, the taxi sample's checks took consecutive
    windows of the split and compared losses on different rows."""
    args, inputs = taxi_training_input(taxi_examples, tmp_path)

    def miles(fixed_steps: int, calls: int) -> list:
        data = inputs.dataset_fn(args.eval_files, False, 2, fixed_steps)(
            tf.distribute.InputContext())
        return [features["trip_miles"].numpy().ravel().tolist()
                for features, _ in data.take(calls)]

    first, again = miles(3, 3), miles(3, 9)
    assert all(len(batch) == 128 for batch in first)
    assert again == first * 3
    assert miles(0, 6)[3:] != first  # the split read on: rows after the first three calls


def test_the_run_evaluation_is_the_check_that_chose_the_kept_weights(taxi_examples, tmp_path):
    """With early stopping on eval rows that repeat, the kept weights were scored on those
    rows by the check that chose them: the run reports that check and reads no rows again,
    and its figures are what a fresh pass over the rows gives the restored model."""
    args, inputs = taxi_training_input(taxi_examples, tmp_path)
    strategy = distribute.make_strategy()
    model = models.build_tabular_model(inputs.schema, inputs.feature_keys,
                                       inputs.statistics(args.train_files),
                                       models.Head("binary"))
    eval_rows = inputs.dataset_fn(args.eval_files, False, 1, 3)
    pulled = tf.Variable(0, dtype=tf.int64)

    def counted(features, label):
        pulled.assign_add(1)
        return features, label

    result = fit.train(
        model, strategy, distribute.distribute(strategy, inputs.dataset_fn(args.train_files,
                                                                           True)),
        steps=8, steps_per_epoch=2, log_dir=str(tmp_path), global_batch_size=64,
        validation_data=eval_rows(tf.distribute.InputContext()).map(counted),
        validation_steps=3, early_stopping=fit.EarlyStopping(patience=10, validation_steps=3),
        validation_rows_repeat=True)
    # Four checks of 3 calls; tf.data may have fetched one call ahead, not a fifth pass.
    assert len(result.eval_losses) == 4 and 4 * 3 <= int(pulled.numpy()) < 5 * 3
    assert result.evaluation["loss"] == min(result.eval_losses)
    fresh = model.evaluate(eval_rows(tf.distribute.InputContext()), steps=3, verbose=0,
                           return_dict=True)
    for name, value in result.evaluation.items():
        assert value == pytest.approx(fresh[name], rel=1e-5, abs=1e-6), name


# --- run_fn: training, report, serving -----------------------------------------------------
def profiler_band(wait_share: float) -> str:
    """The TensorFlow profiler's input-bound bands, written out here rather than taken from
    the code under test: under 5 % of step time waiting is fine, 20 % or more is input-bound."""
    if wait_share < 0.05:
        return "not input-bound"
    return "moderately input-bound" if wait_share < 0.20 else "highly input-bound"


@pytest.mark.parametrize("share, band", [
    (0.0, "not input-bound"), (0.0499, "not input-bound"), (0.05, "moderately input-bound"),
    (0.1999, "moderately input-bound"), (0.20, "highly input-bound"),
    (1.0, "highly input-bound")])
def test_input_bound_bands_are_the_profilers(share, band):
    assert fit.input_bound_label(share) == band


def check_report(args) -> dict:
    """The report has an epoch per pass over the training rows (or per reporting window, when
    a pass is longer), and the steps of the budget, or fewer when training stopped early."""
    from components.trainer.options import TrainerOptions

    budget = module.training_budget(args, TrainerOptions.from_custom_config(args.custom_config))
    report = fit.load_report(args.model_run_dir)
    assert report is not None
    trained = sum(epoch["steps"] for epoch in report["epochs"])
    stopped = report["early_stopping"]["stopped_at_step"]
    assert trained == (stopped or budget.steps)
    assert len(report["epochs"]) == -(-trained // budget.steps_per_epoch)
    for item in report["epochs"] + [report["overall"]]:
        assert 0.0 <= item["input_wait_share"] <= 1.0
        assert item["label"] == profiler_band(item["input_wait_share"])
    assert report["overall"]["compute_seconds"] > 0
    assert glob.glob(os.path.join(args.model_run_dir, "train", "events.out.tfevents.*"))
    return report


@pytest.mark.slow
def test_taxi_training_reduces_loss_reports_input_wait_and_serves(taxi_examples, taxi_csv,
                                                                  tmp_path):
    args = fn_args(taxi_examples, tmp_path, train_steps=240, eval_steps=5,
                   custom_config={**taxi.TRAINER_SETTINGS, "batch_size": 64, "epochs": 4,
                                  "cache": "memory"})
    module.run_fn(args)
    report = check_report(args)
    losses = [e["metrics"]["loss"] for e in report["epochs"]]
    assert losses[-1] < losses[0], losses
    assert report["evaluation"]["accuracy"] > 0.5

    served = tf.saved_model.load(args.serving_model_dir).signatures["serving_default"]
    scores = served(examples=tf.constant([
        example(fare=12.25, trip_miles=3.1, payment_type=b"Credit Card", trip_start_hour=14),
        example()]))["probability"].numpy()
    assert scores.shape == (2, 1) and np.all((scores >= 0) & (scores <= 1))


def test_trains_on_stock_csv_example_gen_output(stock_taxi_examples, tmp_path):
    examples, schema_path = stock_taxi_examples
    args = fn_args(examples, tmp_path, schema_path=schema_path, train_steps=20, eval_steps=2,
                   custom_config={**taxi.TRAINER_SETTINGS, "batch_size": 32, "epochs": 2})
    module.run_fn(args)
    check_report(args)
    assert os.path.exists(os.path.join(args.serving_model_dir, "saved_model.pb"))


@pytest.mark.slow
def test_digits_cnn_training_reduces_loss_and_serves_png_bytes(digits_examples, tmp_path):
    from tfrecord_shards import example_rows

    args = fn_args(digits_examples, tmp_path, train_steps=150, eval_steps=5,
                   custom_config={"images": {"image": [8, 8, 1]}, "batch_size": 32,
                                  "epochs": 3, "num_classes": 10})
    module.run_fn(args)
    report = check_report(args)
    losses = [e["metrics"]["loss"] for e in report["epochs"]]
    assert losses[-1] < losses[0], losses
    assert report["evaluation"]["accuracy"] > 0.5  # ten classes: chance is 0.1

    row = next(example_rows.iter_rows(os.path.join(digits_examples, "Split-eval"), limit=1))
    served = tf.saved_model.load(args.serving_model_dir).signatures["serving_default"]
    raw = next(iter(tf.data.TFRecordDataset(resolve_files(
        os.path.join(digits_examples, "Split-eval", "*")), "GZIP")))
    probabilities = served(examples=tf.reshape(raw, [1]))["probabilities"].numpy()
    assert probabilities.shape == (1, 10)
    assert abs(probabilities.sum() - 1) < 1e-4
    assert "label" in row


def test_corrupt_training_shard_fails_run_fn_with_the_file_named(corrupt_shard, taxi_examples,
                                                                 tmp_path):
    path, _, _, offset = corrupt_shard
    folder = tmp_path / "examples"
    (folder / "Split-train").mkdir(parents=True)
    (folder / "Split-eval").mkdir()
    os.replace(path, folder / "Split-train" / "shard-00000")
    for shard in glob.glob(os.path.join(taxi_examples, "Split-eval", "*")):
        (folder / "Split-eval" / os.path.basename(shard)).write_bytes(open(shard, "rb").read())
    args = fn_args(str(folder), tmp_path, schema_path=os.path.join(taxi_examples, "schema.pbtxt"),
                   train_steps=100, eval_steps=1,
                   custom_config={**taxi.TRAINER_SETTINGS, "batch_size": 32})
    with pytest.raises(tfrecord_io.CorruptRecordError,
                       match=f"shard-00000: corrupt TFRecord at byte offset {offset}"):
        module.run_fn(args)
    assert not os.path.exists(args.serving_model_dir)


def test_a_number_constant_in_training_is_not_scaled_by_its_zero_variance(taxi_examples):
    """In the taxi slice's first rows a column can be constant (no trip without a tip
    record, a flag never set). Scaled by its training variance of about 0, the first other
    value at serving time would enter the model millions strong: it is scaled by 1 instead,
    and such a row scores like its neighbours, where before it saturated the output."""
    schema = schema_file.load_schema(taxi_examples)
    keys = module.model_feature_keys(schema, taxi.TAXI_LABEL, taxi.TAXI_EXCLUDED, {})
    numbers = models.numeric_keys(schema, keys)
    data = build_dataset(os.path.join(taxi_examples, "Split-train", "*"), schema, None,
                         feature_keys=keys, label_fn=taxi.taxi_label,
                         label_inputs=("tips", "fare"), config=InputConfig(batch_size=64))
    statistics = models.DataStatistics.of(data.take(4), numbers)
    varying = max(numbers, key=lambda k: statistics.features[k].variance)
    constant = models.Moments()
    constant.add(np.zeros(256))  # a flag never set in training
    assert models.scaling_variance(constant) == 1.0
    assert models.scaling_variance(statistics.features[varying]) == \
        statistics.features[varying].variance
    flagged = numbers[0]
    statistics.features[flagged] = constant
    model = models.build_tabular_model(schema, keys, statistics, models.Head("binary"),
                                       models.Periodic(frequencies=0))
    features, _ = next(iter(data))
    features[flagged] = tf.zeros_like(features[flagged])  # as in every training row
    scored = model.predict(features, verbose=0).ravel()
    features[flagged] = tf.ones_like(features[flagged])  # set at serving time
    shifted = model.predict(features, verbose=0).ravel()
    assert np.abs(shifted - scored).max() < 0.2
