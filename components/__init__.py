"""The TFX components of tfrecord-pipeline, one folder each, and nothing else: the shard
format is `tfrecord_shards/`, the TensorFlow-free readers `shard_readers/`."""
