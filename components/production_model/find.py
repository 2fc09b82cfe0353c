"""The model in production: the newest version the Pusher wrote to its push destination.
No TFX here: the component, the CLI and the tests share it."""
from __future__ import annotations

from typing import Optional

from components import fileio

SAVED_MODEL_FILE = "saved_model.pb"
# The ProductionModel artifact's property naming the pushed folder it is a copy of.
PUSHED_MODEL = "pushed_model"


def latest_pushed(serving_dir: str) -> Optional[str]:
    """The newest complete version folder under `serving_dir` (the Pusher names each push by
    its Unix time), or None before the first push. A folder without saved_model.pb is a push
    that did not finish, not a model."""
    if not fileio.isdir(serving_dir):
        return None
    versions = sorted((int(name), name) for name in fileio.listdir(serving_dir)
                      if name.isdigit())
    for _, name in reversed(versions):
        folder = fileio.join(serving_dir, name)
        if fileio.exists(fileio.join(folder, SAVED_MODEL_FILE)):
            return folder
    return None


def serving_state(serving_dir: str) -> str:
    """What the pipeline knows of the serving folder when it is built (its newest model's
    version, or nothing): a parameter of the step, so a new push makes the cached step run
    again on LocalDagRunner. A compiled pipeline turns the step's cache off instead."""
    latest = latest_pushed(serving_dir)
    return fileio.basename(latest) if latest else ""
