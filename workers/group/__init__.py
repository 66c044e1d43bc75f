"""A worker's membership of its consumer group: the offsets it commits, the rebalance
listener that drains what is revoked, the consumer protocol's (KIP-848) client, and the
typed seams between them and the worker."""
