"""Readers of our shards that need no TensorFlow: numpy batches (`numpy_reader`), map-style
access by index (`random_access`), batches onto an accelerator for PyTorch (`device_feed`),
JPEG crops (`jpeg_crops`), and image features both ways (`images`)."""
