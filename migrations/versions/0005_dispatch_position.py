"""where each job's latest dispatch record lies, and which log a partition end is of

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("dispatch_log", sa.Text(), nullable=True))
    op.add_column("partition_ends", sa.Column("log", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("dispatch_partition", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("dispatch_offset", sa.BigInteger(), nullable=True))
    # The reconciler reads only jobs that were published and have not ended.
    op.create_index(
        "ix_jobs_dispatch_position",
        "jobs",
        ["dispatch_partition", "dispatch_offset"],
        postgresql_where=sa.text(
            "state IN ('dispatched', 'running') AND dispatch_offset IS NOT NULL"
        ),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_dispatch_position", table_name="jobs")
    op.drop_column("jobs", "dispatch_offset")
    op.drop_column("jobs", "dispatch_partition")
    op.drop_column("jobs", "dispatch_log")
    op.drop_column("partition_ends", "log")
