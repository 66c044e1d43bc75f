"""The outbox's SQL: publishing rows (the relay), recording where each dispatch record lies,
finding the jobs whose record the broker no longer holds, and dispatching a job again
when its record is gone (the reconciler, ``sluicegate up``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    and_,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnElement

from plumbing.db import transaction
from plumbing.lock_store import locking_in_order
from plumbing.published_store import Acked, OutboxRow, Published, record
from producers.outbox.rule import Lost, Position, TopicView
from schemas.envelopes import DispatchEnvelope
from schemas.jobs import estimate_tokens
from schemas.states import JobState
from schemas.tables import jobs, outbox, partition_ends

Publish = Callable[[list[OutboxRow]], Awaitable[list[Acked]]]


@dataclass(frozen=True)
class RelayRound:
    """One publishing round: rows published, and rows locked but left for a later round
    (an earlier row of their key was still unpublished elsewhere)."""

    published: int = 0
    deferred: int = 0


UNSTARTED_OR_RUNNING = [JobState.DISPATCHED.value, JobState.RUNNING.value]


def of_pool(topic: str, first: bool) -> ColumnElement[bool]:
    """The jobs of the pool whose dispatch topic is ``topic``: those stored before pools
    (no topic) are the first pool's (plumbing/pools.py)."""
    if first:
        return or_(jobs.c.dispatch_topic == topic, jobs.c.dispatch_topic.is_(None))
    return jobs.c.dispatch_topic == topic


def dispatch_row(topic: str, job: Mapping[Any, Any]) -> dict[str, object]:
    """The outbox row of a job's dispatch record (``job``: the job's columns)."""
    envelope = DispatchEnvelope(
        job_id=str(job["id"]),
        tenant=job["tenant"],
        kind=job["kind"],
        priority=job["priority"],
        max_tokens=job["max_tokens"],
        prompt_tokens=estimate_tokens(job["input"]),
        deadline=job["deadline"],
    )
    return envelope.outbox_row(topic, str(job["id"]))


async def redispatch(conn: AsyncConnection, topic: str, which: ColumnElement[bool]) -> list[str]:
    """Give the unfinished jobs ``which`` picks a new dispatch record, in the caller's
    transaction; returns their ids.

    Their recorded position is cleared (the reconciler leaves them alone until the new
    record is published). Workers treat a second record for a job as a redelivery. A
    queued job is not picked: its first record is still waiting in the outbox.
    """
    await conn.execute(locking_in_order(jobs, and_(which, jobs.c.state.in_(UNSTARTED_OR_RUNNING))))
    rows = (
        await conn.execute(
            update(jobs)
            .where(which, jobs.c.state.in_(UNSTARTED_OR_RUNNING))
            .values(
                dispatch_topic=topic,
                dispatch_cluster_id=None,
                dispatch_partition=None,
                dispatch_offset=None,
            )
            .returning(
                jobs.c.id,
                jobs.c.tenant,
                jobs.c.kind,
                jobs.c.priority,
                jobs.c.max_tokens,
                jobs.c.deadline,
                jobs.c.input,
            )
        )
    ).all()
    if rows:
        await conn.execute(insert(outbox), [dispatch_row(topic, r._mapping) for r in rows])
    return [str(r.id) for r in rows]


