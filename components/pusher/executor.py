"""The Pusher's TFX executor: stock's checks and PushedModel properties, with the copy into
the serving folder done by `push.push` (a unique version, staged, marked complete last)."""
from __future__ import annotations

import logging
from typing import Any

from tfx.components.pusher import executor as stock
from tfx.proto import pusher_pb2
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import proto_utils

from tfrecord_shards import fileio
from components.pusher import push

_VERSIONING = pusher_pb2.Versioning


class Executor(stock.Executor):
    """Stock's Pusher executor (blessing checks, the model path, the archive copy in the
    PushedModel artifact, its `pushed`, `pushed_destination` and `pushed_version`), except
    where the model goes: stock names the version by the second, so two pushes within one
    second land in one folder and the second is silently dropped, and it copies in place,
    where TF Serving can see a half-copied folder."""

    def Do(self, input_dict: dict[str, list], output_dict: dict[str, list],
           exec_properties: dict[str, Any]) -> None:
        self._log_startup(input_dict, output_dict, exec_properties)
        model_push = artifact_utils.get_single_instance(
            output_dict[standard_component_specs.PUSHED_MODEL_KEY])
        if not self.CheckBlessing(input_dict):
            self._MarkNotPushed(model_push)
            return
        model_path = self.GetModelPath(input_dict)
        destination = pusher_pb2.PushDestination()
        proto_utils.json_to_proto(
            exec_properties[standard_component_specs.PUSH_DESTINATION_KEY], destination)
        kind = destination.WhichOneof("destination")
        if kind != "filesystem":
            raise NotImplementedError(f"Pusher: push destination {kind!r}; only filesystem")
        # Ours is a Unix time too, in microseconds: what AUTO and UNIX_TIMESTAMP ask for.
        if destination.filesystem.versioning not in (_VERSIONING.AUTO,
                                                     _VERSIONING.UNIX_TIMESTAMP):
            raise NotImplementedError(
                f"Pusher: versioning {destination.filesystem.versioning}")
        pushed = push.push(model_path, destination.filesystem.base_directory)
        logging.info("Pusher: model written to %s", pushed.destination)
        fileio.copy_tree(model_path, model_push.uri)  # stock's archive copy
        self._MarkPushed(model_push, pushed_destination=pushed.destination,
                         pushed_version=str(pushed.version))
