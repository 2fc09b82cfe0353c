"""The shard format, as a library of its own: the file layer every path goes through
(`fileio`; the stores behind its URIs, `object_stores`, and files' versions,
`file_versions`; TensorFlow's file systems for it, `tf_filesystems`), TFRecord framing with
offsets (`tfrecord_io`) and record indexes (`record_index`), the sharded writer (`shards`,
on Beam: `beam_shards`), its manifest (`manifest`) and staged commit (`commit`), tf.Example as
columns (`codec/`) and as packed blocks (`packing/`), rows read back (`example_rows`), feature
names (`names`), the base of every options object (`options`), rows counted for the live line
(`rows_done`), and the hook points the retry tests use (`hooks`). No TFX; the components, the
readers and the pipeline build on it."""
