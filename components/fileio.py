"""File access for local paths and any filesystem TensorFlow's gfile knows (gs://, s3://, hdfs://).

One home for the few file operations the components share, so a different filesystem layer
is a change here and nowhere else.
"""
from __future__ import annotations

import json
from typing import Any, Optional


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def exists(path: str) -> bool:
    return _gfile().exists(path)


def isdir(path: str) -> bool:
    return _gfile().isdir(path)


def read_text(path: str) -> str:
    with _gfile().GFile(path, "r") as f:
        return f.read()


def write_text(path: str, text: str) -> None:
    with _gfile().GFile(path, "w") as f:
        f.write(text)


def read_json(path: str) -> Optional[Any]:
    """The JSON document at `path`, or None when there is no such file."""
    if not exists(path):
        return None
    return json.loads(read_text(path))


def write_json(path: str, value: Any, indent: Optional[int] = 2) -> None:
    write_text(path, json.dumps(value, indent=indent, sort_keys=True))


def copy_tree(source: str, destination: str) -> None:
    """Copies every file below `source` to the same place below `destination`."""
    gfile = _gfile()
    for root, _, names in gfile.walk(source):
        target = destination + root[len(source.rstrip("/")):]
        gfile.makedirs(target)
        for name in names:
            gfile.copy(f"{root.rstrip('/')}/{name}", f"{target.rstrip('/')}/{name}",
                       overwrite=True)
