"""The training input function: TFRecord shards of tf.Example -> (features, label) batches.

It reads top to bottom as one tf.data chain, the order the tf.data performance guide gives:
list files, interleave readers, shuffle, batch, parse the whole batch at once (densify, decode
images, split off the label), cache, repeat, prefetch. The feature spec comes from the schema,
so no one hand-writes it. What the chain reads and in what sizes is settled before it
(`_ReadingPlan`), as is its parse function (`example_parser`). A global order's reading is in
global_order.py, the tf.data service's stage in data_service.py, damaged files in
corruption.py, and the scaling pass's sample of a large split (read in place of the files) in
sampling.py.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Mapping, Optional, Sequence, Union

import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import fileio, packing, shards, tf_filesystems, tfrecord_io
from tfrecord_shards.packing import graph as packed_graph
from tfrecord_shards.packing.layout import ROWS_KEY
from tfrecord_shards.codec import parser
from shard_readers.images import ImageSpec, decode_images, with_storage_from
from components.trainer.corruption import scan_for_corruption, with_salvaged_records
from components.trainer.data_service import ServedEpochs, on_data_service
from components.trainer.global_order import global_blocks, global_records
from components.trainer.options import GLOBAL_SHUFFLE, InputConfig
from components.trainer.sampling import RecordSample

AUTOTUNE = tf.data.AUTOTUNE
LabelFn = Callable[[Mapping[str, tf.Tensor]], tf.Tensor]
Transform = Callable[[dict], dict]


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


def split_rows(file_patterns) -> Optional[int]:
    """The rows of a split from our manifest beside it (None for stock shards)."""
    patterns = [file_patterns] if isinstance(file_patterns, str) else list(file_patterns)
    total = 0
    for pattern in patterns:
        split_dir = pattern.rstrip("*/").rstrip("/")
        split = fileio.basename(split_dir)
        manifest = shards.read_manifest(fileio.dirname(split_dir)) \
            if split.startswith("Split-") else None
        if not manifest or split[len("Split-"):] not in manifest.get("splits", {}):
            return None
        total += manifest["splits"][split[len("Split-"):]]["rows"]
    return total


def detect_compression(path: str) -> str:
    """'GZIP' when the file starts with the gzip magic bytes, else '' (uncompressed)."""
    return "GZIP" if tfrecord_io.is_gzip(path) else ""


def _compression_type(files: Sequence[str], compression: str) -> str:
    if compression == "auto":
        return detect_compression(files[0])
    return {"gzip": "GZIP", "none": "", "": ""}[compression.lower()]


# ---------------------------------------------------------------------------------------------
# Validation rows held out of a split
# ---------------------------------------------------------------------------------------------
# The hash's resolution: a fraction is held out to 1 part in a million.
HOLDOUT_BUCKETS = 1_000_000


# splitmix64's constants (Steele, Lea and Flood 2014): a row's place in its block is spread
# over the 64 bits and mixed with its block's hash in a few integer ops a row.
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MIX_MULTIPLIERS = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB))
_MIX_LAST_SHIFT = 31


def mixed_row_keys(block_hashes: tf.Tensor, places: tf.Tensor) -> tf.Tensor:
    """A uint64 per row from its block's hash and its place in the block: splitmix64's
    finaliser over `block + (place + 1) * golden gamma`, wrapping as uint64 does."""
    u64 = tf.uint64
    z = tf.bitcast(block_hashes, u64) + \
        (tf.cast(places, u64) + 1) * tf.constant(_GOLDEN_GAMMA, u64)
    for shift, multiplier in _MIX_MULTIPLIERS:
        z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(shift, u64)))
        z = z * tf.constant(multiplier, u64)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(_MIX_LAST_SHIFT, u64)))


@dataclasses.dataclass(frozen=True)
class Holdout:
    """The rows of a split held out of training to choose the weights: those whose stable hash
    falls in the first `fraction` of its buckets. A per-row record hashes its serialized bytes
    (farmhash Fingerprint64, `tf.strings.to_hash_bucket_fast`); a packed record's row mixes
    the block's Fingerprint64 with its place in the block (`mixed_row_keys`), so a table
    packed into one block still holds out a fraction of its rows, not all or none. The same
    rows every run, on every machine, whichever features are read; `validation` picks the
    held-out side, else the rest."""

    fraction: float
    validation: bool

    @property
    def _held_out_buckets(self) -> int:
        return round(self.fraction * HOLDOUT_BUCKETS)

    def _keeps(self, held_out: tf.Tensor) -> tf.Tensor:
        return held_out if self.validation else tf.logical_not(held_out)

    def keeps_record(self, serialized: tf.Tensor) -> tf.Tensor:
        return self._keeps(tf.strings.to_hash_bucket_fast(serialized, HOLDOUT_BUCKETS) <
                           self._held_out_buckets)

    def keeps_packed_rows(self, serialized: tf.Tensor, rows_per_block: tf.Tensor) -> tf.Tensor:
        """For each real row of the blocks `serialized`, in block order, whether it is kept.
        Integer mixing, not a string key per row: joining and hashing a string for each row
        took 0.28 s per 2M rows in one graph call, the mixing 0.02 s."""
        blocks = tf.strings.to_hash_bucket_fast(serialized, 1 << 62)
        places = tf.ragged.range(rows_per_block).flat_values
        buckets = mixed_row_keys(tf.repeat(blocks, rows_per_block), places) % \
            tf.constant(HOLDOUT_BUCKETS, tf.uint64)
        return self._keeps(buckets < tf.constant(self._held_out_buckets, tf.uint64))


def _held_out_records(holdout: Optional[Holdout], packed: bool):
    """Per-row records on `holdout`'s side; packed rows are kept or dropped as they are
    unpacked (`example_parser`)."""
    def apply(records: tf.data.Dataset) -> tf.data.Dataset:
        if holdout is None or packed:
            return records
        return records.filter(holdout.keeps_record)
    return apply


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------
def example_parser(schema: schema_pb2.Schema, feature_names: Sequence[str],
                   images: Mapping[str, ImageSpec] = {}, shuffle_rows: bool = False,
                   shuffle_seed: int = 0, holdout: Optional[Holdout] = None
                   ) -> Callable[[tf.Tensor], dict]:
    """A function from a batch of serialized tf.Examples to model-ready tensors: parsed with
    the schema's spec, gaps filled with the schema default, images decoded (or, stored as raw
    pixels, reshaped). Training and the serving signature both use it, so they cannot drift
    apart.

    When the schema says the data is packed, each Example is a block of rows: the function
    unpacks them (in random order with `shuffle_rows`), so callers see rows either way, and
    with a `holdout` keeps only the rows on its side (per-row records are filtered before
    they are batched, in `build_dataset`)."""
    features_by_name = parser.feature_by_name(schema)
    missing = sorted(set(feature_names) - set(features_by_name))
    if missing:
        raise KeyError(f"features {missing} are not in the schema "
                       f"(it has {sorted(features_by_name)})")
    names = list(dict.fromkeys(feature_names))
    images = with_storage_from(images, schema)
    layout = packing.PackedLayout.from_schema(schema)
    if layout:
        spec = packed_graph.block_spec(layout, names)

        def to_rows(serialized: tf.Tensor) -> dict:
            # The group's own first record seeds its row order: a different order for every
            # group and epoch, and no random state a checkpoint would have to hold.
            seed = tf.stack([tf.constant(shuffle_seed, tf.int64),
                             tf.strings.to_hash_bucket_fast(serialized[0], 1 << 62)])
            parsed = tf.io.parse_example(serialized, spec)
            if holdout is None:
                return packed_graph.unpack(parsed, layout, names,
                                          shuffle_seed=seed if shuffle_rows else None)
            # Rows in block order, so each is known by its block and place, then the kept
            # ones (shuffled) in one more move per feature.
            rows = packed_graph.unpack(parsed, layout, names)
            kept = tf.where(holdout.keeps_packed_rows(
                serialized, parsed[ROWS_KEY][:, 0]))[:, 0]
            if shuffle_rows:
                kept = tf.random.experimental.stateless_shuffle(kept, seed=seed)
            return {name: tf.gather(value, kept) for name, value in rows.items()}
    else:
        spec = {k: v for k, v in parser.feature_spec_from_schema(schema).items() if k in names}

        def to_rows(serialized: tf.Tensor) -> dict:
            return {name: parser.densify(value, features_by_name[name])
                    for name, value in tf.io.parse_example(serialized, spec).items()}

    # Plain graph code (its branches are on names and dtypes, its one tensor branch a
    # tf.cond): left to AutoGraph, converting it and every function it calls took about 2 s
    # of each Trainer run's first input pipeline (taxi, packed).
    @tf.autograph.experimental.do_not_convert
    def parse(serialized: tf.Tensor) -> dict:
        features = to_rows(serialized)
        for name, image in images.items():
            if name in features:
                features[name] = decode_images(features[name], image)
        return features

    return parse


def _dataset_options(config: InputConfig, packed: bool) -> tf.data.Options:
    options = tf.data.Options()
    # A tf.data service client needs the autotuner's model (without it TF warns every second).
    autotune = not packed or bool(config.data_service)
    options.autotune.enabled = autotune if config.autotune is None else config.autotune
    if config.ram_budget_bytes:
        options.autotune.ram_budget = config.ram_budget_bytes
    # Whether elements may come out of order is set on the interleave and the map
    # themselves (not in training, or when pipelines share records). It is not set here as
    # well: on a packed chain that only added a graph rewrite ("make_sloppy") to the start
    # of every iterator.
    if packed:
        # The packed chain is parallel where it pays already: without tf.data's static
        # rewrites an epoch is no slower, and each iterator starts about 10 ms sooner.
        options.experimental_optimization.apply_default_optimizations = False
    else:
        options.experimental_optimization.map_parallelization = True
        options.experimental_optimization.parallel_batch = True
    options.threading.private_threadpool_size = config.private_threadpool_size
    intra_op_threads = 1 if packed else 0
    if config.intra_op_threads is not None:
        intra_op_threads = config.intra_op_threads
    if intra_op_threads:  # 0: TF's default
        options.threading.max_intra_op_parallelism = intra_op_threads
    return options


def _prefetch(config: InputConfig, packed: bool):
    wanted = (not packed or bool(config.data_service)) if config.prefetch is None \
        else config.prefetch
    return (lambda ds: ds.prefetch(AUTOTUNE)) if wanted else (lambda ds: ds)


def _shuffle_if(training: bool, buffer: int, seed: Optional[int]):
    return (lambda ds: ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)) \
        if training and buffer > 1 else (lambda ds: ds)


def _cache(where: str, training: bool, seed: Optional[int]):
    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if where in ("", "none"):
            return dataset
        dataset = dataset.cache() if where == "memory" else dataset.cache(where)
        # The cache replays the first epoch's batches; reshuffling whole batches keeps the
        # epoch order from repeating, at no cost in parsing.
        return _shuffle_if(training, 64, seed)(dataset)
    return apply


def input_share(files: list[str], input_context: Optional[tf.distribute.InputContext]
                ) -> tuple[list[str], Optional[tuple[int, int]]]:
    """(the files this input pipeline reads, None) when there are files enough for each
    pipeline to read its own; else (every file, (pipelines, this pipeline's id)): each
    pipeline reads all files and keeps every n-th record, rather than some reading nothing."""
    pipelines = input_context.num_input_pipelines if input_context else 1
    if pipelines <= 1:
        return files, None
    if len(files) >= pipelines:
        return files[input_context.input_pipeline_id::pipelines], None
    return files, (pipelines, input_context.input_pipeline_id)


def _record_share(share: Optional[tuple[int, int]]):
    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset if share is None else dataset.shard(*share)
    return apply


def _rows_read(files: Sequence[str], all_files: Sequence[str], file_patterns,
               packed: bool) -> Optional[int]:
    """The rows an epoch over `files` holds, known without reading them: per-row shards'
    record counts from our manifest, or a packed split's rows when every file is read; None
    otherwise."""
    if packed:
        return split_rows(file_patterns) if list(files) == list(all_files) else None
    manifests: dict = {}
    counted = [tfrecord_io.manifest_shard(f, manifests=manifests) for f in files]
    return sum(s["rows"] for s in counted) if counted and all(counted) else None


def _epoch_batches(rows: Optional[int], config: InputConfig) -> Optional[int]:
    """The batches of `num_epochs` epochs of `rows` rows; None when either is unknown."""
    if rows is None or config.num_epochs is None:
        return None
    per_epoch = rows // config.batch_size if config.drop_remainder else \
        -(-rows // config.batch_size)
    return per_epoch * config.num_epochs


def _known_batches(batches: Optional[int]):
    """A bounded read whose batches are known before it is read says how many
    (`dataset.cardinality()`): Keras shows totals, and a loop can take its steps from it."""
    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if batches is None:
            return dataset
        return dataset.apply(tf.data.experimental.assert_cardinality(batches))
    return apply


def _check_config(config: InputConfig, holdout: Optional[Holdout],
                  sample: Optional[RecordSample]) -> None:
    """Refuses the settings that cannot go together, each in one line."""
    if config.data_service and config.skip_corrupt:
        raise ValueError("skip_corrupt reads damaged files in this process, which tf.data "
                         "service workers cannot run; use one or the other")
    if config.shuffle == GLOBAL_SHUFFLE and (config.data_service or config.skip_corrupt):
        raise ValueError("shuffle=global reads records by index in this process; it cannot "
                         "run on tf.data service workers or skip damaged records")
    if sample is not None and (config.training or config.data_service or config.skip_corrupt):
        raise ValueError("a sample of the records is read in this process, in order, once: "
                         "not for training, a tf.data service or skip_corrupt")
    if config.shuffle == GLOBAL_SHUFFLE and holdout is not None:
        raise ValueError("shuffle=global reads records by index, so it cannot hold validation "
                         "rows out of the train split by hash: name a validation split "
                         "(validation_split) or set validation_fraction=0")


@dataclasses.dataclass(frozen=True)
class _ReadingPlan:
    """What one input pipeline reads and how: its files (or every file and its share of the
    records), whether in a global order, and the sizes its chain shuffles and parses in."""

    files: list[str]  # this pipeline's files (a global order: every file)
    record_share: Optional[tuple[int, int]]  # (pipelines, this one) when files are too few
    compression: str
    damaged: dict  # {file: its corrupt regions}, with skip_corrupt
    global_order: bool
    deterministic: bool
    rows_per_block: int  # packed records' rows; 0 for a record per row
    record_shuffle_buffer: int
    records_per_parse: int
    records_per_turn: int  # the interleave's block_length
    served: Optional[ServedEpochs]  # through a tf.data service: each epoch's rows counted
    known_rows: Optional[int]  # an epoch's rows, when known before reading
    sample: Optional[RecordSample]  # read instead of the files: a share of their records

    @property
    def clean_files(self) -> list[str]:
        return [f for f in self.files if f not in self.damaged]

    @property
    def packed(self) -> bool:
        return bool(self.rows_per_block)


def _reading_plan(file_patterns, schema: schema_pb2.Schema, config: InputConfig,
                  input_context: Optional[tf.distribute.InputContext],
                  on_served_epoch: Optional[Callable[[dict], None]],
                  holdout: Optional[Holdout], sample: Optional[RecordSample]) -> _ReadingPlan:
    """This pipeline's reading plan (`_ReadingPlan`), once the settings are checked."""
    _check_config(config, holdout, sample)
    global_order = config.shuffle == GLOBAL_SHUFFLE and config.training
    # tf.data reads the files: on s3:// through tensorflow-io, whatever process calls this.
    tf_filesystems.register_for(*([file_patterns] if isinstance(file_patterns, str)
                                  else file_patterns))
    files, record_share = resolve_files(file_patterns), None
    all_files = files
    if global_order:
        pass  # every pipeline indexes every file and takes its share of the row stream
    elif not config.data_service:  # else the service hands out the files
        files, record_share = input_share(files, input_context)
    if record_share:
        logging.warning("%d input pipelines but %d file(s): sharding by record; write at "
                        "least %d shards to let each pipeline read its own files",
                        record_share[0], len(files), record_share[0])
    compression = _compression_type(files, config.compression)
    damaged = scan_for_corruption(files) if config.skip_corrupt else {}
    # Counted when the split's rows are known and every batch's rows reach the trainer.
    split_total = split_rows(file_patterns) if config.data_service and \
        not config.drop_remainder and holdout is None else None
    # Packed data (tfrecord_shards/packing/) holds blocks of rows: the records shuffled are
    # whole blocks, one map parses a group of about `shuffle_buffer` rows (shuffled among
    # themselves), and the rows are then cut into batches of `batch_size`.
    rows_per_block = packing.packed_rows(schema)
    if rows_per_block:
        record_shuffle_buffer = config.block_shuffle_buffer
        records_per_parse = max(1, -(-config.shuffle_buffer // rows_per_block))
        records_per_turn = 1
    else:
        record_shuffle_buffer = config.shuffle_buffer
        records_per_parse = config.batch_size
        records_per_turn = config.block_length
    return _ReadingPlan(
        files, record_share, compression, damaged, global_order,
        # Record-level sharding needs every pipeline to see the records in the same order,
        # and a global order is resumed by its position, so it must arrive in that order.
        deterministic=not config.training or record_share is not None or global_order,
        rows_per_block=rows_per_block, record_shuffle_buffer=record_shuffle_buffer,
        records_per_parse=records_per_parse, records_per_turn=records_per_turn,
        served=ServedEpochs(split_total, on_served_epoch) if split_total else None,
        known_rows=None if global_order or record_share or damaged or config.data_service
        or holdout is not None or sample is not None else
        _rows_read(files, all_files, file_patterns, bool(rows_per_block)),
        sample=sample)


def _features_and_label(schema: schema_pb2.Schema, label_key: Optional[str],
                        feature_keys: Optional[Sequence[str]], label_fn: Optional[LabelFn],
                        label_inputs: Sequence[str], config: InputConfig,
                        global_order: bool, holdout: Optional[Holdout]) -> Callable:
    """Serialized records -> (features, label) rows, or features alone without a label: the
    parse (and unpack) of `example_parser`, then the label read or computed."""
    keep = list(feature_keys) if feature_keys is not None else [
        k for k in parser.feature_by_name(schema) if k != label_key]
    # A global order shuffles a packed block's rows itself, by epoch and block.
    parse = example_parser(schema, list(keep) + list(label_inputs) + (
        [label_key] if label_key else []), config.image_specs,
        shuffle_rows=config.training and not global_order, shuffle_seed=config.seed or 0,
        holdout=holdout if packing.packed_rows(schema) else None)

    def to_features_and_label(serialized: tf.Tensor):
        features = parse(serialized)
        kept = {k: features[k] for k in keep}
        if label_fn is not None:
            return kept, label_fn(features)
        if label_key is not None:
            return kept, features[label_key]
        return kept
    return to_features_and_label


def _records(plan: _ReadingPlan, config: InputConfig) -> tf.data.Dataset:
    """The plan's serialized records: its files shuffled and read interleaved, or its
    sample's pieces in order."""
    if plan.sample is not None:
        return plan.sample.records_dataset()

    def read_file(path: tf.Tensor) -> tf.data.Dataset:
        return tf.data.TFRecordDataset(
            path, compression_type=plan.compression, buffer_size=config.reader_buffer_bytes)

    return (tf.data.Dataset.from_tensor_slices(tf.constant(plan.clean_files, tf.string))
            .apply(_shuffle_if(config.training, len(plan.clean_files), config.seed))
            .interleave(read_file, cycle_length=config.cycle_length or AUTOTUNE,
                        block_length=plan.records_per_turn, num_parallel_calls=AUTOTUNE,
                        deterministic=plan.deterministic))


def _to_batches(config: InputConfig, packed: bool):
    """Rows cut into batches of `batch_size`; a record per row is batched so already."""
    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if not packed:
            return dataset  # already batches of batch_size
        if any(isinstance(spec, tf.RaggedTensorSpec)
               for spec in tf.nest.flatten(dataset.element_spec)):
            return dataset.unbatch().batch(config.batch_size, config.drop_remainder)
        return dataset.rebatch(config.batch_size, drop_remainder=config.drop_remainder)
    return apply


def _global_order_batches(plan: _ReadingPlan, config: InputConfig,
                          input_context: Optional[tf.distribute.InputContext],
                          to_features_and_label: Callable) -> tf.data.Dataset:
    """Rows in a seeded permutation of the epoch, read by index, in units of batch_size that
    this pipeline takes from the stream of every epoch's rows (global_order.py)."""
    if plan.packed:
        rows, stream = global_blocks(plan.files, config, input_context, to_features_and_label)
    else:
        records, stream = global_records(plan.files, config, input_context)
        rows = (records
                .batch(config.batch_size, drop_remainder=config.drop_remainder)
                .map(to_features_and_label, num_parallel_calls=AUTOTUNE, deterministic=True))
    return (rows
            .apply(_to_batches(config, plan.packed))
            .apply(_known_batches(stream.batches(config.drop_remainder))))


def build_dataset(file_patterns: Union[str, Sequence[str]], schema: schema_pb2.Schema,
                  label_key: Optional[str], *, feature_keys: Optional[Sequence[str]] = None,
                  label_fn: Optional[LabelFn] = None, label_inputs: Sequence[str] = (),
                  config: Optional[InputConfig] = None,
                  input_context: Optional[tf.distribute.InputContext] = None,
                  on_served_epoch: Optional[Callable[[dict], None]] = None,
                  holdout: Optional[Holdout] = None,
                  sample: Optional[RecordSample] = None) -> tf.data.Dataset:
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
      on_served_epoch: through a tf.data service, called with each epoch's count of rows
        against the split's (`ServedEpochs`; our shards' manifest gives the split's rows).
      holdout: only the validation rows of the files, or only the rest (`Holdout`).
      sample: read this share of the files' records instead of all of them, once, in order
        (`RecordSample`: the Trainer's scaling pass over a large split).
    """
    config = config or InputConfig()
    plan = _reading_plan(file_patterns, schema, config, input_context, on_served_epoch, holdout,
                         sample)
    to_features_and_label = _features_and_label(schema, label_key, feature_keys, label_fn,
                                                label_inputs, config, plan.global_order, holdout)
    if plan.global_order:
        batches = _global_order_batches(plan, config, input_context, to_features_and_label)
    else:
        # The records (the files shuffled, read interleaved), shuffled through a buffer.
        batches = (
            _records(plan, config)
            .apply(with_salvaged_records(sorted(plan.damaged), config.seed))
            .apply(_record_share(plan.record_share))
            .apply(_held_out_records(holdout, packed=plan.packed))
            .apply(_shuffle_if(config.training, plan.record_shuffle_buffer, config.seed))
            .batch(plan.records_per_parse,
                   drop_remainder=config.drop_remainder and not plan.packed)
            .map(to_features_and_label, num_parallel_calls=AUTOTUNE,
                 deterministic=plan.deterministic)
            .apply(_to_batches(config, plan.packed)))
    return (
        batches
        .apply(on_data_service(config.data_service, plan.served))
        .apply(_cache(config.cache, config.training, config.seed))
        .repeat(1 if plan.global_order else config.num_epochs)  # a global order has its epochs
        .apply(_known_batches(_epoch_batches(plan.known_rows, config)))
        .apply(_prefetch(config, packed=plan.packed))
        .with_options(_dataset_options(config, packed=plan.packed))
    )
