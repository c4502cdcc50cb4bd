"""What is wrong and why: scanned parameters paired with their stacked gradients, the findings (buffers
propagation leaves under-sharded), their root cause and the picture of the split, shard-group conflicts,
what holds the peak, and the warnings a plan carries."""
