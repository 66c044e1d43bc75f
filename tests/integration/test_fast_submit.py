"""POST /v1/jobs through the fast path (producers/api/fast_submit.py) and through the FastAPI
route alone (``api_fast_submit = false``), on one database: every request, valid or not, is
answered with the same status, headers and body bytes, and moves the same counters (jobs
accepted, requests refused, admission decisions); the fast path answers the plain requests
itself and hands the others to the route."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import Receive, Scope, Send

from plumbing.settings import Settings
from producers.api.app import create_app
from producers.api.fast_submit import FastSubmit
from producers.lag.rule import Reading
from producers.metrics import ADMISSIONS, REFUSED, SUBMITTED
from producers.tenancy.repository import KeyStore
from schemas.constants import M_SUBMITTED

# Not published at once: a job stays queued, so its answers do not change between requests.
LIMITS = {
    "auth": "api_key",
    "max_body_bytes": 8192,
    "max_input_bytes": 2000,
    "publish_at_once": False,
}
JOB: dict[str, Any] = {"kind": "summarize", "input": "The gate holds.", "ttl_s": 600}
JSON = {"Content-Type": "application/json"}
# In each case's headers, KEY stands for the caller's API key.
KEY = "<key>"
BEARER = {**JSON, "Authorization": f"Bearer {KEY}"}


def job(**fields: Any) -> bytes:
    return json.dumps({**JOB, **fields}).encode()


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    """A body without Content-Length."""
    for at in range(0, len(data), 1000):
        yield data[at : at + 1000]


# id: (body, headers, query): refused by both, in the same words. Those in HANDED_OVER FastAPI
# words itself (the fast path hands them to the route); the body limit refuses "too-large"
# before either; the fast path refuses the others, in the route's code.
REFUSALS: dict[str, tuple[bytes, dict[str, str], str]] = {
    "no-key": (job(), JSON, ""),
    "key-not-bearer": (job(), {**JSON, "Authorization": KEY}, ""),
    "unknown-key": (job(), {**JSON, "Authorization": "Bearer sk_0123456789ab_" + "x" * 30}, ""),
    "invalid-json": (b'{"kind": "summarize", "input": ', BEARER, ""),
    "invalid-json-and-no-key": (b'{"kind": ', JSON, ""),
    "not-utf8": (b'{"kind": "summarize", "input": "\xff\xfe"}', BEARER, ""),
    "nested-too-deeply": (b"[" * 3000 + b"]" * 3000, BEARER, ""),
    "text-plain": (job(), {**BEARER, "Content-Type": "text/plain"}, ""),
    "no-content-type": (job(), {"Authorization": f"Bearer {KEY}"}, ""),
    "empty": (b"", BEARER, ""),
    "array": (b"[1, 2]", BEARER, ""),
    "null": (b"null", BEARER, ""),
    "extra-field": (job(colour="red"), BEARER, ""),
    "extra-field-and-no-key": (job(colour="red"), JSON, ""),
    "string-max-tokens": (job(max_tokens="12"), BEARER, ""),
    "float-max-tokens": (job(max_tokens=12.5), BEARER, ""),
    "no-kind": (json.dumps({"input": "x"}).encode(), BEARER, ""),
    "unknown-kind": (job(kind="sing"), BEARER, ""),
    "empty-input": (job(input=""), BEARER, ""),
    "ttl-nan": (b'{"kind": "summarize", "input": "x", "ttl_s": NaN}', BEARER, ""),
    "naive-deadline": (job(ttl_s=None, deadline="2030-01-01T00:00:00"), BEARER, ""),
    "key-too-long": (job(), {**BEARER, "Idempotency-Key": "k" * 256}, ""),
    "wait-0": (job(), BEARER, "wait=0"),
    "wait-abc": (job(), BEARER, "wait=abc"),
    "wait-negative": (job(), BEARER, "wait=-1"),
    "wait-too-long": (job(), BEARER, "wait=100000"),
    "too-large": (job(input="x" * 9000), BEARER, ""),
    "blank-input": (job(input="   "), BEARER, ""),
    "input-too-large": (job(input="x" * 3000), BEARER, ""),
    "unknown-model": (job(model="nope"), BEARER, ""),
    "deadline-past": (job(ttl_s=None, deadline="2001-01-01T00:00:00Z"), BEARER, ""),
    "deadline-and-ttl": (job(deadline="2030-01-01T00:00:00Z"), BEARER, ""),
    "ttl-infinity": (b'{"kind": "summarize", "input": "x", "ttl_s": Infinity}', BEARER, ""),
    "max-tokens-too-large": (job(max_tokens=10**30), BEARER, ""),
    "nul-character": (job(input="a\u0000b"), BEARER, ""),
    "keys-differ": (job(idempotency_key="b"), {**BEARER, "Idempotency-Key": "a"}, ""),
}
HANDED_OVER = {
    "invalid-json",
    "invalid-json-and-no-key",
    "not-utf8",
    "nested-too-deeply",
    "text-plain",
    "no-content-type",
    "empty",
    "array",
    "null",
    "extra-field",
    "extra-field-and-no-key",
    "string-max-tokens",
    "float-max-tokens",
    "no-kind",
    "unknown-kind",
    "empty-input",
    "ttl-nan",
    "naive-deadline",
    "key-too-long",
    "wait-0",
    "wait-abc",
    "wait-negative",
    "wait-too-long",
}
# id: (body, headers): stored by both (an Idempotency-Key is added); those in FAST_STORED
# by the fast path itself.
STORED: dict[str, tuple[bytes, dict[str, str]]] = {
    "plain": (job(), BEARER),
    "every-field": (
        job(
            max_tokens=9,
            priority="high",
            model="sim",
            temperature=0.5,
            stop=["."],
            abandon_after_s=60,
            callback_url="https://example.com/hook",
        ),
        BEARER,
    ),
    "charset": (job(), {**BEARER, "Content-Type": "application/json; charset=utf-8"}),
    "upper-case-type": (job(), {**BEARER, "Content-Type": "Application/JSON"}),
    "lower-case-bearer": (job(), {**BEARER, "Authorization": f"bearer {KEY}"}),
    "utf-16": (json.dumps(JOB).encode("utf-16-le"), BEARER),
    "json-suffix-type": (job(), {**BEARER, "Content-Type": "application/vnd.sg+json"}),
    "streamed": (job(input="y" * 1500), BEARER),
}
FAST_STORED = {"plain", "every-field", "charset", "upper-case-type", "lower-case-bearer"}
FAST_STORED |= {"utf-16", "streamed"}


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    counted: Counter[tuple[str, str]]  # what the request added to the submit's counters


def accepted(answer: Answer) -> int:
    """The jobs ``sluicegate_jobs_submitted_total`` counted for the answer's request."""
    return sum(n for (name, _), n in answer.counted.items() if name == M_SUBMITTED)


