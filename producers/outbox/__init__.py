"""The transactional outbox: its SQL, the relay that publishes it and the reconciler."""
