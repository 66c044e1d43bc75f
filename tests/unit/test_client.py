"""The producer client honours refusals with jitter and a retry budget."""

from __future__ import annotations

import json

import httpx
import pytest

from client.api import ApiError, AsyncClient, RetryPolicy, Unreachable
from schemas.jobs import JobKind

ACCEPTED = {
    "id": "01a20311-051f-7568-bc8b-08749cb34fb6",
    "state": "queued",
    "deadline": "2026-01-01T00:00:00Z",
    "created_at": "2026-01-01T00:00:00Z",
    "status_url": "/v1/jobs/01a20311-051f-7568-bc8b-08749cb34fb6",
}


def yielding(times: int, retry_after_ms: int = 1500) -> tuple[httpx.MockTransport, list[int]]:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) <= times:
            body = {
                "status": "yield",
                "retry_after_ms": retry_after_ms,
                "reason": "lag_hard",
                "lag": 99,
                "error": {"code": "lag_hard", "message": "behind"},
            }
            return httpx.Response(429, json=body, headers={"Retry-After": "2"})
        return httpx.Response(202, json=ACCEPTED)

    return httpx.MockTransport(handler), calls


async def test_retries_after_the_hint_with_jitter() -> None:
    transport, calls = yielding(2)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    policy = RetryPolicy(min_retries_per_s=100)
    async with AsyncClient("http://sg", transport=transport, retry=policy, sleep=sleep) as c:
        answer = await c.submit(JobKind.SUMMARIZE, "x", idempotency_key="k")
    assert answer.state == "queued"
    assert len(calls) == 3
    assert len(slept) == 2
    assert all(1.5 <= s <= 3.0 for s in slept)  # at least the hint, jittered up to twice it


async def test_without_a_policy_the_refusal_surfaces() -> None:
    transport, calls = yielding(1)
    async with AsyncClient("http://sg", transport=transport) as c:
        with pytest.raises(ApiError) as caught:
            await c.submit(JobKind.SUMMARIZE, "x")
    assert caught.value.status == 429
    assert caught.value.code == "lag_hard"
    assert caught.value.retry_after_s == 1.5
    assert len(calls) == 1


async def test_retry_budget_stops_a_retry_storm() -> None:
    transport, calls = yielding(10_000, retry_after_ms=1)

    async def sleep(_: float) -> None:
        return None

    policy = RetryPolicy(max_attempts=1000, budget_ratio=0.1, min_retries_per_s=0, budget_cap=3)
    refused = 0
    async with AsyncClient("http://sg", transport=transport, retry=policy, sleep=sleep) as c:
        for _ in range(50):
            with pytest.raises(ApiError):
                await c.submit(JobKind.SUMMARIZE, "x")
            refused += 1
    # The initial 3 retries plus 5 earned by 50 requests at 10%: not 50 x 1000 calls.
    assert refused == 50
    assert len(calls) <= 50 + 3 + 5


async def test_bad_request_is_not_retried() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["kind"] == "summarize"
        return httpx.Response(422, json={"error": {"code": "empty_input", "message": "empty"}})

    async with AsyncClient(
        "http://sg", transport=httpx.MockTransport(handler), retry=RetryPolicy()
    ) as c:
        with pytest.raises(ApiError) as caught:
            await c.submit(JobKind.SUMMARIZE, "x")
    assert caught.value.code == "empty_input"


async def test_each_wait_is_said_before_it_starts() -> None:
    transport, _ = yielding(2)
    said: list[tuple[str, float]] = []

    async def sleep(seconds: float) -> None:
        said.append(("slept", seconds))

    def on_wait(refusal: ApiError, seconds: float) -> None:
        said.append((refusal.code, seconds))

    policy = RetryPolicy(min_retries_per_s=100)
    async with AsyncClient(
        "http://sg", transport=transport, retry=policy, sleep=sleep, on_wait=on_wait
    ) as c:
        await c.submit(JobKind.SUMMARIZE, "x", idempotency_key="k")
    assert [what for what, _ in said] == ["lag_hard", "slept", "lag_hard", "slept"]
    assert said[0][1] == said[1][1]  # it says the wait it then takes


async def test_a_deadline_that_cannot_be_met_is_not_retried() -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        error = {"code": "deadline_unreachable", "message": "predicted 90s > 3s left"}
        return httpx.Response(429, json={"error": error}, headers={"Retry-After": "60"})

    async def sleep(seconds: float) -> None:
        raise AssertionError("a refusal that cannot succeed must not be waited for")

    policy = RetryPolicy(min_retries_per_s=100)
    transport = httpx.MockTransport(handler)
    async with AsyncClient("http://sg", transport=transport, retry=policy, sleep=sleep) as c:
        with pytest.raises(ApiError, match="deadline_unreachable"):
            await c.submit(JobKind.SUMMARIZE, "x")
    assert len(calls) == 1


async def test_nothing_listening_is_unreachable_not_a_transport_traceback() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    transport = httpx.MockTransport(handler)
    async with AsyncClient("http://sg:1", transport=transport) as c:
        with pytest.raises(Unreachable, match=r"cannot reach the Sluicegate API at http://sg:1"):
            await c.get("some-job")


async def test_kind_and_priority_may_be_given_as_strings() -> None:
    """As a caller writes them from the docs: "summarize", not only JobKind.SUMMARIZE."""
    sent: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(202, json=ACCEPTED)

    async with AsyncClient(
        "http://sg", transport=httpx.MockTransport(handler), coalesce=False
    ) as c:
        await c.submit("summarize", "x", priority="high")
        await c.submit(JobKind.COMPLETE, "y")
    assert [(b["kind"], b["priority"]) for b in sent] == [
        ("summarize", "high"),
        ("complete", "normal"),
    ]
