"""The fast Evaluator's executor: a thin adapter from TFX's artifacts to `evaluate.evaluate`
(in this process) or `beam_job.run` (a Beam pipeline, on the runner the pipeline's Beam args
name; `beam_job.runs_on_beam` decides), with stock's config handling before it and stock's
ModelBlessing after it."""
from __future__ import annotations

import logging
from typing import Any, Optional

import tensorflow_model_analysis as tfma
from tfx.components.evaluator import constants
from tfx.dsl.components.base import base_beam_executor, base_executor
from tfx.types import artifact_utils, standard_component_specs as keys
from tfx.utils import io_utils, json_utils, path_utils, proto_utils

from tfrecord_shards import fileio, tf_filesystems
from tfrecord_shards.codec import schema_file
from components.evaluator import beam_job, evaluate, stock_executor, transformed
from components.evaluator.options import EvaluatorOptions, UnsupportedSetting
from components.evaluator.stock_executor import without_empty_baseline
from tfrecord_shards.options import OPTIONS_KEY
from components.statistics_gen import releases


# Our input beside stock's: Transform's output of the same examples (optional).
TRANSFORMED_EXAMPLES_KEY = "transformed_examples"


class Executor(base_beam_executor.BaseBeamExecutor):
    """Stock's Evaluator executor, step for step, with the evaluation itself done by
    `evaluate.evaluate` in this process (no Beam args, or the DirectRunner in process), or
    by our Beam pipeline (`beam_job`) on any other runner, instead of TFMA on Beam: the
    eval config gets TFMA's defaults (a baseline model spec only with a baseline model;
    change thresholds dropped without one), validation runs only when thresholds are
    configured, and the blessing is written as stock writes it (BLESSED or NOT_BLESSED
    file; blessed, current_model, current_model_id, baseline_model, baseline_model_id,
    component_id properties)."""

    def Do(self, input_dict: dict[str, list], output_dict: dict[str, list],
           exec_properties: dict[str, Any]) -> None:
        if not releases.fast_path_tested("tensorflow-model-analysis", "Evaluator"):
            # The fast path calls TFMA internals that another release may have changed.
            stock_executor.Executor(_beam_context(self._context)).Do(
                input_dict, output_dict,
                {k: v for k, v in exec_properties.items() if k != OPTIONS_KEY})
            return
        input_dict = without_empty_baseline(input_dict)
        options = EvaluatorOptions.from_json(exec_properties.get(OPTIONS_KEY) or "{}")
        for unsupported in (keys.FEATURE_SLICING_SPEC_KEY, keys.MODULE_FILE_KEY,
                            keys.MODULE_PATH_KEY, keys.FAIRNESS_INDICATOR_THRESHOLDS_KEY):
            value = exec_properties.get(unsupported)
            if value and value != "null":
                raise UnsupportedSetting(
                    f"the fast Evaluator does not support {unsupported}; use StockEvaluator")
        if not exec_properties.get(keys.EVAL_CONFIG_KEY):
            raise ValueError("the Evaluator needs an eval_config")
        for key in (keys.MODEL_KEY, keys.BASELINE_MODEL_KEY):
            if len(input_dict.get(key) or []) > 1:
                raise ValueError(f"There can be only one {key}, there are "
                                 f"{len(input_dict[key])}.")
        if not input_dict.get(keys.MODEL_KEY):
            raise ValueError("the fast Evaluator needs a model to score")

        eval_config = tfma.EvalConfig()
        proto_utils.json_to_proto(exec_properties[keys.EVAL_CONFIG_KEY], eval_config)
        has_baseline = bool(input_dict.get(keys.BASELINE_MODEL_KEY))
        # As stock: rubber stamp, so change thresholds are dropped while there is no baseline.
        eval_config = tfma.utils.update_eval_config_with_defaults(
            eval_config, has_baseline=has_baseline, rubber_stamp=True)
        tfma.utils.verify_eval_config(eval_config)
        run_validation = bool(tfma.metrics.metric_thresholds_from_metrics_specs(
            eval_config.metrics_specs, eval_config=eval_config))

        model_paths = {}
        for spec in eval_config.model_specs:
            artifact = artifact_utils.get_single_instance(
                input_dict[keys.BASELINE_MODEL_KEY if spec.is_baseline else keys.MODEL_KEY])
            model_paths[spec.name] = path_utils.serving_model_path(
                artifact.uri, path_utils.is_old_model_artifact(artifact))
            logging.info("Using %s as %s model.", model_paths[spec.name], spec.name)
        schema = None
        if input_dict.get(keys.SCHEMA_KEY):
            schema = schema_file.load_schema(io_utils.get_only_uri_in_dir(
                artifact_utils.get_single_uri(input_dict[keys.SCHEMA_KEY])))
        splits = json_utils.loads(exec_properties.get(keys.EXAMPLE_SPLITS_KEY) or "null") \
            or ["eval"]
        data_files = []
        for split in splits:
            for uri in artifact_utils.get_split_uris(input_dict[keys.EXAMPLES_KEY], split):
                data_files += split_files(uri)
        output_uri = artifact_utils.get_single_uri(output_dict[keys.EVALUATION_KEY])
        tf_filesystems.register_for(output_uri, *model_paths.values(), *data_files)
        transformed_split = _transformed_split(input_dict, splits)
        if beam_job.runs_on_beam(self._beam_pipeline_args):
            logging.info("Evaluator: a Beam pipeline on the runner of %s",
                         self._beam_pipeline_args)
            result = beam_job.run(eval_config, data_files, model_paths, output_uri,
                                  schema=schema, options=options,
                                  make_pipeline=self._make_beam_pipeline,
                                  temp_dir=self._beam_temp_dir(),
                                  transformed=transformed_split)
        else:
            result = evaluate.evaluate(eval_config, data_files, model_paths, output_uri,
                                       schema=schema, options=options,
                                       transformed=transformed_split)
        logging.info("Evaluation complete. Results written to %s.", output_uri)

        if not run_validation:
            logging.info("No threshold configured, will not validate model.")
            return
        write_blessing(artifact_utils.get_single_instance(output_dict[keys.BLESSING_KEY]),
                       input_dict, exec_properties, result.validation.validation_ok)

    def _beam_temp_dir(self) -> Optional[str]:
        """The executor's temp folder, which the Beam pipeline's workers can write too (the
        pipeline root's); None (a local one) without a context giving one."""
        if self._context is None or not self._context._tmp_dir:  # noqa: SLF001 - no getter
            return None
        return fileio.join(self._get_tmp_dir(), "evaluator")


