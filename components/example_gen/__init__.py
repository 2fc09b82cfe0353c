"""ShardedExampleGen: source files -> sized, split TFRecord shards with a stored schema.

`engine.run` is the one place that picks the engine; `component.py` is the TFX interface.
"""
