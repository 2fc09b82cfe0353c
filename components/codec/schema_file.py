"""`schema.pbtxt`: the text-format tensorflow_metadata Schema stored beside every output."""
from __future__ import annotations

import posixpath

from tensorflow_metadata.proto.v0 import schema_pb2

from components import fileio

SCHEMA_FILE = "schema.pbtxt"


def load_schema(path: str) -> schema_pb2.Schema:
    """Reads a text-format Schema; `path` may be the file or the folder holding schema.pbtxt."""
    from google.protobuf import text_format

    if fileio.isdir(path):
        path = posixpath.join(path.rstrip("/"), SCHEMA_FILE)
    return text_format.Parse(fileio.read_text(path), schema_pb2.Schema())


def write_schema(schema: schema_pb2.Schema, path: str) -> None:
    from google.protobuf import text_format

    fileio.write_text(path, text_format.MessageToString(schema))
