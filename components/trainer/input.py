"""The training input function: TFRecord shards of tf.Example -> (features, label) batches.

It reads top to bottom as one tf.data chain, the order the tf.data performance guide gives:
list files, interleave readers, shuffle, batch, parse the whole batch at once, densify,
split off the label, cache, repeat, prefetch. The feature spec comes from the schema, so
no one hand-writes it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional, Sequence, Union

import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2

from components import codec

AUTOTUNE = tf.data.AUTOTUNE
LabelFn = Callable[[Mapping[str, tf.Tensor]], tf.Tensor]


@dataclasses.dataclass
class InputConfig:
    """Every knob of the input chain. The defaults are the fast path."""

    batch_size: int = 256
    training: bool = True
    shuffle_buffer: int = 10_000
    seed: Optional[int] = 42
    # "none", "memory" or a file path prefix; placed after parsing so later epochs skip it.
    cache: str = "none"
    # None repeats forever (Keras counts steps); an int gives that many epochs.
    num_epochs: Optional[int] = None
    # "auto" sniffs the gzip magic of the first file.
    compression: str = "auto"
    cycle_length: Optional[int] = None  # None lets AUTOTUNE choose the reader parallelism.
    reader_buffer_bytes: int = 8 << 20
    skip_corrupt: bool = False
    drop_remainder: bool = False
    # 0 keeps TF's global pool; a private pool isolates input work from the model's ops.
    private_threadpool_size: int = 0
    ram_budget_bytes: Optional[int] = None


def resolve_files(file_patterns: Union[str, Sequence[str]]) -> list[str]:
    """Expands patterns (local or any tf.io.gfile filesystem) to a sorted file list."""
    patterns = [file_patterns] if isinstance(file_patterns, str) else list(file_patterns)
    files: list[str] = []
    for pattern in patterns:
        matched = tf.io.gfile.glob(pattern)
        if not matched and tf.io.gfile.isdir(pattern):
            matched = [f for f in tf.io.gfile.glob(pattern.rstrip("/") + "/*")
                       if not tf.io.gfile.isdir(f)]
        files.extend(matched)
    if not files:
        raise FileNotFoundError(f"No TFRecord files match {patterns}")
    return sorted(files)


def detect_compression(path: str) -> str:
    """'GZIP' when the file starts with the gzip magic bytes, else '' (uncompressed)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        return "GZIP" if f.read(2) == b"\x1f\x8b" else ""


def _compression_type(files: Sequence[str], compression: str) -> str:
    if compression == "auto":
        return detect_compression(files[0])
    return {"gzip": "GZIP", "none": "", "": ""}[compression.lower()]


def _dataset_options(config: InputConfig) -> tf.data.Options:
    options = tf.data.Options()
    options.autotune.enabled = True
    if config.ram_budget_bytes:
        options.autotune.ram_budget = config.ram_budget_bytes
    # Training order need not be reproducible element by element; letting the
    # interleave and map emit whatever is ready first removes head-of-line stalls.
    options.deterministic = not config.training
    options.experimental_optimization.map_parallelization = True
    options.experimental_optimization.parallel_batch = True
    options.threading.private_threadpool_size = config.private_threadpool_size
    return options


def build_dataset(
    file_patterns: Union[str, Sequence[str]],
    schema: schema_pb2.Schema,
    label_key: Optional[str],
    *,
    feature_keys: Optional[Sequence[str]] = None,
    label_fn: Optional[LabelFn] = None,
    label_inputs: Sequence[str] = (),
    config: Optional[InputConfig] = None,
    input_context: Optional[tf.distribute.InputContext] = None,
) -> tf.data.Dataset:
    """Builds batches of `(features, label)` from tf.Example shards.

    Args:
      file_patterns: glob(s) of TFRecord files, gzip or plain.
      schema: the tensorflow_metadata Schema stored beside the data; it gives the feature spec
        and the default used for absent values.
      label_key: the feature used as label, or None to yield features only.
      feature_keys: the features to keep; by default every schema feature but the label.
      label_fn: computes the label from the parsed features instead of reading `label_key`
        (e.g. "tip > 20 % of fare").
      label_inputs: features parsed only so that `label_fn` can read them.
      config: the knobs; see `InputConfig`.
      input_context: under `distribute_datasets_from_function`, each input pipeline reads
        its own share of the files.
    """
    config = config or InputConfig()
    files = resolve_files(file_patterns)
    if input_context and input_context.num_input_pipelines > 1:
        files = files[input_context.input_pipeline_id::input_context.num_input_pipelines]
    compression = _compression_type(files, config.compression)
    feature_spec = codec.feature_spec_from_schema(schema)
    keep = list(feature_keys) if feature_keys is not None else [
        k for k in feature_spec if k != label_key]
    needed = set(keep) | set(label_inputs) | ({label_key} if label_key else set())
    feature_spec = {k: v for k, v in feature_spec.items() if k in needed}
    features_by_name = codec.feature_by_name(schema)

    def read_file(path: tf.Tensor) -> tf.data.Dataset:
        records = tf.data.TFRecordDataset(
            path, compression_type=compression, buffer_size=config.reader_buffer_bytes)
        if config.skip_corrupt:
            records = records.ignore_errors(log_warning=True)
        return records

    def parse(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        return tf.io.parse_example(serialized, feature_spec)

    def densify(parsed: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {name: codec.densify(value, features_by_name[name])
                for name, value in parsed.items()}

    def split_label(features: dict[str, tf.Tensor]):
        kept = {k: features[k] for k in keep}
        if label_fn is not None:
            return kept, label_fn(features)
        if label_key is not None:
            return kept, features[label_key]
        return kept

    dataset = (
        tf.data.Dataset.from_tensor_slices(files)
        .shuffle(len(files), seed=config.seed, reshuffle_each_iteration=True)
        if config.training else tf.data.Dataset.from_tensor_slices(files)
    )
    dataset = dataset.interleave(
        read_file,
        cycle_length=config.cycle_length or AUTOTUNE,
        num_parallel_calls=AUTOTUNE,
        deterministic=not config.training,
    )
    if config.training:
        dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed,
                                  reshuffle_each_iteration=True)
    dataset = (
        dataset.batch(config.batch_size, drop_remainder=config.drop_remainder)
        .map(parse, num_parallel_calls=AUTOTUNE, deterministic=not config.training)
        .map(densify, num_parallel_calls=AUTOTUNE, deterministic=not config.training)
        .map(split_label, num_parallel_calls=AUTOTUNE, deterministic=not config.training)
    )
    if config.cache == "memory":
        dataset = dataset.cache()
    elif config.cache and config.cache != "none":
        dataset = dataset.cache(config.cache)
    return (
        dataset.repeat(config.num_epochs)
        .prefetch(AUTOTUNE)
        .with_options(_dataset_options(config))
    )
