"""ShardedTransform's options: one frozen dataclass shared by the component, the Beam job and
the bench."""
from __future__ import annotations

import dataclasses
from typing import Optional

from components.options import JsonOptions
from components.shards import ShardingOptions


@dataclasses.dataclass(frozen=True)
class TransformOptions(JsonOptions):
    module_file: Optional[str] = None  # a .py file defining preprocessing_fn
    preprocessing_fn: Optional[str] = None  # or "package.module.function"
    # The schema-derived preprocessing_fn keeps this feature in its own units (a string label
    # becomes vocabulary ids); see components/transform/defaults.py.
    label_key: Optional[str] = None
    # Rows per packed tf.Example (components/packing.py); 0 writes one tf.Example per row,
    # the layout stock components read.
    packed_rows: int = 1024
    analyze_split: str = "train"
    # With ExampleValidator's anomalies wired in, any anomaly stops the run before Transform.
    fail_on_anomalies: bool = True
    sharding: ShardingOptions = dataclasses.field(default_factory=ShardingOptions)
