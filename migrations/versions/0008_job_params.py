"""jobs carry their request's model and sampling parameters (temperature, top_p, stop, seed)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing, however many jobs are stored.
    op.add_column("jobs", sa.Column("params", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "params")