def _beam_context(context: Optional[base_executor.BaseExecutor.Context]
                  ) -> Optional[base_beam_executor.BaseBeamExecutor.Context]:
    """Our executor's context as stock's Beam executor takes it: as it is (the component
    is a Beam component, so TFX gives it the pipeline's Beam args), or with Beam's defaults
    for a plain executor context."""
    if context is None or isinstance(context, base_beam_executor.BaseBeamExecutor.Context):
        return context
    return base_beam_executor.BaseBeamExecutor.Context(
        extra_flags=context.extra_flags, executor_output_uri=context.executor_output_uri,
        tmp_dir=context._tmp_dir, unique_id=context._unique_id,  # noqa: SLF001 - no getters
        stateful_working_dir=context.stateful_working_dir,
        pipeline_node=context.pipeline_node, pipeline_info=context.pipeline_info,
        pipeline_run_id=context.pipeline_run_id)


def _transformed_split(input_dict: dict[str, list], splits: list[str]
                       ) -> Optional[transformed.TransformedSplit]:
    """Transform's output of the one Examples artifact evaluated, when it pairs row for row."""
    if not input_dict.get(TRANSFORMED_EXAMPLES_KEY):
        return None
    if len(input_dict[keys.EXAMPLES_KEY]) != 1:
        logging.info("Evaluator: scoring the raw records: %d Examples artifacts",
                     len(input_dict[keys.EXAMPLES_KEY]))
        return None
    found, why_not = transformed.transformed_split(
        artifact_utils.get_single_uri(input_dict[TRANSFORMED_EXAMPLES_KEY]),
        artifact_utils.get_single_uri(input_dict[keys.EXAMPLES_KEY]), splits)
    if found is None:
        logging.info("Evaluator: scoring the raw records: %s", why_not)
    return found


def split_files(split_uri: str) -> list[str]:
    """The files of a split folder, as stock reads them (`<split>/*`), hidden ones left out."""
    if not fileio.isdir(split_uri):
        raise FileNotFoundError(f"{split_uri}: no such split folder")
    files = [fileio.join(split_uri, name) for name in sorted(fileio.listdir(split_uri))
             if not fileio.is_hidden(name)]
    return [path for path in files if not fileio.isdir(path)]


def write_blessing(blessing: Any, input_dict: dict[str, list], exec_properties: dict[str, Any],
                   blessed: bool) -> None:
    """The ModelBlessing exactly as stock's executor writes it."""
    blessing.set_string_custom_property(
        constants.ARTIFACT_PROPERTY_CURRENT_MODEL_URI_KEY,
        artifact_utils.get_single_uri(input_dict[keys.MODEL_KEY]))
    blessing.set_int_custom_property(constants.ARTIFACT_PROPERTY_CURRENT_MODEL_ID_KEY,
                                     input_dict[keys.MODEL_KEY][0].id)
    if input_dict.get(keys.BASELINE_MODEL_KEY):
        baseline = input_dict[keys.BASELINE_MODEL_KEY][0]
        blessing.set_string_custom_property(constants.ARTIFACT_PROPERTY_BASELINE_MODEL_URI_KEY,
                                            baseline.uri)
        blessing.set_int_custom_property(constants.ARTIFACT_PROPERTY_BASELINE_MODEL_ID_KEY,
                                         baseline.id)
    if "current_component_id" in exec_properties:
        blessing.set_string_custom_property("component_id",
                                            exec_properties["current_component_id"])
    name = constants.BLESSED_FILE_NAME if blessed else constants.NOT_BLESSED_FILE_NAME
    fileio.makedirs(blessing.uri)
    fileio.write_text(fileio.join(blessing.uri, name), "")
    blessing.set_int_custom_property(
        constants.ARTIFACT_PROPERTY_BLESSED_KEY,
        constants.BLESSED_VALUE if blessed else constants.NOT_BLESSED_VALUE)
    logging.info("Blessing result %s written to %s.", blessed, blessing.uri)
