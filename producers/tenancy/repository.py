"""API keys in the database: create, revoke, and map a key to its tenant.

Keys are stored as their hash (``keys.hash_key``); lookups are cached for
``api_key_cache_s``.
"""

from __future__ import annotations

import time

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from producers.tenancy.keys import hash_key, new_key, valid_tenant, well_formed
from schemas.tables import api_keys


class KeyStore:
    def __init__(self, db: AsyncEngine, *, cache_s: float = 30.0) -> None:
        self._db = db
        self._cache_s = cache_s
        self._cache: dict[str, tuple[str | None, float]] = {}

    async def create(self, tenant: str, name: str | None = None) -> str:
        """A new key for ``tenant``; the only time the key itself is seen."""
        key, public = new_key()
        async with self._db.begin() as conn:
            await conn.execute(
                insert(api_keys).values(
                    id=public,
                    key_hash=hash_key(key),
                    tenant=valid_tenant(tenant),
                    name=name,
                )
            )
        return key

    async def revoke(self, key_id: str) -> bool:
        async with self._db.begin() as conn:
            result = await conn.execute(
                update(api_keys)
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=func.now())
            )
        return bool(result.rowcount)

    async def tenant_of(self, key: str) -> str | None:
        if not well_formed(key):
            return None
        digest = hash_key(key)
        cached = self._cache.get(digest)
        now = time.monotonic()
        if cached is not None and now - cached[1] < self._cache_s:
            return cached[0]
        async with self._db.connect() as conn:
            tenant = await conn.scalar(
                select(api_keys.c.tenant).where(
                    api_keys.c.key_hash == digest, api_keys.c.revoked_at.is_(None)
                )
            )
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (tenant, now)
        return tenant
