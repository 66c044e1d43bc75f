"""outbox rows published at once by their writer: the relay's only after publish_after;
the jobs channel's notice says whether the job is in a batch

Revision ID: 0020
Revises: 0019z
Create Date: 2026-11-27 07:00:00

The API publishes each job's dispatch record, and a worker each job event, as soon as the
row is committed, and marks it in its next statement. Such a row is stored with
``publish_after`` (a grace period ahead): until then the relay leaves it alone, and its
insert wakes no relay (the trigger now notifies only for rows the relay publishes now).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019z"
branch_labels = None
depends_on = None

NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION sluicegate_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted WHERE publish_after IS NULL) THEN
        PERFORM pg_notify('sluicegate_outbox', '');
    END IF;
    RETURN NULL;
END;
$$
"""
NOTIFY_TRIGGER = """
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT EXECUTE FUNCTION sluicegate_outbox_notify()
"""
TERMINAL = "('succeeded', 'failed', 'expired', 'cancelled', 'abandoned')"
JOBS_FUNCTION = """
CREATE OR REPLACE FUNCTION sluicegate_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IN {terminal} AND NEW.state IS DISTINCT FROM OLD.state THEN
        PERFORM pg_notify(
            'sluicegate_jobs',
            NEW.id::text || ' ' || NEW.state || ' ' || extract(epoch FROM clock_timestamp())
            || ' ' || coalesce(NEW.error ->> 'reason', NEW.error ->> 'code', NEW.state){batch}
        );
    END IF;
    RETURN NULL;
END;
$$
"""
BATCH_WORD = """
            || CASE WHEN NEW.batch_id IS NULL THEN ' -' ELSE ' batch' END"""
OLD_FUNCTION = """
CREATE OR REPLACE FUNCTION sluicegate_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sluicegate_outbox', '');
    RETURN NULL;
END;
$$
"""
OLD_TRIGGER = """
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
FOR EACH STATEMENT EXECUTE FUNCTION sluicegate_outbox_notify()
"""


def upgrade() -> None:
    op.add_column("outbox", sa.Column("publish_after", sa.DateTime(timezone=True), nullable=True))
    op.execute("DROP TRIGGER IF EXISTS outbox_notify ON outbox")
    op.execute(NOTIFY_FUNCTION)
    op.execute(NOTIFY_TRIGGER)
    op.execute(JOBS_FUNCTION.format(terminal=TERMINAL, batch=BATCH_WORD))


def downgrade() -> None:
    op.execute(JOBS_FUNCTION.format(terminal=TERMINAL, batch=""))
    op.execute("DROP TRIGGER IF EXISTS outbox_notify ON outbox")
    op.execute(OLD_FUNCTION)
    op.execute(OLD_TRIGGER)
    op.drop_column("outbox", "publish_after")
