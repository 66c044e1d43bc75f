"""The overview's reads: jobs by model and state, drops by reason, the workers' rows."""
