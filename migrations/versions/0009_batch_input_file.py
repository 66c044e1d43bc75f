"""batches remember the uploaded file they were made from (OpenAI's input_file_id)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 19:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing, however many batches are stored.
    op.add_column("batches", sa.Column("input_file_id", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("batches", "input_file_id")
