"""A quiet lag reading, on the real database and broker: while the process's listener hears
nothing, the reader reuses PostgreSQL's part of its last reading (when nothing was
unpublished) and rewrites the shared row only when the reading changed or the row is half
stale; a follower looks only when it heard something or its copy is getting old, and a
silent reader is still replaced before its reading goes stale."""

from __future__ import annotations

import asyncio

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.activity import Activity
from plumbing.settings import Settings
from producers.lag.kafka import KafkaLagSource
from producers.lag.shared import SharedLagSource
from schemas.tables import outbox


def heard() -> Activity:
    """An activity whose listener is connected (the test touches it for the notices)."""
    activity = Activity()
    connected = asyncio.Event()
    connected.set()
    activity.heard_by(connected)
    return activity


def local(settings: Settings, db: AsyncEngine, activity: Activity | None) -> KafkaLagSource:
    return KafkaLagSource(
        db=db,
        bootstrap=settings.require_kafka(),
        topic=settings.dispatch_topic,
        group_id=settings.consumer_group,
        partitions=settings.partitions,
        activity=activity,
    )


def shared(
    settings: Settings,
    db: AsyncEngine,
    activity: Activity | None = None,
    stale_after_s: float | None = None,
    reuses: bool = True,
) -> tuple[SharedLagSource, KafkaLagSource]:
    """``reuses``: whether its broker part reuses PostgreSQL's part while nothing is heard
    (False: each read runs its statement)."""
    source = local(settings, db, activity if reuses else None)
    replica = SharedLagSource(
        source,
        url=settings.require_database_url(),
        topic=settings.dispatch_topic,
        group=settings.consumer_group,
        stale_after_s=stale_after_s,
        activity=activity,
    )
    return replica, source


async def test_nothing_heard_and_nothing_unpublished_reuses_the_last_statement(
    settings: Settings, db: AsyncEngine
) -> None:
    activity = heard()
    source = local(settings, db, activity)
    try:
        first = await source.read(lambda: 7)
        again = await source.read(lambda: 9)
        assert source.pg_reads == 1
        assert (again.ends, again.committed, again.unpublished, again.open) == (
            first.ends,
            first.committed,
            first.unpublished,
            first.open,
        )
        assert again.tally == 7  # what was admitted since the statement counts as unseen

        async with db.begin() as conn:  # a submit: its outbox row's NOTIFY is heard
            await conn.execute(
                insert(outbox).values(topic=settings.dispatch_topic, key="k", payload=b"x")
            )
        activity.touch()
        seen = await source.read(lambda: 10)
        assert (source.pg_reads, seen.unpublished, seen.tally) == (2, 1, 10)
        await source.read()  # an unpublished row may be published without a notice
        assert source.pg_reads == 3
    finally:
        await source.close()


async def test_nothing_is_reused_while_the_listener_is_down(
    settings: Settings, db: AsyncEngine
) -> None:
    activity = Activity()  # never connected
    source = local(settings, db, activity)
    try:
        await source.read()
        await source.read()
        assert source.pg_reads == 2
    finally:
        await source.close()


async def test_a_quiet_reader_rewrites_its_row_only_on_a_change_or_half_stale(
    settings: Settings, db: AsyncEngine
) -> None:
    activity = heard()
    (reader, _), (plain, _) = (
        shared(settings, db, activity, stale_after_s=1.0),
        shared(settings, db),
    )
    try:
        await reader.read()
        assert reader.reader
        assert await plain.read() is not None
        await reader.read()
        assert await plain.read() is None  # the same reading: the row was not rewritten
        await asyncio.sleep(0.55)
        await reader.read()
        handed = await plain.read()  # half stale: rewritten, young again
        assert handed is not None
        assert handed.age_s < 0.5
    finally:
        await reader.close()
        await plain.close()


async def test_a_reading_read_from_postgresql_is_stored_by_its_own_statement_when_it_changed(
    settings: Settings, db: AsyncEngine
) -> None:
    # The reader's broker part reuses nothing (no activity): each read runs its statement,
    # which stores the reading only when it changed or the row is half stale.
    (reader, source), (plain, _) = (
        shared(settings, db, heard(), stale_after_s=1.0, reuses=False),
        shared(settings, db),
    )
    try:
        await reader.read()
        assert reader.reader
        first = await plain.read()
        assert first is not None
        await reader.read()
        assert source.pg_reads == 2
        assert await plain.read() is None  # the same reading: the row was not rewritten

        async with db.begin() as conn:  # a submit not yet published: the reading changed
            await conn.execute(
                insert(outbox).values(topic=settings.dispatch_topic, key="k", payload=b"x")
            )
        await reader.read()
        changed = await plain.read()
        assert changed is not None
        assert (changed.unpublished, first.unpublished) == (1, 0)
        assert changed.ends == first.ends
        assert len(changed.ends) == settings.partitions

        await reader.read()
        assert await plain.read() is None
        await asyncio.sleep(0.55)
        await reader.read()
        handed = await plain.read()  # half stale: rewritten, young again
        assert handed is not None
        assert handed.age_s < 0.5
        assert source.pg_reads == 5
    finally:
        await reader.close()
        await plain.close()


async def test_a_quiet_follower_looks_when_it_hears_something_or_its_copy_ages(
    settings: Settings, db: AsyncEngine
) -> None:
    activity = heard()
    (reader, _), (follower, follower_kafka) = (
        shared(settings, db),
        shared(settings, db, activity, stale_after_s=1.0),
    )
    try:
        await reader.read()
        assert await follower.read() is not None
        await reader.read()  # a plain reader writes every reading
        assert await follower.read() is None  # nothing heard, its copy young: no look
        activity.touch()
        assert await follower.read() is not None
        await asyncio.sleep(0.65)  # its copy is older than FOLLOW_AFTER of stale
        await reader.read()
        assert await follower.read() is not None  # it looked, and found a new row

        await reader.close()  # the reader goes: a quiet follower takes over in time
        assert await follower.read() is None  # its copy is young: no look yet
        await asyncio.sleep(0.65)
        taken = await follower.read()
        assert follower.reader
        assert taken is not None
        assert follower_kafka.pg_reads == 1
    finally:
        await reader.close()
        await follower.close()
