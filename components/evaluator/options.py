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
    # Each call's activations are held by every thread at once. The Evaluator alone on 10M
    # taxi eval rows (one `tfrp run` that reran only it): 32,768 rows a call peaked at
    # 1,835 MiB in 23.9 s, 16,384 at 1,429 MiB in 23.2 s, 8,192 at 1,291 MiB in 23.7 s; on
    # 1M rows 32,768 took 1,744 MiB and 8,192 1,305. On 333k rows, median of 3, 2 threads:
    # 0.80 s at 8,192, 0.71 s at 32,768; 3 threads were no better.
    transformed_batch_rows: int = setting(
        8192, "Rows a call of the score_transformed signature scores.", minimum=1,
        flag=False)
    # XLA fuses the model's many small ops (a scaling, an embedding and sines a feature)
    # into a few loops. On 10M taxi eval rows the Evaluator alone took 23.8-24.6 s compiled
    # against 27.3-27.9 s (44-45 against 53-54 CPU-s); each batch shape compiles once, in
    # about 0.2 s, which 1M rows just repay (4.24-4.26 s against 4.16-4.33 s, 10.5 against
    # 10.9-11.4 CPU-s), so smaller splits are not compiled.
    jit_compile_rows: int = setting(
        1_000_000, "Compile the score_transformed signature with XLA when Transform's split "
                   "holds at least this many rows (0: never); a model XLA cannot compile "
                   "(string ops) is scored as it is.", minimum=0, flag=False)
    # A part's scores, the reader's batches and the metrics' working arrays: at 1M-row parts
    # the stage peaked at 2,109 MiB on 10M eval rows (1,951 on 1M), in a process holding
    # 1.5 GiB before it; the merged statistics of the parts are small.
    part_rows: int = setting(
        1 << 18, "Rows of Transform's split scored and reduced to metric statistics at a "
                 "time, so memory stays flat however many rows there are.", minimum=1,
        flag=False)
    score_transformed: bool = setting(
        True, "Score Transform's eval split through the model's score_transformed signature "
              "(the layers after the Transform graph) when its rows pair with the raw ones, "
              "checked against serving_default on the first serving_check_rows.", flag=False)
    serving_check_rows: int = setting(
        4096, "Raw eval rows scored through serving_default and compared with the "
              "transformed split's when score_transformed is used.", minimum=1, flag=False)
