"""partition ends recorded by the outbox relay

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 11:55:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "partition_ends",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("end_offset", sa.BigInteger(), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("topic", "partition", name=op.f("pk_partition_ends")),
    )


def downgrade() -> None:
    op.drop_table("partition_ends")
