"""Upgrade an empty database to head, compare with the table metadata, down and up again."""

import uuid

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.engine import Connection, make_url

from plumbing.db import libpq_url, make_engine
from schemas.tables import metadata
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
