"""one shared lag reading per dispatch topic and worker group, for many API replicas

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25 11:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lag_readings",
        sa.Column("topic", sa.Text(), primary_key=True),
        sa.Column("consumer_group", sa.Text(), primary_key=True),
        sa.Column("reader", sa.Text(), nullable=False),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends", JSONB(), nullable=False),
        sa.Column("committed", JSONB(), nullable=False),
        sa.Column("open", JSONB(), nullable=True),
        sa.Column("unpublished", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("lag_readings")