def _unpublished(limit: int) -> Select[Any]:
    """Up to ``limit`` unpublished rows in id order (those published at once by their
    writer only after their ``publish_after``), locked (``SKIP LOCKED``: several relays
    take different rows), each with ``blocked``: an earlier unpublished row of its topic and
    key is not among them (another relay holds it, or it is not yet committed as
    published), so it must wait for a later round. One statement."""
    taken = (
        select(outbox.c.id, outbox.c.topic, outbox.c.key, outbox.c.payload)
        .where(
            outbox.c.published_at.is_(None),
            or_(outbox.c.publish_after.is_(None), outbox.c.publish_after <= func.now()),
        )
        .order_by(outbox.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("taken")
    )
    earlier = outbox.alias("earlier")
    blocked = (
        exists()
        .where(
            earlier.c.published_at.is_(None),
            earlier.c.topic == taken.c.topic,
            earlier.c.key == taken.c.key,
            earlier.c.id < taken.c.id,
            earlier.c.id.not_in(select(taken.c.id)),
        )
        .label("blocked")
    )
    return select(taken.c.id, taken.c.topic, taken.c.key, taken.c.payload, blocked).order_by(
        taken.c.id
    )


class OutboxStore:
    """The outbox relay's and the reconciler's queries. Rows stay locked while they are being
    published."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        dispatch_topic: str,
        first: bool = True,
        dispatch_topics: frozenset[str] | None = None,
    ) -> None:
        """``dispatch_topic``: the pool whose jobs the reconciler's queries look at
        (``first``: the first pool); ``dispatch_topics``: every pool's, whose records the
        relay's rounds record positions and ends of (by default ``dispatch_topic`` only)."""
        self._engine = engine
        self._dispatch_topic = dispatch_topic
        self._pool = of_pool(dispatch_topic, first)
        self._topics = dispatch_topics or frozenset([dispatch_topic])

    async def publish_batch(self, limit: int, publish: Publish) -> RelayRound:
        """Lock up to ``limit`` unpublished rows, publish them, record them as published;
        all or nothing.

        Several relays may run this at once: each locks rows the others have not
        (``SKIP LOCKED``), and a row whose key has an earlier row still unpublished outside
        this batch (held by another relay, or not yet committed as published) is deferred
        to a later round, so that each key's records reach their partition in row order.
        """
        async with transaction(self._engine) as conn:
            found = (await conn.execute(_unpublished(limit))).all()
            if not found:
                return RelayRound()
            rows = [
                OutboxRow(id=r.id, topic=r.topic, key=r.key, payload=r.payload)
                for r in found
                if not r.blocked
            ]
            if not rows:
                return RelayRound(deferred=len(found))
            acked = await publish(rows)
            await record(
                conn,
                [
                    Published(row=r, acked=a, dispatch=r.topic in self._topics)
                    for r, a in zip(rows, acked, strict=True)
                ],
            )
        return RelayRound(published=len(rows), deferred=len(found) - len(rows))

    async def reset_ends(
        self, cluster_id: str | None = None, ends: dict[int, int] | None = None
    ) -> int:
        """Void the recorded ends that are not of ``cluster_id`` (all of them without one)
        and put ``ends`` (that cluster's) in their place; the relay records ends again as it
        publishes. Returns how many were void."""
        topic = self._dispatch_topic
        void = partition_ends.c.topic == topic
        if cluster_id is not None:
            void = and_(void, partition_ends.c.cluster_id.is_distinct_from(cluster_id))
        async with transaction(self._engine) as conn:
            gone = (
                (
                    await conn.execute(
                        delete(partition_ends).where(void).returning(partition_ends.c.partition)
                    )
                )
                .scalars()
                .all()
            )
            if ends and gone:
                now = datetime.now(UTC)
                await conn.execute(
                    insert(partition_ends),
                    [
                        {
                            "topic": topic,
                            "partition": p,
                            "end_offset": ends.get(p, 0),
                            "cluster_id": cluster_id,
                            "updated_at": now,
                        }
                        for p in gone
                    ],
                )
        return len(gone)

    async def redispatch_unfinished(self) -> int:
        """A dispatch record for every job that has not ended: for a broker known to have
        lost all its records (the embedded one keeps them in memory)."""
        async with transaction(self._engine) as conn:
            done = await redispatch(conn, self._dispatch_topic, self._pool)
        return len(done)

    async def suspects(
        self, view: TopicView, *, partitions: int, running_since: datetime
    ) -> dict[str, tuple[Position, bool]]:
        """Jobs whose record ``view`` takes for gone (``TopicView.gone``, in SQL): id →
        (position, started). A ``running`` job only once it started before
        ``running_since``."""
        per_partition = []
        for p in range(partitions):
            # Offsets that cannot be in the partition: before its first, at or past its end,
            # and (not started only) before the group's commit point.
            out_of_range = [jobs.c.dispatch_offset < view.first.get(p, 0)]
            if view.exact_end:
                out_of_range.append(jobs.c.dispatch_offset >= view.end.get(p, 0))
            skipped = and_(
                jobs.c.state == JobState.DISPATCHED.value,
                jobs.c.dispatch_offset < view.committed.get(p, 0),
            )
            per_partition.append(and_(jobs.c.dispatch_partition == p, or_(*out_of_range, skipped)))
        gone = or_(
            jobs.c.dispatch_cluster_id.is_distinct_from(view.cluster_id),
            *per_partition,
        )
        startable = or_(
            jobs.c.state == JobState.DISPATCHED.value,
            and_(jobs.c.state == JobState.RUNNING.value, jobs.c.started_at < running_since),
        )
        async with self._engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(
                        jobs.c.id,
                        jobs.c.state,
                        jobs.c.dispatch_cluster_id,
                        jobs.c.dispatch_partition,
                        jobs.c.dispatch_offset,
                    ).where(
                        jobs.c.state.in_(UNSTARTED_OR_RUNNING),
                        self._pool,
                        jobs.c.dispatch_offset.is_not(None),
                        startable,
                        gone,
                    )
                )
            ).all()
        return {
            str(r.id): (
                (r.dispatch_cluster_id, r.dispatch_partition, r.dispatch_offset),
                r.state == JobState.RUNNING.value,
            )
            for r in rows
        }

    async def redispatch_lost(self, lost: Lost) -> int:
        """A new dispatch record for each of ``lost`` whose position is still the one judged
        gone, in one transaction; returns how many got one."""
        position = tuple_(
            jobs.c.dispatch_cluster_id, jobs.c.dispatch_partition, jobs.c.dispatch_offset
        )
        which = or_(*(and_(jobs.c.id == job_id, position == at) for job_id, at in lost))
        async with transaction(self._engine) as conn:
            ids = await redispatch(conn, self._dispatch_topic, which)
        return len(ids)
