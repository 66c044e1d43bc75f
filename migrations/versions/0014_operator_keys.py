"""operator API keys: a key that sees every tenant's jobs and batches

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "api_keys",
        sa.Column("operator", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )


def downgrade() -> None:
    op.drop_column("api_keys", "operator")