def counters() -> Counter[tuple[str, str]]:
    """The counters a submit moves: jobs accepted, requests refused, admission decisions."""
    found: Counter[tuple[str, str]] = Counter()
    for family in (SUBMITTED, REFUSED, ADMISSIONS):
        for metric in family.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    found[(sample.name, str(sorted(sample.labels.items())))] = int(sample.value)
    return found


@dataclass
class Apps:
    fast: httpx.AsyncClient
    plain: httpx.AsyncClient
    key: str
    handed_over: list[str] = field(default_factory=list)  # the fast path's, by request

    async def post(
        self,
        client: httpx.AsyncClient,
        body: bytes,
        headers: dict[str, str],
        query: str = "",
        *,
        stream: bool = False,
    ) -> Answer:
        own = {name: value.replace(KEY, self.key) for name, value in headers.items()}
        content: Any = chunks(body) if stream else body
        before = counters()
        r = await client.post(
            f"/v1/jobs?{query}" if query else "/v1/jobs", content=content, headers=own
        )
        return Answer(r.status_code, list(r.headers.raw), r.content, counters() - before)

    async def ask(
        self, body: bytes, headers: dict[str, str], query: str = "", *, stream: bool = False
    ) -> tuple[Answer, Answer, bool]:
        """The fast app's answer, the plain app's, and whether the fast path handed the
        request over to the route."""
        before = len(self.handed_over)
        fast = await self.post(self.fast, body, headers, query, stream=stream)
        handed = len(self.handed_over) > before
        return fast, await self.post(self.plain, body, headers, query, stream=stream), handed


class Lag:
    """A lag source that reads ``lag`` records once, then nothing new (the reading ages);
    None: it never reads."""

    def __init__(self, lag: int | None) -> None:
        self.lag = lag
        self.read_once = False

    async def read(self, tally: Callable[[], int]) -> Reading | None:
        if self.lag is None:
            raise OSError("no lag here")
        if self.read_once:
            return None
        self.read_once = True
        return Reading(ends={0: self.lag}, committed={0: 0})


def counting(fast: FastSubmit, seen: list[str]) -> None:
    """Count what the fast path hands over to the router."""
    router = fast.handed

    async def handed(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["path"])
        await router(scope, receive, send)

    fast.handed = handed


