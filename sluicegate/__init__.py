"""Sluicegate: plumbing and the composition root."""

__version__ = "0.1.0"
