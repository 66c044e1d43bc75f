"""SQLAlchemy table definitions: the only description of the database schema."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
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
        "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
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
    # The request's model and sampling parameters, those given (schemas/sampling.py).
    Column("params", JSONB, nullable=True),
    # A job of a batch: its batch and the caller's custom_id (unique within the batch).
    Column("batch_id", UUID(as_uuid=False), ForeignKey("batches.id"), nullable=True),
    Column("custom_id", Text, nullable=True),
    # Where the job's latest dispatch record lies: the broker cluster's id, the partition
    # and the offset the broker acknowledged. The reconciler compares them with the broker's
    # cluster id and offsets to find records that are gone (producers/outbox/reconciler.py).
    # The topic of its model's worker pool, set when the job is stored (None: stored before
    # pools, the first pool's).
    Column("dispatch_topic", Text, nullable=True),
    Column("dispatch_cluster_id", Text, nullable=True),
    Column("dispatch_partition", Integer, nullable=True),
    Column("dispatch_offset", BigInteger, nullable=True),
    # A batch's job waiting in PostgreSQL for the meter to release it into the dispatch
    # topic (producers/batches/meter.py); false once released, and for every single job.
    Column("held", Boolean, nullable=False, server_default=text("false")),
    # A part of a document's graph (docs/graphs.md): its document, level (0: a chunk; 1
    # and up: a reduce) and place in the level.
    Column(
        "parent_id", UUID(as_uuid=False), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=True
    ),
    Column("level", Integer, nullable=True),
    Column("seq", Integer, nullable=True),
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
    # A batch's jobs: custom_ids unique within it, and its results read in submission order.
    Index(
        "uq_jobs_batch_id_custom_id",
        "batch_id",
        "custom_id",
        unique=True,
        postgresql_where=text("batch_id IS NOT NULL"),
    ),
    Index("ix_jobs_batch_id_id", "batch_id", "id", postgresql_where=text("batch_id IS NOT NULL")),
    Index("ix_jobs_tenant_id", "tenant", "id"),
    # The flow metrics and the measured speed read the jobs that ended in the last minute.
    Index("ix_jobs_finished_at", "finished_at", postgresql_where=text("finished_at IS NOT NULL")),
    Index(
        "ix_jobs_dispatch_position",
        "dispatch_partition",
        "dispatch_offset",
        postgresql_where=text("state IN ('dispatched', 'running') AND dispatch_offset IS NOT NULL"),
    ),
    # A document's jobs, level by level, in order.
    Index(
        "ix_jobs_parent_id_level_seq",
        "parent_id",
        "level",
        "seq",
        postgresql_where=text("parent_id IS NOT NULL"),
    ),
    # The meter's queue: each tenant's held jobs, earliest deadline first.
    Index("ix_jobs_held", "tenant", "deadline", "id", postgresql_where=text("held")),
    # The backlog the meter fills up to: jobs released (or submitted) and not ended.
    Index(
        "ix_jobs_backlog",
        "batch_id",
        postgresql_where=text("NOT held AND state IN ('queued', 'dispatched', 'running')"),
    ),
)

# A document summarized as a graph of jobs (docs/graphs.md): the level running, its jobs
# and how many ended, the usage so far. A part's end counts itself here in the statement
# that writes it; the last of a level makes the next level, or ends the document.
graphs = Table(
    "graphs",
    metadata,
    Column(
        "job_id", UUID(as_uuid=False), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("chunks", Integer, nullable=False),  # the map's jobs
    Column("level", Integer, nullable=False, server_default=text("0")),
    Column("total", Integer, nullable=False),  # jobs of the level
    Column("ended", Integer, nullable=False, server_default=text("0")),  # of them, ended
    Column("levels", Integer, nullable=False),  # levels planned at the split, the map included
    Column("fan_in", Integer, nullable=False),  # most summaries one reduce job combines
    Column("budget_tokens", Integer, nullable=False),  # prompt tokens one child may take
    Column("level_s", Float, nullable=False),  # seconds kept back for each reduce level
    Column("prompt_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("output_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("ended <= total", name="ended"),
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
    # A row its writer publishes at once: the relay's only after this (None: at once).
    Column("publish_after", DateTime(timezone=True), nullable=True),
    Index("ix_outbox_unpublished", "id", postgresql_where=text("published_at IS NULL")),
    # A relay defers a row while an earlier row of its key is unpublished elsewhere.
    Index("ix_outbox_unpublished_key", "key", postgresql_where=text("published_at IS NULL")),
)

# The end of each dispatch partition as the relays' acknowledged sends record it. The relays
# are the only writers to the dispatch topic, so these are exact, whatever ListOffsets
# reports (each relay raises an end to its highest acknowledged offset + 1).
partition_ends = Table(
    "partition_ends",
    metadata,
    Column("topic", Text, primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("end_offset", BigInteger, nullable=False),
    Column("cluster_id", Text, nullable=True),  # the broker cluster's id the end belongs to
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# The worker group's latest lag reading, taken by one API replica (the one holding the
# reader's advisory lock) and read by the others (producers/lag/shared.py). Partition maps
# are JSON objects keyed by partition number.
lag_readings = Table(
    "lag_readings",
    metadata,
    Column("topic", Text, primary_key=True),
    Column("consumer_group", Text, primary_key=True),
    Column("reader", Text, nullable=False),  # host:pid of the replica that took it
    Column("taken_at", DateTime(timezone=True), nullable=False),  # when the reading began
    Column("ends", JSONB, nullable=False),
    Column("committed", JSONB, nullable=False),
    Column("open", JSONB, nullable=True),
    Column("unpublished", BigInteger, nullable=False),
    prefixes=["UNLOGGED"],  # no WAL: rewritten while a reader lives (migration 0019)
)

# API keys: a key is shown once when it is made; only its SHA-256 is stored.
api_keys = Table(
    "api_keys",
    metadata,
    Column("id", Text, primary_key=True),  # the key's public prefix, e.g. "sk_3f9a1c2e"
    Column("key_hash", Text, nullable=False, unique=True),
    Column("tenant", Text, nullable=False),
    Column("name", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    # An operator key sees (and may cancel) every tenant's jobs and batches.
    Column("operator", Boolean, nullable=False, server_default=text("false")),
)

# Webhook signing secrets ("whsec_..."), per tenant. Every unexpired secret signs each
# delivery (Standard Webhooks: several signatures, space-separated), which is how a
# tenant rotates one: add the new secret, let the receivers learn it, expire the old one.
webhook_secrets = Table(
    "webhook_secrets",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("tenant", Text, nullable=False),
    Column("secret", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Index("ix_webhook_secrets_tenant", "tenant"),
)

batches = Table(
    "batches",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True),
    Column("tenant", Text, nullable=False),
    # OpenAI Batch statuses: validating (a file's lines not checked yet), failed (some were
    # bad: ``errors``), in_progress, cancelling, finalizing (the result files being
    # written), completed, expired, cancelled (producers/batches/lifecycle.py).
    Column("status", Text, nullable=False),
    Column("priority", Text, nullable=False, server_default="normal"),
    Column("errors", JSONB, nullable=True),  # OpenAI's errors.data of a failed batch
    Column("in_progress_at", DateTime(timezone=True), nullable=True),
    Column("finalizing_at", DateTime(timezone=True), nullable=True),
    Column("output_file_id", Text, nullable=True),  # stored files (purpose batch_output)
    Column("error_file_id", Text, nullable=True),
    Column("endpoint", Text, nullable=False),
    Column("completion_window", Text, nullable=False),
    Column("deadline", DateTime(timezone=True), nullable=False),
    Column("callback_url", Text, nullable=True),
    Column("metadata", JSONB, nullable=True),
    Column("total", Integer, nullable=False),
    Column("idempotency_key", Text, nullable=True),
    Column("request_hash", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("cancelled_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    # The uploaded file (POST /v1/files) the batch was made from; null for a batch sent
    # whole. Not a foreign key: the file may be deleted while its batch is kept.
    Column("input_file_id", Text, nullable=True),
    CheckConstraint("total >= 0", name="total"),  # 0: failed validation
    Index(
        "ix_batches_active",
        "status",
        postgresql_where=text(
            "status IN ('validating', 'in_progress', 'cancelling', 'finalizing')"
        ),
    ),
    Index(
        "uq_batches_tenant_idempotency_key",
        "tenant",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
)

# One row per webhook message: its id (the webhook-id header) and body are fixed when it is
# made, so every retry is the same message. Unique per subject and event, so a terminal
# state yields one delivery sequence however often its event is consumed.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", Text, primary_key=True),  # "msg_<uuid>"
    Column("tenant", Text, nullable=False),
    Column("subject", Text, nullable=False),  # the job or batch id
    Column("event_type", Text, nullable=False),  # e.g. "job.succeeded", "batch.completed"
    Column("url", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("state", Text, nullable=False),  # pending, delivered, dead
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_status", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    CheckConstraint("state IN ('pending', 'delivered', 'dead')", name="state"),
    Index("uq_webhook_deliveries_subject_event_type", "subject", "event_type", unique=True),
    Index(
        "ix_webhook_deliveries_due",
        "next_attempt_at",
        postgresql_where=text("state = 'pending'"),
    ),
    # Retention deletes the ended ones, oldest first (producers/retention/).
    Index(
        "ix_webhook_deliveries_ended",
        "finished_at",
        postgresql_where=text("state IN ('delivered', 'dead')"),
    ),
)

webhook_attempts = Table(
    "webhook_attempts",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("delivery_id", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("status_code", Integer, nullable=True),
    Column("error", Text, nullable=True),
    Column("duration_ms", Float, nullable=False),
    Index("ix_webhook_attempts_delivery_id", "delivery_id"),
)

# An endpoint that answered 410 Gone: no further deliveries to it.
webhook_endpoints = Table(
    "webhook_endpoints",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("url", Text, primary_key=True),
    Column("disabled_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("reason", Text, nullable=False),
)

# What could not be processed and was set aside with its reason (also published to the
# dead-letter topic): webhook deliveries after their last attempt, poison records.
dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("source", Text, nullable=False),  # "webhook", "dispatch", ...
    Column("tenant", Text, nullable=True),
    Column("subject", Text, nullable=True),  # delivery id, job id, topic@offset
    Column("reason", Text, nullable=False),
    Column("payload", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_dead_letters_tenant_source", "tenant", "source"),
)

# Uploaded files (POST /v1/files, OpenAI's Files API): one row per file, its content in
# file_parts, about 1 MiB a part in order of seq. Deleting a file deletes its parts.
files = Table(
    "files",
    metadata,
    Column("id", Text, primary_key=True),  # "file-" and 24 random hex digits
    Column("tenant", Text, nullable=False),
    Column("filename", Text, nullable=False),
    Column("purpose", Text, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("lines", Integer, nullable=False),  # newline-separated lines, blank ones too
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_files_tenant_created_at", "tenant", "created_at", "id"),
)

file_parts = Table(
    "file_parts",
    metadata,
    Column("file_id", Text, ForeignKey("files.id", ondelete="CASCADE"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

# The workers that report themselves (workers/presence/report.py): each upserts its row every
# worker_report_s and deletes it when it stops cleanly; a row not seen for a few intervals
# is a worker gone (shown as stale, then pruned by retention).
workers = Table(
    "workers",
    metadata,
    Column("id", Text, primary_key=True),  # worker-N (static member id) or host:pid
    Column("model", Text, nullable=False),  # the model its engine serves
    Column("engine", Text, nullable=False),  # sim, vllm_http, vllm_local, llamacpp
    Column("capacity", Integer, nullable=False),  # jobs it may run at once
    Column("running", Integer, nullable=False),
    Column("kv_usage", Float, nullable=True),  # fraction of its KV cache (or slots) in use
    # Tokens one request's prompt and output may hold together on its engine (None: not
    # known): the API judges a document's graph by it before storing it.
    Column("context_tokens", Integer, nullable=True),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
