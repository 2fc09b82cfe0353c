"""ShardedExampleGen: source files -> sized, split TFRecord shards with a stored schema."""
