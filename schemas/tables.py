"""SQLAlchemy table definitions: the only description of the database schema."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from schemas.jobs import JobKind, Priority
from schemas.states import JobState

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def _one_of(column: str, values: type[JobState] | type[JobKind] | type[Priority]) -> str:
    return f"{column} IN ({', '.join(repr(v.value) for v in values)})"


jobs = Table(
    "jobs",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("priority", Text, nullable=False),
    Column("input", Text, nullable=False),
    Column("max_tokens", Integer, nullable=False),
    Column("deadline", DateTime(timezone=True), nullable=False),
    Column("callback_url", Text, nullable=True),
    Column("idempotency_key", Text, nullable=True),
    Column("request_hash", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("dispatched_at", DateTime(timezone=True), nullable=True),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    Column("result", JSONB, nullable=True),
    Column("error", JSONB, nullable=True),
    # How the caller may go away: by closing a waiting connection (abandon_on_disconnect),
    # or by not polling for abandon_after_s seconds (a lease renewed by every poll).
    Column("abandon_on_disconnect", Boolean, nullable=False, server_default=text("false")),
    Column("abandon_after_s", Float, nullable=True),
    Column("last_seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Output tokens decoded on the attempt that ended the job (wasted unless it succeeded).
    Column("decoded_tokens", Integer, nullable=True),
    CheckConstraint(_one_of("state", JobState), name="state"),
    CheckConstraint("abandon_after_s > 0", name="abandon_after_s"),
    CheckConstraint(_one_of("kind", JobKind), name="kind"),
    CheckConstraint(_one_of("priority", Priority), name="priority"),
    CheckConstraint("max_tokens > 0", name="max_tokens"),
    Index(
        "uq_jobs_tenant_idempotency_key",
        "tenant",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
    Index("ix_jobs_state", "state"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("topic", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("published_at", DateTime(timezone=True), nullable=True),
    Index("ix_outbox_unpublished", "id", postgresql_where=text("published_at IS NULL")),
)

# The end of each dispatch partition as the relay's acknowledged sends record it. The relay
# is the only writer to the dispatch topic, so these are exact, whatever ListOffsets reports.
partition_ends = Table(
    "partition_ends",
    metadata,
    Column("topic", Text, primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("end_offset", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
