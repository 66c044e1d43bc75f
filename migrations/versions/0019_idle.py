"""the shared lag reading costs no WAL: lag_readings is UNLOGGED

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27 07:20:00

The row is rewritten while a reader lives (at least every half ``lag_stale_after_s``) and
means nothing once it is older than that: after a crash it is empty, and the next reader
writes it again within an interval. A standby has none (the lag is the primary's readers').
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE lag_readings SET UNLOGGED")


def downgrade() -> None:
    op.execute("ALTER TABLE lag_readings SET LOGGED")
