"""Trainer pieces: the tf.data input function and the TFX `run_fn` module."""
