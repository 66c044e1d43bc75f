"""an index on when jobs ended: the API reads the last minute's every 2 s

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The flow metrics and deadline-aware admission's measured speed read the jobs that
    # ended in the last minute; without it, a sequential scan of every job ever stored.
    # Built concurrently, outside the migration's transaction: a large jobs table keeps
    # taking writes meanwhile.
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_jobs_finished_at",
            "jobs",
            ["finished_at"],
            postgresql_where=sa.text("finished_at IS NOT NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            "ix_jobs_finished_at",
            table_name="jobs",
            postgresql_concurrently=True,
            if_exists=True,
        )
