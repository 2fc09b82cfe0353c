"""Packed records: one tf.Example holds a block of N rows as column lists.

Parsing is what caps per-row input speed: every row is a tf.Example with its own feature map.
A packed Example carries N rows at once, so one parse yields N rows of each column.

- `layout`: the block layout, worked out once from the stored schema (`PackedLayout`), and
  the schema tags that declare it (`annotate`, `packed_rows`);
- `write`: `pack_batch`, Arrow rows -> blocks, through the codec's compiled encoder;
- `arrow`: `unpack_blocks` and `RowDecoder`, blocks -> rows on Arrow arrays (no TensorFlow):
  the one unpacker of the Spark reader, `tfrp inspect` and the numpy/PyTorch reader;
- `graph`: `block_spec` and `unpack`, blocks -> rows inside the tf.data input function.
"""
from tfrecord_shards.packing.layout import PackedLayout, annotate, packed_rows

__all__ = ["PackedLayout", "annotate", "packed_rows"]
