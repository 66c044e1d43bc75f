"""Ids of a graph's jobs: UUIDv7, like every job's, so a document's jobs sort after it."""

from __future__ import annotations

import uuid_utils


def new_id() -> str:
    return str(uuid_utils.uuid7())
