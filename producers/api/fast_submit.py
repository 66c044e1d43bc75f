"""``POST /v1/jobs`` without FastAPI's per-request machinery, for the common valid request.

Why: the single submit is the busiest route, and FastAPI spent about 40 % of the API's CPU
on it solving the route's dependencies and validating its parameters (a model built per
parameter, the query string parsed: docs/performance.md). This layer sits in front of the
app's router, inside the middleware (the body limits, the error handlers), and answers a
plain submit itself: the body parsed and validated by the route's own body field, the caller
found by the same ``current_caller``, the job made, admitted and stored by the route's own
code (``jobs.submitted``), whose answer it sends.

The parity rule: every answer is the one the FastAPI route gives, byte for byte. So the fast
path takes only a request it is sure of: no query string (``?wait=``), one JSON content type
of the usual spellings, no repeated header it reads, an Idempotency-Key within its 255, a
body that is a JSON object the model accepts. Anything else (an error FastAPI words itself:
invalid JSON, a wrong content type, a field that fails validation), and every request while
FastAPI's telemetry or a test's dependency overrides are on, is handed to the router
unchanged, the body it read replayed, and the FastAPI route answers it as before. The caller
is found once the body is valid, where FastAPI finds it first: a bad key with a bad body is
the route's to answer, a bad key with a valid body is the same 401 either way. What the
route's code raises (401, 409, 429, 503...) goes to the same error handlers, which sit
outside the router. ``api_fast_submit = false`` turns the layer off;
tests/integration/test_fast_submit.py holds the two to the rule.
"""

from __future__ import annotations

import json

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producers.api import jobs
from producers.api.deps import current_caller
from schemas import constants
from schemas.api import SubmitJob

# The content types FastAPI reads as JSON, in the spellings clients send (any other one is
# left to FastAPI's own parsing of it).
_JSON_TYPES = frozenset(
    {b"application/json", b"application/json; charset=utf-8", b"application/json;charset=utf-8"}
)
_CONTENT_TYPE = b"content-type"
_AUTHORIZATION = b"authorization"
_TENANT = constants.HEADER_TENANT.lower().encode()
_IDEMPOTENCY_KEY = constants.HEADER_IDEMPOTENCY_KEY.lower().encode()
_READ = frozenset({_CONTENT_TYPE, _AUTHORIZATION, _TENANT, _IDEMPOTENCY_KEY})
MAX_KEY = 255  # the route's max_length of the Idempotency-Key header


class FastSubmit:
    """In front of ``app``, the router: a plain ``POST /v1/jobs`` answered here, every other
    request (and a submit this is not sure of) passed to ``app``."""

    def __init__(self, app: ASGIApp, route: APIRoute) -> None:
        self.app = app
        self.route = route
        if route.body_field is None:
            raise ValueError(f"{route.path} has no body")
        self.body_field = route.body_field

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope)
        headers = None if route is None else _headers(scope)
        if route is None or headers is None:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = await _body(receive, messages)
        submit = None if body is None else self._valid(body)
        if submit is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        scope.update(route)  # the route and its endpoint, as the router sets them
        state = scope["app"].state
        caller = await current_caller(
            state.settings,
            state.keys,
            _text(headers.get(_AUTHORIZATION)),
            _text(headers.get(_TENANT)),
        )
        key = _text(headers.get(_IDEMPOTENCY_KEY))
        response = await jobs.submitted(state, submit, caller.tenant, key, None, receive)
        await response(scope, receive, send)

    def _route(self, scope: Scope) -> Scope | None:
        """What the route adds to the scope of a ``POST /v1/jobs`` the fast path may take;
        None for another request, one with a query string, and any while FastAPI's
        telemetry (its spans) or a test's dependency overrides are on."""
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["query_string"]
            or "fastapi.telemetry" in scope
            or scope["app"].dependency_overrides
        ):
            return None
        match, child = self.route.matches(scope)
        return child if match is Match.FULL else None

    def _valid(self, body: bytes) -> SubmitJob | None:
        """The body as the route validates it; None where FastAPI should say why not."""
        if not body:
            return None
        try:
            data = json.loads(body)  # as Starlette's Request.json
        except Exception:  # FastAPI words each failure itself
            return None
        if type(data) is not dict:
            return None
        value, errors = self.body_field.validate(data, {}, loc=("body",))
        return value if not errors and isinstance(value, SubmitJob) else None


def _headers(scope: Scope) -> dict[bytes, bytes] | None:
    """The headers the route reads; None if the request is not one the fast path takes:
    not JSON, a header it reads repeated, an Idempotency-Key over its limit."""
    found: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in _READ:
            if name in found:
                return None
            found[name] = value
    content_type = found.get(_CONTENT_TYPE)
    if content_type is None or content_type.lower() not in _JSON_TYPES:
        return None
    if len(found.get(_IDEMPOTENCY_KEY, b"")) > MAX_KEY:
        return None
    return found


def _text(value: bytes | None) -> str | None:
    """A header's value as Starlette decodes it."""
    return None if value is None else value.decode("latin-1")


async def _body(receive: Receive, messages: list[Message]) -> bytes | None:
    """The whole body, each message kept in ``messages``; None if the client left first
    (FastAPI answers that). What the body limits raise from ``receive`` goes up to the
    error handlers, as it does from FastAPI's read."""
    chunks = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` with the messages already read given again first."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def submit_route() -> APIRoute:
    """The FastAPI route of ``POST /v1/jobs``."""
    for route in jobs.router.routes:
        if isinstance(route, APIRoute) and route.endpoint is jobs.submit:
            return route
    raise LookupError("no POST /v1/jobs route")


def install(app: FastAPI) -> None:
    """Put the fast path in front of ``app``'s router (inside its middleware)."""
    app.router.middleware_stack = FastSubmit(app.router.middleware_stack, submit_route())
