"""`schema.pbtxt`: the text-format tensorflow_metadata Schema stored beside every output."""
from __future__ import annotations

import posixpath
from typing import Optional

from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards import fileio

SCHEMA_FILE = "schema.pbtxt"
# A shard sits in Split-x/ (and maybe col=value/) below the folder holding the schema.
_SCHEMA_SEARCH_DEPTH = 3


def load_schema(path: str) -> schema_pb2.Schema:
    """Reads a text-format Schema; `path` may be the file or the folder holding schema.pbtxt."""
    if fileio.isdir(path):
        path = posixpath.join(path.rstrip("/"), SCHEMA_FILE)
    return text_format.Parse(fileio.read_text(path), schema_pb2.Schema())


def write_schema(schema: schema_pb2.Schema, path: str) -> None:
    fileio.write_text(path, text_format.MessageToString(schema))


def find_schema(path: str) -> Optional[schema_pb2.Schema]:
    """schema.pbtxt in `path` or up to three folders above it (shard -> Split-x -> artifact)."""
    folder = path if fileio.isdir(path) else fileio.dirname(path)
    for _ in range(_SCHEMA_SEARCH_DEPTH + 1):
        candidate = fileio.join(folder, SCHEMA_FILE)
        if fileio.exists(candidate):
            return load_schema(candidate)
        folder = fileio.dirname(folder.rstrip("/"))
    return None
