"""``POST /v1/jobs`` without FastAPI's per-request machinery, for the common valid request.

Why: the single submit is the busiest route, and FastAPI spent about 40 % of the API's CPU
on it solving the route's dependencies and validating its parameters (a model built per
parameter, the query string parsed: docs/performance.md). This layer sits in the app's
router, inside the middleware (the body limits, the error handlers), and answers a plain
submit itself: the body parsed and validated as the route validates it, the caller found by
the same ``current_caller``, the job made, admitted and stored by the route's own
code (``jobs.submitted``), whose answer it sends.

The layer is a Starlette route (the public ``BaseRoute``) put first among the app's routes:
every ``POST /v1/jobs`` is matched to it before the FastAPI route, and one it hands over goes
back to the router, which then passes the layer by and routes it as before. The body is
validated by the route's own model (``SubmitJob``) as FastAPI validates a body parameter
(``from_attributes``). Only public FastAPI, Starlette and pydantic API is used.

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
outside the router. ``api_fast_submit = false`` leaves the layer out;
tests/integration/test_fast_submit.py holds the two to the rule.
"""

from __future__ import annotations

import json

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.datastructures import URLPath
from starlette.routing import BaseRoute, Match, NoMatchFound
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
# What ``matches`` leaves in the scope for ``handle``, the scope the FastAPI route adds;
# and the mark of a request handed back to the router.
_ROUTE = "sluicegate.fast_submit.route"
_HANDED = "sluicegate.fast_submit.handed"
MAX_KEY = 255  # the route's max_length of the Idempotency-Key header


class FastSubmit(BaseRoute):
    """The first of the app's routes: a plain ``POST /v1/jobs`` answered here, one this is
    not sure of handed back to the router, which then passes this route by and routes it
    as it routes every other request."""

    def __init__(self, route: APIRoute) -> None:
        self.route = route
        self.handed: ASGIApp = self._hand_over  # where a request this hands over goes

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """FULL for a ``POST /v1/jobs`` (not one handed back), with the scope the FastAPI
        route adds kept aside for ``handle``; NONE for any other request."""
        if scope["type"] != "http" or scope["method"] != "POST" or _HANDED in scope:
            return Match.NONE, {}
        match, child = self.route.matches(scope)
        return (Match.FULL, {_ROUTE: child}) if match is Match.FULL else (Match.NONE, {})

    def url_path_for(self, name: str, /, **path_params: object) -> URLPath:
        raise NoMatchFound(name, path_params)  # the FastAPI route has the name

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope) if _takes(scope) else None
        if headers is None:
            await self.handed(scope, receive, send)
            return
        messages: list[Message] = []
        body = await _body(receive, messages)
        submit = None if body is None else _valid(body)
        if submit is None:
            await self.handed(scope, _replay(messages, receive), send)
            return
        scope.update(scope[_ROUTE])  # the route and its endpoint, as the router sets them
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

    async def _hand_over(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The router again, which this route then lets pass: FastAPI's own route answers."""
        scope[_HANDED] = True
        await scope["router"](scope, receive, send)


def _takes(scope: Scope) -> bool:
    """Whether the fast path may take the submit: not with a query string, nor while
    FastAPI's telemetry (its spans) or a test's dependency overrides are on."""
    return not (
        scope["query_string"] or "fastapi.telemetry" in scope or scope["app"].dependency_overrides
    )


def _valid(body: bytes) -> SubmitJob | None:
    """The body as the route validates it; None where FastAPI should say why not."""
    if not body:
        return None
    try:
        data = json.loads(body)  # as Starlette's Request.json
    except Exception:  # FastAPI words each failure itself
        return None
    if type(data) is not dict:
        return None
    try:  # as FastAPI validates a body parameter
        return SubmitJob.model_validate(data, from_attributes=True)
    except ValidationError:
        return None


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
    """Put the fast path first among ``app``'s routes (inside its middleware)."""
    app.router.routes.insert(0, FastSubmit(submit_route()))
