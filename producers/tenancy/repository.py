"""API keys in the database: create, list, revoke, and map a key to its caller.

Keys are stored as their hash (``keys.hash_key``); lookups are cached for
``api_key_cache_s``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.db import transaction
from producers.tenancy.keys import Caller, hash_key, new_key, valid_tenant, well_formed
from schemas.tables import api_keys


@dataclass(frozen=True, kw_only=True)
class KeyInfo:
    """A key as listed: never the key itself, which is not stored."""

    id: str
    tenant: str
    name: str | None
    operator: bool
    created_at: datetime
    revoked_at: datetime | None


class KeyStore:
    def __init__(self, db: AsyncEngine, *, cache_s: float = 30.0) -> None:
        self._db = db
        self._cache_s = cache_s
        self._cache: dict[str, tuple[Caller | None, float]] = {}

    async def create(self, tenant: str, name: str | None = None, *, operator: bool = False) -> str:
        """A new key for ``tenant`` (an operator's: it sees every tenant); the only time the
        key itself is seen."""
        key, public = new_key()
        async with transaction(self._db) as conn:
            await conn.execute(
                insert(api_keys).values(
                    id=public,
                    key_hash=hash_key(key),
                    tenant=valid_tenant(tenant),
                    name=name,
                    operator=operator,
                )
            )
        return key

    async def revoke(self, key_id: str) -> bool:
        async with transaction(self._db) as conn:
            result = await conn.execute(
                update(api_keys)
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=func.now())
            )
        return bool(result.rowcount)

    async def grant_operator(self, key: str) -> bool:
        """Make an active key an operator's; whether there was one."""
        async with transaction(self._db) as conn:
            result = await conn.execute(
                update(api_keys)
                .where(api_keys.c.key_hash == hash_key(key), api_keys.c.revoked_at.is_(None))
                .values(operator=True)
            )
        self._cache.clear()
        return bool(result.rowcount)

    async def list(self) -> list[KeyInfo]:
        """Every key, oldest first, revoked ones too."""
        columns = [c for c in api_keys.c if c.name != "key_hash"]
        async with self._db.connect() as conn:
            rows = (
                (await conn.execute(select(*columns).order_by(api_keys.c.created_at)))
                .mappings()
                .all()
            )
        return [KeyInfo(**dict(r)) for r in rows]

    async def tenant_of(self, key: str) -> str | None:
        caller = await self.caller_of(key)
        return None if caller is None else caller.tenant

    async def caller_of(self, key: str) -> Caller | None:
        """The caller a key stands for; None for an unknown or revoked key."""
        if not well_formed(key):
            return None
        digest = hash_key(key)
        cached = self._cache.get(digest)
        now = time.monotonic()
        if cached is not None and now - cached[1] < self._cache_s:
            return cached[0]
        async with self._db.connect() as conn:
            row = (
                await conn.execute(
                    select(api_keys.c.tenant, api_keys.c.operator).where(
                        api_keys.c.key_hash == digest, api_keys.c.revoked_at.is_(None)
                    )
                )
            ).first()
        caller = None if row is None else Caller(tenant=row.tenant, operator=row.operator)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (caller, now)
        return caller
