"""Database engine factory, URL handling, and the one way to open a transaction.

Connections are autocommit: a statement on its own is its own transaction, one round trip,
with no ``BEGIN`` and ``COMMIT`` around it. Where two writes must be atomic, ``transaction``
opens a real one. A connection is not pinged when it is taken from the pool (SQLAlchemy's
asyncpg dialect pings in a ``BEGIN``/``ROLLBACK``, three round trips); instead one the server
closed is replaced at no cost (``checked_out``), and a statement that fails on a connection
that dropped meanwhile is retried by its caller's retry (``plumbing.retry``), which counts it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from plumbing.metrics import RETRIES


def sqlalchemy_url(url: str) -> str:
    """The same database as a SQLAlchemy asyncpg URL."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The same database as a plain postgresql:// URL (for asyncpg.connect)."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def make_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """A pooled engine of autocommit connections (``transaction`` for a real one)."""
    engine = create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=10,
        isolation_level="AUTOCOMMIT",
    )
    event.listen(engine.sync_engine, "checkout", checked_out)
    return engine


def checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """A connection whose socket the server closed (a restart, an idle timeout) is known
    without a round trip (asyncpg saw the close): the pool drops it and takes another."""
    driver = getattr(dbapi_connection, "driver_connection", None)
    if driver is not None and driver.is_closed():
        RETRIES.labels(operation="db_checkout", error="connection_closed").inc()
        raise DisconnectionError("the server closed this connection")


@asynccontextmanager
async def transaction(
    engine: AsyncEngine, isolation: str = "READ COMMITTED"
) -> AsyncIterator[AsyncConnection]:
    """A connection in a transaction (``BEGIN`` … ``COMMIT``, or ``ROLLBACK`` on an error),
    for writes that must be atomic: on an autocommit engine ``engine.begin()`` is not one."""
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level=isolation)
        async with conn.begin():
            yield conn
