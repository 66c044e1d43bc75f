"""The group of submits' statement, kept whole: the jobs and their dispatch records in one
statement, with or without the records of rows published at once."""

from __future__ import annotations

from sqlalchemy import CTE, BigInteger, column, text

from plumbing.published_store import RECORDING, cte
from schemas.tables import jobs

# Single submits, grouped: the jobs and their dispatch records in one statement. A job whose
# (tenant, idempotency key) is taken already is skipped, and so is its record (the join);
# its answer is read after. Keyed rows go in key order, so that two groups that share keys
# take their locks in the same order (no deadlock); the records go in submission order.
_GROUP: tuple[CTE, ...] = (
    cte(
        "given",
        """SELECT * FROM unnest(
        CAST(:ids AS uuid[]), CAST(:tenants AS text[]), CAST(:kinds AS text[]),
        CAST(:priorities AS text[]), CAST(:inputs AS text[]), CAST(:max_tokens AS int[]),
        CAST(:deadlines AS timestamptz[]), CAST(:callback_urls AS text[]),
        CAST(:keys AS text[]), CAST(:hashes AS text[]),
        CAST(:abandon_on_disconnect AS boolean[]), CAST(:abandon_after_s AS float8[]),
        CAST(:params AS text[]), CAST(:payloads AS bytea[]), CAST(:topics AS text[])
    ) WITH ORDINALITY AS t(id, tenant, kind, priority, input, max_tokens, deadline,
                           callback_url, idempotency_key, request_hash,
                           abandon_on_disconnect, abandon_after_s, params, payload, topic, n)""",
    ),
    cte(
        "new_jobs",
        """INSERT INTO jobs (id, tenant, kind, state, priority, input, max_tokens, deadline,
                      callback_url, idempotency_key, request_hash, abandon_on_disconnect,
                      abandon_after_s, params, dispatch_topic)
    SELECT id, tenant, kind, 'queued', priority, input, max_tokens, deadline, callback_url,
           idempotency_key, request_hash, abandon_on_disconnect, abandon_after_s,
           CAST(params AS jsonb), topic
    FROM given
    ORDER BY tenant, idempotency_key, n
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, deadline, created_at, updated_at, last_seen_at, attempt""",
    ),
    cte(
        "new_outbox",
        """INSERT INTO outbox (topic, key, payload, publish_after)
    SELECT given.topic, CAST(given.id AS text), given.payload,
           now() + CAST(:grace_s AS float8) * interval '1 second'
    FROM given JOIN new_jobs ON new_jobs.id = given.id
    ORDER BY given.n
    RETURNING id, key""",
    ),
)
_STORED = text(
    """SELECT new_jobs.id, deadline, created_at, updated_at, last_seen_at, attempt,
       new_outbox.id AS outbox_id
FROM new_jobs LEFT JOIN new_outbox ON new_outbox.key = CAST(new_jobs.id AS text)"""
).columns(
    jobs.c.id,
    jobs.c.deadline,
    jobs.c.created_at,
    jobs.c.updated_at,
    jobs.c.last_seen_at,
    jobs.c.attempt,
    column("outbox_id", BigInteger()),
)
SUBMIT = _STORED.add_cte(*_GROUP)
# With the records of the rows this API published at once (``plumbing.published_store``).
SUBMIT_RECORDING = _STORED.add_cte(*_GROUP, *RECORDING)
