"""One lock order for rows taken several at a time.

Two transactions that each lock several rows of a table deadlock when they take them in
different orders (each holds a row the other waits for). Every statement that locks or
updates more than one row of ``jobs`` and waits for the rows it finds locked (the worker's
claim, the relay recording dispatch positions, the reconciler's redispatch, a batch cancel)
first locks them with ``locking_in_order``: by primary key, ascending. A statement that
may skip a locked row instead uses ``SKIP LOCKED`` and never waits (the meter, retention,
the worker's heartbeat-lapse sweep, the webhook dispatcher's claim).

A document's graph (docs/graphs.md) is locked document first: its id is older than its
parts' ids, so key order puts it first, and every writer of a graph (a part's end, a cancel,
the API's abandon) locks the document's row before its parts'. ``end_children`` ends a
document's parts with it, the same way on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, Select, Table, select
from sqlalchemy.ext.asyncio import AsyncConnection

from schemas import reasons
from schemas.states import CANCELLABLE_STATES, JobState
from schemas.tables import jobs


def locking_in_order(table: Table, which: ColumnElement[bool]) -> Select[tuple[object]]:
    """``SELECT id … WHERE which ORDER BY id FOR UPDATE``: the rows locked in key order
    (PostgreSQL locks the rows of such a query as they leave the sort)."""
    return select(table.c.id).where(which).order_by(table.c.id).with_for_update()


def _unended_children(parent_ids: Sequence[str]) -> ColumnElement[bool]:
    return jobs.c.parent_id.in_(parent_ids) & jobs.c.state.in_(
        [s.value for s in CANCELLABLE_STATES]
    )


async def end_children(
    conn: AsyncConnection, parent_ids: Sequence[str], state: JobState, now: datetime
) -> int:
    """End every job not ended yet of the documents ``parent_ids`` as ``state`` (their
    document's end), on ``conn``'s transaction; how many. A job that runs is aborted by its
    worker (the jobs channel's NOTIFY, or its next look at its rows); one not started is
    dropped by the claim that finds it ended. They announce no event of their own: the
    document's is the one."""
    if not parent_ids:
        return 0
    which = _unended_children(parent_ids)
    locked = (await conn.execute(locking_in_order(jobs, which))).scalars().all()
    if not locked:
        return 0
    result = await conn.execute(
        jobs.update()
        .where(jobs.c.id.in_(locked), which)
        .values(
            state=state.value,
            finished_at=now,
            updated_at=now,
            error=reasons.error(state, reasons.DOCUMENT_ENDED),
        )
    )
    return int(result.rowcount)
