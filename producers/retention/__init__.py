"""Retention: what has ended is deleted once past its window."""
