"""Map-style access to the rows of TFRecord shards, with no TensorFlow: `len(source)` and
`source[i]` for any row i, per-row and packed records alike, through each file's record index
(tfrecord_shards/record_index.py). `torch_dataset` gives the same source as a PyTorch map-style
`Dataset`, so `DataLoader(shuffle=True)` and `DistributedSampler` work as documented, and
`RowCollate` batches its rows, missing values included, as `numpy_reader` does. An
`ExampleSource` is itself a Grain `RandomAccessDataSource` (thread-safe, deterministic, and
pickled whole into Grain's worker processes), so Grain's samplers, sharding and iterator
checkpoints work on it unchanged.

Row i is the i-th row of a sequential read of the files in name order (the order
`example_rows.record_files` lists them)."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np
from tensorflow_metadata.proto.v0 import schema_pb2

from shard_readers import numpy_reader
from tfrecord_shards import example_rows, record_index, tfrecord_io
from tfrecord_shards.codec import schema_file
from tfrecord_shards.packing.arrow import RowDecoder


class ExampleSource:
    """Every row of `path` (a split folder, an artifact, or a file) or of `files`, decoded by
    the stored schema (or `schema`) to {feature: numpy array of the row's values}."""

    def __init__(self, path_or_files: Union[str, Sequence[str]],
                 schema: Optional[schema_pb2.Schema] = None,
                 features: Optional[Sequence[str]] = None):
        files = example_rows.record_files(path_or_files) if isinstance(path_or_files, str) \
            else list(path_or_files)
        if schema is None:
            schema = schema_file.find_schema(path_or_files if isinstance(path_or_files, str)
                                             else files[0])
        if schema is None:
            raise ValueError(f"{path_or_files}: no schema.pbtxt found above the data; pass "
                             f"schema=")
        self.files, self.schema = files, schema
        self.decoder = RowDecoder(schema, features)
        self.features = [f.name for f in self.decoder.schema.feature]
        self.readers = [record_index.RecordReader(record_index.load_or_build(f))
                        for f in files]
        # Packed files: the first row of each block (and the file's rows at the end).
        self._record_starts = [numpy_reader.FileRows.of(f, packed=True).block_starts
                               if self.decoder.layout else None for f in files]
        per_file = [len(reader) if starts is None else int(starts[-1])
                    for reader, starts in zip(self.readers, self._record_starts)]
        self._file_starts = np.concatenate([[0], np.cumsum(per_file)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self._file_starts[-1])

    def __getitem__(self, row: int) -> dict[str, np.ndarray]:
        if row < 0:
            row += len(self)
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} of {len(self)}")
        k = int(np.searchsorted(self._file_starts, row, side="right")) - 1
        record, within = row - int(self._file_starts[k]), 0
        starts = self._record_starts[k]
        if starts is not None:  # packed: the block holding the row, and where in it
            block_number = int(np.searchsorted(starts, record, side="right")) - 1
            record, within = block_number, record - int(starts[block_number])
        reader = self.readers[k]
        index = reader.index
        # The record's own offset names it in a decode error (a gzip record has none).
        offset = 0 if index.gzip else int(index.offsets[record])
        decoded = self.decoder.decode(tfrecord_io.RecordBlock.of_records(
            index.path, offset, [reader[record]]))
        # A missing value is an empty array, as in the numpy reader's batches.
        return {name: decoded.column(i).slice(within, 1).flatten().to_numpy(
                    zero_copy_only=False)
                for i, name in enumerate(decoded.schema.names)}


def torch_dataset(source: ExampleSource):
    """`source` as a `torch.utils.data.Dataset` (map-style): each item the row's dict of
    numpy arrays. Batch it with `collate_fn=RowCollate(source)`: torch's default collate
    cannot stack the empty array of a missing value."""
    # torch: 1.8 s to import, optional; the map-style source runs without it
    import torch.utils.data

    class _Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(source)

        def __getitem__(self, row: int):
            return source[row]

    return _Rows()


class RowCollate:
    """A DataLoader `collate_fn` for `torch_dataset` rows: the batch `numpy_reader` gives for
    the same rows (a missing scalar filled with the schema default, other features as flat
    values plus `<name>__lengths`), as tensors (bytes stay numpy arrays). A class, so that
    DataLoader worker processes can be handed it by pickling."""

    def __init__(self, source: ExampleSource):
        self.schema, self.features = source.schema, source.features

    def __call__(self, rows: Sequence[dict]) -> dict:
        # torch: 1.8 s to import, optional; the map-style source runs without it
        from torch.utils.data import default_convert

        return default_convert(numpy_reader.rows_to_batch(rows, self.schema, self.features))