@contextlib.asynccontextmanager
async def apps(settings: Settings, db: AsyncEngine, lag: int | None = 0) -> AsyncIterator[Apps]:
    """The API with the fast path and without, both started, on ``db``."""
    on = settings.model_copy(update=LIMITS)
    fast_app = create_app(on, engine=db, lag_source=Lag(lag))
    plain_app = create_app(
        on.model_copy(update={"api_fast_submit": False}), engine=db, lag_source=Lag(lag)
    )
    assert isinstance(fast_app.router.routes[0], FastSubmit)
    assert not any(isinstance(r, FastSubmit) for r in plain_app.router.routes)
    key = await KeyStore(db).create("acme")
    async with (
        fast_app.router.lifespan_context(fast_app),
        plain_app.router.lifespan_context(plain_app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=fast_app), base_url="http://sg"
        ) as fast,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=plain_app), base_url="http://sg"
        ) as plain,
    ):
        found = Apps(fast=fast, plain=plain, key=key)
        fast_route = fast_app.router.routes[0]
        assert isinstance(fast_route, FastSubmit)
        counting(fast_route, found.handed_over)
        yield found


async def test_every_refusal_is_the_routes_own(settings: Settings, db: AsyncEngine) -> None:
    unlike, handed = [], set()
    async with apps(settings, db) as api:
        for case, (body, headers, query) in REFUSALS.items():
            fast, plain, over = await api.ask(body, headers, query)
            assert plain.status >= 400, (case, plain)
            if fast != plain:
                unlike.append((case, fast, plain))
            if over:
                handed.add(case)
        fast, plain, over = await api.ask(job(input="x" * 9000), BEARER, stream=True)
        assert fast == plain
        assert plain.status == 413
    assert not unlike
    assert handed == HANDED_OVER


async def test_a_stored_job_is_answered_alike(settings: Settings, db: AsyncEngine) -> None:
    """A job stored by either is answered by the other's replay with the same body, and
    both replays are the same bytes."""
    async with apps(settings, db) as api:
        for case, (body, headers) in STORED.items():
            stream = case == "streamed"
            for first, then, key in ((api.fast, api.plain, "f"), (api.plain, api.fast, "p")):
                keyed = {**headers, "Idempotency-Key": f"{case}-{key}"}
                before = len(api.handed_over)
                stored = await api.post(first, body, keyed, stream=stream)
                assert stored.status == 202, (case, stored)
                if first is api.fast:
                    assert (len(api.handed_over) == before) == (case in FAST_STORED), case
                replays = [await api.post(c, body, keyed, stream=stream) for c in (then, first)]
                assert replays[0] == replays[1], case
                assert (replays[0].status, replays[0].body) == (200, stored.body), case
                assert (accepted(stored), accepted(replays[0])) == (1, 0), case
                replayed = {**dict(stored.headers), b"idempotent-replayed": b"true"}
                assert dict(replays[0].headers) == replayed, case
        # No key: a new job each time, answered in the same shape.
        fast, plain, _ = await api.ask(job(), BEARER)
        assert (fast.status, [n for n, _ in fast.headers]) == (202, [n for n, _ in plain.headers])
        assert json.loads(fast.body).keys() == json.loads(plain.body).keys()
        assert fast.counted == plain.counted
        # The key of a stored job with another body: 409 from both.
        fast, plain, over = await api.ask(
            job(max_tokens=7), {**BEARER, "Idempotency-Key": "plain-p"}
        )
        assert (fast, over) == (plain, False)
        assert plain.status == 409
        # ?wait= is the route's: the job held and answered 202 with Retry-After.
        fast, plain, over = await api.ask(job(), BEARER, "wait=0.2")
        assert over
        assert (fast.status, plain.status) == (202, 202)
        assert dict(fast.headers)[b"retry-after"] == dict(plain.headers)[b"retry-after"]


@pytest.mark.parametrize(("lag", "status"), [(10**9, 429), (None, 503)], ids=["full", "unknown"])
async def test_a_yield_is_the_routes_own(
    settings: Settings, db: AsyncEngine, lag: int | None, status: int
) -> None:
    # The consumer lag: with the open lag, the batch meter's count of the backlog (none)
    # would soon stand in for the reading.
    consumer = settings.model_copy(update={"lag_measure": "consumer"})
    async with apps(consumer, db, lag) as api:
        fast, plain, over = await api.ask(job(), BEARER)
    assert (fast, over) == (plain, False)
    assert plain.status == status
    assert b"retry-after" in dict(plain.headers)
