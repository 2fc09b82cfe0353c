"""The model in production: the newest version the Pusher wrote to its push destination.
No TFX here: the component, the CLI and the tests share it."""
from __future__ import annotations

from typing import Optional

from tfrecord_shards import fileio
from components.pusher import push

# The ProductionModel artifact's property naming the pushed folder it is a copy of.
PUSHED_MODEL = "pushed_model"


def latest_pushed(serving_dir: str) -> Optional[str]:
    """The newest complete version folder under `serving_dir`, or None before the first push.
    Complete means the Pusher's marker is there (components/pusher/push.py): a push still
    being copied, or killed part-way (on a bucket its numeric folder is written object by
    object), is not a model."""
    versions = push.pushed_versions(serving_dir)
    return versions[-1][1] if versions else None


def serving_state(serving_dir: str) -> str:
    """What the pipeline knows of the serving folder when it is built (its newest model's
    version, or nothing): a parameter of the step, so a new push makes the cached step run
    again on LocalDagRunner. A compiled pipeline turns the step's cache off instead."""
    latest = latest_pushed(serving_dir)
    return fileio.basename(latest) if latest else ""
