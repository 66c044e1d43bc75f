"""The lists' filters, read from a page's query string: what a filter form sends (empty
fields included) and what a paging link carries on. Pure, so that a unit test covers
every odd input without a server."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import urlencode

from producers.tenancy.keys import valid_tenant
from schemas.errors import InvalidRequest
from schemas.states import JobState

PAGE_SIZES = (20, 50, 100)
DEFAULT_PAGE = 50
MAX_MODEL = 128


@dataclass(frozen=True, kw_only=True)
class JobFilter:
    states: tuple[JobState, ...] = ()
    model: str | None = None
    tenant: str | None = None
    batch_id: str | None = None
    after: str | None = None
    limit: int = DEFAULT_PAGE
    problems: tuple[str, ...] = field(default=(), compare=False)

    def query(self, **changes: object) -> str:
        """This filter's query string, with ``changes`` (``after=None`` for the first
        page); empty fields are left out."""
        chosen = replace(self, **changes)  # type: ignore[arg-type]
        pairs: list[tuple[str, str]] = [("state", s.value) for s in chosen.states]
        for name in ("model", "tenant", "batch_id", "after"):
            value = getattr(chosen, name)
            if value:
                pairs.append((name, value))
        if chosen.limit != DEFAULT_PAGE:
            pairs.append(("limit", str(chosen.limit)))
        return urlencode(pairs)


def _one(params: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = [v.strip() for v in params.get(name, ()) if v.strip()]
    return values[-1] if values else None


def _uuid(value: str | None, name: str, problems: list[str]) -> str | None:
    if value is None:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        problems.append(f"{name} {value!r} is not an id")
        return None


def job_filter(params: Mapping[str, Sequence[str]]) -> JobFilter:
    """The filter of a query string (``params``: each name's values, as
    ``parse_qs`` or Starlette's ``multi_items`` give them). A value that cannot be used is
    left out and named in ``problems``, so that the page shows the rest and says why."""
    problems: list[str] = []
    states: list[JobState] = []
    for raw in params.get("state", ()):
        raw = raw.strip().lower()
        if not raw:
            continue
        try:
            state = JobState(raw)
        except ValueError:
            problems.append(f"no state {raw!r}")
            continue
        if state not in states:
            states.append(state)
    tenant = _one(params, "tenant")
    if tenant is not None:
        try:
            valid_tenant(tenant)
        except InvalidRequest:
            problems.append(f"tenant {tenant!r} is not a tenant name")
            tenant = None
    model = _one(params, "model")
    if model is not None and len(model) > MAX_MODEL:
        problems.append("model is too long")
        model = None
    limit = DEFAULT_PAGE
    if (raw_limit := _one(params, "limit")) is not None:
        if raw_limit.isdigit() and int(raw_limit) in PAGE_SIZES:
            limit = int(raw_limit)
        else:
            problems.append(f"limit must be one of {', '.join(map(str, PAGE_SIZES))}")
    return JobFilter(
        states=tuple(states),
        model=model,
        tenant=tenant,
        batch_id=_uuid(_one(params, "batch_id"), "batch_id", problems),
        after=_uuid(_one(params, "after"), "after", problems),
        limit=limit,
        problems=tuple(problems),
    )


def multi(items: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """A query string's (name, value) pairs by name."""
    found: dict[str, list[str]] = {}
    for name, value in items:
        found.setdefault(name, []).append(value)
    return found
