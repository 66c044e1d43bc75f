"""Who is looking at the page: the login cookie, the viewer it names, and the CSRF checks
of the page's few writes (cancel, redeliver).

The cookie holds the API key itself, HttpOnly and SameSite=Strict (Secure over https),
scoped to /ui: it is checked on every request exactly as the API checks a bearer key
(``KeyStore.tenant_of``, cached ``api_key_cache_s``), so a revoked key logs the page out
within that time and nothing else has to be stored. A write must also carry a token
derived from the cookie (an HMAC of it, which a page of another origin cannot compute) and,
when the browser sends one, an Origin of this very host.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import quote, urlsplit

from fastapi import Depends, Request

from plumbing.settings import Settings
from producers.tenancy.keys import Caller, valid_tenant
from producers.tenancy.repository import KeyStore
from schemas.errors import InvalidRequest, SluicegateError

COOKIE = "sluicegate_ui"
COOKIE_PATH = "/ui"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
_CSRF_SALT = b"sluicegate-ui-csrf-v1"


@dataclass(frozen=True, kw_only=True)
class Viewer:
    """The logged-in caller (its tenant, and whether its key is an operator's, which sees
    every tenant), and the token its forms carry."""

    caller: Caller
    csrf: str

    @property
    def tenant(self) -> str:
        return self.caller.tenant

    @property
    def operator(self) -> bool:
        return self.caller.operator


class LoginRequired(Exception):
    """No valid login cookie: the page answers with a redirect to the login form."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


class CsrfRefused(SluicegateError):
    """A write from the page without its token, or from another origin."""

    code = "csrf_refused"
    status = 403


def csrf_token(credential: str) -> str:
    """The token of the session whose cookie is ``credential``."""
    return hmac.new(credential.encode(), _CSRF_SALT, hashlib.sha256).hexdigest()


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether an ``Origin`` header names this host (any scheme: TLS may end at a proxy).
    A request without Origin passes this check (the token still has to match); ``null``
    and other hosts do not."""
    if origin is None:
        return True
    if not host:
        return False
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def check_write(
    *, credential: str, token: str | None, origin: str | None, host: str | None
) -> None:
    """A write is the viewer's own: the token matches its cookie and the origin is ours."""
    if not token or not hmac.compare_digest(token, csrf_token(credential)):
        raise CsrfRefused("the form is stale or not this page's: reload the page and try again")
    if not same_origin(origin, host):
        raise CsrfRefused("a write to this page must come from this page")


def safe_next(value: str | None) -> str:
    """Where to go after the login: a path of the page, never another site."""
    if value and (value == COOKIE_PATH or value.startswith((f"{COOKIE_PATH}/", f"{COOKIE_PATH}?"))):
        parts = urlsplit(value)
        if not parts.scheme and not parts.netloc:
            return value
    return COOKIE_PATH


def login_url(next_path: str) -> str:
    return f"{COOKIE_PATH}/login?next={quote(next_path, safe='/')}"


async def caller_of(settings: Settings, keys: KeyStore, credential: str) -> Caller | None:
    """The caller a credential logs in as, as the API would take it: an API key (the
    ``auth = tenant_header`` deployments, which trust the caller, take a tenant name)."""
    credential = credential.strip()
    if not credential:
        return None
    if settings.auth == "tenant_header":
        try:
            return Caller(tenant=valid_tenant(credential))
        except InvalidRequest:
            return None
    return await keys.caller_of(credential)


async def viewer(request: Request) -> Viewer:
    """The viewer of a page, or LoginRequired (a redirect to the login form)."""
    credential = request.cookies.get(COOKIE)
    state = request.app.state
    caller = await caller_of(state.settings, state.keys, credential) if credential else None
    if caller is None or credential is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target)
    return Viewer(caller=caller, csrf=csrf_token(credential))


async def writer(request: Request) -> Viewer:
    """The viewer of a write (POST): its login, its CSRF token (form field or header) and
    its origin checked."""
    found = await viewer(request)
    token = request.headers.get(CSRF_HEADER)
    if token is None:
        form = await request.form(max_files=0, max_fields=4)
        field = form.get(CSRF_FIELD)
        token = field if isinstance(field, str) else None
    check_write(
        credential=request.cookies[COOKIE],
        token=token,
        origin=request.headers.get("origin"),
        host=request.headers.get("host"),
    )
    return found


Viewing = Annotated[Viewer, Depends(viewer)]
Writing = Annotated[Viewer, Depends(writer)]
