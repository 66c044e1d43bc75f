"""Batches: the JSON and JSONL input, the batch service and its SQL."""
