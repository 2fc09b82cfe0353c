"""The packed-block layout, decided once from the schema stored beside packed data.

A block is one tf.Example holding N rows as column lists:
  `__rows__`             int64, one value: the rows really in this block (the last may be short)
  <fixed>                N * k values; a short block is padded with the schema default
  <variable>             the values of all N rows, concatenated
  <variable>__lengths    N int64s: values per row (0 for a missing value and for padding)
From layout version 2 on, a string feature is stored dictionary-coded instead of as <string>:
  <string>__dictionary   the block's distinct values
  <string>__codes        each value (as above: N * k, or concatenated) as its index there

The schema stored beside packed data is the *row* schema plus two annotation tags:
`tfrp.packed_rows=<N>` and `tfrp.packed_layout=<version>`. Schemas written before the version
tag existed carry `tfrp.packed_strings=dictionary` (version 2) or nothing (version 1).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Optional

import numpy as np
from tensorflow_metadata.proto.v0 import schema_pb2

from tfrecord_shards.codec import parser

ROWS_KEY = "__rows__"
LENGTHS_SUFFIX = "__lengths"
DICTIONARY_SUFFIX = "__dictionary"
CODES_SUFFIX = "__codes"
ROWS_TAG = "tfrp.packed_rows="
VERSION_TAG = "tfrp.packed_layout="
# Written by builds before VERSION_TAG; it means version 2.
LEGACY_DICTIONARY_TAG = "tfrp.packed_strings=dictionary"
PLAIN_STRINGS, DICTIONARY_STRINGS = 1, 2
CURRENT_VERSION = DICTIONARY_STRINGS


@dataclasses.dataclass(frozen=True)
class PackedFeature:
    """One row feature as a block stores it."""

    name: str
    type: int  # schema_pb2.FeatureType
    fixed_size: Optional[int]  # k values in every row, or None: variable, with lengths
    shape: tuple[int, ...]
    scalar: bool
    dictionary: bool  # strings stored as __dictionary + __codes
    default: object

    @property
    def values_key(self) -> str:
        return self.name + CODES_SUFFIX if self.dictionary else self.name

    @property
    def dictionary_key(self) -> str:
        return self.name + DICTIONARY_SUFFIX

    @property
    def lengths_key(self) -> str:
        return self.name + LENGTHS_SUFFIX

    @property
    def values_type(self) -> int:
        return schema_pb2.INT if self.dictionary else self.type


@dataclasses.dataclass(frozen=True)
class PackedLayout:
    rows: int
    version: int
    features: tuple[PackedFeature, ...]

    @classmethod
    def from_schema(cls, schema: schema_pb2.Schema) -> Optional["PackedLayout"]:
        """The layout `schema` describes, or None when the data is not packed."""
        rows = packed_rows(schema)
        if not rows:
            return None
        version = layout_version(schema)
        features = []
        for feature in schema.feature:
            fixed = parser.is_fixed(feature)
            shape = tuple(d.size for d in feature.shape.dim)
            features.append(PackedFeature(
                name=feature.name, type=feature.type,
                fixed_size=int(np.prod(shape)) if fixed and shape else (1 if fixed else None),
                shape=shape, scalar=parser.is_scalar(feature),
                dictionary=version >= DICTIONARY_STRINGS and feature.type == schema_pb2.BYTES,
                default=parser.default_value(feature)))
        return cls(rows, version, tuple(features))

    def feature(self, name: str) -> PackedFeature:
        for feature in self.features:
            if feature.name == name:
                return feature
        raise KeyError(f"feature {name!r} is not in the packed schema")

    def block_schema(self) -> schema_pb2.Schema:
        """The schema of the blocks themselves (every column a list): what a decoder of the
        stored records is given."""
        blocks = schema_pb2.Schema()
        blocks.feature.add(name=ROWS_KEY, type=schema_pb2.INT)
        for feature in self.features:
            if feature.dictionary:
                blocks.feature.add(name=feature.dictionary_key, type=schema_pb2.BYTES)
            blocks.feature.add(name=feature.values_key, type=feature.values_type)
            if feature.fixed_size is None:
                blocks.feature.add(name=feature.lengths_key, type=schema_pb2.INT)
        return blocks


def packed_rows(schema: schema_pb2.Schema) -> int:
    """N when `schema` describes packed data, else 0."""
    for tag in schema.annotation.tag:
        if tag.startswith(ROWS_TAG):
            return int(tag[len(ROWS_TAG):])
    return 0


def layout_version(schema: schema_pb2.Schema) -> int:
    for tag in schema.annotation.tag:
        if tag.startswith(VERSION_TAG):
            return int(tag[len(VERSION_TAG):])
    return DICTIONARY_STRINGS if LEGACY_DICTIONARY_TAG in schema.annotation.tag \
        else PLAIN_STRINGS


def annotate(schema: schema_pb2.Schema, rows: int,
             version: int = CURRENT_VERSION) -> schema_pb2.Schema:
    """The schema of data packed `rows` to a block (in the current layout unless an older
    `version` is asked for, which only tests of old data do)."""
    packed = copy.deepcopy(schema)
    kept = [t for t in packed.annotation.tag if not t.startswith((ROWS_TAG, VERSION_TAG))
            and t != LEGACY_DICTIONARY_TAG]
    del packed.annotation.tag[:]
    packed.annotation.tag.extend(kept + [f"{ROWS_TAG}{rows}", f"{VERSION_TAG}{version}"])
    return packed
