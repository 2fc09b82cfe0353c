"""ShardedTransform's TFX executor: a thin adapter from TFX's artifacts to the Beam job."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

import tensorflow_transform as tft
from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils
from tfx.utils import io_utils

from components.example_gen import artifacts as tfx_artifacts
from tfrecord_shards import fileio, shards
from tfrecord_shards.codec import parser, schema_file
from tfrecord_shards.options import OPTIONS_KEY
from components.transform import beam_job, feature_stats
from components.transform.inputs import dataset_key
from components.transform.options import TransformOptions
from components.transform.preprocessing import load_preprocessing_fn


class AnomaliesFound(ValueError):
    """ExampleValidator found anomalies, and the pipeline gates on them."""


def check_anomalies(anomalies) -> None:
    """Raises AnomaliesFound listing every anomaly in the ExampleAnomalies artifact."""
    found = tfx_artifacts.split_anomalies(
        anomalies.uri, artifact_utils.decode_split_names(anomalies.split_names), described=True,
        required=True)
    listed = [f"{split}: {item}" for split, items in found.items() for item in items]
    if listed:
        raise AnomaliesFound(
            f"ExampleValidator found {len(listed)} anomalies, so Transform did not run "
            "(fix the data or the schema, or set fail_on_anomalies=false to go on): "
            + "; ".join(listed))


class Executor(base_beam_executor.BaseBeamExecutor):
    """Writes TransformGraph, transformed Examples (Split-*/, schema.pbtxt, manifest.json) and
    the post-transform Schema, which carries the packing for the Trainer."""

    def Do(self, input_dict: dict[str, list], output_dict: dict[str, list],
           exec_properties: dict[str, Any]) -> None:
        options = TransformOptions.from_json(exec_properties[OPTIONS_KEY])
        if options.fail_on_anomalies and input_dict.get("anomalies"):
            check_anomalies(artifact_utils.get_single_instance(input_dict["anomalies"]))
        # A window of spans comes as several artifacts, in span order.
        window = sorted(input_dict["examples"], key=lambda a: (a.span, a.version))
        schema_uri = artifact_utils.get_single_uri(input_dict["schema"])
        given_schema = schema_file.load_schema(io_utils.get_only_uri_in_dir(schema_uri))
        raw_schema = beam_job.mark_images(given_schema, beam_job.shards_schema(window[0].uri))
        graph = artifact_utils.get_single_instance(output_dict["transform_graph"])
        transformed = artifact_utils.get_single_instance(output_dict["transformed_examples"])
        cache = artifact_utils.get_single_uri(output_dict["updated_analyzer_cache"])
        post_schema = artifact_utils.get_single_uri(output_dict["post_transform_schema"])
        # Stock's statistics outputs, unless disabled (then the component declares none).
        statistics = {} if options.disable_statistics else {
            name: artifact_utils.get_single_uri(output_dict[name])
            for name in feature_stats.STATISTICS_OUTPUTS if output_dict.get(name)}
        for output in (graph.uri, transformed.uri, post_schema, *statistics.values()):
            shards.clear_earlier_attempt(output)
        for given in input_dict.get("analyzer_cache") or []:
            beam_job.copy_cache(given.uri, options.analyzer_cache_dir or cache)
        splits = artifact_utils.decode_split_names(window[0].split_names)
        columns = statistics_columns(options, raw_schema) if statistics else []
        from_passes = feature_stats.pass_statistics(
            [a.uri for a in window], options.analyze_split, raw_schema, columns,
            parser.active_schema(raw_schema)) if statistics else None
        manifest = beam_job.run(
            dataclasses.replace(options, analyzer_cache_dir=options.analyzer_cache_dir or cache),
            [a.uri for a in window], raw_schema, graph.uri, transformed.uri,
            make_pipeline=self._make_beam_pipeline, splits=splits, statistics=from_passes)
        if options.analyzer_cache_dir:  # the kept folder: this window's entries, as stock
            beam_job.copy_cache(options.analyzer_cache_dir, cache,
                                [dataset_key(a.uri) for a in window])
        # The transformed rows are the inputs' spans: stock's properties hold the last.
        tfx_artifacts.set_examples_properties(transformed, list(manifest["splits"]),
                                              window[-1].span, window[-1].version)
        if len(window) > 1:
            tfx_artifacts.set_spans(transformed, tfx_artifacts.SPANS, [a.span for a in window])
        span_of = {a.uri: a.span for a in window}
        for name, uris in ((tfx_artifacts.ANALYSED_SPANS, manifest["analysis"]["analysed"]),
                           (tfx_artifacts.CACHED_SPANS, manifest["analysis"]["from_cache"])):
            tfx_artifacts.set_spans(transformed, name, [span_of[u] for u in uris])
        transformed.set_int_custom_property("rows_written", manifest["rows_written"])
        # The post-transform Schema is the schema stored beside the transformed shards.
        fileio.makedirs(post_schema)  # only LocalDagRunner makes output folders beforehand
        schema_file.write_schema(schema_file.load_schema(transformed.uri),
                                 fileio.join(post_schema, schema_file.SCHEMA_FILE))
        if statistics:
            write_statistics(statistics, options, window, given_schema, raw_schema, columns,
                             graph.uri, transformed.uri, list(manifest["splits"]), from_passes)


def statistics_columns(options: TransformOptions, raw_schema) -> list[str]:
    """The raw columns the pre-transform statistics cover: those the preprocessing_fn
    reads."""
    active = parser.active_schema(raw_schema)
    return feature_stats.input_columns(load_preprocessing_fn(options, active), active)


def write_statistics(uris: dict[str, str], options: TransformOptions, window: list,
                     given_schema, raw_schema, columns: list[str], graph_uri: str,
                     transformed_uri: str, splits: list[str],
                     from_passes: Optional[feature_stats.PassStatistics] = None) -> None:
    """Stock's statistics outputs: the pre-transform schema is the one given; the
    statistics take the raw schema with our ExampleGen's image marks (image bytes get bytes
    statistics, not top values of JPEG data) and the transformed one. Those the passes took
    (`from_passes`) are used as they are."""
    found = feature_stats.write_outputs(
        uris, [a.uri for a in window], options.analyze_split, given_schema, raw_schema,
        columns, transformed_uri, splits,
        tft.TFTransformOutput(graph_uri).transformed_metadata.schema, from_passes)
    if found:
        # Stock only records them; ExampleValidator's gate is before Transform.
        logging.warning("Post-transform anomalies (%s): %s",
                        uris[feature_stats.POST_TRANSFORM_ANOMALIES],
                        ", ".join(sorted(found)))
