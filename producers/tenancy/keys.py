"""API keys and tenant names: their form, and the hash a key is stored as.

A key is ``sk_<id>_<secret>``; only its SHA-256 is stored (keys are random, so a plain
hash is enough: there is nothing to guess).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from schemas.errors import InvalidRequest, OperatorOnly

_TENANT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_KEY = re.compile(r"^sk_([0-9a-f]{12})_[A-Za-z0-9_-]{20,128}$")


@dataclass(frozen=True, kw_only=True)
class Caller:
    """Who calls: the key's tenant, and whether the key is an operator's (it sees every
    tenant's jobs and batches and may filter them by tenant)."""

    tenant: str
    operator: bool = False

    def scope(self, tenant: str | None) -> str | None:
        """The tenant a list is limited to for a ``tenant=`` filter: a plain key always its
        own (another tenant's name is ``OperatorOnly``), an operator key the one named or
        every tenant (None)."""
        if self.operator:
            return tenant
        if tenant is not None and tenant != self.tenant:
            raise OperatorOnly(f"only an operator key may list tenant {tenant}'s jobs")
        return self.tenant

    @property
    def owner(self) -> str | None:
        """The tenant one job or batch must belong to (None: any, for an operator)."""
        return None if self.operator else self.tenant


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(key: str) -> str | None:
    """The public id of a well-formed key ("sk_<12 hex>"), else None."""
    found = _KEY.match(key)
    return f"sk_{found.group(1)}" if found else None


def well_formed(key: str) -> bool:
    return _KEY.match(key) is not None


def new_key() -> tuple[str, str]:
    """A new random key and its public id."""
    public = secrets.token_hex(6)
    return f"sk_{public}_{secrets.token_urlsafe(32)}", f"sk_{public}"


def valid_tenant(tenant: str) -> str:
    if not _TENANT.match(tenant):
        raise InvalidRequest("tenant must be 1-64 of A-Z a-z 0-9 . _ -")
    return tenant
