"""a dispatch record's broker cluster id is called a cluster id: jobs.dispatch_cluster_id,
partition_ends.cluster_id

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29 09:00:00

The columns were ``jobs.dispatch_log`` and ``partition_ends.log``; in Kafka a log is a
partition's, so they are renamed for what they hold. No index or constraint names them.
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.alter_column("jobs", "dispatch_log", new_column_name="dispatch_cluster_id")
    op.alter_column("partition_ends", "log", new_column_name="cluster_id")


def downgrade() -> None:
    op.alter_column("partition_ends", "cluster_id", new_column_name="log")
    op.alter_column("jobs", "dispatch_cluster_id", new_column_name="dispatch_log")
