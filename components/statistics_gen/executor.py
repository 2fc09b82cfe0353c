"""StatisticsGen's TFX executor: stock StatisticsGen's, with `stats_job` doing the work
whenever the StatsOptions are ones it computes exactly as stock does; any other setting (a
sample rate, slicing, weights, semantic domains, the sketch-based top-k, sharded output...)
runs stock's Beam job unchanged. The pipeline's Beam args pick where `stats_job` runs
(`engine.runs_on_beam`): in this process on the local DirectRunner, else as its Beam job
(`beam_job`) on the runner they name."""
from __future__ import annotations

import json
import logging
from typing import Any, Optional

import tensorflow_data_validation as tfdv
from tfx.components.statistics_gen import executor as stock
from tfx.components.util import examples_utils
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, standard_component_specs as specs
from tfx.utils import io_utils, json_utils

from tfrecord_shards.codec import schema_file
from components.statistics_gen import engine, plan, releases
from components.statistics_gen.options import StatisticsGenOptions

# StatsOptions attributes (as its to_json names them) and the StatisticsGenOptions setting
# each one is; other attributes must keep their default for the fast path.
_SETTINGS = {
    "num_top_values": "num_top_values",
    "frequency_threshold": "frequency_threshold",
    "num_rank_histogram_buckets": "num_rank_histogram_buckets",
    "_num_values_histogram_buckets": "num_values_histogram_buckets",
    "_num_histogram_buckets": "num_histogram_buckets",
    "_num_quantiles_histogram_buckets": "num_quantiles_histogram_buckets",
    "epsilon": "epsilon",
}
# Attributes that do not change what stock computes without weights: how Beam batches and
# partitions the work, the weighted threshold (no weights), a type hint for CSV decoding.
_NO_EFFECT = {"_desired_batch_size", "_experimental_num_feature_partitions",
              "weighted_frequency_threshold", "infer_type_from_schema", "_schema", "schema_json"}


def fast_path_options(stats_options: tfdv.StatsOptions
                      ) -> tuple[Optional[StatisticsGenOptions], Optional[str]]:
    """(our options, None) when `stats_job` computes what stock would for these StatsOptions,
    else (None, the setting that needs stock's job)."""
    given = json.loads(stats_options.to_json())
    defaults = json.loads(tfdv.StatsOptions().to_json())
    for name, value in given.items():
        if name not in _SETTINGS and name not in _NO_EFFECT and value != defaults.get(name):
            return None, f"StatsOptions.{name.lstrip('_')}={value!r}"
    reason = plan.unsupported_schema(stats_options.schema)
    if reason:
        return None, f"a schema with {reason}"
    return StatisticsGenOptions(**{ours: given[theirs] for theirs, ours in _SETTINGS.items()}), \
        None


class Executor(stock.Executor):
    """Writes the ExampleStatistics artifact stock writes: Split-<name>/FeatureStats.pb, the
    split names, the span, and stock's custom properties."""

    def Do(self, input_dict: dict[str, list], output_dict: dict[str, list],
           exec_properties: dict[str, Any]) -> None:
        if not releases.fast_path_tested("tensorflow-data-validation", "StatisticsGen"):
            # The fast path rebuilds this TFDV's protos and reads StatsOptions' internals.
            super().Do(input_dict, output_dict, exec_properties)
            return
        examples = artifact_utils.get_single_instance(input_dict[specs.EXAMPLES_KEY])
        stats_options = tfdv.StatsOptions.from_json(
            exec_properties.get(specs.STATS_OPTIONS_JSON_KEY) or tfdv.StatsOptions().to_json())
        options, reason = fast_path_options(stats_options)
        schema_input = input_dict.get(specs.SCHEMA_KEY)
        if exec_properties.get(specs.SHARDED_STATS_OUTPUT_KEY):
            reason = "sharded statistics output"
        elif json_utils.loads(exec_properties.get(specs.SAMPLE_RATE_BY_SPLIT_KEY, "null")):
            reason = "sample_rate_by_split"
        elif examples.has_custom_property(examples_utils.CUSTOM_SPLIT_PATTERN_PROPERTY_NAME):
            reason = "a custom split pattern"
        elif examples_utils.get_payload_format(examples) != example_gen_pb2.FORMAT_TF_EXAMPLE:
            reason = f"payload {examples_utils.get_payload_format_string(examples)}"
        elif schema_input and stats_options.schema is not None:
            reason = "a schema given twice"  # stock's executor says so
        elif schema_input:
            stats_options.schema = schema_file.load_schema(io_utils.get_only_uri_in_dir(
                artifact_utils.get_single_uri(schema_input)))
            options, reason = fast_path_options(stats_options)
        if reason:
            logging.info("StatisticsGen: %s needs stock's Beam job", reason)
            super().Do(input_dict, output_dict, exec_properties)
            return

        exclude = json_utils.loads(exec_properties.get(specs.EXCLUDE_SPLITS_KEY, "null")) or []
        if not isinstance(exclude, list):
            raise ValueError(f"exclude_splits in execution properties needs to be a list. "
                             f"Got {type(exclude)} instead.")
        splits = [s for s in artifact_utils.decode_split_names(examples.split_names)
                  if s not in exclude]
        if not splits:
            raise ValueError(f"No splits for examples artifact: {examples}")
        statistics = artifact_utils.get_single_instance(output_dict[specs.STATISTICS_KEY])
        statistics.split_names = artifact_utils.encode_split_names(splits)
        statistics.span = examples.span
        statistics.set_string_custom_property(stock.STATS_DASHBOARD_LINK, "")
        statistics.set_json_value_custom_property(
            stock.SAMPLE_RATE_BY_SPLIT_PROPERTY_NAME,
            json_utils.dumps({split: stats_options.sample_rate or 1.0 for split in splits}))
        written = engine.run(examples.uri, statistics.uri, splits, options,
                             stats_options.schema,
                             beam_pipeline_args=self._beam_pipeline_args,
                             make_pipeline=self._make_beam_pipeline)
        logging.info("StatisticsGen: %s", ", ".join(f"{split} {rows:,} examples"
                                                    for split, rows in written.items()))
