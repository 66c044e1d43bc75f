"""The egress side: KV-gated consumers, engines, result writing."""
