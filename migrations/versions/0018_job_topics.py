"""a job's dispatch topic: the topic of its model's worker pool

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 01:00:00

Jobs stored before pools have none: they belong to the first pool, whose topic keeps the
name the one topic had (plumbing/pools.py), so an upgrade moves nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("dispatch_topic", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "dispatch_topic")
