"""A part of a document's graph, row by row: its end counted in its graph in the statement
that writes it, and the claim's read of parts with their documents (locked document first)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from schemas.states import JobState
from schemas.tables import graphs, jobs


@dataclass(frozen=True, kw_only=True)
class GraphChild:
    """A job of a document's graph: its document and its level."""

    parent_id: str
    level: int


@dataclass(frozen=True, kw_only=True)
class Counted:
    """A child's end as written: whether it was (fencing), and its level's count after it."""

    written: bool
    ended: int = 0
    total: int = 0

    @property
    def last(self) -> bool:
        return self.written and self.ended >= self.total


# A child's end, counted in its graph in the same statement. The document's row is locked
# first (``locked`` is evaluated before ``written`` needs it), so every writer of a graph
# takes the document, then its jobs, then the graph row.
CHILD_END = text(
    """
WITH locked AS (
    SELECT id FROM jobs WHERE id = CAST(:parent AS uuid) FOR UPDATE
), written AS (
    UPDATE jobs SET state = :state, result = CAST(:result AS jsonb),
                    error = CAST(:error AS jsonb), decoded_tokens = :decoded_tokens,
                    finished_at = :at, updated_at = :at
    WHERE id = CAST(:id AS uuid) AND state = 'running' AND attempt = :attempt
      AND EXISTS (SELECT 1 FROM locked)
    RETURNING id
), counted AS (
    UPDATE graphs SET ended = ended + 1, prompt_tokens = prompt_tokens + :prompt_tokens,
                      output_tokens = output_tokens + :output_tokens, updated_at = :at
    WHERE job_id = CAST(:parent AS uuid) AND level = :level AND EXISTS (SELECT 1 FROM written)
    RETURNING ended, total
)
SELECT (SELECT count(*) FROM written) AS written, (SELECT ended FROM counted) AS ended,
       (SELECT total FROM counted) AS total
"""
)


def usage_of(result: Mapping[str, Any] | None) -> tuple[int, int]:
    if not result:
        return 0, 0
    return int(result.get("prompt_tokens") or 0), int(result.get("output_tokens") or 0)


async def child_end(
    conn: AsyncConnection,
    child: GraphChild,
    *,
    job_id: str,
    attempt: int,
    state: JobState,
    result: dict[str, Any] | None,
    error: dict[str, Any] | None,
    decoded_tokens: int | None,
    at: datetime,
) -> Counted:
    """A child's end and its count, on ``conn`` (in a transaction); the step it triggers
    is ``after_end``'s."""
    prompt, output = usage_of(result)
    row = (
        await conn.execute(
            CHILD_END,
            {
                "parent": child.parent_id,
                "id": job_id,
                "attempt": attempt,
                "state": state.value,
                "result": json.dumps(result),
                "error": json.dumps(error),
                "decoded_tokens": decoded_tokens,
                "at": at,
                "level": child.level,
                "prompt_tokens": prompt,
                "output_tokens": output if state is JobState.SUCCEEDED else decoded_tokens or 0,
            },
        )
    ).one()
    return Counted(written=bool(row.written), ended=row.ended or 0, total=row.total or 0)


GRAPHED = select(graphs.c.job_id).where(graphs.c.job_id == jobs.c.id).exists().label("graphed")


def with_documents(ids: Sequence[str]) -> Any:
    """``ids`` and the documents of those that are a document's jobs: locked together, in
    key order (a document's id is older than its jobs'), as every writer of a graph does."""
    parents = select(jobs.c.parent_id).where(jobs.c.id.in_(ids), jobs.c.parent_id.is_not(None))
    return jobs.c.id.in_(ids) | jobs.c.id.in_(parents.scalar_subquery())


def split_rows(
    rows: Sequence[Any],
) -> tuple[list[Mapping[Any, Any]], dict[Any, Mapping[Any, Any]]]:
    """The rows asked for, and the rows of their documents by id."""
    asked = [r for r in rows if r["wanted"]]
    documents = {r["id"]: r for r in rows if not r["wanted"]}
    return asked, documents


def lease_of(document: Mapping[Any, Any] | None) -> dict[str, Any]:
    """What a claimed part takes from its document: its heartbeat lease (the caller polls
    the document), so the worker sweeps a leased document's parts as often as any leased
    job, and no other part's."""
    return {} if document is None else {"abandon_after_s": document["abandon_after_s"]}
