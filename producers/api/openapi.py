"""What the OpenAPI document says beyond the routes' signatures: the error answers and the
response headers callers rely on (docs/api.md is generated from it, tools/apidoc.py)."""

from __future__ import annotations

from typing import Any

from producers.api.errors import DATABASE_RETRY_AFTER_S
from schemas import constants
from schemas.api import ErrorResponse

HEADERS: dict[str, dict[str, Any]] = {
    "Retry-After": {
        "description": "Seconds to wait before trying again. A refusal (429, 503): the lag "
        "over the resume level divided by the measured drain rate (before it is measured, "
        "by the rate the running jobs end at the static speed; retry_after_max_s when "
        "nothing is known to drain it or no worker takes jobs), clamped to "
        "[retry_after_min_s, retry_after_max_s]; a 503 of the database: "
        f"{DATABASE_RETRY_AFTER_S}. A job not ended yet: when a poll may see a change.",
        "schema": {"type": "integer"},
    },
    "Location": {
        "description": "The status URL of the job, batch or file",
        "schema": {"type": "string"},
    },
    constants.HEADER_IDEMPOTENT_REPLAY: {
        "description": "`true` when the answer is the one stored for this Idempotency-Key "
        "(nothing new was stored)",
        "schema": {"type": "string", "enum": ["true"]},
    },
    "ETag": {
        "description": "Weak; changes with every state change and write of the job. Send it "
        "back as If-None-Match to get 304 while nothing changed",
        "schema": {"type": "string"},
    },
}


def headers(*names: str) -> dict[str, dict[str, Any]]:
    """The ``headers`` of a documented response."""
    return {name: HEADERS[name] for name in names}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route for these error statuses: the error body, and for 429
    and 503 the Retry-After header."""
    return {
        status: {
            "model": ErrorResponse,
            **({"headers": headers("Retry-After")} if status in (429, 503) else {}),
        }
        for status in statuses
    }
