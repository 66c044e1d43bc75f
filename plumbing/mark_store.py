"""Marking outbox rows published: the statement part that records where their records went.

Whoever published a row marks it: the relay in its round, and the API and a worker for the
rows they publish at once (``plumbing.at_once``), in their next statement. The marks are
CTEs (``MARKS``, parameters from ``params``) that such a statement carries before its final
``SELECT``; alone they are ``MARK``. For each row not marked yet they:
- set ``published_at``;
- raise each dispatch partition's recorded end to its highest acknowledged offset + 1 (an
  end from another log, a broker that lost its data, is replaced);
- record, for each dispatched job, its newest record's position, and make a ``queued`` job
  ``dispatched``. The jobs are locked in id order first (``plumbing.lock_store``), and the
  ends in partition order.

The rows to update come from one locked CTE joined to ``jobs`` by its key: the planner
counts a few rows in a CTE over ``unnest``, and a join of two such CTEs was planned as a
nested loop over both, quadratic in the marks (1 s for 2,944 marks in one statement).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


@dataclass(frozen=True, kw_only=True)
class OutboxRow:
    id: int
    topic: str
    key: str
    payload: bytes


@dataclass(frozen=True, kw_only=True)
class Acked:
    """Where the broker put one published record; ``log`` is the broker cluster's id."""

    topic: str
    partition: int
    offset: int
    log: str | None = None


@dataclass(frozen=True, kw_only=True)
class Mark:
    """An outbox row published, and where its record went."""

    row: OutboxRow
    acked: Acked


MARKS = """
m_acked AS (
    SELECT * FROM unnest(
        CAST(:m_ids AS bigint[]), CAST(:m_keys AS text[]), CAST(:m_topics AS text[]),
        CAST(:m_partitions AS int[]), CAST(:m_offsets AS bigint[]), CAST(:m_logs AS text[])
    ) AS a(id, key, topic, part, "offset", log)
), m_marked AS (
    UPDATE outbox SET published_at = now() FROM m_acked
    WHERE outbox.id = m_acked.id AND outbox.published_at IS NULL
    RETURNING outbox.id
), m_ends AS (
    INSERT INTO partition_ends AS e (topic, partition, end_offset, log, updated_at)
    SELECT topic, part, max("offset") + 1, max(log), now() FROM m_acked
    WHERE topic = ANY(CAST(:m_dispatch AS text[]))
    GROUP BY topic, part ORDER BY topic, part
    ON CONFLICT (topic, partition) DO UPDATE SET
        end_offset = CASE WHEN e.log IS NOT DISTINCT FROM excluded.log
                          THEN greatest(e.end_offset, excluded.end_offset)
                          ELSE excluded.end_offset END,
        log = excluded.log,
        updated_at = excluded.updated_at
    RETURNING 1
), m_newest AS (
    SELECT DISTINCT ON (key) CAST(key AS uuid) AS job_id, topic, part, "offset", log
    FROM m_acked
    WHERE topic = ANY(CAST(:m_dispatch AS text[])) AND id IN (SELECT id FROM m_marked)
    ORDER BY key, id DESC
), m_locked AS MATERIALIZED (
    SELECT jobs.id, m_newest.topic, m_newest.part, m_newest."offset", m_newest.log
    FROM jobs JOIN m_newest ON jobs.id = m_newest.job_id
    ORDER BY jobs.id FOR UPDATE OF jobs
), m_positioned AS (
    UPDATE jobs SET
        state = CASE WHEN jobs.state = 'queued' THEN 'dispatched' ELSE jobs.state END,
        dispatched_at = coalesce(jobs.dispatched_at, now()),
        updated_at = CASE WHEN jobs.state = 'queued' THEN now() ELSE jobs.updated_at END,
        dispatch_topic = m_locked.topic,
        dispatch_log = m_locked.log,
        dispatch_partition = m_locked.part,
        dispatch_offset = m_locked."offset"
    FROM m_locked
    WHERE jobs.id = m_locked.id
    RETURNING 1
)"""

MARK: TextClause = text(
    f"WITH {MARKS}\nSELECT (SELECT count(*) FROM m_marked) + (SELECT count(*) FROM m_ends)"
    " + (SELECT count(*) FROM m_positioned)"
)


def params(marks: Sequence[Mark], dispatch_topics: Iterable[str]) -> dict[str, Any]:
    """The parameters of ``MARKS``: ``dispatch_topics`` are the topics whose records are
    jobs' dispatch records (their ends and positions are recorded)."""
    return {
        "m_ids": [m.row.id for m in marks],
        "m_keys": [m.row.key for m in marks],
        "m_topics": [m.acked.topic for m in marks],
        "m_partitions": [m.acked.partition for m in marks],
        "m_offsets": [m.acked.offset for m in marks],
        "m_logs": [m.acked.log for m in marks],
        "m_dispatch": sorted(dispatch_topics),
    }


async def mark(
    conn: AsyncConnection, marks: Sequence[Mark], dispatch_topics: Iterable[str]
) -> None:
    """``marks`` recorded on ``conn`` (in the caller's transaction, if it has one)."""
    if marks:
        await conn.execute(MARK, params(marks, dispatch_topics))


def marker(
    engine: AsyncEngine, dispatch_topics: Iterable[str]
) -> Callable[[list[Mark]], Awaitable[None]]:
    """What records marks in a statement of their own (``AtOnce``'s ``flush``)."""
    topics = frozenset(dispatch_topics)

    async def flush(marks: list[Mark]) -> None:
        async with engine.connect() as conn:
            await mark(conn, marks, topics)

    return flush
