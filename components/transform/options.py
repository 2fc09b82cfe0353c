"""ShardedTransform's options: one frozen dataclass shared by the component, the Beam job and
the bench."""
from __future__ import annotations

import dataclasses
from typing import Optional

from shard_readers.images import STORAGES

ANALYSES = ("columnar", "tft")
from tfrecord_shards.options import JsonOptions, SettingError, setting
from tfrecord_shards.shards import ShardingOptions


@dataclasses.dataclass(frozen=True)
class TransformOptions(JsonOptions):
    module_file: Optional[str] = None  # a .py file defining preprocessing_fn
    preprocessing_fn: Optional[str] = None  # or "package.module.function"
    # The schema-derived preprocessing_fn keeps this feature in its own units (a string label
    # becomes vocabulary ids); see components/transform/defaults.py.
    label_key: Optional[str] = None
    # The label's task (components/trainer/tasks.py), which the schema-derived
    # preprocessing_fn follows: a multiclass int label becomes vocabulary ids (the classes
    # are then counted over every training row), a regression int label a float.
    task: Optional[str] = None
    # Rows per packed tf.Example (tfrecord_shards/packing/); 0 writes one tf.Example per row,
    # the layout stock components read.
    packed_rows: int = 1024
    analyze_split: str = "train"
    # How the preprocessing_fn's statistics are computed. "columnar": one vectorized pass
    # over decoded columns, and the graph applied to large batches, for a preprocessing_fn
    # that takes its statistics through components/transform/analyzers.py (the schema-derived
    # default and the taxi Transform; any other keeps tf.Transform's path); "tft":
    # tf.Transform's Beam analysis and transform for every preprocessing_fn.
    analysis: str = setting("columnar", choices=ANALYSES)
    # With ExampleValidator's anomalies wired in, any anomaly stops the run before Transform.
    fail_on_anomalies: bool = True
    # "raw": image features are decoded and resized to image_shape ([height, width, channels])
    # once, here, and stored as uint8 pixels, so the Trainer reads them with no decode each
    # epoch (more bytes on disk, much less CPU; shard_readers/images.py). "encoded" keeps the
    # JPEG/PNG bytes and the input function decodes them.
    image_storage: str = setting("encoded", choices=STORAGES)
    image_shape: Optional[list[int]] = None
    # A folder where each input's analysis is kept (tf.Transform's analyzer cache, by input):
    # an input analysed once, such as a span in a rolling window, is not read again for
    # analysis. Unset: every input is analysed every run.
    analyzer_cache_dir: Optional[str] = None
    # Stock Transform's setting, with its default: on, Transform also writes the statistics
    # of the rows it analysed and of the rows it wrote, their schemas and the anomalies of the
    # latter (components/transform/feature_stats.py); off, those outputs do not exist.
    disable_statistics: bool = False
    # The columnar path (analysis="columnar") keeps the batches its analysis decoded, as
    # Arrow IPC files in the run's staging folder (compact: 115 bytes a taxi row against
    # 273 decoded), and applies the transform to those instead of reading and decoding the
    # analysed split's tf.Examples a second time; each is deleted once it has been read.
    # Off: the analysed split is decoded twice.
    reuse_decoded: bool = True
    # The columnar path's unit of work on the Beam job: about this many records of one input
    # shard (whole gzip members, or records of a plain shard by its .idx; a shard without an
    # index is one unit), so even one large shard spreads over a runner's workers. The
    # analysis merges the pieces' statistics in a tree fixed by their order, so every runner
    # gives the same constants for the same setting. The default keeps a default 128 MB shard
    # of taxi-like rows (about 1.9M) whole: each piece costs the local run a start of its
    # reading pipeline (about 0.3 s for one more piece at 3M rows, in bench/RESULTS.md).
    piece_records: int = setting(1 << 21, minimum=1)
    sharding: ShardingOptions = dataclasses.field(default_factory=ShardingOptions)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.image_storage == "raw" and (not self.image_shape or len(self.image_shape) != 3):
            raise SettingError(["image_storage", "image_shape"],
                               "{0}=raw stores pixels at the training size: set {1} to "
                               "[height, width, channels]")
