"""The fast Evaluator's options, and the error for a TFMA setting it does not implement."""
from __future__ import annotations

import dataclasses

from tfrecord_shards.options import JsonOptions, setting


class UnsupportedSetting(ValueError):
    """A metric or TFMA setting this evaluator does not implement; StockEvaluator (TFMA on Beam)
    does."""


@dataclasses.dataclass(frozen=True)
class EvaluatorOptions(JsonOptions):
    # 1.5M taxi rows on 2 lightly loaded cores: 15 s at 4,096 rows a call, 20 s at 8,192,
    # 23 s at 16,384 (2 threads), and 21 s with 2 threads against 25 s with 1 (8,192 rows).
    # With the cores busy with other work, every setting took 32-37 s.
    batch_rows: int = setting(
        4096, "Rows a call of the model's signatures scores.", minimum=1, flag=False)
    threads: int = setting(
        2, "Batches scored at once: TensorFlow runs one batch's ops on fewer cores than it "
           "has.", minimum=1, flag=False)
