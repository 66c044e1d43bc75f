"""initial schema: jobs and outbox

Revision ID: 0001
Revises:
Create Date: 2026-11-22 10:44:30.358028
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

NOTIFY_FUNCTION = """
CREATE FUNCTION sluicegate_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sluicegate_outbox', '');
    RETURN NULL;
END;
$$
"""
NOTIFY_TRIGGER = """
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
FOR EACH STATEMENT EXECUTE FUNCTION sluicegate_outbox_notify()
"""


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("priority", sa.Text(), nullable=False),
        sa.Column("input", sa.Text(), nullable=False),
        sa.Column("max_tokens", sa.Integer(), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=False),
        sa.Column("callback_url", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.CheckConstraint("kind IN ('summarize', 'complete')", name=op.f("ck_jobs_kind")),
        sa.CheckConstraint("priority IN ('low', 'normal', 'high')", name=op.f("ck_jobs_priority")),
        sa.CheckConstraint(
            "state IN ('queued', 'dispatched', 'running', 'succeeded', 'failed', 'expired', 'cancelled', 'abandoned')",
            name=op.f("ck_jobs_state"),
        ),
        sa.CheckConstraint("max_tokens > 0", name=op.f("ck_jobs_max_tokens")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"], unique=False)
    op.create_index(
        "uq_jobs_tenant_idempotency_key",
        "jobs",
        ["tenant", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox")),
    )
    op.create_index(
        "ix_outbox_unpublished",
        "outbox",
        ["id"],
        unique=False,
        postgresql_where=sa.text("published_at IS NULL"),
    )
    # Wake the outbox relay on commit of any transaction that wrote outbox rows.
    op.execute(NOTIFY_FUNCTION)
    op.execute(NOTIFY_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS outbox_notify ON outbox")
    op.execute("DROP FUNCTION IF EXISTS sluicegate_outbox_notify()")
    op.drop_index(
        "ix_outbox_unpublished",
        table_name="outbox",
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.drop_table("outbox")
    op.drop_index(
        "uq_jobs_tenant_idempotency_key",
        table_name="jobs",
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.drop_index("ix_jobs_state", table_name="jobs")
    op.drop_table("jobs")
