"""a batch's jobs are held in PostgreSQL and metered into the dispatch topic

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 22:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant default: PostgreSQL 11+ adds it without rewriting the table.
    op.add_column(
        "jobs", sa.Column("held", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    # The meter's queue: each tenant's held jobs, earliest deadline first.
    op.create_index(
        "ix_jobs_held",
        "jobs",
        ["tenant", "deadline", "id"],
        postgresql_where=sa.text("held"),
    )
    # The backlog the meter fills up to: jobs released (or submitted) and not ended.
    op.create_index(
        "ix_jobs_backlog",
        "jobs",
        ["batch_id"],
        postgresql_where=sa.text("NOT held AND state IN ('queued', 'dispatched', 'running')"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_backlog", table_name="jobs")
    op.drop_index("ix_jobs_held", table_name="jobs")
    op.drop_column("jobs", "held")
