"""Contracts shared by every Sluicegate process: pure data, no I/O."""
