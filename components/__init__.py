"""TFX components of tfrecord-pipeline, one folder each."""
