"""The training input function: TFRecord shards of tf.Example -> (features, label) batches.

It reads top to bottom as one tf.data chain, the order the tf.data performance guide gives:
list files, interleave readers, shuffle, batch, parse the whole batch at once (densify, decode
images, split off the label), cache, repeat, prefetch. The feature spec comes from the schema,
so no one hand-writes it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Callable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import fileio, packing, tf_filesystems, tfrecord_io
from tfrecord_shards.packing import graph as packed_graph
from tfrecord_shards.packing.layout import ROWS_KEY
from tfrecord_shards.codec import parser
from shard_readers.images import ImageSpec, decode_images, with_storage_from
from components.trainer.options import GLOBAL_SHUFFLE, InputConfig

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
    from tfrecord_shards import shards

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
# Corrupt records
# ---------------------------------------------------------------------------------------------
def locate_corruption(files: Sequence[str]) -> Optional[tfrecord_io.CorruptRecordError]:
    """The first damaged record among `files`, named by file and offset, or None."""
    for path in files:
        try:
            for _ in tfrecord_io.iter_records(path):
                pass
        except tfrecord_io.CorruptRecordError as error:
            return error
    return None


@contextlib.contextmanager
def corrupt_files_named(files: Sequence[str]) -> Iterator[None]:
    """Turns TensorFlow's "corrupted record at N" (which names no file) into an error that
    names the file and offset, found by re-reading the files with our framing reader."""
    try:
        yield
    except tf.errors.DataLossError as error:
        located = locate_corruption(files)
        if located is None:
            raise
        raise located from error


def scan_for_corruption(files: Sequence[str]) -> dict[str, list[tfrecord_io.CorruptRegion]]:
    """The damaged regions of each damaged file; each region and the totals are logged."""
    damaged: dict[str, list[tfrecord_io.CorruptRegion]] = {}
    for path in files:
        regions = [r for _, r in tfrecord_io.iter_records(path, resync=True)
                   if isinstance(r, tfrecord_io.CorruptRegion)]
        if regions:
            damaged[path] = regions
    for path, regions in damaged.items():
        for region in regions:
            logging.warning("skip_corrupt: skipping %d bytes at offset %d of %s (%s; %s)",
                            region.length, region.offset, path, region.reason, region.loss)
    logging.warning("skip_corrupt: %d corrupt region(s) skipped in %d of %d file(s)",
                    sum(len(r) for r in damaged.values()), len(damaged), len(files))
    return damaged


def _intact_records(path: str) -> Iterator[bytes]:
    for _, record in tfrecord_io.iter_records(path, resync=True):
        if isinstance(record, bytes):
            yield record


# ---------------------------------------------------------------------------------------------
# Validation rows held out of a split
# ---------------------------------------------------------------------------------------------
# The hash's resolution: a fraction is held out to 1 part in a million.
HOLDOUT_BUCKETS = 1_000_000


@dataclasses.dataclass(frozen=True)
class Holdout:
    """The rows of a split held out of training to choose the weights: those whose stable hash
    (farmhash Fingerprint64, `tf.strings.to_hash_bucket_fast`) falls in the first `fraction`
    of its buckets. A per-row record hashes its serialized bytes; a packed record's row
    hashes the block's bytes and its place in the block, so a table packed into one block
    still holds out a fraction of its rows, not all or none. The same rows every run, on
    every machine, whichever features are read; `validation` picks the held-out side, else
    the rest."""

    fraction: float
    validation: bool

    def _keeps(self, keys: tf.Tensor) -> tf.Tensor:
        held_out = tf.strings.to_hash_bucket_fast(keys, HOLDOUT_BUCKETS) < \
            round(self.fraction * HOLDOUT_BUCKETS)
        return held_out if self.validation else tf.logical_not(held_out)

    def keeps_record(self, serialized: tf.Tensor) -> tf.Tensor:
        return self._keeps(serialized)

    def keeps_packed_rows(self, serialized: tf.Tensor, rows_per_block: tf.Tensor) -> tf.Tensor:
        """For each real row of the blocks `serialized`, in block order, whether it is kept."""
        blocks = tf.strings.as_string(tf.strings.to_hash_bucket_fast(serialized, 1 << 62))
        places = tf.ragged.range(rows_per_block)
        keys = tf.strings.join([tf.repeat(blocks, rows_per_block),
                                tf.strings.as_string(places.flat_values)], "/")
        return self._keeps(keys)


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


def _with_salvaged_records(damaged: Sequence[str], seed: Optional[int]):
    """Mixes in the intact records of damaged files, read by our resynchronising reader, so
    every record after the damage still arrives (TF's reader drops the rest of the file)."""
    def apply(records: tf.data.Dataset) -> tf.data.Dataset:
        if not damaged:
            return records
        salvaged = tf.data.Dataset.from_generator(
            lambda: (r for path in damaged for r in _intact_records(path)),
            output_signature=tf.TensorSpec([], tf.string))
        return tf.data.Dataset.sample_from_datasets(
            [records, salvaged], seed=seed, stop_on_empty_dataset=False)
    return apply


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


class ServedEpochs:
    """Counts the rows each epoch through a tf.data service brings, against the rows the split
    holds. The service's distributed epoch is at most once: when a worker dies mid-epoch, the
    rows it had taken (its files in progress) never arrive, and the epoch ends without them.
    This says how many, once each epoch ends: a warning when rows were missed."""

    def __init__(self, expected_rows: int,
                 on_epoch: Optional[Callable[[dict], None]] = None):
        self.expected = expected_rows
        self.on_epoch = on_epoch
        self._epoch = self._rows = 0

    def add(self, rows: np.ndarray, ends_epoch: np.ndarray) -> np.ndarray:
        if not ends_epoch:
            self._rows += int(rows)
            return rows
        epoch = {"epoch": self._epoch, "rows": self._rows, "expected_rows": self.expected,
                 "missed_rows": self.expected - self._rows}
        self._epoch, self._rows = self._epoch + 1, 0
        if epoch["missed_rows"]:
            logging.warning(
                "tf.data service: epoch %d brought %d of %d rows; %d missed (a worker was lost "
                "mid-epoch: the service's epoch is at most once, so the rows it held are not "
                "read again)", epoch["epoch"], epoch["rows"], self.expected,
                epoch["missed_rows"])
        else:
            logging.info("tf.data service: epoch %d brought all %d rows", epoch["epoch"],
                         self.expected)
        if self.on_epoch is not None:
            self.on_epoch(epoch)
        return rows


def _empty_like(spec):
    """An element of `spec` with no rows where the batch size is not fixed."""
    if isinstance(spec, tf.RaggedTensorSpec):
        values = tf.zeros([0] + [d or 0 for d in spec.shape[spec.ragged_rank + 1:]],
                          spec.dtype)
        return tf.RaggedTensor.from_nested_row_lengths(
            values, [tf.zeros([0], spec.row_splits_dtype)] * spec.ragged_rank)
    return tf.zeros([d or 0 for d in spec.shape], spec.dtype)


def _rows_in(batch) -> tf.Tensor:
    first = tf.nest.flatten(batch, expand_composites=False)[0]
    return tf.cast(first.nrows() if isinstance(first, tf.RaggedTensor)
                   else tf.shape(first)[0], tf.int64)


def _on_data_service(service: Optional[str], counter: Optional[ServedEpochs] = None):
    """Everything above this point (reading, shuffling, parsing, batching) runs on the tf.data
    service's workers. Dynamic sharding hands each file to one worker at a time, so each row
    arrives once per epoch however many workers there are, unless a worker dies: with
    `counter`, a flagged marker after each epoch's last batch lets the trainer count what the
    epoch brought (`ServedEpochs`)."""
    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if not service:
            return dataset
        served = dataset.apply(tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
            service=service))
        if counter is None:
            return served
        marker = tf.nest.map_structure(_empty_like, served.element_spec)
        flagged = served.map(lambda *batch: (batch, False)).concatenate(
            tf.data.Dataset.from_tensors((tuple(marker) if isinstance(marker, tuple)
                                          else (marker,), True)))

        def count(batch, ends_epoch):
            counted = tf.numpy_function(counter.add, [_rows_in(batch), ends_epoch], tf.int64)
            with tf.control_dependencies([counted]):
                return batch, tf.identity(ends_epoch)

        return (flagged
                .map(count)
                .filter(lambda batch, ends_epoch: tf.logical_not(ends_epoch))
                .map(lambda batch, _: batch if len(batch) > 1 else batch[0]))
    return apply


