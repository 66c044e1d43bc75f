"""The one-command local stack: embedded PostgreSQL and broker, the data directory lock,
stack.json, the local key and the bundled model.
"""
