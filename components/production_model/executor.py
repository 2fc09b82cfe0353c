"""ProductionModel's TFX executor: a thin adapter from the Model artifact to `find`."""
from __future__ import annotations

import logging
from typing import Any

from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils
from tfx.utils import path_utils

from tfrecord_shards import fileio
from tfrecord_shards.options import OPTIONS_KEY
from components.production_model import find
from components.production_model.options import ProductionModelOptions



class Executor(base_executor.BaseExecutor):
    """Copies the newest pushed model into the artifact's Format-Serving folder, where stock
    components look for a model. Before the first push the artifact is an empty folder, which
    the Evaluator and the Trainer take as "no production model yet"."""

    def Do(self, input_dict: dict[str, list], output_dict: dict[str, list],
           exec_properties: dict[str, Any]) -> None:
        options = ProductionModelOptions.from_json(exec_properties[OPTIONS_KEY])
        model = artifact_utils.get_single_instance(output_dict["model"])
        fileio.makedirs(model.uri)  # only LocalDagRunner makes output folders beforehand
        latest = find.latest_pushed(options.serving_dir)
        model.set_string_custom_property(find.PUSHED_MODEL, latest or "")
        if latest is None:
            logging.info("ProductionModel: nothing pushed to %s yet", options.serving_dir)
            return
        fileio.copy_tree(latest, path_utils.serving_model_dir(model.uri))


def has_model(model_uri: str) -> bool:
    """Whether a Model artifact holds a model (a ProductionModel before the first push does
    not)."""
    return fileio.exists(path_utils.serving_model_path(model_uri))