def _record_share(share: Optional[tuple[int, int]]):
    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset if share is None else dataset.shard(*share)
    return apply


# A global order without num_epochs runs on; its row stream stops here, far past any run.
_UNBOUNDED_ROWS = 1 << 62


@dataclasses.dataclass(frozen=True)
class _RowStream:
    """Where a global order starts and stops in the stream of every epoch's rows one after
    another, and the share of it one input pipeline reads. Pipeline w of W reads the units
    (`batch` rows each) w, w + W, ...; in step with the others, after each has read k units
    the pipelines together have read exactly the first k * W units: the stream's rows up to
    one number, whatever W was, so a run resumes from that number on any W."""

    start: int
    stop: int
    batch: int
    pipelines: int
    pipeline: int

    @classmethod
    def of(cls, rows_per_epoch: int, config: InputConfig,
           input_context: Optional[tf.distribute.InputContext]) -> "_RowStream":
        return cls(config.start_epoch * rows_per_epoch + config.start_position,
                   _UNBOUNDED_ROWS if config.num_epochs is None
                   else config.num_epochs * rows_per_epoch, config.batch_size,
                   input_context.num_input_pipelines if input_context else 1,
                   input_context.input_pipeline_id if input_context else 0)

    def unit_starts(self) -> tf.data.Dataset:
        return tf.data.Dataset.range(self.start + self.pipeline * self.batch, self.stop,
                                     self.pipelines * self.batch)

    def batches(self, drop_remainder: bool) -> Optional[int]:
        """This pipeline's batches (a unit each, a short last one left out with
        `drop_remainder`); None for a stream without end."""
        if self.stop == _UNBOUNDED_ROWS:
            return None
        first = self.start + self.pipeline * self.batch
        units = max(0, -(-(self.stop - first) // (self.pipelines * self.batch)))
        last = first + (units - 1) * self.pipelines * self.batch
        return units - (drop_remainder and units > 0 and last + self.batch > self.stop)


def _global_order(files: Sequence[str], config: InputConfig,
                  input_context: Optional[tf.distribute.InputContext]
                  ) -> tuple[tf.data.Dataset, _RowStream]:
    """Per-row records, each epoch in a seeded permutation of all of them
    (`tf.random.experimental.index_shuffle`, keyed by the seed and the epoch): every record
    exactly once an epoch, read by its index, in units of `batch_size` records that this
    pipeline takes from the row stream (`_RowStream`). The order is a function of (seed,
    stream position) alone, so a run stopped anywhere resumes there with no buffer to
    restore (`start_epoch`, `start_position`), on any number of input pipelines."""
    from tfrecord_shards import record_index

    records = record_index.FileRecords(files)
    count = len(records)
    if not count:
        raise ValueError(f"shuffle=global: no records in {len(files)} file(s)")
    stream = _RowStream.of(count, config, input_context)
    seed = tf.constant(config.seed or 0, tf.int64)
    last = tf.constant(count - 1, tf.int64)

    def unit_records(first: tf.Tensor) -> tf.Tensor:
        rows = tf.range(first, tf.minimum(first + stream.batch, stream.stop))
        epoch, position = rows // count, rows % count
        # A unit spans at most two epochs.
        return tf.where(epoch == first // count,
                        tf.random.experimental.index_shuffle(
                            position, tf.stack([seed, first // count]), last),
                        tf.random.experimental.index_shuffle(
                            position, tf.stack([seed, first // count + 1]), last))

    def read(numbers: tf.Tensor) -> tf.Tensor:
        return tf.numpy_function(records.read, [numbers], tf.string, stateful=False)

    return (stream.unit_starts()
            .map(unit_records)
            .map(read, num_parallel_calls=AUTOTUNE, deterministic=True)
            .unbatch()), stream


BLOCKS_PER_READ = 32
REMOTE_BYTES_PER_READ = 32 << 20


class _BlockOrder:
    """Packed records in a global order: each epoch a seeded permutation of the blocks
    (numpy's PCG64, keyed by the seed and the epoch), each block's rows in an order keyed by
    the seed, the epoch and the block. A unit of the row stream is cut from the blocks it
    falls in as (block, epoch, first row, end row) segments."""

    def __init__(self, rows_per_block: np.ndarray, seed: int):
        self.rows = rows_per_block
        self.total = int(rows_per_block.sum())
        self.seed = seed
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if epoch not in self._epochs:
            if len(self._epochs) > 2:  # a run reads at most two epochs at once
                self._epochs.pop(min(self._epochs))
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
            self._epochs[epoch] = (order, np.cumsum(self.rows[order]))
        return self._epochs[epoch]

    def segments(self, firsts: np.ndarray, batch: int, stop: int) -> np.ndarray:
        """(block, epoch, first row, end row) of the units starting at `firsts`, a block
        read once for consecutive rows of it."""
        out: list[list[int]] = []
        for first in firsts.tolist():
            row, end = first, min(first + batch, stop)
            while row < end:
                epoch, within = divmod(row, self.total)
                order, ends = self._epoch(epoch)
                k = int(np.searchsorted(ends, within, side="right"))
                block = int(order[k])
                lo = within - (int(ends[k]) - int(self.rows[block]))
                hi = min(int(self.rows[block]), lo + end - row)
                if out and out[-1][:2] == [block, epoch] and out[-1][3] == lo:
                    out[-1][3] = hi
                else:
                    out.append([block, epoch, lo, hi])
                row += hi - lo
        return np.array(out, np.int64).reshape(-1, 4)


def _global_blocks(files: Sequence[str], config: InputConfig,
                   input_context: Optional[tf.distribute.InputContext],
                   parse: Callable) -> tuple[tf.data.Dataset, _RowStream]:
    """Packed records in a global order (`_BlockOrder`): the rows this pipeline takes from the
    row stream, parsed block by block. A block that units of other pipelines share is read
    by each of them; within one pipeline, once."""
    from shard_readers import numpy_reader
    from tfrecord_shards import record_index

    records = record_index.FileRecords(files)
    order = _BlockOrder(np.concatenate([numpy_reader.block_rows(f) for f in files]),
                        config.seed or 0)
    if not order.total:
        raise ValueError(f"shuffle=global: no rows in {len(files)} file(s)")
    stream = _RowStream.of(order.total, config, input_context)
    seed = tf.constant(config.seed or 0, tf.int64)

    # Units enough to cover about BLOCKS_PER_READ blocks (on an object store, blocks of about
    # REMOTE_BYTES_PER_READ) are read in one call. Their ranges are fetched together, merged
    # where they lie close and concurrently (FileRecords.read): on a store an epoch costs a
    # request per merged span, and the more blocks a call asks for, the closer they lie.
    blocks_per_read = BLOCKS_PER_READ
    if records.remote:
        blocks_per_read = max(BLOCKS_PER_READ, REMOTE_BYTES_PER_READ * len(order.rows) //
                              max(1, records.stored_bytes()))
    units_per_read = max(1, -(-blocks_per_read * order.total // len(order.rows) //
                               stream.batch))

    def segments_and_blocks(firsts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cut = order.segments(firsts, stream.batch, stream.stop)
        return cut, records.read(cut[:, 0])

    def segments(firsts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        cut, blocks = tf.numpy_function(segments_and_blocks, [firsts], (tf.int64, tf.string),
                                        stateful=False)
        return tf.reshape(cut, [-1, 4]), tf.reshape(blocks, [-1])

    def rows_of(segment: tf.Tensor, serialized: tf.Tensor):
        block, epoch, lo, hi = tf.unstack(segment, num=4)
        parsed = parse(tf.reshape(serialized, [1]))
        size = tf.shape(tf.nest.flatten(parsed)[0], out_type=tf.int64)[0]
        # This epoch's order of the block's rows, the same wherever the block is read.
        keys = tf.random.stateless_uniform([size], tf.stack([seed ^ block, epoch]))
        taken = tf.argsort(keys)[lo:hi]
        return tf.nest.map_structure(lambda t: tf.gather(t, taken), parsed)

    return (stream.unit_starts()
            .batch(units_per_read)
            .map(segments, num_parallel_calls=AUTOTUNE, deterministic=True)
            .unbatch()
            .map(rows_of, num_parallel_calls=AUTOTUNE, deterministic=True)), stream


def _rows_read(files: Sequence[str], all_files: Sequence[str], file_patterns,
               packed: bool) -> Optional[int]:
    """The rows an epoch over `files` holds, known without reading them: per-row shards'
    record counts from our manifest, or a packed split's rows when every file is read; None
    otherwise."""
    if packed:
        return split_rows(file_patterns) if list(files) == list(all_files) else None
    shards = [tfrecord_io.manifest_shard(f) for f in files]
    return sum(s["rows"] for s in shards) if shards and all(shards) else None


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
    on_served_epoch: Optional[Callable[[dict], None]] = None,
    holdout: Optional[Holdout] = None,
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
      on_served_epoch: through a tf.data service, called with each epoch's count of rows
        against the split's (`ServedEpochs`; our shards' manifest gives the split's rows).
      holdout: only the validation rows of the files, or only the rest (`Holdout`).
    """
    config = config or InputConfig()
    if config.data_service and config.skip_corrupt:
        raise ValueError("skip_corrupt reads damaged files in this process, which tf.data "
                         "service workers cannot run; use one or the other")
    if config.shuffle == GLOBAL_SHUFFLE and (config.data_service or config.skip_corrupt):
        raise ValueError("shuffle=global reads records by index in this process; it cannot "
                         "run on tf.data service workers or skip damaged records")
    if config.shuffle == GLOBAL_SHUFFLE and holdout is not None:
        raise ValueError("shuffle=global reads records by index, so it cannot hold validation "
                         "rows out of the train split by hash: name a validation split "
                         "(validation_split) or set validation_fraction=0")
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
    served = ServedEpochs(split_total, on_served_epoch) if split_total else None
    # Record-level sharding needs every pipeline to see the records in the same order, and a
    # global order is resumed by its position, so it must arrive in that order.
    deterministic = not config.training or record_share is not None or global_order

    features_by_name = parser.feature_by_name(schema)
    keep = list(feature_keys) if feature_keys is not None else [
        k for k in features_by_name if k != label_key]
    # A global order shuffles a packed block's rows itself, by epoch and block.
    parse = example_parser(schema, list(keep) + list(label_inputs) + (
        [label_key] if label_key else []), config.image_specs,
        shuffle_rows=config.training and not global_order, shuffle_seed=config.seed or 0,
        holdout=holdout if packing.packed_rows(schema) else None)

    # Packed data (tfrecord_shards/packing/) holds blocks of rows: the records shuffled are whole
    # blocks, one map parses a group of about `shuffle_buffer` rows (shuffled among
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

    def read_file(path: tf.Tensor) -> tf.data.Dataset:
        return tf.data.TFRecordDataset(
            path, compression_type=compression, buffer_size=config.reader_buffer_bytes)

    def to_features_and_label(serialized: tf.Tensor):
        features = parse(serialized)
        kept = {k: features[k] for k in keep}
        if label_fn is not None:
            return kept, label_fn(features)
        if label_key is not None:
            return kept, features[label_key]
        return kept

    def to_batches(dataset: tf.data.Dataset) -> tf.data.Dataset:
        if not rows_per_block:
            return dataset  # already batches of batch_size
        if any(isinstance(spec, tf.RaggedTensorSpec)
               for spec in tf.nest.flatten(dataset.element_spec)):
            return dataset.unbatch().batch(config.batch_size, config.drop_remainder)
        return dataset.rebatch(config.batch_size, drop_remainder=config.drop_remainder)

    clean_files = [f for f in files if f not in damaged]
    if global_order:
        # Rows in a seeded permutation of the epoch, read by index, in units of batch_size
        # that this pipeline takes from the stream of every epoch's rows.
        if rows_per_block:
            rows, stream = _global_blocks(files, config, input_context, to_features_and_label)
        else:
            records, stream = _global_order(files, config, input_context)
            rows = (records
                    .batch(config.batch_size, drop_remainder=config.drop_remainder)
                    .map(to_features_and_label, num_parallel_calls=AUTOTUNE,
                         deterministic=True))
        batches = (rows
                   .apply(to_batches)
                   .apply(_known_batches(stream.batches(config.drop_remainder))))
    else:
        # The files shuffled, read interleaved and shuffled through a buffer.
        batches = (
            tf.data.Dataset.from_tensor_slices(tf.constant(clean_files, tf.string))
            .apply(_shuffle_if(config.training, len(clean_files), config.seed))
            .interleave(read_file, cycle_length=config.cycle_length or AUTOTUNE,
                        block_length=records_per_turn, num_parallel_calls=AUTOTUNE,
                        deterministic=deterministic)
            .apply(_with_salvaged_records(sorted(damaged), config.seed))
            .apply(_record_share(record_share))
            .apply(_held_out_records(holdout, packed=bool(rows_per_block)))
            .apply(_shuffle_if(config.training, record_shuffle_buffer, config.seed))
            .batch(records_per_parse,
                   drop_remainder=config.drop_remainder and not rows_per_block)
            .map(to_features_and_label, num_parallel_calls=AUTOTUNE,
                 deterministic=deterministic)
            .apply(to_batches))
    return (
        batches
        .apply(_on_data_service(config.data_service, served))
        .apply(_cache(config.cache, config.training, config.seed))
        .repeat(1 if global_order else config.num_epochs)  # the global order has its epochs
        .apply(_known_batches(_epoch_batches(
            None if global_order or record_share or damaged or config.data_service or
            holdout is not None else
            _rows_read(files, all_files, file_patterns, bool(rows_per_block)), config)))
        .apply(_prefetch(config, packed=bool(rows_per_block)))
        .with_options(_dataset_options(config, packed=bool(rows_per_block)))
    )
