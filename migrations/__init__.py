"""Alembic environment and versions: the only place the schema changes."""
