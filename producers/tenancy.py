"""Who is calling: an API key maps to its tenant, and every read and write is scoped to it.

A key is ``sk_<id>_<secret>``; only its SHA-256 is stored (keys are random, so a plain
hash is enough: there is nothing to guess). Lookups are cached for ``api_key_cache_s``.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from schemas import constants
from schemas.errors import InvalidRequest, Unauthorized
from schemas.tables import api_keys

_TENANT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_KEY = re.compile(r"^sk_([0-9a-f]{12})_[A-Za-z0-9_-]{20,128}$")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(key: str) -> str | None:
    """The public id of a well-formed key ("sk_<12 hex>"), else None."""
    found = _KEY.match(key)
    return f"sk_{found.group(1)}" if found else None


def valid_tenant(tenant: str) -> str:
    if not _TENANT.match(tenant):
        raise InvalidRequest("tenant must be 1-64 of A-Z a-z 0-9 . _ -")
    return tenant


class KeyStore:
    def __init__(self, db: AsyncEngine, *, cache_s: float = 30.0) -> None:
        self._db = db
        self._cache_s = cache_s
        self._cache: dict[str, tuple[str | None, float]] = {}

    async def create(self, tenant: str, name: str | None = None) -> str:
        """A new key for ``tenant``; the only time the key itself is seen."""
        key_id = secrets.token_hex(6)
        key = f"sk_{key_id}_{secrets.token_urlsafe(32)}"
        async with self._db.begin() as conn:
            await conn.execute(
                insert(api_keys).values(
                    id=f"sk_{key_id}",
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
        if not _KEY.match(key):
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


async def current_tenant(
    request: Request,
    authorization: Annotated[
        str | None, Header(description="Bearer <API key> (auth = api_key)")
    ] = None,
    tenant: Annotated[
        str | None,
        Header(
            alias=constants.HEADER_TENANT,
            description="The tenant, trusted only with auth = tenant_header",
        ),
    ] = None,
) -> str:
    """The caller's tenant, by the deployment's ``auth`` setting."""
    if request.app.state.auth == "tenant_header":
        return valid_tenant(tenant or constants.DEFAULT_TENANT)
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key:
        raise Unauthorized("send Authorization: Bearer <API key>")
    store: KeyStore = request.app.state.keys
    owner = await store.tenant_of(key.strip())
    if owner is None:
        raise Unauthorized("unknown or revoked API key")
    return owner


# The calling tenant, for a route's signature: every query a route makes is scoped to it.
Tenant = Annotated[str, Depends(current_tenant)]
