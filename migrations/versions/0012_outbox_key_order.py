"""unpublished outbox rows found by key, so that several relays keep each key's order

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_outbox_unpublished_key",
        "outbox",
        ["key"],
        postgresql_where=sa.text("published_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_unpublished_key", table_name="outbox")
