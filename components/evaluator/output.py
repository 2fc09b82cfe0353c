"""The ModelEvaluation folder as TFMA leaves it: the validation result, from TFMA's own
validator and its writer's combiner (`validate`), and the files its writers write
(`write_evaluation`)."""
from __future__ import annotations

from typing import Any, Sequence

from tensorflow_model_analysis.evaluators import metrics_validator
from tensorflow_model_analysis.proto import metrics_for_slice_pb2
from tensorflow_model_analysis.slicer import slicer_lib
from tensorflow_model_analysis.writers import eval_config_writer
from tensorflow_model_analysis.writers import metrics_plots_and_validations_writer as writer

from tfrecord_shards import fileio, tfrecord_io

# TFMA's output files (writers/metrics_plots_and_validations_writer.py with the default
# tfrecord format: one shard of each sliced output, one unsharded validation result).
METRICS_FILE = "metrics-00000-of-00001.tfrecord"
PLOTS_FILE = "plots-00000-of-00001.tfrecord"
ATTRIBUTIONS_FILE = "attributions-00000-of-00001.tfrecord"
VALIDATIONS_FILE = "validations.tfrecord"
EVAL_CONFIG_FILE = "eval_config.json"
# Ours, beside TFMA's: how serving_default compared with the transformed split's scores.
SERVING_CHECK_FILE = "serving_check.json"


def validate(sliced_metrics: Sequence[tuple], eval_config: Any) -> Any:
    """TFMA's validation result: `metrics_validator.validate_metrics` on each slice, merged by
    the writer's `CombineValidations` (no rubber stamp, as TFX's executor runs it)."""
    combine = writer.CombineValidations(eval_config, rubber_stamp=False)
    merged = combine.create_accumulator()
    for sliced in sliced_metrics:
        merged = combine.add_input(merged, metrics_validator.validate_metrics(sliced,
                                                                               eval_config))
    return combine.extract_output(merged)


def write_evaluation(output_uri: str, eval_config: Any, sliced_metrics: Sequence[tuple],
                     validation: Any, model_locations: dict[str, str],
                     data_files: Sequence[str], serving_check: Any = None) -> None:
    """The files TFMA's writers leave in a ModelEvaluation folder: eval_config.json, one
    MetricsForSlice a slice, an empty PlotsForSlice and AttributionsForSlice a slice (what
    stock writes when no plot is configured) and the ValidationResult; and, when the
    transformed split was scored, the check against serving_default (`SERVING_CHECK_FILE`)."""
    fileio.makedirs(output_uri)
    metrics, plots, attributions = [], [], []
    for slice_key, values in sliced_metrics:
        metrics.append(writer.convert_slice_metrics_to_proto(
            (slice_key, values), add_metrics_callbacks=None).SerializeToString())
        key = slicer_lib.serialize_slice_key(slice_key)
        plots.append(metrics_for_slice_pb2.PlotsForSlice(slice_key=key).SerializeToString())
        attributions.append(metrics_for_slice_pb2.AttributionsForSlice(
            slice_key=key).SerializeToString())
    for name, records in ((METRICS_FILE, metrics), (PLOTS_FILE, plots),
                          (ATTRIBUTIONS_FILE, attributions),
                          (VALIDATIONS_FILE, [validation.SerializeToString()])):
        fileio.write_bytes(fileio.join(output_uri, name),
                           tfrecord_io.frame_records(records)[0].tobytes())
    folders = sorted({fileio.dirname(path) for path in data_files})
    fileio.write_text(fileio.join(output_uri, EVAL_CONFIG_FILE),
                      eval_config_writer._serialize_eval_run(  # noqa: SLF001 - TFMA's format
                          eval_config, ",".join(folders), "tfrecords", model_locations))
    if serving_check is not None:
        fileio.write_json(fileio.join(output_uri, SERVING_CHECK_FILE), {
            "rows": serving_check.rows,
            "largest_difference": serving_check.largest_difference,
            "tolerance": serving_check.tolerance, "refusal": serving_check.refusal})
