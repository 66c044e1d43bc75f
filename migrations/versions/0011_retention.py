"""ended webhook deliveries found by when they ended, for retention

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 23:55:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_webhook_deliveries_ended",
        "webhook_deliveries",
        ["finished_at"],
        postgresql_where=sa.text("state IN ('delivered', 'dead')"),
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_ended", table_name="webhook_deliveries")
