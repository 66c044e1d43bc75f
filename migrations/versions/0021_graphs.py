"""a document too long for its engine becomes a graph of jobs: the children's links and the
graph's countdown

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 13:00:00

A child names its document (``parent_id``), its level (0: a chunk; 1 and up: a reduce) and
its place in the level. ``graphs`` holds one row per document being summarized as a graph.
A worker reports its engine's context, by which the API judges a document's whole graph.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column(
            "parent_id",
            postgresql.UUID(as_uuid=False),
            sa.ForeignKey("jobs.id", name="fk_jobs_parent_id_jobs", ondelete="CASCADE"),
            nullable=True,
        ),
    )
    op.add_column("jobs", sa.Column("level", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("seq", sa.Integer(), nullable=True))
    op.create_index(
        "ix_jobs_parent_id_level_seq",
        "jobs",
        ["parent_id", "level", "seq"],
        postgresql_where=sa.text("parent_id IS NOT NULL"),
    )
    op.create_table(
        "graphs",
        sa.Column(
            "job_id",
            postgresql.UUID(as_uuid=False),
            sa.ForeignKey("jobs.id", name="fk_graphs_job_id_jobs", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("chunks", sa.Integer(), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("ended", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("levels", sa.Integer(), nullable=False),
        sa.Column("fan_in", sa.Integer(), nullable=False),
        sa.Column("budget_tokens", sa.Integer(), nullable=False),
        sa.Column("level_s", sa.Float(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint("ended <= total", name="ck_graphs_ended"),
        sa.PrimaryKeyConstraint("job_id", name="pk_graphs"),
    )
    op.add_column("workers", sa.Column("context_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("workers", "context_tokens")
    op.drop_table("graphs")
    op.drop_index("ix_jobs_parent_id_level_seq", table_name="jobs")
    op.drop_column("jobs", "seq")
    op.drop_column("jobs", "level")
    op.drop_column("jobs", "parent_id")
