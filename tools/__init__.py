"""Generators for the docs (run from the repository root; not shipped)."""
