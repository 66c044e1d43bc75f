"""Bad input on every way in, against the real database: bodies over their limit (declared
or streamed), JSON nested past the parser, bytes that are not UTF-8, absurd deadlines, NUL
characters, batches too large to take, and a body that trickles in under a real server.
Each is refused with its status and stable code, and nothing is stored."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.api.app import create_app
from schemas.tables import batches, jobs, outbox
from tests.integration.serving import serve, serving

TENANT = {"X-Sluicegate-Tenant": "acme"}
JSON = {**TENANT, "Content-Type": "application/json"}
JSONL = {**TENANT, "Content-Type": "application/jsonl"}
LIMITS = {
    "max_body_bytes": 256 * 1024,
    "max_batch_bytes": 512 * 1024,
    "max_batch_requests": 20,
    "lag_hard": 10,
}
DEEP = b"[" * 100_000 + b"]" * 100_000


def line(custom_id: str = "a", text: str = "Summarize: the gate holds.") -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/jobs",
        "body": {"input": text, "max_tokens": 16},
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


@pytest.fixture
async def api(settings: Settings, db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(settings.model_copy(update=LIMITS), db) as client:
        yield client


async def stored(db: AsyncEngine) -> dict[str, int]:
    """Rows in the tables a submission writes."""
    async with db.connect() as conn:
        return {
            t.name: int(await conn.scalar(select(func.count()).select_from(t)) or 0)
            for t in (jobs, batches, outbox)
        }


NOTHING = {"jobs": 0, "batches": 0, "outbox": 0}


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code, response.text


async def chunked(data: bytes, size: int = 16 * 1024) -> AsyncIterator[bytes]:
    """A body without Content-Length (Transfer-Encoding: chunked)."""
    for at in range(0, len(data), size):
        yield data[at : at + size]


async def test_an_oversized_job_is_413_by_content_length_and_while_streaming(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    body = json.dumps({"kind": "summarize", "input": "x" * 300_000}).encode()
    refused(await api.post("/v1/jobs", content=body, headers=JSON), 413, "payload_too_large")
    streamed = await api.post("/v1/jobs", content=chunked(body), headers=JSON)
    assert "content-length" not in streamed.request.headers
    refused(streamed, 413, "payload_too_large")
    assert await stored(db) == NOTHING


async def test_a_batch_has_its_own_larger_body_limit(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    """Over max_body_bytes and under max_batch_bytes is a batch; over that, 413 either way."""
    text = "x" * 50_000
    fits = jsonl([line(f"r{i}", text) for i in range(6)])  # ~300 KB
    assert LIMITS["max_body_bytes"] < len(fits) < LIMITS["max_batch_bytes"]
    too_big = jsonl([line(f"r{i}", text) for i in range(12)])  # ~600 KB
    refused(await api.post("/v1/batches", content=too_big, headers=JSONL), 413, "payload_too_large")
    streamed = await api.post("/v1/batches", content=chunked(too_big), headers=JSONL)
    refused(streamed, 413, "payload_too_large")
    upload = await api.post(
        "/v1/batches", files={"file": ("in.jsonl", too_big, "application/jsonl")}, headers=TENANT
    )
    refused(upload, 413, "payload_too_large")
    assert await stored(db) == NOTHING
    r = await api.post("/v1/batches", content=fits, headers=JSONL)
    assert r.status_code == 201, r.text
    assert (await stored(db))["jobs"] == 6  # held: the meter writes their dispatch records


@pytest.mark.parametrize(
    ("path", "content", "headers", "code"),
    [
        ("/v1/jobs", DEEP, JSON, "invalid_json"),
        ("/v1/batches", DEEP, JSON, "invalid_json"),
        ("/v1/batches", b'{"requests": ' + DEEP + b"}", JSON, "invalid_json"),
        ("/v1/batches", jsonl([line()]) + DEEP, JSONL, "invalid_jsonl"),
    ],
    ids=["job", "batch", "batch-requests", "batch-jsonl"],
)
async def test_json_nested_100000_deep_is_400(
    api: httpx.AsyncClient,
    db: AsyncEngine,
    path: str,
    content: bytes,
    headers: dict[str, str],
    code: str,
) -> None:
    refused(await api.post(path, content=content, headers=headers), 400, code)
    assert await stored(db) == NOTHING


async def test_a_batch_nested_just_under_the_parser_limit_is_never_a_500(
    settings: Settings, db: AsyncEngine
) -> None:
    """Depths the parser takes but hashing an idempotent batch may not: 201 or 4xx."""
    seen = set()
    async with serve(settings, db) as api:
        for depth in range(880, 1000):
            nested = "[" * depth + "]" * depth
            body = (
                '{"requests": [{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",'
                ' "body": {"messages": [{"role": "user", "content": "x"}], "extra": '
                + nested
                + "}}]}"
            )
            r = await api.post(
                "/v1/batches", content=body, headers={**JSON, "Idempotency-Key": f"k{depth}"}
            )
            assert r.status_code in (201, 400, 422), r.text
            seen.add(r.status_code)
    assert {201, 400} <= seen


@pytest.mark.parametrize(
    ("path", "kwargs", "code"),
    [
        ("/v1/jobs", {"content": b'{"kind": "summarize", "input": "\xff\xfe"}'}, "invalid_json"),
        ("/v1/batches", {"content": b'{"requests": ["\xc3\x28"]}'}, "invalid_json"),
        (
            "/v1/batches",
            {"content": jsonl([line()]) + b"\xff\n", "headers": JSONL},
            "invalid_jsonl",
        ),
        (
            "/v1/batches",
            {"files": {"file": ("in.jsonl", b'{"custom_id": "\xe2\x28\xa1"}\n', "text/plain")}},
            "invalid_jsonl",
        ),
    ],
    ids=["job", "batch", "batch-jsonl", "batch-upload"],
)
async def test_invalid_utf8_is_400(
    api: httpx.AsyncClient, db: AsyncEngine, path: str, kwargs: dict[str, Any], code: str
) -> None:
    headers = kwargs.pop("headers", JSON if "content" in kwargs else TENANT)
    refused(await api.post(path, headers=headers, **kwargs), 400, code)
    assert await stored(db) == NOTHING


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ('"deadline": "9999-12-31T23:59:59Z"', "deadline_too_far"),
        ('"deadline": "9999-12-31T23:59:59-14:00"', "deadline_too_far"),
        ('"deadline": "2001-01-01T00:00:00Z"', "deadline_in_past"),
        ('"deadline": "0001-01-01T00:00:00+14:00"', "deadline_in_past"),
        ('"deadline": "2030-01-01T00:00:00"', "invalid_request"),  # no time zone
        ('"ttl_s": -1', "invalid_request"),
        ('"ttl_s": 0', "invalid_request"),
        ('"ttl_s": NaN', "invalid_request"),
        ('"ttl_s": Infinity', "deadline_too_far"),
        ('"ttl_s": -Infinity', "invalid_request"),
        ('"ttl_s": 1e308', "deadline_too_far"),
        ('"ttl_s": 1e999', "deadline_too_far"),
        ('"ttl_s": 5e-324', "deadline_in_past"),
        ('"abandon_after_s": Infinity', "invalid_request"),
        ('"abandon_after_s": NaN', "invalid_request"),
        ('"max_tokens": 99999999999999999999999', "max_tokens_too_large"),
    ],
)
async def test_absurd_deadlines_and_numbers_are_422(
    api: httpx.AsyncClient, db: AsyncEngine, fields: str, code: str
) -> None:
    body = f'{{"kind": "summarize", "input": "a gate", {fields}}}'.encode()
    refused(await api.post("/v1/jobs", content=body, headers=JSON), 422, code)
    assert await stored(db) == NOTHING


@pytest.mark.parametrize("window", ["99999999999999999999d", "0s", "-1h", "1e308s", "24h\u0000"])
async def test_an_absurd_completion_window_is_422(
    api: httpx.AsyncClient, db: AsyncEngine, window: str
) -> None:
    r = await api.post(
        "/v1/batches", json={"requests": [line()], "completion_window": window}, headers=TENANT
    )
    refused(r, 422, "invalid_completion_window")
    assert await stored(db) == NOTHING


JOB = {"kind": "summarize", "input": "a gate"}


@pytest.mark.parametrize(
    ("path", "kwargs", "code"),
    [
        ("/v1/jobs", {"json": {**JOB, "input": "a\u0000gate"}}, "invalid_character"),
        ("/v1/jobs", {"json": {**JOB, "idempotency_key": "k\u0000"}}, "invalid_character"),
        ("/v1/jobs", {"json": JOB, "headers": {"Idempotency-Key": "k\x00"}}, "invalid_character"),
        (
            "/v1/jobs",
            {"json": {**JOB, "callback_url": "https://a\u0000b.example/hook"}},
            "invalid_callback_url",
        ),
        ("/v1/batches", {"json": {"requests": [line(text="a\u0000b")]}}, "invalid_character"),
        ("/v1/batches", {"json": {"requests": [line("a\u0000")]}}, "invalid_character"),
        (
            "/v1/batches",
            {"json": {"requests": [line()], "metadata": {"k": "v\u0000"}}},
            "invalid_character",
        ),
        (
            "/v1/batches",
            {"content": jsonl([line(text="a\u0000b")]), "headers": JSONL},
            "invalid_character",
        ),
        (
            "/v1/batches",
            {"files": {"file": ("in.jsonl", jsonl([line("a\u0000")]), "application/jsonl")}},
            "invalid_character",
        ),
        # A lone surrogate is valid JSON as an escape, has no UTF-8 encoding, and is quoted
        # back in the error.
        (
            "/v1/batches",
            {"content": jsonl([line()]).replace(b'"a"', b'"a\\ud800"'), "headers": JSONL},
            "invalid_batch",
        ),
    ],
    ids=[
        "job-input",
        "job-idempotency-key",
        "job-idempotency-header",
        "job-callback-url",
        "batch-input",
        "batch-custom-id",
        "batch-metadata",
        "batch-jsonl",
        "batch-upload",
        "batch-lone-surrogate",
    ],
)
async def test_a_nul_character_is_422_never_a_500(
    api: httpx.AsyncClient, db: AsyncEngine, path: str, kwargs: dict[str, Any], code: str
) -> None:
    headers = {**TENANT, **kwargs.pop("headers", {})}
    refused(await api.post(path, headers=headers, **kwargs), 422, code)
    assert await stored(db) == NOTHING


async def test_a_nul_character_in_a_lookup_is_422(api: httpx.AsyncClient) -> None:
    for path in (
        "/v1/webhooks/deliveries/a%00b",
        "/v1/webhooks/deliveries?subject=%00",
        "/v1/webhooks/deliveries?after=a%00",
    ):
        refused(await api.get(path, headers=TENANT), 422, "invalid_character")
    for path in ("/v1/jobs/%00", "/v1/batches/a%00b"):  # not a UUID: no such thing
        assert (await api.get(path, headers=TENANT)).status_code == 404


async def test_a_batch_over_max_batch_requests_is_413(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    """21 lines is over max_batch_requests (20); 11 over lag_hard (10) is metered in."""
    lines = [line(f"r{i}") for i in range(LIMITS["max_batch_requests"] + 1)]
    refused(
        await api.post("/v1/batches", content=jsonl(lines), headers=JSONL),
        413,
        "batch_too_large",
    )
    r = await api.post("/v1/batches", json={"requests": lines}, headers=TENANT)
    refused(r, 413, "batch_too_large")
    assert await stored(db) == NOTHING
    over_hard = [line(f"r{i}") for i in range(LIMITS["lag_hard"] + 1)]
    r = await api.post("/v1/batches", json={"requests": over_hard}, headers=TENANT)
    assert r.status_code == 201, r.text


async def raw_post(port: int, declared: int, first: bytes, gap_s: float) -> tuple[bytes, float]:
    """Send a POST's headers and ``first``, then one byte every ``gap_s`` (0: none) until the
    server hangs up; what it answered, and after how long."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(
        b"POST /v1/jobs HTTP/1.1\r\nHost: sg\r\nX-Sluicegate-Tenant: acme\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {declared}\r\n\r\n".encode()
        + first
    )

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            while gap_s:
                await asyncio.sleep(gap_s)
                writer.write(b" ")
                await writer.drain()

    trickling = asyncio.create_task(trickle())
    answer = b""
    try:
        async with asyncio.timeout(10):
            # To EOF: the server closed the connection. A byte still trickling in after the
            # server closed makes its side reset the connection, after its answer: what came
            # before the reset is the answer (StreamReader.read() to EOF would drop it).
            with contextlib.suppress(ConnectionResetError):
                while chunk := await reader.read(65536):
                    answer += chunk
    finally:
        trickling.cancel()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return answer, time.monotonic() - started


