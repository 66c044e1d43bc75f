"""Recording outbox rows as published: where each row's record went.

Whoever published a row records it: the relay in its round, and the API and a worker for
the rows they publish at once (``plumbing.publish_at_once``), in the next statement they write
anyway (``plumbing.unit_of_work``). The recording is a chain of CTEs (``RECORDING``, to be
added to such a statement with ``add_cte``; parameters from ``params``); on its own it is
``RECORD``. For each row not recorded yet it:
- sets ``published_at``;
- raises each dispatch partition's recorded end to its highest acknowledged offset + 1 (an
  end from another cluster, a broker that lost its data, is replaced);
- records, for each dispatched job, its newest record's position, and makes a ``queued``
  job ``dispatched``. The jobs are locked in id order first (``plumbing.lock_store``), and
  the ends in partition order.

The rows to update come from one locked CTE joined to ``jobs`` by its key: the planner
counts a few rows in a CTE over ``unnest``, and a join of two such CTEs was planned as a
nested loop over both, quadratic in the rows (docs/reliability.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import CTE, TextualSelect, column, text
from sqlalchemy.ext.asyncio import AsyncConnection


def cte(name: str, sql: str) -> CTE:
    """A whole, named SQL text as a CTE, to compose into a statement with ``add_cte`` (in
    the order added; a later one may name an earlier one)."""
    return text(sql).columns().cte(name)


@dataclass(frozen=True, kw_only=True)
class OutboxRow:
    id: int
    topic: str
    key: str
    payload: bytes


@dataclass(frozen=True, kw_only=True)
class Acked:
    """Where the broker put one published record; ``cluster_id``: the broker cluster's."""

    topic: str
    partition: int
    offset: int
    cluster_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class Published:
    """An outbox row published, and where its record went; ``dispatch``: a job's dispatch
    record (its partition's end and the job's position are recorded)."""

    row: OutboxRow
    acked: Acked
    dispatch: bool = False


RECORDING: tuple[CTE, ...] = (
    cte(
        "m_acked",
        """SELECT * FROM unnest(
        CAST(:m_ids AS bigint[]), CAST(:m_keys AS text[]), CAST(:m_topics AS text[]),
        CAST(:m_partitions AS int[]), CAST(:m_offsets AS bigint[]), CAST(:m_cluster_ids AS text[])
    ) AS a(id, key, topic, part, "offset", cluster_id)""",
    ),
    cte(
        "m_marked",
        """UPDATE outbox SET published_at = now() FROM m_acked
    WHERE outbox.id = m_acked.id AND outbox.published_at IS NULL
    RETURNING outbox.id""",
    ),
    cte(
        "m_ends",
        """INSERT INTO partition_ends AS e (topic, partition, end_offset, cluster_id, updated_at)
    SELECT topic, part, max("offset") + 1, max(cluster_id), now() FROM m_acked
    WHERE topic = ANY(CAST(:m_dispatch AS text[]))
    GROUP BY topic, part ORDER BY topic, part
    ON CONFLICT (topic, partition) DO UPDATE SET
        end_offset = CASE WHEN e.cluster_id IS NOT DISTINCT FROM excluded.cluster_id
                          THEN greatest(e.end_offset, excluded.end_offset)
                          ELSE excluded.end_offset END,
        cluster_id = excluded.cluster_id,
        updated_at = excluded.updated_at
    RETURNING 1""",
    ),
    cte(
        "m_newest",
        """SELECT DISTINCT ON (key) CAST(key AS uuid) AS job_id, topic, part, "offset", cluster_id
    FROM m_acked
    WHERE topic = ANY(CAST(:m_dispatch AS text[])) AND id IN (SELECT id FROM m_marked)
    ORDER BY key, id DESC""",
    ),
    cte(
        "m_locked",
        """SELECT jobs.id, m_newest.topic, m_newest.part, m_newest."offset", m_newest.cluster_id
    FROM jobs JOIN m_newest ON jobs.id = m_newest.job_id
    ORDER BY jobs.id FOR UPDATE OF jobs""",
    ).prefix_with("MATERIALIZED"),
    cte(
        "m_positioned",
        """UPDATE jobs SET
        state = CASE WHEN jobs.state = 'queued' THEN 'dispatched' ELSE jobs.state END,
        dispatched_at = coalesce(jobs.dispatched_at, now()),
        updated_at = CASE WHEN jobs.state = 'queued' THEN now() ELSE jobs.updated_at END,
        dispatch_topic = m_locked.topic,
        dispatch_cluster_id = m_locked.cluster_id,
        dispatch_partition = m_locked.part,
        dispatch_offset = m_locked."offset"
    FROM m_locked
    WHERE jobs.id = m_locked.id
    RETURNING 1""",
    ),
)

RECORD: TextualSelect = (
    text(
        "SELECT (SELECT count(*) FROM m_marked) + (SELECT count(*) FROM m_ends)"
        " + (SELECT count(*) FROM m_positioned) AS written"
    )
    .columns(column("written"))
    .add_cte(*RECORDING)
)


def params(records: Sequence[Published]) -> dict[str, Any]:
    """The parameters of ``RECORDING``."""
    return {
        "m_ids": [r.row.id for r in records],
        "m_keys": [r.row.key for r in records],
        "m_topics": [r.acked.topic for r in records],
        "m_partitions": [r.acked.partition for r in records],
        "m_offsets": [r.acked.offset for r in records],
        "m_cluster_ids": [r.acked.cluster_id for r in records],
        "m_dispatch": sorted({r.acked.topic for r in records if r.dispatch}),
    }


async def record(conn: AsyncConnection, records: Sequence[Published]) -> None:
    """``records`` written on ``conn`` (in the caller's transaction, if it has one)."""
    if records:
        await conn.execute(RECORD, params(records))
