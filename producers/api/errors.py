"""Map every failure to a JSON error with a stable code."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection

from plumbing.retry import transient_error
from producers.admission.limits import BodyTooLarge, RequestTimeout
from producers.admission.policy import Refused
from producers.metrics import REFUSED
from schemas.completions import SERVED, UnknownEndpoint
from schemas.errors import SluicegateError

log = logging.getLogger(__name__)

DATABASE_RETRY_AFTER_S = 5
# PostgreSQL cannot store U+0000: in text (22021) or in jsonb (22P05). It comes from the
# request (a NUL in a string), and the statement failed, so nothing was stored.
_NUL_IN_TEXT = {"22021", "22P05"}

# Codes the handlers below answer with that no SluicegateError class carries (a class
# carries its own code, status and, in its docstring, its meaning): code -> (status, meaning).
# docs/api.md lists both (tools/apidoc.py); None: the status varies.
HANDLER_CODES: dict[str, tuple[int | None, str]] = {
    "invalid_body": (422, "The body is not a JSON object."),
    "unknown_kind": (422, "`kind` is not one of the job kinds."),
    "unknown_priority": (422, "`priority` is not `low`, `normal` or `high`."),
    "empty_input": (422, "`input` is empty."),
    "missing_input": (422, "The body has no `input`."),
    "missing_kind": (422, "The body has no `kind`."),
    "invalid_character": (422, "The request holds a NUL character, which PostgreSQL cannot store."),
    "not_found": (404, "No such route."),
    "method_not_allowed": (405, "The route does not take this method."),
    "http_error": (None, "Any other HTTP error the framework raises."),
    "database_unavailable": (503, "The database is unavailable; nothing was stored."),
    "database_busy": (
        503,
        "A lock conflict (deadlock, serialization failure) outlasted the retries; nothing was "
        "stored.",
    ),
    "internal_error": (500, "An unexpected error in the server."),
}
# Validation failures whose cause deserves its own code.
_FIELD_CODES = {
    ("kind", "enum"): "unknown_kind",
    ("priority", "enum"): "unknown_priority",
    ("input", "string_too_short"): "empty_input",
    ("input", "missing"): "missing_input",
    ("kind", "missing"): "missing_kind",
}


class _AsciiJSON(JSONResponse):
    """JSON with non-ASCII escaped: an error may quote the caller's text, and text with a
    lone surrogate (valid in JSON as an escape) has no UTF-8 encoding."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def error_response(
    status: int,
    code: str,
    message: str,
    details: Any = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    REFUSED.labels(code=code).inc()
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return _AsciiJSON({"error": body}, status_code=status, headers=headers)


def _validation_code(errors: list[dict[str, Any]]) -> tuple[int, str]:
    for err in errors:
        if err.get("type") == "json_invalid":
            return 400, "invalid_json"
    for err in errors:
        if list(err.get("loc", ()))[:2] == ["query", "wait"]:
            return 422, "invalid_wait"
    for err in errors:
        loc = [p for p in err.get("loc", ()) if p != "body"]
        if loc and (str(loc[0]), err.get("type")) in _FIELD_CODES:
            return 422, _FIELD_CODES[(str(loc[0]), str(err.get("type")))]
    # Not an object: as FastAPI says it of a body, as pydantic says it of a bulk's job.
    if any(err.get("type") in ("model_attributes_type", "model_type") for err in errors):
        return 422, "invalid_body"
    return 422, "invalid_request"


def yield_response(refused: Refused) -> JSONResponse:
    """The explicit yield: a typed refusal with a computed retry hint; nothing was stored."""
    REFUSED.labels(code=refused.code).inc()
    retry_ms = int(refused.retry_after_s * 1000)
    body = {
        "status": "yield",
        "retry_after_ms": retry_ms,
        "reason": refused.reason,
        "lag": refused.lag,
        "error": {"code": refused.code, "message": refused.message},
    }
    headers = {"Retry-After": str(max(1, math.ceil(refused.retry_after_s)))}
    return JSONResponse(body, status_code=refused.status, headers=headers)


async def _refused(_: Request, exc: Refused) -> JSONResponse:
    return yield_response(exc)


async def _sluicegate(_: Request, exc: SluicegateError) -> JSONResponse:
    headers = {"Retry-After": str(DATABASE_RETRY_AFTER_S)} if exc.retriable else None
    return error_response(exc.status, exc.code, exc.message, exc.details, headers)


async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [
        {"loc": list(e.get("loc", ())), "type": e.get("type"), "msg": e.get("msg")}
        for e in exc.errors()
    ]
    status, code = _validation_code(errors)
    return error_response(status, code, "the request is not valid", errors)


async def _body_limit(_: Request, exc: BodyTooLarge | RequestTimeout) -> JSONResponse:
    return error_response(exc.status_code, exc.code, exc.detail, headers=exc.headers)


async def _http(request: Request, exc: HTTPException) -> JSONResponse:
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError | RecursionError):
        # FastAPI could not decode a JSON body: not UTF-8, or nested past the parser.
        reason = "not UTF-8" if isinstance(cause, UnicodeDecodeError) else "nested too deeply"
        return error_response(400, "invalid_json", f"the body is not valid JSON: {reason}")
    if exc.status_code == 404 and request.url.path.startswith("/v1/"):
        unknown = UnknownEndpoint(
            f"Sluicegate does not serve {request.url.path}; it serves {SERVED}"
        )
        return error_response(unknown.status, unknown.code, unknown.message)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail), headers=exc.headers)


async def _database_down(_: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", exc)
    return error_response(
        503,
        "database_unavailable",
        "the database is unavailable; nothing was stored",
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
    )


async def _dbapi(request: Request, exc: DBAPIError) -> JSONResponse:
    kind = transient_error(exc)
    if kind == "connection":
        return await _database_down(request, exc)
    if kind is not None:
        # A lock conflict (deadlock, serialization failure) its retries did not get past:
        # the transaction rolled back.
        log.warning("database busy: %s", exc)
        return error_response(
            503,
            "database_busy",
            "the database was busy with a conflicting change; nothing was stored",
            headers={"Retry-After": "1"},
        )
    if getattr(exc.orig, "sqlstate", None) in _NUL_IN_TEXT:
        return error_response(
            422, "invalid_character", "the request holds a NUL character; nothing was stored"
        )
    log.exception("database error", exc_info=exc)
    return error_response(500, "internal_error", "internal error")


# Every failure's handler, the most specific class first (the order ``answer_for`` tries
# them in; Starlette picks by the exception's class whatever the order).
_HANDLERS: tuple[tuple[type[Exception], Any], ...] = (
    (Refused, _refused),
    (SluicegateError, _sluicegate),
    (RequestValidationError, _invalid),
    (BodyTooLarge, _body_limit),
    (RequestTimeout, _body_limit),
    (HTTPException, _http),
    (PoolTimeout, _database_down),
    (DBAPIError, _dbapi),
    (OSError, _database_down),
)


async def answer_for(conn: HTTPConnection, exc: Exception) -> JSONResponse | None:
    """What the handlers ``install`` registers answer ``exc`` with (None: not one they
    handle), for a route that answers for many requests in one (``POST /v1/jobs/bulk``, a
    submit channel's frames)."""
    for exc_type, handler in _HANDLERS:
        if isinstance(exc, exc_type):
            answer: JSONResponse = await handler(conn, exc)
            return answer
    return None


def install(app: FastAPI) -> None:
    """Answer every failure the routes, the body limits and the database raise."""
    for exc_type, handler in _HANDLERS:
        app.exception_handler(exc_type)(handler)