@pytest.mark.parametrize(
    ("gap_s", "within_s"), [(0.0, 2.0), (0.05, 3.0)], ids=["stalled", "trickling"]
)
async def test_a_slow_upload_is_cut_off_with_408(
    settings: Settings, db: AsyncEngine, gap_s: float, within_s: float
) -> None:
    """Under uvicorn: a body that stops arriving is cut off after request_read_timeout_s; one
    that trickles a byte at a time (20 B/s, never idle that long) once it falls behind
    request_min_rate."""
    slow = settings.model_copy(update={"request_read_timeout_s": 0.5, "request_min_rate": 100})
    async with serving(create_app(slow, engine=db)) as port:
        answer, took = await raw_post(port, 10_000, b'{"kind": "summarize", "input": "', gap_s)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert 0.5 <= took < within_s
    assert await stored(db) == NOTHING


async def test_the_read_timeout_leaves_a_long_poll_alone(
    settings: Settings, db: AsyncEngine
) -> None:
    """Once the body is in, ?wait= holds the request past request_read_timeout_s."""
    quick = settings.model_copy(update={"request_read_timeout_s": 0.2})
    async with serve(quick, db) as api:
        started = time.monotonic()
        r = await api.post("/v1/jobs?wait=1", json=JOB, headers=TENANT)
    assert r.status_code == 202, r.text
    assert r.json()["state"] == "queued"
    assert time.monotonic() - started >= 1
