"""Upgrade an empty database to head, compare with the table metadata, down and up again."""

import asyncio
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select
from sqlalchemy.engine import Connection, make_url

from plumbing.db import libpq_url, make_engine
from plumbing.pools import Pools
from plumbing.settings import Settings
from producers.batches.meter_repository import MeterStore
from producers.lag.repository import LagRepository
from schemas import constants
from schemas.tables import metadata, outbox
from sluicegate import migrate


def _diff(connection: Connection) -> list[object]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, metadata))


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


@pytest.fixture
async def empty_database(pg_admin_url: str):
    name = f"mig_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(libpq_url(pg_admin_url))
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_upgrade_matches_metadata_then_down_and_up(empty_database: str) -> None:
    engine = make_engine(empty_database, pool_size=1)
    try:
        await migrate.upgrade_async(empty_database)
        async with engine.connect() as conn:
            assert await conn.run_sync(_diff) == []
            assert {"jobs", "outbox"} <= await conn.run_sync(_tables)

        await _downgrade(empty_database)
        async with engine.connect() as conn:
            assert await conn.run_sync(_tables) == {"alembic_version"}

        await migrate.upgrade_async(empty_database)
        async with engine.connect() as conn:
            assert await conn.run_sync(_diff) == []
    finally:
        await engine.dispose()


async def _downgrade(url: str) -> None:
    import asyncio

    await asyncio.to_thread(migrate.downgrade, url, "base")


async def test_jobs_stored_before_pools_are_the_first_pools_after_the_upgrade(
    empty_database: str,
) -> None:
    """A single-model deployment upgrades with nothing to move: its jobs (stored with no
    pool's topic) are the first pool's, whose topic and group keep their names; another
    pool sees none of them."""
    await migrate.upgrade_async(empty_database, "0017")
    conn = await asyncpg.connect(libpq_url(empty_database))
    try:
        job = (
            "INSERT INTO jobs (id, tenant, kind, state, priority, input, max_tokens, deadline, "
            "held, dispatch_log, dispatch_partition, dispatch_offset) VALUES (gen_random_uuid(), "
            "'t', 'complete', $1, 'normal', 'x', 10, now() + interval '1 hour', $2, $3, $4, $5)"
        )
        await conn.execute(job, "dispatched", False, "L", 0, 0)  # its record in the log
        await conn.execute(job, "queued", True, None, None, None)  # a batch's, held
        await conn.execute(
            "INSERT INTO partition_ends (topic, partition, end_offset, log) VALUES ($1, 0, 1, 'L')",
            constants.DISPATCH_TOPIC,
        )
    finally:
        await conn.close()
    await migrate.upgrade_async(empty_database)

    first, other = Pools(Settings(pools={"alpha": {}, "beta": {}}))
    assert first.topic == constants.DISPATCH_TOPIC
    engine = make_engine(empty_database, pool_size=2)
    try:
        committed = dict.fromkeys(range(4), 0)
        for pool, open_jobs in ((first, {0: 1}), (other, {})):
            lag = LagRepository(engine, topic=pool.topic, partitions=4, first=pool.first)
            assert (await lag.reading(committed)).open == open_jobs
        now = datetime.now(UTC)
        for pool, released in ((other, 0), (first, 1)):
            meter = MeterStore(
                engine, dispatch_topic=pool.topic, events_topic="e", first=pool.first
            )
            assert (await meter.round(lambda _: 10, now)).released == released
        async with engine.connect() as c:
            topics = (await c.execute(select(outbox.c.topic))).scalars().all()
        assert topics == [constants.DISPATCH_TOPIC]
    finally:
        await engine.dispose()


BIG_COLUMNS = {
    ("jobs", "input"),
    ("jobs", "result"),
    ("jobs", "error"),
    ("file_parts", "data"),
    ("batches", "errors"),
    ("webhook_deliveries", "body"),
    ("dead_letters", "payload"),
}
COMPRESSION = (
    "SELECT c.relname, a.attname, a.attcompression::text AS attcompression FROM pg_attribute a "
    "JOIN pg_class c ON c.oid = a.attrelid WHERE c.relnamespace = 'public'::regnamespace "
    "AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped"
)


async def _compression(conn: asyncpg.Connection) -> dict[tuple[str, str], str]:
    return {
        (r["relname"], r["attname"]): r["attcompression"] for r in await conn.fetch(COMPRESSION)
    }


async def test_big_columns_are_lz4_where_the_server_has_it_and_default_after_downgrade(
    empty_database: str,
) -> None:
    """0019z sets lz4 on the columns that hold kilobytes where the server was built with
    lz4, and applies (leaving pglz) where it was not; a value stored after it is compressed
    with the method its column names. The downgrade sets the default back."""
    await migrate.upgrade_async(empty_database)
    conn = await asyncpg.connect(libpq_url(empty_database))
    try:
        lz4 = await conn.fetchval(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        )
        methods = await _compression(conn)
        want = "l" if lz4 else ""
        assert {c: methods[c] for c in BIG_COLUMNS} == dict.fromkeys(BIG_COLUMNS, want)
        assert {m for c, m in methods.items() if c not in BIG_COLUMNS} == {""}
        text = " ".join(
            f"sentence {i} of a long prompt about the quarterly report" for i in range(400)
        )
        await conn.execute(
            "INSERT INTO jobs (id, tenant, kind, state, priority, input, max_tokens, deadline) "
            "VALUES (gen_random_uuid(), 't', 'complete', 'queued', 'normal', $1, 10, "
            "now() + interval '1 hour')",
            text,
        )
        stored = await conn.fetchval("SELECT pg_column_compression(input) FROM jobs")
        assert stored == ("lz4" if lz4 else "pglz")
    finally:
        await conn.close()

    await asyncio.to_thread(migrate.downgrade, empty_database, "0018")
    conn = await asyncpg.connect(libpq_url(empty_database))
    try:
        assert set((await _compression(conn)).values()) == {""}
    finally:
        await conn.close()


async def test_the_cluster_id_columns_keep_their_values_up_and_down(empty_database: str) -> None:
    """0022 renames ``jobs.dispatch_log`` and ``partition_ends.log`` to ``dispatch_cluster_id``
    and ``cluster_id``; what they held stays, and the downgrade renames them back."""
    await migrate.upgrade_async(empty_database, "0021")
    conn = await asyncpg.connect(libpq_url(empty_database))
    try:
        await conn.execute(
            "INSERT INTO jobs (id, tenant, kind, state, priority, input, max_tokens, deadline, "
            "dispatch_log, dispatch_partition, dispatch_offset) VALUES (gen_random_uuid(), 't', "
            "'complete', 'dispatched', 'normal', 'x', 10, now() + interval '1 hour', 'C', 0, 0)"
        )
        await conn.execute(
            "INSERT INTO partition_ends (topic, partition, end_offset, log) VALUES ('d', 0, 1, 'C')"
        )
    finally:
        await conn.close()
    await migrate.upgrade_async(empty_database)
    conn = await asyncpg.connect(libpq_url(empty_database))
    try:
        assert await conn.fetchval("SELECT dispatch_cluster_id FROM jobs") == "C"
        assert await conn.fetchval("SELECT cluster_id FROM partition_ends") == "C"
    finally:
        await conn.close()
    await asyncio.to_thread(migrate.downgrade, empty_database, "0021")
    conn = await asyncpg.connect(libpq_url(empty_database))
    try:
        assert await conn.fetchval("SELECT dispatch_log FROM jobs") == "C"
        assert await conn.fetchval("SELECT log FROM partition_ends") == "C"
    finally:
        await conn.close()
