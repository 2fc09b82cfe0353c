"""File access for local paths and any filesystem TensorFlow's gfile knows (gs://, s3://, hdfs://).

One home for the few file operations the components share, so a different filesystem layer
is a change here and nowhere else. Local paths use Python's own file functions, so readers
that run without TensorFlow (components/numpy_reader.py) can use this module.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def _remote(path: str) -> bool:
    return "://" in path


def open_file(path: str, mode: str = "rb"):
    return _gfile().GFile(path, mode) if _remote(path) else open(path, mode)


def append_range(source: str, start: int, length: int, out) -> None:
    """Appends `length` bytes of `source`, from offset `start`, to the open file `out`. Between
    two local files the kernel copies them (copy_file_range: no trip through Python's memory);
    otherwise, or where the filesystem refuses, they are read and written."""
    if not _remote(source) and hasattr(os, "copy_file_range") and hasattr(out, "fileno"):
        out.flush()
        copied = 0
        try:
            with open(source, "rb") as f:
                while copied < length:
                    step = os.copy_file_range(f.fileno(), out.fileno(), length - copied,
                                              offset_src=start + copied)
                    if step == 0:
                        raise _short_range(source, start, length, copied)
                    copied += step
            return
        except OSError:
            if copied:  # part of the range is written: going on would duplicate it
                raise
    with open_file(source, "rb") as f:
        f.seek(start)
        data = f.read(length)
    if len(data) != length:
        raise _short_range(source, start, length, len(data))
    out.write(data)


def _short_range(source: str, start: int, length: int, found: int) -> EOFError:
    return EOFError(f"{source}: {length} bytes asked for at offset {start}, only {found} there")


def exists(path: str) -> bool:
    return _gfile().exists(path) if _remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    return _gfile().isdir(path) if _remote(path) else os.path.isdir(path)


def listdir(path: str) -> list[str]:
    return [n.rstrip("/") for n in _gfile().listdir(path)] if _remote(path) \
        else sorted(os.listdir(path))


def walk(path: str):
    return _gfile().walk(path) if _remote(path) else os.walk(path)


def glob(pattern: str) -> list[str]:
    import glob as local_glob

    return _gfile().glob(pattern) if _remote(pattern) else local_glob.glob(pattern)


def makedirs(path: str) -> None:
    _gfile().makedirs(path) if _remote(path) else os.makedirs(path, exist_ok=True)


def size(path: str) -> int:
    return _gfile().stat(path).length if _remote(path) else os.path.getsize(path)


def remove(path: str) -> None:
    _gfile().remove(path) if _remote(path) else os.remove(path)


def rmtree(path: str) -> None:
    import shutil

    _gfile().rmtree(path) if _remote(path) else shutil.rmtree(path)


def rename(source: str, destination: str) -> None:
    """Moves a file or folder (on object stores, gfile copies a folder object by object)."""
    _gfile().rename(source, destination, overwrite=True) if _remote(source) else \
        os.rename(source, destination)


def read_text(path: str) -> str:
    with open_file(path, "r") as f:
        return f.read()


def write_text(path: str, text: str) -> None:
    with open_file(path, "w") as f:
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
