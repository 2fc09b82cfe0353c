"""ShardedTransform: tf.Transform with our sharding writer and optional packed output."""
