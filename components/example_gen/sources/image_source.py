"""An image folder: labels.csv (filename,label[,extra...]) and the image files it names."""
from __future__ import annotations

import io
import posixpath
import re
from typing import Iterator, Optional

import pyarrow as pa
from PIL import Image, UnidentifiedImageError

from tfrecord_shards import fileio
from tfrecord_shards.codec import serializer
from components.example_gen.sources.base import (
    BadRecord, FileProfile, Item, SourceError, SourceFormat)
from components.example_gen.sources.csv_source import profile_csv, read_csv

LABELS_FILE = "labels.csv"
IMAGE_FEATURE = "image"
IMAGE_COLUMNS = {IMAGE_FEATURE: (serializer.BYTES, False), "height": (serializer.INT, False),
                 "width": (serializer.INT, False), "channels": (serializer.INT, False),
                 "format": (serializer.BYTES, False)}
# What tf.io.decode_image reads, by PIL's format names.
TRAINER_FORMATS = ("jpeg", "png", "gif", "bmp", "webp")
_CHANNELS = {"1": 1, "L": 1, "P": 1, "LA": 2, "RGB": 3, "YCbCr": 3, "RGBA": 4, "CMYK": 4,
             "I": 1, "F": 1, "I;16": 1}


def read_images(labels_path: str, kinds: Optional[dict] = None
                ) -> Iterator[Item]:
    """labels.csv (filename,label[,extra...]) joined with the image files it names.

    The image keeps its original encoded bytes; each is decoded once here, whole, so a
    truncated or damaged file is set aside (or, with on_bad_record=fail, refused) here and not
    in the middle of training; a format the Trainer's decoder (tf.io.decode_image) does not
    read is set aside too.
    """
    folder = fileio.dirname(labels_path)
    label_kinds = None if kinds is None else {
        k: v for k, v in kinds.items() if k not in IMAGE_COLUMNS}
    for item in read_csv(labels_path, label_kinds):
        if isinstance(item, BadRecord):
            yield item
            continue
        if "filename" not in item.schema.names or "label" not in item.schema.names:
            raise SourceError(f"{labels_path}: the header must start with filename,label")
        names = item.column(item.schema.get_field_index("filename")).to_pylist()
        keep, columns = [], {k: [] for k in IMAGE_COLUMNS}
        for row, name in enumerate(names):
            name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            # Normalised as a name inside the folder, never the folder's URI (gs:// stays).
            inside = posixpath.normpath(name.replace("\\", "/"))
            path = fileio.join(folder, inside)
            if inside.startswith(("../", "/")) or inside in ("..", "."):
                yield BadRecord(labels_path, f"filename {name!r}", "path leaves the folder")
                continue
            try:  # one look, not an exists() and a read: on a bucket each is a request
                data = fileio.read_bytes(path)
            except FileNotFoundError:
                yield BadRecord(labels_path, f"filename {name!r}", "image file missing")
                continue
            except OSError as e:
                yield BadRecord(path, "offset 0", f"unreadable file: {_reason(e)}")
                continue
            try:
                with Image.open(io.BytesIO(data)) as image:
                    width, height = image.size
                    channels = _CHANNELS.get(image.mode, len(image.getbands()))
                    fmt = (image.format or "").lower()
                    image.load()  # the whole decode: a truncated file fails here
            except UnidentifiedImageError:
                yield BadRecord(path, "offset 0", "empty file" if not data else
                                "not an image (no image format recognised)")
                continue
            except (OSError, SyntaxError, ValueError) as e:
                yield BadRecord(path, "offset 0", f"damaged image: {_reason(e)}")
                continue
            if fmt not in TRAINER_FORMATS:
                yield BadRecord(path, "offset 0", f"{fmt.upper() or 'unknown'} images are not "
                                f"read by the Trainer's decoder (it reads "
                                f"{', '.join(f.upper() for f in TRAINER_FORMATS)})")
                continue
            keep.append(row)
            for key, value in (("image", data), ("height", height), ("width", width),
                               ("channels", channels), ("format", fmt.encode())):
                columns[key].append(value)
        if not keep:
            continue
        labels = item.take(pa.array(keep, pa.int64()))
        arrays = [pa.array(columns["image"], pa.binary()), pa.array(columns["height"]),
                  pa.array(columns["width"]), pa.array(columns["channels"]),
                  pa.array(columns["format"], pa.binary())]
        extra = [n for n in labels.schema.names if n != "filename"]
        arrays += [labels.column(labels.schema.get_field_index(n)) for n in extra]
        yield pa.RecordBatch.from_arrays(arrays, list(IMAGE_COLUMNS) + extra)


def _reason(error: Exception) -> str:
    """The library's message without the object reprs some carry (`<... at 0x7f...>`)."""
    text = re.sub(r"\s*<[^<>]* at 0x[0-9a-f]+>", "", str(error)).strip()
    return text or type(error).__name__


def profile_images(path: str) -> tuple[FileProfile, int]:
    """The labels' profile plus the image columns, which every readable image has."""
    labels, bad = profile_csv(path)
    profile = FileProfile(rows=labels.rows)
    for name, kind in IMAGE_COLUMNS.items():
        profile.columns[name], profile.non_null[name] = kind, labels.rows
    for name, kind in labels.columns.items():
        if name != "filename":
            profile.columns[name], profile.non_null[name] = kind, labels.non_null[name]
            profile.string_values[name] = labels.string_values.get(name, set())
    return profile, bad


FORMAT = SourceFormat("images", (), read_images, profile_images, folder_marker=LABELS_FILE)
