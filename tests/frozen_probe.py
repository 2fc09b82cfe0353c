"""A TFX executor for tests/test_memory.py: its Do writes how many objects the garbage
collector's passes leave out (`gc.get_freeze_count`) to the file its `probe_path` names."""
from __future__ import annotations

import gc
import json

from tfx.dsl.components.base import base_executor


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: dict, output_dict: dict, exec_properties: dict) -> None:
        with open(exec_properties["probe_path"], "w") as out:
            json.dump({"frozen": gc.get_freeze_count()}, out)
