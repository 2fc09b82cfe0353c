"""StatisticsGen's options: the parts of TFDV's StatsOptions that shape its output, and the
threads that do the work."""
from __future__ import annotations

import dataclasses
from typing import Optional

from tfrecord_shards.options import JsonOptions, setting


# The output settings take StatsOptions' defaults (TFDV 1.16), so that our artifact and stock
# StatisticsGen's agree when neither is configured; a test checks them against StatsOptions().
@dataclasses.dataclass(frozen=True)
class StatisticsGenOptions(JsonOptions):
    num_top_values: int = setting(
        20, "Most frequent values listed per string feature.", minimum=0, flag=False)
    frequency_threshold: int = setting(
        1, "A string value is listed only with at least this many occurrences.", flag=False)
    num_rank_histogram_buckets: int = setting(
        1000, "Values in a string feature's rank histogram.", minimum=0, flag=False)
    num_values_histogram_buckets: int = setting(
        10, "Buckets of the histogram of values per example.", minimum=2, flag=False)
    num_histogram_buckets: int = setting(
        10, "Buckets of a numeric feature's equal-width histogram.", minimum=1, flag=False)
    num_quantiles_histogram_buckets: int = setting(
        10, "Buckets of a numeric feature's quantiles histogram.", minimum=1, flag=False)
    epsilon: float = setting(
        0.01, "Rank error allowed in the quantile sketches.", above=0, maximum=1, flag=False)
    piece_records: int = setting(
        1 << 20, "Records one Beam element summarises on the Beam path (whole gzip members, "
                 "or records of a plain file with a .idx index), so that a large shard "
                 "spreads over the workers; a file without an index is one element.",
        minimum=1, flag=False)
    threads: Optional[int] = setting(
        None, "Threads decoding and summarising blocks of records (unset: one per CPU).",
        minimum=1, flag=False)
