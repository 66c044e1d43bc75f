"""A worker's membership of its consumer group: the offsets it commits, the rebalance
listener that drains what is revoked, and the consumer protocol's (KIP-848) client."""
