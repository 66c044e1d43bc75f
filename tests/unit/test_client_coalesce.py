"""The client coalesces concurrent submits into bulk requests, and each caller keeps its own
answer: its status, its refusal and retry, its error."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from client.api import ApiError, AsyncClient, RetryPolicy
from client.sync import Client
from schemas.jobs import JobKind


def accepted(n: int) -> dict[str, Any]:
    job_id = f"01a20311-051f-7568-bc8b-{n:012d}"
    return {
        "id": job_id,
        "state": "queued",
        "deadline": "2026-01-01T00:00:00Z",
        "created_at": "2026-01-01T00:00:00Z",
        "status_url": f"/v1/jobs/{job_id}",
    }


REFUSED = {
    "status": "yield",
    "retry_after_ms": 1500,
    "reason": "rate_limited",
    "lag": None,
    "error": {"code": "rate_limited", "message": "over the tenant's rate"},
}


class Server:
    """Answers POST /v1/jobs and /v1/jobs/bulk by each job's input: "refuse" is refused
    (429) once, "bad" is invalid (422); the rest are stored (their input is their number)."""

    def __init__(self, bulk_status: int | None = None) -> None:
        self.requests: list[tuple[str, int]] = []  # (path, jobs)
        self.bulk_status = bulk_status
        self.refused: set[str] = set()

    def answer(self, job: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        text = job["input"]
        if text.startswith("refuse") and text not in self.refused:
            self.refused.add(text)
            return 429, REFUSED, {"retry-after": "2"}
        if text == "bad":
            error = {"code": "empty_input", "message": "the request is not valid"}
            return 422, {"error": error}, {}
        return 202, accepted(int(text.rsplit(" ", 1)[-1])), {"location": "/v1/jobs/x"}

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/v1/jobs":
            self.requests.append(("one", 1))
            status, answer, headers = self.answer(body)
            return httpx.Response(status, json=answer, headers=headers)
        self.requests.append(("bulk", len(body["jobs"])))
        if self.bulk_status is not None:
            return httpx.Response(self.bulk_status, json={"error": {"code": "x", "message": "x"}})
        data = []
        for job in body["jobs"]:
            status, answer, headers = self.answer(job)
            data.append({"status": status, "body": answer, "headers": headers})
        return httpx.Response(200, json={"object": "list", "data": data})


def client_of(server: Server, **kwargs: Any) -> AsyncClient:
    return AsyncClient("http://sg", transport=httpx.MockTransport(server.handler), **kwargs)


async def test_a_lone_submit_goes_alone_to_the_single_route() -> None:
    server = Server()
    async with client_of(server) as client:
        answer = await client.submit(JobKind.SUMMARIZE, "doc 1")
    assert answer.id.endswith("000000000001")
    assert server.requests == [("one", 1)]


async def test_concurrent_submits_go_as_one_bulk_request_each_with_its_own_answer() -> None:
    server = Server()
    async with client_of(server) as client:
        answers = await asyncio.gather(
            *(client.submit(JobKind.SUMMARIZE, f"doc {i}") for i in range(10))
        )
    assert [a.id[-2:] for a in answers] == [f"{i:02d}" for i in range(10)]
    assert server.requests == [("bulk", 10)]


async def test_a_refused_or_invalid_job_is_its_callers_alone() -> None:
    server = Server()
    async with client_of(server) as client:
        outcomes = await asyncio.gather(
            client.submit(JobKind.SUMMARIZE, "doc 1"),
            client.submit(JobKind.SUMMARIZE, "refuse 2"),
            client.submit(JobKind.SUMMARIZE, "bad"),
            client.submit(JobKind.SUMMARIZE, "doc 3"),
            return_exceptions=True,
        )
    first, refused, bad, last = outcomes
    assert not isinstance(first, BaseException)
    assert not isinstance(last, BaseException)
    assert (first.id[-1], last.id[-1]) == ("1", "3")
    assert isinstance(refused, ApiError)
    assert (refused.status, refused.code, refused.retry_after_s) == (429, "rate_limited", 1.5)
    assert isinstance(bad, ApiError)
    assert (bad.status, bad.code) == (422, "empty_input")


async def test_only_the_refused_caller_retries() -> None:
    server = Server()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    policy = RetryPolicy(min_retries_per_s=100)
    async with client_of(server, retry=policy, sleep=sleep) as client:
        answers = await asyncio.gather(
            *(
                client.submit(JobKind.SUMMARIZE, f"{'refuse' if i == 2 else 'doc'} {i}")
                for i in range(4)
            )
        )
    assert [a.id[-1] for a in answers] == ["0", "1", "2", "3"]
    assert len(slept) == 1
    assert 1.5 <= slept[0] <= 3.0
    assert server.requests == [("bulk", 4), ("one", 1)]  # the retry alone


async def test_a_server_without_the_bulk_route_gets_single_submits_from_then_on() -> None:
    server = Server(bulk_status=404)
    async with client_of(server) as client:
        first = await asyncio.gather(
            *(client.submit(JobKind.SUMMARIZE, f"d {i}") for i in range(3))
        )
        again = await asyncio.gather(
            *(client.submit(JobKind.SUMMARIZE, f"d {i}") for i in range(3))
        )
    assert [a.id[-1] for a in first + again] == ["0", "1", "2", "0", "1", "2"]
    assert server.requests == [("bulk", 3)] + [("one", 1)] * 6


async def test_a_bulk_request_over_the_body_limit_is_sent_again_one_job_a_request() -> None:
    server = Server(bulk_status=413)
    async with client_of(server) as client:
        await asyncio.gather(*(client.submit(JobKind.SUMMARIZE, f"d {i}") for i in range(2)))
        await asyncio.gather(*(client.submit(JobKind.SUMMARIZE, f"d {i}") for i in range(2)))
    assert server.requests == [("bulk", 2), ("one", 1), ("one", 1)] * 2


async def test_without_coalescing_each_submit_is_a_request() -> None:
    server = Server()
    async with client_of(server, coalesce=False) as client:
        await asyncio.gather(*(client.submit(JobKind.SUMMARIZE, f"d {i}") for i in range(3)))
    assert server.requests == [("one", 1)] * 3


async def test_an_unreachable_server_fails_every_waiting_caller() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with AsyncClient("http://sg", transport=httpx.MockTransport(down)) as client:
        outcomes = await asyncio.gather(
            *(client.submit(JobKind.SUMMARIZE, f"d {i}") for i in range(3)),
            return_exceptions=True,
        )
    assert len(outcomes) == 3
    assert all("cannot reach the Sluicegate API" in str(o) for o in outcomes)


def test_the_thread_client_coalesces_submits_made_at_once_from_many_threads() -> None:
    server = Server()
    barrier = threading.Barrier(8)

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.2)  # the threads' submits arrive while the first are answered
        return server.handler(request)

    with Client("http://sg", transport=httpx.MockTransport(slow)) as client:

        def one(i: int) -> str:
            barrier.wait()
            return client.submit(JobKind.SUMMARIZE, f"doc {i}").id

        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(one, range(8)))
        with pytest.raises(ApiError) as caught:
            client.submit(JobKind.SUMMARIZE, "bad")
    assert [i[-1] for i in ids] == [str(i) for i in range(8)]
    assert sum(n for _, n in server.requests) == 9
    assert len(server.requests) <= 6  # at most 4 in flight: the rest went together
    assert caught.value.code == "empty_input"
