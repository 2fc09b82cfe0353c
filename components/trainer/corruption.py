"""Damaged TFRecord files in the Trainer's input: the error that names the file and offset
(TensorFlow's names neither), and, with skip_corrupt, the records salvaged past the damage.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional, Sequence

import tensorflow as tf

from tfrecord_shards import tfrecord_io


def locate_corruption(files: Sequence[str]) -> Optional[tfrecord_io.CorruptRecordError]:
    """The first damaged record among `files`, named by file and offset, or None."""
    for path in files:
        try:
            for _ in tfrecord_io.iter_records(path):
                pass
        except tfrecord_io.CorruptRecordError as error:
            return error
    return None


@contextlib.contextmanager
def corrupt_files_named(files: Sequence[str]) -> Iterator[None]:
    """Turns TensorFlow's "corrupted record at N" (which names no file) into an error that
    names the file and offset, found by re-reading the files with our framing reader."""
    try:
        yield
    except tf.errors.DataLossError as error:
        located = locate_corruption(files)
        if located is None:
            raise
        raise located from error


def scan_for_corruption(files: Sequence[str]) -> dict[str, list[tfrecord_io.CorruptRegion]]:
    """The damaged regions of each damaged file; each region and the totals are logged."""
    damaged: dict[str, list[tfrecord_io.CorruptRegion]] = {}
    for path in files:
        regions = [r for _, r in tfrecord_io.iter_records(path, resync=True)
                   if isinstance(r, tfrecord_io.CorruptRegion)]
        if regions:
            damaged[path] = regions
    for path, regions in damaged.items():
        for region in regions:
            logging.warning("skip_corrupt: skipping %d bytes at offset %d of %s (%s; %s)",
                            region.length, region.offset, path, region.reason, region.loss)
    logging.warning("skip_corrupt: %d corrupt region(s) skipped in %d of %d file(s)",
                    sum(len(r) for r in damaged.values()), len(damaged), len(files))
    return damaged


def _intact_records(path: str) -> Iterator[bytes]:
    for _, record in tfrecord_io.iter_records(path, resync=True):
        if isinstance(record, bytes):
            yield record


def with_salvaged_records(damaged: Sequence[str], seed: Optional[int]):
    """Mixes in the intact records of damaged files, read by our resynchronising reader, so
    every record after the damage still arrives (TF's reader drops the rest of the file)."""
    def apply(records: tf.data.Dataset) -> tf.data.Dataset:
        if not damaged:
            return records
        salvaged = tf.data.Dataset.from_generator(
            lambda: (r for path in damaged for r in _intact_records(path)),
            output_signature=tf.TensorSpec([], tf.string))
        return tf.data.Dataset.sample_from_datasets(
            [records, salvaged], seed=seed, stop_on_empty_dataset=False)
    return apply
