"""Database engine factory, URL handling, and the one way to open a transaction.

Connections are autocommit: a statement on its own is its own transaction, one round trip,
with no ``BEGIN`` and ``COMMIT`` around it. Where two writes must be atomic, ``transaction``
opens a real one. A connection is not pinged when it is taken from the pool (SQLAlchemy's
asyncpg dialect pings in a ``BEGIN``/``ROLLBACK``, three round trips); instead one the server
closed is replaced at no cost (``checked_out``), and a statement that fails on a connection
that dropped meanwhile is retried by its caller's retry (``plumbing.retry``), which counts it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError
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
    if closed_by_server(dbapi_connection):
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


class KeptConnections:
    """A few connections kept open between statements, for a writer whose statements follow
    one another: the API's submits.

    Why: taking a connection from SQLAlchemy's pool and giving it back costs more CPU than the
    submit's statement itself (docs/performance.md), and a lone caller waits for both. Kept
    open, a connection in autocommit runs each statement as its own transaction, as one taken
    from the pool does.

    A connection the server closed (a restart, an idle timeout: asyncpg saw its socket close)
    is dropped before use, without a round trip, as the pool's checkout does; one whose
    statement failed with its connection broken is dropped after. At most ``keep`` wait for
    the next statement; more in use at once are opened and closed as needed.
    """

    def __init__(self, engine: AsyncEngine, *, keep: int) -> None:
        self._engine = engine
        self._keep = keep
        self._idle: list[AsyncConnection] = []

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        conn = await self._take()
        try:
            yield conn
        except BaseException as exc:
            broken = not isinstance(exc, DBAPIError) or exc.connection_invalidated
            if broken or isinstance(exc, InterfaceError):
                await _close(conn)  # its state is not known: not kept
            else:
                await self._give_back(conn)
            raise
        await self._give_back(conn)

    async def _take(self) -> AsyncConnection:
        while self._idle:
            conn = self._idle.pop()
            if _open(conn):
                return conn
            await _close(conn)
        return await self._engine.connect()

    async def _give_back(self, conn: AsyncConnection) -> None:
        if len(self._idle) < self._keep and _open(conn):
            self._idle.append(conn)
        else:
            await _close(conn)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close(conn)


def _open(conn: AsyncConnection) -> bool:
    """Whether the connection is open as far as asyncpg knows (no round trip)."""
    if conn.closed or conn.invalidated or conn.sync_connection is None:
        return False
    return not closed_by_server(conn.sync_connection.connection)


def closed_by_server(connection: Any) -> bool:
    """Whether asyncpg saw the socket of ``connection`` (the DBAPI one, or the pool's proxy
    of it) close: known without a round trip."""
    driver = getattr(connection, "driver_connection", None)
    return driver is not None and driver.is_closed()


async def _close(conn: AsyncConnection) -> None:
    with contextlib.suppress(Exception):
        await conn.close()
