"""ShardedExampleGen's TFX executor: a thin adapter from TFX's artifacts to `engine.run`
(the Beam job, or the Spark job with `engine="spark"`)."""
from __future__ import annotations

from typing import Any

from tfx.components.example_gen import utils as example_gen_utils
from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils

from components.example_gen import artifacts as tfx_artifacts
from tfrecord_shards import shards
from components.example_gen import engine, inputs
from components.example_gen.options import ExampleGenOptions
from tfrecord_shards.options import OPTIONS_KEY


class Executor(base_beam_executor.BaseBeamExecutor):
    """Writes a standard Examples artifact: Split-<name>/ shards, schema.pbtxt, manifest.json."""

    def Do(self, input_dict: dict[str, list], output_dict: dict[str, list],
           exec_properties: dict[str, Any]) -> None:
        options = ExampleGenOptions.from_json(exec_properties[OPTIONS_KEY])
        examples = artifact_utils.get_single_instance(output_dict["examples"])
        shards.clear_earlier_attempt(examples.uri)
        manifest = engine.run(options, examples.uri, make_pipeline=self._make_beam_pipeline)
        tfx_artifacts.set_examples_properties(examples, shards.split_names(manifest),
                                              options.span, options.version)
        # Stock's fingerprint of the files when stock's utilities resolved the inputs (spans,
        # pre-split patterns); else the files read and their rows.
        stock = inputs.stock_fingerprint(options.source_fingerprint)
        examples.set_string_custom_property(
            example_gen_utils.FINGERPRINT_PROPERTY_NAME,
            stock or ",".join(f"{s['path']}:{s['rows_in']}" for s in manifest["sources"]))
        if options.resolved_spans:  # a range: stock's span property holds its last span
            tfx_artifacts.set_spans(examples, tfx_artifacts.SPANS, options.resolved_spans)
        examples.set_int_custom_property("rows_written", manifest["rows_written"])
        examples.set_int_custom_property("rows_quarantined", manifest["rows_quarantined"])
        examples.set_int_custom_property("rows_unlabelled", manifest.get("rows_unlabelled", 0))
