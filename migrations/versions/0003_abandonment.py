"""abandonment leases, decoded tokens, and a NOTIFY on every terminal state

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 14:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TERMINAL = "('succeeded', 'failed', 'expired', 'cancelled', 'abandoned')"

NOTIFY_FUNCTION = f"""
CREATE FUNCTION sluicegate_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IN {TERMINAL} AND NEW.state IS DISTINCT FROM OLD.state THEN
        PERFORM pg_notify(
            'sluicegate_jobs',
            NEW.id::text || ' ' || NEW.state || ' ' || extract(epoch FROM clock_timestamp())
            || ' ' || coalesce(NEW.error ->> 'reason', NEW.error ->> 'code', NEW.state)
        );
    END IF;
    RETURN NULL;
END;
$$
"""
NOTIFY_TRIGGER = """
CREATE TRIGGER jobs_terminal_notify AFTER UPDATE OF state ON jobs
FOR EACH ROW EXECUTE FUNCTION sluicegate_jobs_notify()
"""


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column(
            "abandon_on_disconnect", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
    )
    op.add_column("jobs", sa.Column("abandon_after_s", sa.Float(), nullable=True))
    op.add_column(
        "jobs",
        sa.Column(
            "last_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
    )
    op.add_column("jobs", sa.Column("decoded_tokens", sa.Integer(), nullable=True))
    op.create_check_constraint("abandon_after_s", "jobs", "abandon_after_s > 0")
    op.execute(NOTIFY_FUNCTION)
    op.execute(NOTIFY_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS jobs_terminal_notify ON jobs")
    op.execute("DROP FUNCTION IF EXISTS sluicegate_jobs_notify()")
    op.drop_constraint(op.f("ck_jobs_abandon_after_s"), "jobs", type_="check")
    op.drop_column("jobs", "decoded_tokens")
    op.drop_column("jobs", "last_seen_at")
    op.drop_column("jobs", "abandon_after_s")
    op.drop_column("jobs", "abandon_on_disconnect")
