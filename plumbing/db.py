"""Database engine factory and URL handling."""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


def sqlalchemy_url(url: str) -> str:
    """The same database as a SQLAlchemy asyncpg URL."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The same database as a plain postgresql:// URL (for asyncpg.connect)."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def make_engine(url: str, *, pool_size: int = 10, autocommit: bool = False) -> AsyncEngine:
    """A pooled engine; its connections are checked with a ping when taken from the pool.

    ``autocommit``: every statement is its own transaction. The ping of such a connection
    is one round trip (``;``); on the others, asyncpg's dialect wraps it in BEGIN and
    ROLLBACK, three round trips."""
    return create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_timeout=10,
        **({"isolation_level": "AUTOCOMMIT"} if autocommit else {}),
    )
