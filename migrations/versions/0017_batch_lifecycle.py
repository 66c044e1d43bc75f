"""OpenAI's batch lifecycle: a batch from an uploaded file is stored ``validating`` and its
lines checked in the background (``failed`` with per-line ``errors``, or ``in_progress``
with its jobs); once every job ended it is ``finalizing`` while its output and error files
are written (stored files, purpose ``batch_output``), then completed, expired or cancelled

Revision ID: 0017
Revises: 0015
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0017"
down_revision = "0015"
branch_labels = None
depends_on = None

ACTIVE = "status IN ('validating', 'in_progress', 'cancelling', 'finalizing')"


def upgrade() -> None:
    op.add_column(
        "batches", sa.Column("priority", sa.Text(), nullable=False, server_default="normal")
    )
    op.add_column("batches", sa.Column("errors", JSONB(), nullable=True))
    op.add_column("batches", sa.Column("in_progress_at", sa.DateTime(timezone=True)))
    op.add_column("batches", sa.Column("finalizing_at", sa.DateTime(timezone=True)))
    op.add_column("batches", sa.Column("output_file_id", sa.Text(), nullable=True))
    op.add_column("batches", sa.Column("error_file_id", sa.Text(), nullable=True))
    op.execute("UPDATE batches SET in_progress_at = created_at")
    # A validating batch has no jobs yet: its total is the file's lines until it is checked,
    # and a failed one keeps 0.
    op.drop_constraint(op.f("ck_batches_total"), "batches", type_="check")
    op.create_check_constraint(op.f("ck_batches_total"), "batches", "total >= 0")
    op.create_index(
        "ix_batches_active",
        "batches",
        ["status"],
        postgresql_where=sa.text(ACTIVE),
    )


def downgrade() -> None:
    op.drop_index("ix_batches_active", table_name="batches")
    op.execute("DELETE FROM batches WHERE total = 0")
    op.drop_constraint(op.f("ck_batches_total"), "batches", type_="check")
    op.create_check_constraint(op.f("ck_batches_total"), "batches", "total > 0")
    for column in ("error_file_id", "output_file_id", "finalizing_at", "in_progress_at"):
        op.drop_column("batches", column)
    op.drop_column("batches", "errors")
    op.drop_column("batches", "priority")
