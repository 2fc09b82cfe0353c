"""The codec: tf.Example and its Schema, in two halves, as TFDS splits example_parser.py and
example_serializer.py.

- `schema_file`: reads and writes `schema.pbtxt`.
- `parser` (reading): Schema -> parse specs, defaults, densifying, tf.Example -> Arrow.
  Imports TensorFlow.
- `serializer` (writing): Arrow -> tf.Example, column kinds, the Schema a profile implies.
  Imports no TensorFlow, so encoding workers (Beam, Spark executors) stay light.
- `example_loops`, `framing`, `wire`: the compiled loops (numba) under both halves and under
  `tfrecord_io`: the encoder's and decoder's, TFRecord framing, the wire format's steps.
"""
